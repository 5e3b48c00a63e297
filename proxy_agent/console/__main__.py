"""``python -m proxy_agent.console``."""

import sys

from . import main

sys.exit(main())
