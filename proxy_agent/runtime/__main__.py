"""``proxy-runtime``: the co-allocation runtime for shell scripts and programs in any language.

::

    proxy-runtime [--timeout SECONDS] [--json] COMMAND [ARGUMENTS]

    info                         what the agent knows of this process (JSON)
    barrier                      wait at the start barrier; prints PART-INDEX PARTS
    rank | size | part-index     this process's rank, its part's size, the part's index
    send RANK TAG                send standard input to process RANK of this part
    receive TAG                  write the oldest message tagged TAG to standard output
    structure                    (rank 0) the job's layout: this part's index, then one
                                 line per part: INDEX SIZE group|independent LABEL
    part-send PART TAG           (rank 0) send standard input to part PART's rank 0
    part-receive TAG             (rank 0) the oldest message from another part tagged TAG
    exchange TEXT                (rank 0) give TEXT; prints every group part's text, a line each
    register [--rank N] [--level L]   register standard input with the rendezvous; prints the rank
    forward                      let the agent pass this part's rendezvous up to level 2
    rendezvous [--level N] [--no-wait] [--items]
                                 write the level-N aggregate (the rendezvous format) to
                                 standard output; --items: each process's data, a line each

Exit status: 0 done; 1 the agent refused the request (the message says why) or it can
never complete; 2 usage error; 3 not a multi-part job's process (or the agent did not
accept its secret); 4 the agent could not be reached or failed; 5 the multi-part job
failed or was cancelled; 6 the timeout passed; 130 interrupted.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import List, NoReturn, Optional, Sequence

from ..cli import entry_point
from . import CoallocError, FormatError, Runtime, decode, flatten

EXIT_OK = 0
EXIT_REFUSED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"proxy-runtime: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="proxy-runtime",
        description="The co-allocation runtime for a multi-part job's processes.",
        epilog="Exit status: 0 done; 1 refused; 2 usage; 3 not a multi-part job's process; "
        "4 agent unreachable or failed; 5 the job failed or was cancelled; 6 timed out.",
    )
    parser.add_argument("--timeout", type=float, default=None, metavar="SECONDS", help="give up after this long")
    parser.add_argument("--json", action="store_true", help="print results as JSON")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    commands.required = True
    commands.add_parser("info", help="what the agent knows of this process")
    commands.add_parser("barrier", help="wait at the start barrier")
    commands.add_parser("rank", help="this process's rank within its part")
    commands.add_parser("size", help="how many processes the part has")
    commands.add_parser("part-index", help="this part's index in the job")
    send = commands.add_parser("send", help="send standard input to a process of this part")
    send.add_argument("rank", type=int)
    send.add_argument("tag")
    receive = commands.add_parser("receive", help="receive a message to standard output")
    receive.add_argument("tag")
    commands.add_parser("structure", help="the job's layout (rank 0)")
    part_send = commands.add_parser("part-send", help="send standard input to another part (rank 0)")
    part_send.add_argument("part", type=int)
    part_send.add_argument("tag")
    part_receive = commands.add_parser("part-receive", help="receive a message from another part (rank 0)")
    part_receive.add_argument("tag")
    exchange = commands.add_parser("exchange", help="exchange a text with every part (rank 0)")
    exchange.add_argument("text")
    register = commands.add_parser("register", help="register standard input with the rendezvous")
    register.add_argument("--rank", type=int, default=-1, help="the rendezvous rank (default -1: the next free one)")
    register.add_argument("--level", type=int, default=1, help="1: the part's rendezvous; 2: the job's")
    commands.add_parser("forward", help="let the agent register this part's rendezvous at level 2")
    rendezvous = commands.add_parser("rendezvous", help="wait for a rendezvous and write its aggregate")
    rendezvous.add_argument("--level", type=int, default=1)
    rendezvous.add_argument("--no-wait", action="store_true", help="exit 1 at once if it is not complete")
    rendezvous.add_argument("--items", action="store_true", help="each process's data on a line of its own")
    return parser


def _stdin() -> bytes:
    return sys.stdin.buffer.read()


def _out(text: str) -> None:
    sys.stdout.write(text + "\n")


def _run(args: argparse.Namespace) -> int:
    runtime = Runtime(timeout=args.timeout)
    command = args.command
    if command == "info":
        _out(json.dumps(runtime.info()))
    elif command == "barrier":
        passed = runtime.barrier()
        _out(json.dumps(passed._asdict()) if args.json else f"{passed.part_index} {passed.parts}")
    elif command == "rank":
        _out(str(runtime.rank()))
    elif command == "size":
        _out(str(runtime.size()))
    elif command == "part-index":
        _out(str(runtime.part_index()))
    elif command == "send":
        runtime.send(args.rank, args.tag, _stdin())
    elif command == "receive":
        _write_bytes(runtime.receive(args.tag))
    elif command == "structure":
        layout = runtime.structure()
        if args.json:
            _out(json.dumps({"part_index": layout.part_index, "parts": [part._asdict() for part in layout.parts]}))
        else:
            _out(str(layout.part_index))
            for part in layout.parts:
                group = "group" if part.in_group else "independent"
                _out(f"{part.index} {part.size} {group} {part.label or ''}".rstrip())
    elif command == "part-send":
        runtime.part_send(args.part, args.tag, _stdin())
    elif command == "part-receive":
        _write_bytes(runtime.part_receive(args.tag))
    elif command == "exchange":
        result = runtime.exchange(args.text)
        if args.json:
            _out(json.dumps(result._asdict()))
        else:
            for text in result.texts:
                _out(text)
    elif command == "register":
        _out(str(runtime.register(_stdin(), rank=args.rank, level=args.level)))
    elif command == "forward":
        runtime.forward()
    elif command == "rendezvous":
        if args.no_wait:
            data = runtime.subscribe(args.level).poll()
            if data is None:
                sys.stderr.write(f"proxy-runtime: the level-{args.level} rendezvous is not complete\n")
                return EXIT_REFUSED
        else:
            data = runtime.wait_rendezvous(args.level)
        if args.items:
            try:
                items = flatten(decode(data, args.level))
            except FormatError as error:
                sys.stderr.write(f"proxy-runtime: the aggregate is malformed: {error}\n")
                return EXIT_REFUSED
            for item in items:
                _write_bytes(item + b"\n")
        else:
            _write_bytes(data)
    return EXIT_OK


def _write_bytes(data: bytes) -> None:
    sys.stdout.flush()
    sys.stdout.buffer.write(data)
    sys.stdout.buffer.flush()


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return _run(args)
    except CoallocError as error:
        sys.stderr.write(f"proxy-runtime: {args.command}: {error}\n")
        return error.exit_code
    except (TypeError, ValueError) as error:
        sys.stderr.write(f"proxy-runtime: {args.command}: {error}\n")
        return EXIT_USAGE
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return EXIT_OK


@entry_point
def console_main(argv: Optional[List[str]] = None) -> int:
    """The ``proxy-runtime`` entry point."""
    return main(argv)


if __name__ == "__main__":
    sys.exit(console_main())
