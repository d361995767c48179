"""Train the number-guessing agent with Tinker: ``TinkerGRPO`` under ``agl.Trainer``.

Needs the Tinker SDK (``pip install 'agentbolt[tinker]'``) and ``TINKER_API_KEY``::

    python -m examples.tinker.train_guess_number --base-model Qwen/Qwen3-4B-Instruct-2507 --steps 20

Before anything starts, the command checks that the key is set and that the Tinker service (``$TINKER_BASE_URL``,
else the SDK's default address) answers within ``--connect-timeout`` seconds; otherwise it stops with exit code 2 and
says what it tried to reach. A key that is not a Tinker key (the SDK's start with ``tml-``) stops it the
same way. Without that check an unreachable service leaves the SDK retrying for minutes.
"""

from __future__ import annotations

import argparse
import os
from typing import List, Optional

import agentbolt as agl
from agentbolt.utils.server_launcher import pick_free_port
from examples.common.arguments import count, number
from examples.common.environment import CONFIGURATION_ERROR, PROBE_TIMEOUT, require_reachable, require_variables
from examples.tinker.bridge import TinkerGRPO, tinker_base_url
from examples.tinker.guess_number import guess_number_agent, make_tasks

TINKER_KEY_PREFIXES = ("tml-", "eyJ")
"""How the SDK's keys begin: account keys (``tml-``) and the JSON web tokens it also accepts."""


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m examples.tinker.train_guess_number", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--base-model", default="Qwen/Qwen3-4B-Instruct-2507")
    parser.add_argument("--steps", type=count(1), default=20)
    parser.add_argument("--group-size", type=count(2), default=8)
    parser.add_argument("--tasks-per-step", type=count(1), default=8)
    parser.add_argument("--learning-rate", type=number(above=0.0), default=4e-5)
    parser.add_argument("--lora-rank", type=count(1), default=32)
    parser.add_argument("--n-runners", type=count(1), default=8)
    parser.add_argument(
        "--connect-timeout",
        type=number(above=0.0),
        default=PROBE_TIMEOUT,
        help="seconds the Tinker service has to answer the start-up check (default: %(default)s)",
    )
    args = parser.parse_args(argv)
    require_variables(
        parser, ["TINKER_API_KEY"], needed_by="training on Tinker", hint="set it to the key of your Tinker account"
    )
    if not os.environ["TINKER_API_KEY"].startswith(TINKER_KEY_PREFIXES):
        parser.exit(
            CONFIGURATION_ERROR,
            "error: TINKER_API_KEY is not a Tinker key (Tinker's keys start with 'tml-'); "
            "copy the key from your Tinker account\n",
        )
    try:
        base_url = tinker_base_url()
    except ImportError as exc:
        parser.exit(CONFIGURATION_ERROR, f"error: {exc}\n")
    require_reachable(
        parser,
        f"{base_url}/api/v1/healthz",
        service="the Tinker service",
        configure="check the network (and HTTPS_PROXY), set TINKER_BASE_URL to the service's address, "
        "or allow it longer with --connect-timeout",
        timeout=args.connect_timeout,
    )
    agl.setup_logging("INFO")
    algorithm = TinkerGRPO(args.base_model, lora_rank=args.lora_rank, learning_rate=args.learning_rate,
                           group_size=args.group_size, tasks_per_step=args.tasks_per_step, n_steps=args.steps)  # fmt: skip
    trainer = agl.Trainer(algorithm=algorithm, n_runners=args.n_runners, port=pick_free_port("127.0.0.1"))
    trainer.fit(guess_number_agent, train_dataset=make_tasks(200, seed=0), val_dataset=make_tasks(50, seed=1))
    for entry in algorithm.history:
        print(entry)


if __name__ == "__main__":
    main()
