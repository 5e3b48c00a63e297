"""Shell completion for ``proxy-agent`` and ``proxy-console``, made from their parsers.

``proxy-agent completion bash`` (or ``zsh``) prints the script for both programs;
``proxy-agent completion --install`` writes them where bash-completion and zsh look for them
in the user's home (``$XDG_DATA_HOME``, that is ``~/.local/share``): the one command to
install them.  Options, their values (choices, scheduler names, directories and files) and
the job ids ``forget`` and ``output`` take (from ``proxy-agent jobs``) are completed.

``proxy-agent --man`` (:func:`manual`) is made here too, from the same parsers: every parser of
the agent's commands is gathered in this module, above the modules that define them.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Dict, List, Optional, Sequence, Union

import attrs

__all__ = ["Program", "bash_script", "install", "manual", "zsh_script"]

#: What an option's value is completed from: words, or a kind of path.
Values = Union[Sequence[str], str, None]
DIRECTORY, FILE, COMMAND, JOB = "dir", "file", "command", "job"


@attrs.frozen
class Program:
    """A program's command line as completion sees it."""

    name: str
    parser: argparse.ArgumentParser
    #: its commands (``proxy-agent jobs``): name -> parser
    commands: Dict[str, argparse.ArgumentParser] = attrs.field(factory=dict)
    #: values of options the parser does not say (``--scheduler`` -> the schedulers' names)
    hints: Dict[str, Values] = attrs.field(factory=dict)
    #: what the words that are not options are, per command ("" for the program itself)
    arguments: Dict[str, Values] = attrs.field(factory=dict)
    #: an option after which every word is another program's command line
    rest: Optional[str] = None


def _values(action: argparse.Action, hints: Dict[str, Values]) -> Values:
    for flag in action.option_strings:
        if flag in hints:
            return hints[flag]
    if action.choices:
        return [str(choice) for choice in action.choices]
    metavar = str(action.metavar or "")
    if metavar == "DIR" or action.dest.endswith("_dir"):
        return DIRECTORY
    if metavar in ("FILE", "PATH", "LOGFILE") or action.dest.endswith(("_file", "_path")):
        return FILE
    return None


def _options(parser: argparse.ArgumentParser, hints: Dict[str, Values]):
    """(every option string, {option taking a value: what its value is})."""
    flags: List[str] = []
    takes: Dict[str, Values] = {}
    for action in parser._actions:
        if action.help == argparse.SUPPRESS:
            continue
        flags.extend(action.option_strings)
        if action.option_strings and action.nargs != 0:
            for flag in action.option_strings:
                takes[flag] = _values(action, hints)
    return flags, takes


def _function(name: str) -> str:
    return "_" + name.replace("-", "_")


def _bash_words(values: Values, program: str) -> str:
    """The COMPREPLY line completing ``$cur`` from ``values``."""
    if values == DIRECTORY:
        return 'COMPREPLY=($(compgen -d -- "$cur"))'
    if values == FILE:
        return 'COMPREPLY=($(compgen -f -- "$cur"))'
    if values == COMMAND:
        return 'COMPREPLY=($(compgen -c -- "$cur"))'
    if values == JOB:
        return (f'COMPREPLY=($(compgen -W "$({program} jobs --format id --no-header $state_dir 2>/dev/null)" '
                '-- "$cur"))')
    if values:
        return f'COMPREPLY=($(compgen -W "{" ".join(values)}" -- "$cur"))'
    return "COMPREPLY=()"


def bash_script(programs: Sequence[Program]) -> str:
    """A bash script completing each program (``complete -F``); bash-completion's helpers are
    used when loaded, plain bash otherwise."""
    parts = ["# bash completion for " + " and ".join(p.name for p in programs)
             + " (made by `proxy-agent completion bash`)"]
    for program in programs:
        commands = {"": program.parser, **program.commands}
        lines = [
            f"{_function(program.name)}() {{",
            '    local cur="${COMP_WORDS[COMP_CWORD]}" prev="${COMP_WORDS[COMP_CWORD-1]}" command="" state_dir="" i',
            "    for ((i = 1; i < COMP_CWORD; i++)); do",
            '        case "${COMP_WORDS[i]}" in',
        ]
        if program.rest:
            lines.append(f'            {program.rest}) if ((i == COMP_CWORD - 1)); then COMPREPLY=($(compgen -c -- "$cur")); '
                         'else COMPREPLY=($(compgen -f -- "$cur")); fi; return;;')
        lines.append('            --state-dir) state_dir="--state-dir ${COMP_WORDS[i+1]}";;')
        if program.commands:
            names = "|".join(program.commands)
            lines.append(f'            {names}) [ -z "$command" ] && command="${{COMP_WORDS[i]}}";;')
        lines += ["        esac", "    done", '    case "$command" in']
        for command, parser in commands.items():
            flags, takes = _options(parser, program.hints)
            if program.rest and not command:
                flags.append(program.rest)
            lines.append(f'        "{command}")')
            lines.append('            case "$prev" in')
            for flag, values in sorted(takes.items()):
                lines.append(f"                {flag}) {_bash_words(values, program.name)}; return;;")
            lines.append("            esac")
            lines.append('            if [[ "$cur" == -* ]]; then')
            lines.append(f'                COMPREPLY=($(compgen -W "{" ".join(flags)}" -- "$cur")); return')
            lines.append("            fi")
            arguments = program.arguments.get(command)
            if command == "" and program.commands:
                arguments = list(program.commands)
            if arguments:
                lines.append(f"            {_bash_words(arguments, program.name)};;")
            else:
                lines.append("            COMPREPLY=();;")
        lines += ["    esac", "}", f"complete -o default -F {_function(program.name)} {program.name}"]
        parts.append("\n".join(lines))
    return "\n\n".join(parts) + "\n"


# --------------------------------------------------------------------------- zsh


def _zsh_quote(text: str) -> str:
    return text.replace("\\", "\\\\").replace("'", "'\\''").replace("[", "\\[").replace("]", "\\]").replace(":", "\\:")


def _zsh_action(values: Values, program: str) -> str:
    if values == DIRECTORY:
        return "_files -/"
    if values == FILE:
        return "_files"
    if values == COMMAND:
        return "_command_names -e"
    if values == JOB:
        return f"{{compadd -- $({program} jobs --format id --no-header 2>/dev/null)}}"
    if values:
        return "(" + " ".join(values) + ")"
    return " "


def _zsh_specs(parser: argparse.ArgumentParser, program: Program) -> List[str]:
    specs = []
    for action in parser._actions:
        if action.help == argparse.SUPPRESS or not action.option_strings:
            continue
        text = _zsh_quote(" ".join((action.help or "").split()).replace("%(default)s", str(action.default))[:120])
        values = _values(action, program.hints)
        for flag in action.option_strings:
            if action.nargs == 0:
                specs.append(f"'{flag}[{text}]'")
            else:
                metavar = _zsh_quote(str(action.metavar or action.dest.upper()))
                specs.append(f"'{flag}[{text}]:{metavar}:{_zsh_action(values, program.name)}'")
    return specs


def zsh_script(program: Program) -> str:
    """A zsh completion function for one program (the ``_NAME`` file of ``fpath``)."""
    name = program.name
    lines = [f"#compdef {name}", f"# zsh completion for {name} (made by `proxy-agent completion zsh`)", ""]
    specs = _zsh_specs(program.parser, program)
    function = _function(name)
    lines.append(f"{function}() {{")
    if program.rest:
        lines.append(f"  local rest=${{words[(i){program.rest}]}}")
        lines.append("  if (( rest < CURRENT )); then")
        lines.append("    shift $rest words; (( CURRENT -= rest )); _normal; return")
        lines.append("  fi")
    if program.commands:
        lines.append("  local curcontext=$curcontext state line")
        lines.append("  _arguments -C \\")
        for spec in specs:
            lines.append(f"    {spec} \\")
        lines.append(f"    '1:command:({' '.join(program.commands)})' \\")
        lines.append("    '*::argument:->command'")
        lines.append('  case $state in')
        lines.append("    command)")
        lines.append("      case $words[1] in")
        for command, parser in program.commands.items():
            lines.append(f"        {command})")
            lines.append("          _arguments \\")
            for spec in _zsh_specs(parser, program):
                lines.append(f"            {spec} \\")
            arguments = program.arguments.get(command)
            lines.append(f"            '*:argument:{_zsh_action(arguments, name)}' ;;" if arguments
                         else "            '*: :' ;;")
        lines += ["      esac;;", "  esac"]
    else:
        lines.append("  _arguments \\")
        for spec in specs:
            lines.append(f"    {spec} \\")
        lines.append("    '*: :'")
    lines += ["}", "", f'{function} "$@"', ""]
    return "\n".join(lines)


# --------------------------------------------------------------------------- installing


def data_home() -> str:
    return os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")


def install(programs: Sequence[Program]) -> List[str]:
    """Write the completion of every program for bash (bash-completion's per-user directory)
    and zsh (a directory to put on ``fpath``); returns the files written."""
    base = data_home()
    bash_dir = os.path.join(base, "bash-completion", "completions")
    zsh_dir = os.path.join(base, "zsh", "site-functions")
    written = []
    script = bash_script(programs)
    for program in programs:
        written.append(_write(os.path.join(bash_dir, program.name), script))
        written.append(_write(os.path.join(zsh_dir, f"_{program.name}"), zsh_script(program)))
    return written


def _write(path: str, text: str) -> str:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    temporary = path + ".new"
    with open(temporary, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.replace(temporary, path)
    return path


# --------------------------------------------------------------------------- the two programs


def command_parser() -> argparse.ArgumentParser:
    """``proxy-agent completion``'s own command line."""
    from .joblist import CommandParser

    parser = CommandParser(prog="proxy-agent completion",
                     description="Print the shell completion of proxy-agent and proxy-console, or install it for "
                     "bash and zsh in your home (--install).")
    parser.add_argument("shell", nargs="?", choices=("bash", "zsh"), help="the shell to print the completion for")
    parser.add_argument("--install", action="store_true",
                        help="write both shells' completion under $XDG_DATA_HOME (~/.local/share), where "
                        "bash-completion and (with that directory on fpath) zsh find it")
    return parser


def programs() -> List[Program]:
    """``proxy-agent`` (with its commands) and ``proxy-console``, as their parsers have them."""
    from . import joblist
    from .__main__ import build_parser as agent_parser
    from .console import build_parser as console_parser
    from .console.deploy import build_parser as deploy_parser
    from .schedulers.registry import BACKENDS
    from .service.broker_names import BUILT_IN_BROKERS
    from .service.jobs import JobState

    commands = {name: joblist.build_parser(name) for name in joblist.COMMANDS}
    from .launch import stop_parser

    commands["stop"] = stop_parser()
    commands["completion"] = command_parser()
    hints: Dict[str, Values] = {
        "--scheduler": list(BACKENDS),
        "--broker": list(BUILT_IN_BROKERS),
        "--state": [state.value for state in JobState] + ["active", "ended"],
        "--format": list(joblist.COLUMNS),
    }
    agent = Program("proxy-agent", agent_parser(), commands, hints,
                    arguments={"forget": JOB, "output": JOB, "completion": ["bash", "zsh"]})
    console = Program("proxy-console", console_parser(), {"deploy": deploy_parser()}, rest="--spawn")
    return [agent, console]


def main(argv: Sequence[str]) -> int:
    """``proxy-agent completion [bash|zsh] [--install]``."""
    args = command_parser().parse_args(list(argv))
    chosen = programs()
    if args.install:
        written = install(chosen)
        for path in written:
            print(f"wrote {path}")
        zsh_dir = os.path.dirname(next(p for p in written if os.path.basename(p).startswith("_")))
        print(f"bash: bash-completion loads these by itself (open a new shell); zsh: put "
              f"'fpath=({zsh_dir} $fpath)' before 'compinit' in ~/.zshrc")
        return 0
    if args.shell is None:
        print("proxy-agent completion: name a shell (bash or zsh), or give --install", file=sys.stderr)
        return 2
    if args.shell == "bash":
        sys.stdout.write(bash_script(chosen))
    else:
        sys.stdout.write("\n".join(zsh_script(program) for program in chosen))
    return 0


def manual() -> str:
    """``proxy-agent --man``: the manual page, made from the same parsers as ``--help``."""
    from . import config, joblist
    from .__main__ import build_parser
    from .manpage import manual_page

    commands = [(f"proxy-agent {name}", joblist.build_parser(name)) for name in joblist.COMMANDS]
    from .launch import stop_parser

    commands.append(("proxy-agent stop", stop_parser()))
    commands.append(("proxy-agent completion", command_parser()))
    return manual_page("proxy-agent", "a resource-manager proxy agent", build_parser(), commands, [
        ("configuration file", [
            f"Defaults for the options are read from $XDG_CONFIG_HOME/proxy-agent/{config.FILE_NAME} "
            f"(~/.config/proxy-agent/{config.FILE_NAME}), or from the file ${config.ENVIRONMENT} names (empty: "
            "none). It is INI: the [agent] section holds options of proxy-agent without their dashes, a section "
            "named after a scheduler that scheduler's options without their prefix; a flag takes yes or no. "
            "An option given on the command line wins over the file, and the file over the built-in default. "
            "The transport is chosen on the command line only. The file's state-dir is also the one proxy-agent "
            "jobs, forget and output read.",
            "    [agent]\n    scheduler = slurm,local\n    keep-ended = 7d\n\n    [slurm]\n    poll-interval = 10",
        ]),
        ("files", [
            "The state directory ($XDG_STATE_HOME/proxy-agent, that is ~/.local/state/proxy-agent) holds the job "
            "store (jobs.sqlite), the lock of the agent using it (agent.lock), its socket (agent.sock), each "
            "job's kept output (output/ID/) and the local jobs' keeper (local/). Everything in it is the user's "
            "alone (mode 0600, directories 0700).",
        ]),
        ("exit status", [
            "0 when the agent ended normally; 2 for a wrong option, an unusable configuration file, a state "
            "directory another agent holds, or a connection that cannot be made. proxy-agent jobs, forget and "
            "output: 0 done, 1 a job named is not known (or, for forget, has not ended), 2 a wrong option or no "
            "job store. A program whose output is closed before it has written everything (a pipe into head) "
            "ends with 141, as one killed by SIGPIPE.",
        ]),
        ("see also", ["proxy-console(1); the project's README.md, docs/ and spec/protocol.md."]),
    ])
