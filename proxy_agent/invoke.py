"""``python -m proxy_agent.invoke``: the Ninf-G Invoke Server (see ``proxy_agent.frontends.invoke``)."""

import sys

from .frontends.invoke.__main__ import main

if __name__ == "__main__":
    sys.exit(main())
