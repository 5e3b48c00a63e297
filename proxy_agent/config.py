"""The configuration file: defaults for the agent's command line, kept in one place.

``$XDG_CONFIG_HOME/proxy-agent/config.ini`` (``~/.config/proxy-agent/config.ini`` when
``XDG_CONFIG_HOME`` is not set), or the file ``PROXY_AGENT_CONFIG`` names (set it empty for
none).  INI, as :mod:`configparser` reads it on every Python the agent runs on::

    [agent]
    scheduler = slurm,local
    state-dir = ~/work/agent-state
    keep-ended = 7d
    broker = FastestQueue

    [slurm]
    poll-interval = 10

    [local]
    kill-grace = 5

A key of ``[agent]`` is an option of ``proxy-agent`` without its dashes; a key of a section
named after a scheduler is that scheduler's option without its prefix (``[slurm]
poll-interval`` is ``--slurm-poll-interval``).  A flag takes ``yes`` or ``no``.  What is
chosen on the command line wins over the file, and the file over the built-in defaults;
the transport (``--stdio``, ``--listen``...) is chosen on the command line only.  The file's
``state-dir`` is also where ``proxy-agent jobs``, ``forget`` and ``output`` and the Invoke
Server look, unless they are given ``--state-dir``.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, List, Optional, Sequence

if TYPE_CHECKING:  # configparser is imported when there is a file to read
    import configparser

__all__ = ["ENVIRONMENT", "FILE_NAME", "ConfigError", "config_arguments", "config_path", "state_dir"]

#: The file's name in the configuration directory.
FILE_NAME = "config.ini"
#: The environment variable naming another file (empty: no file at all).
ENVIRONMENT = "PROXY_AGENT_CONFIG"
#: The section of the agent's own options.
AGENT_SECTION = "agent"
#: Options that are not defaults to keep: the transport, and what only makes sense once.
_NOT_IN_THE_FILE = frozenset({"stdio", "connect", "listen", "unix", "proxy", "host", "port", "debug", "help",
                              "version"})
_TRUE = frozenset({"yes", "true", "on", "1"})
_FALSE = frozenset({"no", "false", "off", "0"})


class ConfigError(ValueError):
    """The configuration file cannot be used; the text says where and why, in one line."""


def config_path() -> Optional[str]:
    """The configuration file to read (None: none is to be read)."""
    named = os.environ.get(ENVIRONMENT)
    if named is not None:
        return os.path.expanduser(named) if named.strip() else None
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return os.path.join(base, "proxy-agent", FILE_NAME)


def _read(path: Optional[str]) -> "Optional[configparser.ConfigParser]":
    if path is None or not os.path.exists(path):
        return None
    import configparser

    parser = configparser.ConfigParser(interpolation=None)
    try:
        with open(path, encoding="utf-8") as handle:
            parser.read_file(handle)
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read the configuration file {path}: {getattr(exc, 'strerror', None) or exc}") from None
    except configparser.Error as exc:
        first = str(exc).strip().splitlines()[0]
        raise ConfigError(f"the configuration file {path} is not INI: {first}") from None
    return parser


def _options(parser: Any) -> dict:
    """Long option name without dashes -> its argparse action."""
    found = {}
    for action in parser._actions:
        for flag in action.option_strings:
            if flag.startswith("--"):
                found[flag[2:]] = action
    return found


def config_arguments(parser: Any, backends: Sequence[str], path: Optional[str] = None) -> List[str]:
    """The command-line words the configuration file stands for (``[]`` without one), to go
    before the real command line so that the real one wins.  ``parser`` is the agent's full
    argparse parser (every backend's options), ``backends`` the schedulers' names (the other
    sections).  :class:`ConfigError` for a key no option has or a value it does not take."""
    path = config_path() if path is None else path
    config = _read(path)
    if config is None:
        return []
    options = _options(parser)
    words: List[str] = []
    for section in config.sections():
        for key, value in config.items(section):
            option = key if section == AGENT_SECTION else f"{section}-{key}"
            where = f"{path}: [{section}] {key}"
            if section != AGENT_SECTION and section not in backends:
                raise ConfigError(f"{path}: [{section}]: no such section (use [{AGENT_SECTION}] or a scheduler's name)")
            action = options.get(option)
            if action is None or option in _NOT_IN_THE_FILE:
                known = [name if section == AGENT_SECTION else name[len(section) + 1:] for name in options
                         if (section == AGENT_SECTION or name.startswith(section + "-")) and name not in _NOT_IN_THE_FILE]
                import difflib

                guess = difflib.get_close_matches(key, known, n=1)
                hint = f" (did you mean {guess[0]}?)" if guess else ""
                what = "is chosen on the command line only" if option in _NOT_IN_THE_FILE else "is no option"
                raise ConfigError(f"{where} {what}{hint}")
            words.extend(_words(action, f"--{option}", value.strip(), where))
    return words


def _words(action: Any, flag: str, value: str, where: str) -> List[str]:
    kind = type(action).__name__
    if kind in ("_StoreTrueAction", "_StoreFalseAction"):
        lowered = value.lower()
        if lowered not in _TRUE | _FALSE:
            raise ConfigError(f"{where} = {value!r}: a flag is yes or no")
        wanted = lowered in _TRUE if kind == "_StoreTrueAction" else lowered in _FALSE
        return [flag] if wanted else []
    if kind == "_CountAction":
        if not value.isdigit():
            raise ConfigError(f"{where} = {value!r}: expected a number")
        return [flag] * int(value)
    if not value:
        raise ConfigError(f"{where}: no value")
    if (action.metavar or "") in ("DIR", "PATH", "FILE"):
        value = os.path.expanduser(os.path.expandvars(value))
    return [f"{flag}={value}"]


def state_dir(default: str) -> str:
    """The state directory the configuration file names (``[agent] state-dir``), else
    ``default``.  :class:`ConfigError` when the file cannot be read."""
    path = config_path()
    config = _read(path)
    if config is None or not config.has_option(AGENT_SECTION, "state-dir"):
        return default
    value = config.get(AGENT_SECTION, "state-dir").strip()
    return os.path.expanduser(os.path.expandvars(value)) if value else default
