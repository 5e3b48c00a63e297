"""Manual pages made from the command lines' own parsers: what ``--help`` says, in roff.

``proxy-agent --man`` and ``proxy-console --man`` print their pages; the options, their
arguments and their help texts (defaults included) come from the same argparse parsers as
``--help``, so the two cannot disagree.  Read one with ``man -l <(proxy-agent --man)``, or
install it with ``proxy-agent --man > ~/.local/share/man/man1/proxy-agent.1``.
"""

from __future__ import annotations

import argparse
import re
from typing import Iterable, List, Sequence, Tuple, Union

from . import __version__

__all__ = ["Section", "manual_page", "option_entries", "roff_text"]

#: A section of a page beyond the options: (heading, paragraphs); a paragraph is text (one
#: indented by four spaces is an example, kept line by line) or a (term, text) entry.
Section = Tuple[str, Sequence[Union[str, Tuple[str, str]]]]


def roff_text(text: str) -> str:
    """Text as roff prints it: backslashes and hyphens escaped, no line starting with a
    control character."""
    text = text.replace("\\", "\\e").replace("-", "\\-")
    return "\n".join("\\&" + line if line.startswith((".", "'")) else line for line in text.splitlines())


def option_entries(parser: argparse.ArgumentParser) -> List[Tuple[str, List[Tuple[str, str]]]]:
    """The parser's options as ``--help`` shows them, group by group: (title, [(invocation,
    help text with its default)])."""
    formatter = parser._get_formatter()
    groups = []
    for group in parser._action_groups:
        entries = []
        for action in group._group_actions:
            if action.help == argparse.SUPPRESS or isinstance(action, argparse._SubParsersAction):
                continue
            invocation = formatter._format_action_invocation(action)
            text = formatter._expand_help(action) if action.help else ""
            entries.append((invocation, " ".join(text.split())))
        if entries:
            groups.append((group.title or "options", entries))
    return groups


def _options_roff(parser: argparse.ArgumentParser, level: str) -> List[str]:
    lines = []
    for title, entries in option_entries(parser):
        lines.append(f'{level} "{roff_text(title)}"')
        for invocation, text in entries:
            lines.extend(_entry(invocation, text))
    return lines


def _entry(invocation: str, text: str) -> List[str]:
    return [".TP", f"\\fB{roff_text(invocation)}\\fR"] + ([roff_text(text)] if text else [])


def _paragraphs(paragraphs: Iterable[Union[str, Tuple[str, str]]]) -> List[str]:
    lines = []
    for paragraph in paragraphs:
        if isinstance(paragraph, tuple):
            lines.extend(_entry(*paragraph))
            continue
        lines.append(".PP")
        if paragraph.startswith("    "):  # an example, kept as written
            lines.extend([".nf", roff_text("\n".join(l[4:] for l in paragraph.splitlines())), ".fi"])
        else:
            lines.append(roff_text(" ".join(paragraph.split())))
    return lines


def manual_page(name: str, summary: str, parser: argparse.ArgumentParser,
                commands: Sequence[Tuple[str, argparse.ArgumentParser]] = (),
                sections: Sequence[Section] = ()) -> str:
    """The page of program ``name``: its parser's usage, description and options, then each
    of ``commands`` (``(name, parser)`` of ``NAME COMMAND``) the same way, then ``sections``."""
    lines = [
        f'.TH "{name.upper()}" 1 "" "{name} {__version__}" "User Commands"',
        ".SH NAME",
        f"{roff_text(name)} \\- {roff_text(summary)}",
        ".SH SYNOPSIS",
        ".nf",
    ]
    for usage in [parser.format_usage()] + [command.format_usage() for _, command in commands]:
        lines.append(roff_text(re.sub(r"\n\s+", "\n    ", re.sub(r"^usage: ", "", usage.strip()))))
    lines.append(".fi")
    if parser.description:
        lines += [".SH DESCRIPTION"] + _paragraphs([parser.description])
    lines += [".SH OPTIONS"] + _options_roff(parser, ".SS")
    if commands:
        lines.append(".SH COMMANDS")
        for command_name, command in commands:
            lines.append(f'.SS "{roff_text(command_name)}"')
            if command.description:
                lines += _paragraphs([command.description])
            for title, entries in option_entries(command):
                for invocation, text in entries:
                    lines.extend(_entry(invocation, text))
    for heading, paragraphs in sections:
        lines += [f'.SH "{roff_text(heading.upper())}"'] + _paragraphs(paragraphs)
    return "\n".join(lines) + "\n"
