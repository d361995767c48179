"""``python -m agentbolt.verl``: see :func:`agentbolt.verl.entrypoint.main`."""

from agentbolt.verl.entrypoint import main

if __name__ == "__main__":
    main()
