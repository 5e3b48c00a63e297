"""Batch systems: the shared engine and one small module per system.

``script`` turns a job description into a batch script and a submit command line;
``records`` holds the neutral records every batch system's parsers produce.
"""

from .script import *  # noqa: F401,F403
from .script import __all__  # noqa: F401
