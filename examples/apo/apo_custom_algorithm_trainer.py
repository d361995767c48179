"""Run the custom algorithm of ``apo_custom_algorithm.py`` and its runners under one Trainer (one command).

Usage::

    python -m examples.apo.apo_custom_algorithm_trainer              # every candidate on all 24 validation tasks
    python -m examples.apo.apo_custom_algorithm_trainer --tasks 4    # a quick look: the first 4 only
"""

from __future__ import annotations

import argparse
import contextlib
import os
from typing import Optional, Sequence

import agentbolt as agl
from agentbolt.utils.server_launcher import pick_free_port
from examples.apo.apo_custom_algorithm import pick_best_prompt, setup_logging
from examples.apo.room_selector import load_room_tasks, prompt_template_baseline, room_selector
from examples.apo.room_selector_apo import EMBEDDED_MODEL, check_hosted, embedded_model
from examples.common.arguments import count


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(description="Score hand-written prompts with a custom algorithm and runners.")
    parser.add_argument("--tasks", type=count(), default=None, help="score on the first N validation tasks only")
    parser.add_argument("--runners", type=count(), default=2, help="runner processes")
    parser.add_argument("--hosted", action="store_true", help="call OPENAI_BASE_URL, not the embedded model")
    args = parser.parse_args(argv)
    check_hosted(parser, args.hosted)
    setup_logging()
    with contextlib.ExitStack() as stack:
        if not args.hosted:
            os.environ["OPENAI_BASE_URL"] = stack.enter_context(embedded_model(args.runners, None))
            os.environ["OPENAI_API_KEY"] = "local"
            os.environ["ROOM_SELECTOR_MODEL"] = EMBEDDED_MODEL
        trainer = agl.Trainer(
            algorithm=pick_best_prompt,
            n_runners=args.runners,
            port=pick_free_port("127.0.0.1"),
            initial_resources={"prompt_template": prompt_template_baseline()},
        )
        trainer.fit(room_selector, val_dataset=load_room_tasks("val")[: args.tasks])


if __name__ == "__main__":
    main()
