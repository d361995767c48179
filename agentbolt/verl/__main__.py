"""``python -m agentbolt.verl``: see :func:`agentbolt.verl.entrypoint.main`."""

import sys

from agentbolt.verl import require_verl

if __name__ == "__main__":
    try:
        require_verl("python -m agentbolt.verl")
    except ImportError as exc:
        sys.exit(f"agentbolt.verl: error: {exc}")
    from agentbolt.verl.entrypoint import main

    main()
