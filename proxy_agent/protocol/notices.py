"""The events an agent sends only when something goes wrong or ends: MESSAGE, SHUTDOWN,
SUBMITJOB_ERROR and TERMINATEJOB_ERROR.

:mod:`.messages` gives them under its own names, loading this module the first time one is
asked for: an agent answers INIT without them.
"""

from __future__ import annotations

import attrs

from .event_base import ArgumentError, Event, EventId, MessageLevel, expect_attrs, int_value

__all__ = ["Message", "Shutdown", "SubmitJobError", "TerminateJobError"]


@attrs.frozen(slots=True)
class Shutdown(Event):
    tid: int
    event_id = EventId.SHUTDOWN

    def to_args(self) -> list:
        return []

    @classmethod
    def from_args(cls, tid, args, event_id):
        if args:
            raise ArgumentError(f"SHUTDOWN takes no arguments, got {len(args)}")
        return cls(tid)


@attrs.frozen(slots=True)
class Message(Event):
    tid: int
    level: str
    code: int
    text: str
    event_id = EventId.MESSAGE

    def to_args(self) -> list:
        level = self.level.value if isinstance(self.level, MessageLevel) else self.level
        return ["3", f"messageLevel={level}", f"messageCode={int(self.code)}", f"messageText={self.text}"]

    @classmethod
    def from_args(cls, tid, args, event_id):
        level, code, text = expect_attrs(args, ("messageLevel", "messageCode", "messageText"), "MESSAGE")
        if level not in MessageLevel.__members__:
            raise ArgumentError(f"MESSAGE: unknown messageLevel {level!r}")
        return cls(tid, level, int_value(code, "messageCode"), text)


@attrs.frozen(slots=True)
class SubmitJobError(Event):
    tid: int
    job_sub_id: str
    code: int
    message: str
    event_id = EventId.SUBMITJOB_ERROR

    def to_args(self) -> list:
        return ["3", f"jobSubId={self.job_sub_id}", f"errorCode={int(self.code)}", f"errorMsg={self.message}"]

    @classmethod
    def from_args(cls, tid, args, event_id):
        sub, code, msg = expect_attrs(args, ("jobSubId", "errorCode", "errorMsg"), "SUBMITJOB_ERROR")
        return cls(tid, sub, int_value(code, "errorCode"), msg)


@attrs.frozen(slots=True)
class TerminateJobError(Event):
    tid: int
    job_id: str
    code: int
    message: str
    event_id = EventId.TERMINATEJOB_ERROR

    def to_args(self) -> list:
        return ["3", f"jobId={self.job_id}", f"errorCode={int(self.code)}", f"errorMsg={self.message}"]

    @classmethod
    def from_args(cls, tid, args, event_id):
        job, code, msg = expect_attrs(args, ("jobId", "errorCode", "errorMsg"), "TERMINATEJOB_ERROR")
        return cls(tid, job, int_value(code, "errorCode"), msg)
