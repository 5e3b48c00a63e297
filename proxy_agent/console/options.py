"""The console's command-line manners, shared by ``proxy-console`` and its ``deploy``: a usage
error in one line, defaults shown in the help, and the ssh options."""

from __future__ import annotations

import argparse
from typing import NoReturn

__all__ = ["HelpFormatter", "Parser", "add_ssh_options", "port_number"]


class Parser(argparse.ArgumentParser):
    """A usage error is one line on stderr and exit status 2, without the usage block."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Epilog kept as written; every option that has a default value shows it."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if "default" in text or action.option_strings == [] or default in (None, False, [], argparse.SUPPRESS):
            return text
        return f"{text} (default: %(default)s)"


def port_number(text: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise argparse.ArgumentTypeError(f"expected a port number (1-65535), got {text!r}")
    return int(text)


def add_ssh_options(parser: argparse.ArgumentParser) -> None:
    """The options saying how to reach a machine with ssh (the console's and ``deploy``'s)."""
    parser.add_argument("--ssh-config", metavar="FILE", help="ssh configuration file (ssh -F), for ssh and scp")
    parser.add_argument("--ssh-port", type=port_number, metavar="PORT", help="ssh port (default: ssh's own choice, usually 22)")
    parser.add_argument(
        "--ssh-option", action="append", default=[], metavar="OPTION",
        help="an ssh option such as IdentityFile=~/.ssh/cluster (ssh -o); repeatable",
    )
