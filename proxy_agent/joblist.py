"""The job list for people: ``proxy-agent jobs``, ``forget`` and ``output``, no agent needed.

``proxy-agent jobs`` lists the jobs the store keeps, filtered (``--state``, ``--scheduler``,
``--queue``, ``--name``, ``--since``, ``--until``) and in chosen columns (``--format``), as a
table or as JSON lines (``--json``); ``proxy-agent forget JOB... | --ended-before WHEN``
removes ended jobs (a running job is never forgotten) with what is kept for them;
``proxy-agent output JOB [--stderr] [--follow]`` prints a job's kept output.  The data comes
from :mod:`.service.statedir`; this module filters, formats and prints it.  When the service
of the state directory runs, the list and forgetting go through it (its interface on
``agent.sock``): the list as it is this moment, and forgetting done by the one process that
writes the store.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import difflib
import fnmatch
import json
import re
import sqlite3
import sys
import time
from typing import Any, Callable, Dict, List, NoReturn, Optional, Sequence, Tuple

from .config import ConfigError
from .config import state_dir as configured_state_dir
from .service import history
from .service.jobs import JobState
from .service.statedir import ROW_FIELDS, forget_jobs, job_output, list_jobs
from .service.store import StoreError, default_state_dir, holder_of

__all__ = ["COLUMNS", "COMMANDS", "build_parser", "main"]

#: The commands this module runs (``proxy-agent COMMAND``).
COMMANDS = ("jobs", "forget", "output")


class CommandParser(argparse.ArgumentParser):
    """A command's parser whose usage error is one line and exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


class UsageError(Exception):
    """A value on the command line that cannot be used; the text says why."""


# --------------------------------------------------------------------------- columns


def _local_time(value: Optional[float]) -> str:
    if value is None:
        return ""
    return _dt.datetime.fromtimestamp(value).strftime("%Y-%m-%d %H:%M:%S")


def iso_time(value: Optional[float]) -> Optional[str]:
    """ISO 8601 with the local zone's offset (``2026-11-25T09:12:03+01:00``); None stays None."""
    if value is None:
        return None
    return _dt.datetime.fromtimestamp(value).astimezone().isoformat(timespec="seconds")


def _exit_text(row: Dict[str, Any]) -> str:
    if row["exit_code"] is not None:
        return str(row["exit_code"])
    return row["signal"] or ""


def _visible(text: Any) -> str:
    text = "" if text is None else str(text)
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


#: Column name -> (heading, the cell of a row in the table).  ``--format`` chooses among them.
COLUMNS: Dict[str, Tuple[str, Callable[[Dict[str, Any]], str]]] = {
    "id": ("ID", lambda row: str(row["id"])),
    "name": ("NAME", lambda row: _visible(row["name"])),
    "scheduler": ("SCHEDULER", lambda row: row["scheduler"]),
    "queue": ("QUEUE", lambda row: _visible(row["queue"])),
    "native_id": ("NATIVE ID", lambda row: _visible(row["native_id"])),
    "state": ("STATE", lambda row: row["state"]),
    "native_state": ("NATIVE STATE", lambda row: _visible(row["native_state"])),
    "exit": ("EXIT", _exit_text),
    "exit_code": ("EXIT CODE", lambda row: "" if row["exit_code"] is None else str(row["exit_code"])),
    "signal": ("SIGNAL", lambda row: row["signal"] or ""),
    "submitted": ("SUBMITTED", lambda row: _local_time(row["submitted"])),
    "ended": ("ENDED", lambda row: _local_time(row["ended"])),
    "message": ("MESSAGE", lambda row: _visible(row["message"])),
    "client_ref": ("CLIENT REF", lambda row: _visible(row["client_ref"])),
    "broker": ("BROKER", lambda row: _visible(row["broker"])),
    "broker_queue": ("BROKER QUEUE", lambda row: _visible(row["broker_queue"])),
    "broker_reason": ("BROKER REASON", lambda row: _visible(row["broker_reason"])),
}
#: The table's columns unless ``--format`` says otherwise.
DEFAULT_COLUMNS = ("id", "name", "scheduler", "queue", "native_id", "state", "exit", "submitted", "ended")
#: What ``--json`` writes of a row (all of it unless ``--format`` says otherwise).
_JSON_TIMES = ("submitted", "ended")


def _columns(text: Optional[str], json_mode: bool) -> List[str]:
    if not text:
        return list(ROW_FIELDS) if json_mode else list(DEFAULT_COLUMNS)
    names = [name.strip().lower().replace("-", "_") for name in text.split(",") if name.strip()]
    known = list(ROW_FIELDS) if json_mode else list(COLUMNS)
    for name in names:
        if name not in known:
            guess = difflib.get_close_matches(name, known, n=1)
            hint = f" (did you mean {guess[0]}?)" if guess else ""
            raise UsageError(f"--format: no column {name!r}{hint}; columns: {','.join(known)}")
    if not names:
        raise UsageError("--format names no column")
    return names


def _json_row(row: Dict[str, Any], fields: Sequence[str]) -> str:
    return json.dumps({name: iso_time(row[name]) if name in _JSON_TIMES else row[name] for name in fields})


# --------------------------------------------------------------------------- filters

_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*([smhdw])\Z")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_when(text: str, what: str, now: Optional[float] = None) -> float:
    """A point in time: an ISO 8601 date or time (``2026-01-31``, ``2026-01-31T12:00``,
    with or without a zone; without one it is local time), or how long ago (``90m``, ``2h``,
    ``3d``, ``1w``)."""
    raw = text.strip().lower()
    match = _DURATION.match(raw)
    if match:
        return (time.time() if now is None else now) - float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
    try:
        value = _dt.datetime.fromisoformat(text.strip().replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise UsageError(f"{what} {text!r} is not a time like 2026-01-31, 2026-01-31T12:00 or 2h (ago)") from None
    return value.timestamp()


#: ``--state`` words beside the states themselves.
_STATE_GROUPS = {"active": "not ended yet", "ended": "ended"}


def _state_filter(text: str) -> Callable[[Dict[str, Any]], bool]:
    known = [state.value for state in JobState]
    wanted = set()
    for word in (w.strip().upper() for w in text.split(",") if w.strip()):
        if word in known or word.lower() in _STATE_GROUPS:
            wanted.add(word)
            continue
        guess = difflib.get_close_matches(word, known + [g.upper() for g in _STATE_GROUPS], n=1)
        hint = f" (did you mean {guess[0]}?)" if guess else ""
        raise UsageError(f"--state: no state {word!r}{hint}; states: {', '.join(known)}, or active, ended")

    def keep(row: Dict[str, Any]) -> bool:
        if row["state"] in wanted:
            return True
        ended = row["ended"] is not None
        return ("ENDED" in wanted and ended) or ("ACTIVE" in wanted and not ended)

    return keep


def _matches(value: str, patterns: Sequence[str]) -> bool:
    return any(fnmatch.fnmatchcase(value, pattern) for pattern in patterns)


def _queue_matches(queue: str, patterns: Sequence[str]) -> bool:
    """``local:default`` matches ``local:default``, ``default`` and patterns of either."""
    return _matches(queue, patterns) or _matches(queue.partition(":")[2] or queue, patterns)


def _filters(args: argparse.Namespace) -> List[Callable[[Dict[str, Any]], bool]]:
    chosen: List[Callable[[Dict[str, Any]], bool]] = []
    if args.state:
        chosen.append(_state_filter(args.state))
    if args.scheduler:
        names = [n.strip() for n in args.scheduler.split(",") if n.strip()]
        chosen.append(lambda row: row["scheduler"] in names)
    if args.queue:
        queues = [q.strip() for q in args.queue.split(",") if q.strip()]
        chosen.append(lambda row: _queue_matches(row["queue"], queues))
    if args.name:
        chosen.append(lambda row: _matches(row["name"], [args.name]))
    if args.since:
        since = parse_when(args.since, "--since")
        # in any state at or after that time: not ended before it (as sacct --starttime)
        chosen.append(lambda row: row["ended"] is None or row["ended"] >= since)
    if args.until:
        until = parse_when(args.until, "--until")
        chosen.append(lambda row: row["submitted"] <= until)
    return chosen


# --------------------------------------------------------------------------- the parsers


def build_parser(command: str) -> argparse.ArgumentParser:
    """The command line of ``proxy-agent COMMAND`` (one of :data:`COMMANDS`)."""
    parser = CommandParser(prog=f"proxy-agent {command}")
    parser.add_argument("--state-dir", metavar="DIR", default=configured_state_dir(default_state_dir()),
                        help="the agent's state directory (default: %(default)s, or the configuration file's)")
    if command == "jobs":
        parser.description = ("List the jobs the agent keeps, with or without an agent running. "
                              "Filters may be combined; each takes comma-separated values.")
        parser.add_argument("--json", action="store_true",
                            help="one JSON object per job (times in ISO 8601 with their zone)")
        parser.add_argument("--state", metavar="STATE[,...]",
                            help="only jobs in these states (QUEUING, RUNNING, FINISHED, FAILED, KILLED...), "
                            "or active (not ended) or ended")
        parser.add_argument("--scheduler", metavar="NAME[,...]", help="only jobs of these schedulers (local, slurm...)")
        parser.add_argument("--queue", metavar="QUEUE[,...]",
                            help="only jobs in these queues (NAME or SCHEDULER:NAME; * and ? match)")
        parser.add_argument("--name", metavar="PATTERN", help="only jobs whose name matches (* and ? match)")
        parser.add_argument("--since", metavar="WHEN",
                            help="only jobs not ended before WHEN: a date or time (2026-01-31, 2026-01-31T12:00) "
                            "or how long ago (90m, 2h, 3d, 1w)")
        parser.add_argument("--until", metavar="WHEN", help="only jobs submitted at or before WHEN")
        parser.add_argument("--format", metavar="COLUMN[,...]",
                            help=f"the columns to show, in order, comma-separated (default: {', '.join(DEFAULT_COLUMNS)}; "
                            f"available: {', '.join(COLUMNS)}; with --json the fields: {', '.join(ROW_FIELDS)})")
        parser.add_argument("--no-header", action="store_true", help="leave out the table's heading")
    elif command == "forget":
        parser.description = "Remove ended jobs from the agent's job list, with their kept output."
        parser.add_argument("jobs", nargs="*", metavar="JOB", help="job ids (as `proxy-agent jobs` shows them)")
        parser.add_argument("--ended-before", metavar="WHEN",
                            help="forget every job that ended before WHEN (2026-01-31, 2026-01-31T12:00, or 3d ago)")
    else:
        parser.description = ("Print a job's kept output: every line each process wrote, rank by rank, "
                              f"up to {history.LIMIT >> 20} MiB per job, whether or not a client saw it.")
        parser.add_argument("job", metavar="JOB", help="the job's id (as `proxy-agent jobs` shows it) or its name")
        parser.add_argument("--stderr", action="store_true", help="standard error instead of standard output")
        parser.add_argument("--rank", type=int, metavar="N", help="only process N (0 is the first)")
        parser.add_argument("--label", action="store_true", help="begin each line with its process's rank and ': '")
        parser.add_argument("-f", "--follow", action="store_true",
                            help="keep printing new lines until the job ends")
    return parser


# --------------------------------------------------------------------------- jobs


def _ask_service(state_dir: str, op: str, *, refused: bool = False, **fields: Any) -> Optional[Dict[str, Any]]:
    """The running service's answer to a request (None: no service with the interface runs,
    and the store is read or written as it is).  Its refusal is a StoreError, or with
    ``refused`` the interface's own Refused."""
    from .endpoints import lock_holder
    from .frontends.api.wire import Refused, ask, socket_path

    if lock_holder(state_dir) is None:
        return None
    try:
        return ask(socket_path(state_dir), op, **fields)
    except Refused as exc:
        if refused:
            raise
        raise StoreError(exc.message) from None
    except (OSError, ValueError):
        return None


def _rows(state_dir: str) -> List[Dict[str, Any]]:
    answer = _ask_service(state_dir, "jobs")
    if answer is None:
        return list_jobs(state_dir)
    import attrs

    from .service.statedir import job_row
    from .service.store import StoredJob

    names = {field.name for field in attrs.fields(StoredJob)}
    return [job_row(StoredJob(**{k: v for k, v in row.items() if k in names})) for row in answer["jobs"]]


def _list(args: argparse.Namespace) -> int:
    columns = _columns(args.format, args.json)
    chosen = _filters(args)
    rows = [row for row in _rows(args.state_dir) if all(keep(row) for keep in chosen)]
    if args.json:
        for row in rows:
            print(_json_row(row, columns))
        return 0
    table = [] if args.no_header else [tuple(COLUMNS[name][0] for name in columns)]
    table += [tuple(COLUMNS[name][1](row) for name in columns) for row in rows]
    if not table:
        return 0
    widths = [max(len(line[i]) for line in table) for i in range(len(columns))]
    for line in table:
        print("  ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip())
    return 0


# --------------------------------------------------------------------------- forget


def _forget(args: argparse.Namespace) -> int:
    if not args.jobs and not args.ended_before:
        print("proxy-agent forget: name jobs, or give --ended-before WHEN", file=sys.stderr)
        return 2
    keys = []
    for text in args.jobs:
        if not (text.isascii() and text.isdigit()):
            print(f"proxy-agent forget: {text!r} is not a job id", file=sys.stderr)
            return 2
        keys.append(int(text))
    when = parse_when(args.ended_before, "--ended-before") if args.ended_before else None
    answer = _ask_service(args.state_dir, "forget", jobs=keys, ended_before=when)
    if answer is None:
        outcome = forget_jobs(args.state_dir, keys, when)
    else:
        outcome = {"forgotten": list(answer["forgotten"]), "refused": list(answer["refused"])}
        outcome["missing"] = [k for k in keys if k not in outcome["forgotten"] and k not in outcome["refused"]]
    for key in outcome["refused"]:
        print(f"proxy-agent forget: job {key} has not ended; it is kept", file=sys.stderr)
    for key in outcome["missing"]:
        print(f"proxy-agent forget: no job {key} in the list", file=sys.stderr)
    count = len(outcome["forgotten"])
    print(f"forgot {count} job{'s' if count != 1 else ''}")
    return 1 if outcome["refused"] or outcome["missing"] else 0


# --------------------------------------------------------------------------- output

#: How often ``output --follow`` looks for new lines.
FOLLOW_INTERVAL = 0.5


def _job_key(state_dir: str, text: str) -> int:
    """A job named on the command line: its id, or a name only one job has."""
    if text.isascii() and text.isdigit():
        return int(text)
    named = [row["id"] for row in _rows(state_dir) if row["name"] == text]
    if len(named) == 1:
        return named[0]
    if not named:
        raise LookupError(f"no job {text!r} in the list (give its id, as `proxy-agent jobs` shows it)")
    raise LookupError(f"{len(named)} jobs are named {text!r} (ids {', '.join(map(str, named))}); give one id")


def _kept_output(state_dir: str, key: int, rank: Optional[int], stream: str,
                 seen: Dict[Tuple[int, str], int]) -> Dict[str, Any]:
    """A job's kept output after the lines ``seen``: from the running service (which first
    writes out what it holds), else from the state directory as it is."""
    from .frontends.api.wire import Refused

    try:
        answer = _ask_service(state_dir, "kept_output", refused=True, job=key, rank=rank, streams=[stream],
                              skip=[[r, s, n] for (r, s), n in seen.items()])
    except Refused as exc:
        if exc.kind == "NO_SUCH_JOB":
            raise LookupError(exc.message) from None
        raise StoreError(exc.message) from None
    if answer is None:
        return job_output(state_dir, key, rank=rank, streams=(stream,), skip=seen)
    return answer


def _output(args: argparse.Namespace) -> int:
    try:
        key = _job_key(args.state_dir, args.job)
    except LookupError as exc:
        print(f"proxy-agent output: {exc.args[0]}", file=sys.stderr)
        return 1
    stream = "stderr" if args.stderr else "stdout"
    seen: Dict[Tuple[int, str], int] = {}
    told: Dict[Tuple[int, str], int] = {}
    while True:
        try:
            found = _kept_output(args.state_dir, key, args.rank, stream, seen)
        except LookupError as exc:
            print(f"proxy-agent output: {exc.args[0]}", file=sys.stderr)
            return 1
        for part in found["streams"]:
            where = (part["rank"], part["stream"])
            prefix = f"{part['rank']}: " if args.label else ""
            if part["lines"]:
                sys.stdout.write("".join(f"{prefix}{line}\n" for line in part["lines"]))
            seen[where] = part["first"] + len(part["lines"])
            if part["dropped"] and told.get(where) != part["dropped"] and (found["ended"] or not args.follow):
                told[where] = part["dropped"]
                why = part["why_dropped"] or f"at most {history.LIMIT >> 20} MiB of output is kept per job"
                print(f"proxy-agent output: {part['dropped']} further lines process {part['rank']} wrote to {stream} "
                      f"were not kept ({why})", file=sys.stderr)
        sys.stdout.flush()
        if not args.follow or found["ended"]:
            return 0
        if not holder_of(args.state_dir):
            print(f"proxy-agent output: job {key} has not ended, and no agent runs on {args.state_dir} to keep "
                  "its output; start one to follow it", file=sys.stderr)
            return 1
        time.sleep(FOLLOW_INTERVAL)


# --------------------------------------------------------------------------- main

_RUN = {"jobs": _list, "forget": _forget, "output": _output}


def main(argv: List[str]) -> int:
    command, rest = argv[0], argv[1:]
    try:
        args = build_parser(command).parse_args(rest)
    except ConfigError as exc:
        print(f"proxy-agent {command}: {exc}", file=sys.stderr)
        return 2
    try:
        return _RUN[command](args)
    except UsageError as exc:
        print(f"proxy-agent {command}: {exc}", file=sys.stderr)
        return 2
    except StoreError as exc:
        print(f"proxy-agent {command}: {exc.message}", file=sys.stderr)
        return 2
    except sqlite3.Error as exc:  # found damaged while reading
        print(f"proxy-agent {command}: the job store in {args.state_dir} cannot be read: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
