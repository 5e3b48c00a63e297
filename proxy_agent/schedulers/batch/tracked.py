"""A job the engine follows: the one it submitted or adopted, with its output files."""


from typing import Any, Dict, Optional, Tuple

import attrs
import trio


@attrs.define(eq=False)
class TrackedJob:
    """A job submitted or adopted here: its elements, its output files and how far its end is shown."""

    native_id: str
    element: int
    process: int
    queue: int
    submitted: bool = False
    completed: bool = False
    retire_at: Optional[float] = None
    gone_polls: int = 0
    #: deleted on request: if the system keeps no record of it, it was KILLED
    deleted: bool = False
    node: Optional[int] = None
    started: Optional[trio.Event] = None
    done: Optional[trio.Event] = None
    #: files the agent chose itself: removed once their output is delivered
    spool_files: Tuple[str, ...] = ()
    #: stream -> followed file
    paths: Dict[str, str] = attrs.Factory(dict)
    followers: int = 0
    #: the final attributes (job, process), shown once every output file is delivered
    held: Optional[Tuple[Dict[str, Any], Dict[str, Any]]] = None


