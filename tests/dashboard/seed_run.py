"""Seed a running ``agentbolt store`` for the dashboard's browser tests: a real short GRPO run, then a few extras.

Usage: ``python tests/dashboard/seed_run.py STORE_URL WORK_DIR``. The run trains a tiny random word-level Llama (no
download) through the full stack against the store at STORE_URL: a runner, an agent making two OpenAI SDK calls
inside an operation, the gateway recording token ids and log-probs, the in-process engine, and GRPO, which stores
its per-step metrics. Then, through the store's API: two prompt-template versions (for the diff), the second scored
on the full validation set as a prompt search tags its rollouts (one reward NaN), a rollout retried after a failure,
and a span holding a 2 MB attribute (for truncation).
"""

from __future__ import annotations

import asyncio
import itertools
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[0] / "algorithm" / "grpo"))
sys.path.insert(0, str(HERE.parents[0]))

from word_model import ask, build_word_model  # noqa: E402

import agentbolt as agl  # noqa: E402
from agentbolt.algorithm.apo.search import FULL_VAL, METADATA_KEY  # noqa: E402
from agentbolt.algorithm.grpo.algorithm import GRPO  # noqa: E402
from agentbolt.store.client_server import LightningStoreClient  # noqa: E402
from dashboard.seeding import SCRIPT_PAYLOAD, finish, reward_span  # noqa: E402

TRAIN = [{"prompt": "ping", "answer": "yes"}, {"prompt": "pong", "answer": "no"}]
# The full-validation rollouts of a prompt-search candidate: (task, reward emitted, how the rollout ends). The
# optimizer scores the candidate (0.25 + 0 + 1.0 + 0) / 4 = 0.3125.
SCORED = [
    ("scored a", 0.25, "succeeded"),
    ("nan reward", float("nan"), "succeeded"),
    ("scored c", 1.0, "succeeded"),
    ("scored d", 0.5, "failed"),
]
VAL = [{"prompt": "ping", "answer": "yes", "note": SCRIPT_PAYLOAD}]
HUGE_CHARS = 2_000_000


def train(url: str, work: Path) -> None:
    counter = itertools.count()

    @agl.rollout
    async def agent(task: dict, llm: agl.LLM) -> float:
        with agl.operation(name="solve", question=task["prompt"]):
            with agl.operation(name="draft"):
                draft = await ask(llm, task["prompt"], seed=next(counter))
            with agl.operation(name="final"):
                final = await ask(llm, task["prompt"], seed=next(counter))
            agl.emit_message(f"draft={draft} final={final}")
        return 1.0 if final == task["answer"] else 0.0

    algorithm = GRPO(
        model=str(build_word_model(work / "word-llama")),
        served_model_name="word-llama",
        finetune="full",
        batch_size=2,
        group_size=3,
        max_steps=3,
        learning_rate=2e-2,
        micro_batch_size=8,
        val_interval=1,
        log_dir=str(work / "grpo-dashboard-run"),
        console=False,
        rollout_timeout=120,
        seed=0,
    )
    tracer = agl.OtelTracer()
    trainer = agl.Trainer(
        algorithm=algorithm,
        store=LightningStoreClient(url),
        strategy=agl.SharedMemoryExecutionStrategy(n_runners=1, main_thread="algorithm"),
        tracer=tracer,
        runner=agl.LitAgentRunner(tracer=tracer, poll_interval=0.05, heartbeat_interval=1.0),
    )
    trainer.fit(agent, train_dataset=TRAIN, val_dataset=VAL)


async def extras(url: str) -> None:
    store = LightningStoreClient(url)
    try:
        template = "You answer with one word.\nQuestion: {question}\nAnswer:"
        await store.add_resources({"prompt": agl.PromptTemplate(template=template, engine="f-string")})
        better = "You answer with exactly one word, yes or no.\nQuestion: {question}\nThink first.\nAnswer:"
        candidate = await store.add_resources({"prompt": agl.PromptTemplate(template=better, engine="f-string")})
        for task, reward, status in SCORED:
            tag = {METADATA_KEY: {"run_id": "apo-dashboard", "version": "v1", "purpose": FULL_VAL, "task": task}}
            scored = await store.enqueue_rollout(
                input={"prompt": task}, mode="val", resources_id=candidate.resources_id, metadata=tag
            )
            await finish(store, scored.rollout_id, "Worker-6", reward, status=status)
        # A rollout retried once after a failure, then failed for good.
        config = agl.RolloutConfig(max_attempts=2, retry_condition=["failed"])
        retried = await store.enqueue_rollout(input={"prompt": "retry me"}, mode="train", config=config)
        for worker in ("Worker-7", "Worker-8"):
            claimed = await store.dequeue_rollout(worker_id=worker)
            assert claimed is not None and claimed.rollout_id == retried.rollout_id
            await asyncio.sleep(0.2)
            await store.update_attempt(retried.rollout_id, claimed.attempt.attempt_id, status="failed")
        # A rollout whose trace holds a huge attribute.
        huge = await store.start_rollout(input={"prompt": "huge"}, mode="test", worker_id="Worker-9")
        attempt_id = huge.attempt.attempt_id
        sequence_id = await store.get_next_span_sequence_id(huge.rollout_id, attempt_id)
        span = reward_span(huge.rollout_id, attempt_id, sequence_id, 0.5, **{"agent.output": "x" * HUGE_CHARS})
        await store.add_span(span)
        await store.update_attempt(huge.rollout_id, attempt_id, status="succeeded")
    finally:
        await store.close()


def main() -> None:
    url, work = sys.argv[1], Path(sys.argv[2])
    started = time.monotonic()
    train(url, work)
    asyncio.run(extras(url))
    print(f"seeded in {time.monotonic() - started:.1f}s", flush=True)


if __name__ == "__main__":
    main()
