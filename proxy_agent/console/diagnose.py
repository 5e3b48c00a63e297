"""The client's diagnosis of a stream that does not start with the protocol, for the console
(see :mod:`proxy_agent.client.diagnose`)."""

from ..client.diagnose import garbage_before_first_frame, looks_like_frame_start, shown_bytes

__all__ = ["looks_like_frame_start", "garbage_before_first_frame", "shown_bytes"]
