"""Write your own prompt-tuning algorithm against the store, and run it apart from its runners.

The algorithm below is the smallest useful one: it scores a few hand-written prompt templates on the validation
tasks and publishes the best. It uses only the store: publish a template as resources, enqueue rollouts bound to
them, wait for them, read each one's final reward from its spans. Run the three parts in three terminals::

    agentbolt store --port 4747                               # the store everyone talks to
    python -m examples.apo.apo_custom_algorithm runner        # serves the embedded model and runs rollouts
    python -m examples.apo.apo_custom_algorithm algo          # enqueues the work and picks the best prompt

or everything in one process with ``python -m examples.apo.apo_custom_algorithm_trainer``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
from typing import Any, Dict, List, Optional, Sequence

import agentbolt as agl
from examples.apo.room_selector import load_room_tasks, prompt_template_baseline, room_selector

logger = logging.getLogger("examples.apo.apo_custom_algorithm")


def setup_logging() -> None:
    """agentbolt's console logging at INFO, for this example's logger too (it is not under ``agentbolt``)."""
    agl.setup_logging("INFO", apply_to=[logger.name])


CANDIDATES = [
    prompt_template_baseline().template,
    prompt_template_baseline().template
    + "\n\nFirst call get_rooms_and_availability. Then answer with the name of one room only.",
    prompt_template_baseline().template
    + "\n\nCall the tool, keep the free rooms that are large enough and have the equipment, and answer with the "
    "smallest of them: its name only.",
]


async def score_prompt(store: agl.LightningStore, template: str, tasks: Sequence[Any], name: str) -> float:
    """Average final reward of ``template`` on ``tasks`` (failed or unrewarded rollouts count 0)."""
    resources = await store.update_resources(
        name, {"prompt_template": agl.PromptTemplate(template=template, engine="f-string")}
    )
    rollout_ids = [
        (await store.enqueue_rollout(input=task, mode="val", resources_id=resources.resources_id)).rollout_id
        for task in tasks
    ]
    finished: Dict[str, agl.Rollout] = {}
    while len(finished) < len(rollout_ids):
        for rollout in await store.wait_for_rollouts(rollout_ids=rollout_ids, timeout=0.0):
            finished[rollout.rollout_id] = rollout
        await asyncio.sleep(0.5)
    total = 0.0
    for rollout_id in rollout_ids:
        reward = agl.find_final_reward(await store.query_spans(rollout_id, "latest"))
        total += reward if finished[rollout_id].status == "succeeded" and reward is not None else 0.0
    return total / len(rollout_ids)


@agl.algo
async def pick_best_prompt(store: agl.LightningStore, val_dataset: Optional[List[Any]] = None) -> None:
    """Score every candidate on the validation tasks and publish the best as the resources ``best``."""
    tasks = list(val_dataset or load_room_tasks("val"))
    scores = []
    for index, template in enumerate(CANDIDATES):
        score = await score_prompt(store, template, tasks, f"candidate-{index}")
        logger.info("Candidate %d scores %.3f on %d validation tasks.", index, score, len(tasks))
        scores.append(score)
    best = max(range(len(CANDIDATES)), key=lambda i: scores[i])
    await store.update_resources(
        "best", {"prompt_template": agl.PromptTemplate(template=CANDIDATES[best], engine="f-string")}
    )
    logger.info("Best: candidate %d (%.3f).", best, scores[best])


async def run_algorithm(address: str) -> None:
    store = agl.LightningStoreClient(address)
    try:
        pick_best_prompt.set_store(store)
        await pick_best_prompt.run(val_dataset=load_room_tasks("val"))
    finally:
        await store.close()


async def run_runner(address: str) -> None:
    store = agl.LightningStoreClient(address)
    runner = agl.LitAgentRunner(agl.AgentOpsTracer())
    try:
        with runner.run_context(agent=room_selector, store=store):
            await runner.iter()
    finally:
        await store.close()


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(description="A custom prompt-selection algorithm and its runner.")
    parser.add_argument("role", choices=["algo", "runner"])
    parser.add_argument("--store", default="http://127.0.0.1:4747", help="address of a running agentbolt store")
    parser.add_argument("--hosted", action="store_true", help="runner: call OPENAI_BASE_URL, not the embedded model")
    args = parser.parse_args(argv)
    setup_logging()
    if args.role == "algo":
        asyncio.run(run_algorithm(args.store))
        return
    from examples.apo.room_selector_apo import EMBEDDED_MODEL, check_hosted, embedded_model

    check_hosted(parser, args.hosted)

    with contextlib.ExitStack() as stack:
        if not args.hosted:
            os.environ["OPENAI_BASE_URL"] = stack.enter_context(embedded_model(1, None))
            os.environ["OPENAI_API_KEY"] = "local"
            os.environ["ROOM_SELECTOR_MODEL"] = EMBEDDED_MODEL
        asyncio.run(run_runner(args.store))


if __name__ == "__main__":
    main()
