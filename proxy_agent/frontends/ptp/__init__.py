"""The PTP proxy protocol front-end: sessions over the job service."""

from .session import PtpConfig, PtpSession, refuse_busy

__all__ = ["PtpConfig", "PtpSession", "refuse_busy"]
