"""The PTP proxy protocol front-end: sessions over the job service."""

from .session import PtpConfig, PtpSession, keep_snapshot_planned, refuse_busy

__all__ = ["PtpConfig", "PtpSession", "keep_snapshot_planned", "refuse_busy"]
