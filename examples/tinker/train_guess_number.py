"""Train the number-guessing agent with Tinker: ``TinkerGRPO`` under ``agl.Trainer``.

Needs the Tinker SDK (``pip install 'agentbolt[tinker]'``) and ``TINKER_API_KEY``::

    python -m examples.tinker.train_guess_number --base-model Qwen/Qwen3-4B-Instruct-2507 --steps 20
"""

from __future__ import annotations

import argparse
import os
from typing import List, Optional

import agentbolt as agl
from agentbolt.utils.server_launcher import pick_free_port
from examples.tinker.bridge import TinkerGRPO
from examples.tinker.guess_number import guess_number_agent, make_tasks


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m examples.tinker.train_guess_number", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--base-model", default="Qwen/Qwen3-4B-Instruct-2507")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--tasks-per-step", type=int, default=8)
    parser.add_argument("--learning-rate", type=float, default=4e-5)
    parser.add_argument("--lora-rank", type=int, default=32)
    parser.add_argument("--n-runners", type=int, default=8)
    args = parser.parse_args(argv)
    if not os.environ.get("TINKER_API_KEY"):
        parser.exit(2, "error: set TINKER_API_KEY (the key of your Tinker account)\n")
    agl.setup_logging("INFO")
    algorithm = TinkerGRPO(args.base_model, lora_rank=args.lora_rank, learning_rate=args.learning_rate,
                           group_size=args.group_size, tasks_per_step=args.tasks_per_step, n_steps=args.steps)  # fmt: skip
    trainer = agl.Trainer(algorithm=algorithm, n_runners=args.n_runners, port=pick_free_port("127.0.0.1"))
    trainer.fit(guess_number_agent, train_dataset=make_tasks(200, seed=0), val_dataset=make_tasks(50, seed=1))
    for entry in algorithm.history:
        print(entry)


if __name__ == "__main__":
    main()
