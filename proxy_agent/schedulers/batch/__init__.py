"""Batch systems: the shared engine, and one folder per system.

``engine`` polls, diffs and follows every batch system's jobs; ``records`` holds the neutral
records every system's parsers produce; ``script`` is the one job script renderer and the one
check of a job, with each system's row (its directives) in its folder.  ``slurm/``, ``sge/``
and ``pbs/`` each hold a system's commands, parsers, directives, state table and backend.
"""

from .script import *  # noqa: F401,F403
from .script import __all__  # noqa: F401
