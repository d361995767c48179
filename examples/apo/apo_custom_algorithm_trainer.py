"""Run the custom algorithm of ``apo_custom_algorithm.py`` and its runners under one Trainer (one command)."""

from __future__ import annotations

import contextlib
import os

import agentbolt as agl
from agentbolt.utils.server_launcher import pick_free_port
from examples.apo.apo_custom_algorithm import pick_best_prompt
from examples.apo.room_selector import load_room_tasks, prompt_template_baseline, room_selector
from examples.apo.room_selector_apo import EMBEDDED_MODEL, embedded_model


def main(hosted: bool = False, runners: int = 2) -> None:
    agl.setup_logging("INFO")
    with contextlib.ExitStack() as stack:
        if not hosted:
            os.environ["OPENAI_BASE_URL"] = stack.enter_context(embedded_model(runners, None))
            os.environ["OPENAI_API_KEY"] = "local"
            os.environ["ROOM_SELECTOR_MODEL"] = EMBEDDED_MODEL
        trainer = agl.Trainer(
            algorithm=pick_best_prompt,
            n_runners=runners,
            port=pick_free_port("127.0.0.1"),
            initial_resources={"prompt_template": prompt_template_baseline()},
        )
        trainer.fit(room_selector, val_dataset=load_room_tasks("val"))


if __name__ == "__main__":
    main()
