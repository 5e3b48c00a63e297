"""Command line of the agent: ``proxy-agent`` / ``python -m proxy_agent``.

* ``proxy-agent [--stdio | --connect ... | --listen ... | --unix ...] [OPTIONS]``: a launch,
  which joins the service of its state directory (see :mod:`.launch`);
* ``proxy-agent service``: that service itself (see :mod:`.daemon`);
* ``proxy-agent stop``: stops it;
* ``proxy-agent jobs`` and ``forget``: the job list (see :mod:`.joblist`).

Loading stays small until a command needs more: a launch that joins a running service
imports the standard library and :mod:`.launch` only.  The agent's options and the names
this module had before (``parse_arguments``, ``build_parser``...) live in :mod:`.agent`, and
are looked up there when asked for.
"""

from __future__ import annotations

import sys
from typing import Any, List, Optional


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    command = argv[0] if argv else ""
    if command in ("jobs", "forget"):
        from .joblist import main as joblist_main

        return joblist_main(argv)
    if command == "service":
        from .daemon import main as service_main

        return service_main(argv[1:])
    if command == "stop":
        from .launch import stop_main

        return stop_main(argv[1:])
    from .launch import main as launch_main

    return launch_main(argv)


def __getattr__(name: str) -> Any:
    from . import agent

    try:
        return getattr(agent, name)
    except AttributeError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None


if __name__ == "__main__":
    sys.exit(main())
