"""A batch backend's options: the settings (:class:`BatchOptions`) and their command line
(``--NAME-poll-interval``, ``--NAME-commands``, ``--NAME-definitions-interval``...)."""


import os
from typing import ClassVar, Optional

import attrs


#: Seconds between two polls unless ``--NAME-poll-interval`` says otherwise.
DEFAULT_POLL_INTERVAL = 15.0
#: the share of one core an agent's idle polls take at most when the poll interval is the
#: default one (a big listing is then polled less often)
DEFAULT_CPU_BUDGET = 0.008
#: seconds between two readings of the queues' definitions beyond their listing (at most)
DEFAULT_DEFINITIONS_INTERVAL = 300.0


@attrs.frozen
class BatchOptions:
    #: seconds between two polls
    poll_interval: float = DEFAULT_POLL_INTERVAL
    #: seconds between two readings of the queues' definitions beyond their listing
    definitions_interval: float = DEFAULT_DEFINITIONS_INTERVAL
    #: the directory of the system's commands (None: found on PATH)
    commands_dir: Optional[str] = None
    #: the share of one core idle polling may take (None: no limit; see the engine)
    cpu_budget: Optional[float] = None


class BatchCommandLine:
    """The command line of a batch backend: its options, from its arguments."""


    @classmethod
    def add_arguments(cls, parser) -> None:
        group = parser.add_argument_group(f"{cls.summary.split(' (')[0]} ({cls.name})")
        group.add_argument(f"--{cls.name}-poll-interval", dest=f"{cls.name}_poll_interval", type=float,
                           default=None, metavar="SECONDS", help=cls.poll_interval_help())
        cls.add_definitions_argument(group)
        cls.add_commands_argument(group)
        cls.add_more_arguments(group)

    @classmethod
    def add_commands_argument(cls, group) -> None:
        group.add_argument(f"--{cls.name}-commands", dest=f"{cls.name}_commands", metavar="DIR",
                           help="the directory of the scheduler's commands (default: found on PATH; for a host "
                                "where another batch system's commands of the same names come first)")

    #: seconds between two polls unless an option says otherwise
    default_poll_interval: ClassVar[float] = DEFAULT_POLL_INTERVAL

    @classmethod
    def poll_interval_help(cls) -> str:
        return (f"seconds between two polls of the scheduler (default: {cls.default_poll_interval}); without "
                f"this option, idle polls of a long listing are spaced to take at most "
                f"{DEFAULT_CPU_BUDGET * 100:g} %% of a core")

    @classmethod
    def add_definitions_argument(cls, group) -> None:
        group.add_argument(f"--{cls.name}-definitions-interval", dest=f"{cls.name}_definitions_interval", type=float,
                           default=DEFAULT_DEFINITIONS_INTERVAL, metavar="SECONDS",
                           help="seconds between two readings of the queues' definitions (limits) beyond what "
                                "every poll lists, at most 300 (default: %(default)s)")

    @classmethod
    def add_more_arguments(cls, group) -> None:
        """Options of the batch system beyond the poll interval."""

    @classmethod
    def options_from_args(cls, args) -> BatchOptions:
        interval = getattr(args, f"{cls.name}_poll_interval", None)
        budget = DEFAULT_CPU_BUDGET if interval is None else None
        if interval is None:
            interval = cls.default_poll_interval
        if not 0.1 <= interval <= 3600:
            raise ValueError(f"--{cls.name}-poll-interval must be between 0.1 and 3600 seconds, got {interval:g}")
        definitions = getattr(args, f"{cls.name}_definitions_interval", DEFAULT_DEFINITIONS_INTERVAL)
        if not 0.1 <= definitions <= 300:
            raise ValueError(f"--{cls.name}-definitions-interval must be between 0.1 and 300 seconds, "
                             f"got {definitions:g}")
        commands = getattr(args, f"{cls.name}_commands", None)
        if commands is not None and not os.path.isdir(commands):
            raise ValueError(f"--{cls.name}-commands {commands}: no such directory")
        return BatchOptions(poll_interval=interval, definitions_interval=definitions,
                            commands_dir=os.path.abspath(commands) if commands else None, cpu_budget=budget)

    @classmethod
    def default_options(cls) -> BatchOptions:
        return BatchOptions()

