"""Code written like the reference's APO tutorial runs unchanged: default Trainer strategy, runner processes."""

from __future__ import annotations

import asyncio
import os
from typing import Any

from apo_standin import GOOD_TEMPLATE, SEED_TEMPLATE, TRAIN, VAL, capital_agent
from support.servers import free_port

import agentbolt as agl


def test_the_tutorial_script_shape_runs(optimizer_client: Any) -> None:
    algo = agl.APO(
        optimizer_client,
        gradient_model="critic",
        apply_edit_model="editor",
        val_batch_size=2,
        gradient_batch_size=2,
        beam_width=1,
        branch_factor=1,
        beam_rounds=1,
        use_poml=False,
    )
    trainer = agl.Trainer(
        algorithm=algo,
        n_runners=2,
        port=free_port(),
        initial_resources={"prompt_template": agl.PromptTemplate(template=SEED_TEMPLATE, engine="f-string")},
        adapter=agl.TraceToMessages(),
    )
    trainer.fit(agent=capital_agent, train_dataset=TRAIN, val_dataset=VAL)
    assert algo.get_best_prompt().template == GOOD_TEMPLATE


def test_the_custom_algorithm_example_scores_each_candidate(standin: Any, monkeypatch: Any) -> None:
    from examples.apo.apo_custom_algorithm import CANDIDATES, pick_best_prompt
    from examples.apo.room_selector import load_room_tasks, prompt_template_baseline, room_selector

    monkeypatch.setenv("OPENAI_BASE_URL", standin.base_url)
    monkeypatch.setenv("OPENAI_API_KEY", "stand-in")
    monkeypatch.setenv("ROOM_SELECTOR_MODEL", "agent")  # the stand-in answers "I do not know.": reward 0
    store = agl.InMemoryLightningStore()
    trainer = agl.Trainer(
        algorithm=pick_best_prompt,
        store=store,
        strategy=agl.SharedMemoryExecutionStrategy(n_runners=1),
        initial_resources={"prompt_template": prompt_template_baseline()},
    )
    trainer.fit(room_selector, val_dataset=load_room_tasks("val")[:2])
    best = asyncio.run(store.get_resources_by_id("best"))
    assert best is not None and best.resources["prompt_template"].template == CANDIDATES[0]
    rollouts = asyncio.run(store.query_rollouts())
    assert len(rollouts) == 2 * len(CANDIDATES) and {r.status for r in rollouts} == {"succeeded"}
    assert os.environ["ROOM_SELECTOR_MODEL"] == "agent"
