"""``python -m agentbolt``: the command line."""

import sys

from agentbolt.cli import main

if __name__ == "__main__":
    sys.exit(main())
