"""A reader of command lines made only of options spelled out in full, filled the way an
argparse parser is (``add_argument``, groups) and giving the same namespace, without
importing argparse: a good share of start-up when nothing is compiled yet."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

__all__ = ["Namespace", "SimpleLine"]


class _Option:
    """One option as :class:`SimpleLine` reads it."""

    __slots__ = ("dest", "action", "default", "type", "choices", "group")

    def __init__(self, dest: str, action: Optional[str], default: Any, type: Any, choices: Any,
                 group: Optional[int]) -> None:
        self.dest, self.action, self.default, self.type = dest, action, default, type
        self.choices, self.group = choices, group


class SimpleLine:
    """Reads a command line made only of options spelled out in full, each value a separate
    word that does not begin with ``-`` (or given as ``--option=value``), the way argparse
    reads it, without importing argparse or building its parser (a good share of start-up
    when nothing is compiled yet).  It gives up (None) on anything else: help, the version, an
    abbreviation, options run together, a value of the wrong type or not among the choices,
    two options of one exclusive group, an option it does not know; argparse then reads the
    line, with its own messages."""

    def __init__(self) -> None:
        self._options: List[_Option] = []
        self._by_flag: Dict[str, _Option] = {}
        self._usable = True
        self._groups = 0

    # what the agent's option table and the backends' add_arguments call (argparse's names)
    def add_argument_group(self, *args: Any, **kwargs: Any) -> "SimpleLine":
        return self

    def add_mutually_exclusive_group(self, **kwargs: Any) -> "_Exclusive":
        self._groups += 1
        return _Exclusive(self, self._groups)

    def add_argument(self, *flags: str, **settings: Any) -> None:
        self._add(flags, settings, None)

    def _add(self, flags: Sequence[str], settings: Dict[str, Any], group: Optional[int]) -> None:
        settings = dict(settings)
        action = settings.pop("action", None)
        if action == "version":
            return  # not read here (and it sets no attribute)
        settings.pop("help", None)
        settings.pop("metavar", None)
        default, kind, choices, dest = (settings.pop(key, None) for key in ("default", "type", "choices", "dest"))
        if settings or action not in (None, "store", "store_true", "count"):
            self._usable = False  # nothing the agent's options use: left to argparse
            return
        if dest is None:
            longs = [flag for flag in flags if flag.startswith("--")]
            dest = (longs or list(flags))[0].lstrip("-").replace("-", "_")
        if action == "store_true" and default is None:
            default = False
        option = _Option(dest, action or "store", default, kind, choices, group)
        self._options.append(option)
        for flag in flags:
            self._by_flag[flag] = option

    def parse(self, argv: Sequence[str]) -> Optional[Any]:
        """The options of ``argv`` as argparse would have them, or None."""
        parsed = self.parse_given(argv)
        return None if parsed is None else parsed[0]

    def parse_given(self, argv: Sequence[str]) -> Optional[Tuple[Any, List[str]]]:
        """As :meth:`parse`, with the names (dests) of the options ``argv`` gives."""
        if not self._usable:
            return None
        values: Dict[str, Any] = {option.dest: option.default for option in self._options}
        given: List[_Option] = []
        in_group: Dict[int, _Option] = {}
        words = list(argv)
        i = 0
        while i < len(words):
            word = words[i]
            flag, equals, value = word.partition("=") if word.startswith("--") else (word, "", "")
            option = self._by_flag.get(flag)
            if option is None:
                return None
            if option.group is not None and in_group.setdefault(option.group, option) is not option:
                return None  # two of one exclusive group
            if option.action == "store":
                if not equals:
                    i += 1
                    if i >= len(words) or words[i].startswith("-"):
                        return None
                    value = words[i]
                try:
                    converted = value if option.type is None else option.type(value)
                except Exception:  # noqa: BLE001 - argparse says what is wrong
                    return None
                if option.choices is not None and converted not in option.choices:
                    return None
                values[option.dest] = converted
                given.append(option)
            elif equals:
                return None
            elif option.action == "store_true":
                values[option.dest] = True
                given.append(option)
            else:  # count
                values[option.dest] = (values[option.dest] or 0) + 1
                given.append(option)
            i += 1
        for option in self._options:
            # argparse converts a default given as text when the option was not given
            if option.action == "store" and isinstance(option.default, str) and option not in given:
                if option.type is not None:
                    try:
                        values[option.dest] = option.type(option.default)
                    except Exception:  # noqa: BLE001
                        return None
        return Namespace(**values), list(dict.fromkeys(option.dest for option in given))


class _Exclusive:
    """A mutually exclusive group of a :class:`SimpleLine`."""

    def __init__(self, line: SimpleLine, number: int) -> None:
        self._line, self._number = line, number

    def add_argument(self, *flags: str, **settings: Any) -> None:
        self._line._add(flags, settings, self._number)


class Namespace:
    """The options read by :class:`SimpleLine`: attributes, as argparse's namespace has them."""

    def __init__(self, **values: Any) -> None:
        self.__dict__.update(values)

    def __eq__(self, other: object) -> bool:
        return vars(self) == vars(other) if hasattr(other, "__dict__") else NotImplemented

    def __contains__(self, key: str) -> bool:
        return key in self.__dict__

    def __repr__(self) -> str:
        return "Namespace(" + ", ".join(f"{k}={v!r}" for k, v in self.__dict__.items()) + ")"
