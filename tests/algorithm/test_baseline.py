"""Baseline against a real InMemoryLightningStore, with a small loop playing the runner."""

from __future__ import annotations

import asyncio
import logging
import re
import time
from typing import Any, Dict, List, Optional

import pytest

from agentbolt.adapter import TracerTraceToTriplet, TraceToMessages
from agentbolt.algorithm import Baseline
from agentbolt.store.memory import InMemoryLightningStore
from agentbolt.types import PromptTemplate, Span

LOGGER = "agentbolt.algorithm.fast"


async def _add_span(store: InMemoryLightningStore, rollout_id: str, attempt_id: str, **kwargs: Any) -> Span:
    sequence_id = await store.get_next_span_sequence_id(rollout_id, attempt_id)
    span = Span.from_attributes(rollout_id=rollout_id, attempt_id=attempt_id, sequence_id=sequence_id, **kwargs)
    await store.add_span(span)
    return span


async def run_worker(
    store: InMemoryLightningStore,
    n_rollouts: int,
    *,
    fail_inputs: tuple = (),
    queue_lengths: Optional[List[int]] = None,
    extra_attributes: Optional[Dict[str, Any]] = None,
) -> None:
    """Act as a runner: dequeue, record an agent span, one LLM call and a reward, then finish the attempt."""
    done = 0
    while done < n_rollouts:
        if queue_lengths is not None:
            queue_lengths.append(len(await store.query_rollouts(status_in=["queuing", "requeuing"])))
        rollout = await store.dequeue_rollout(worker_id="Worker-0")
        if rollout is None:
            await asyncio.sleep(0.01)
            continue
        rid, aid = rollout.rollout_id, rollout.attempt.attempt_id
        now = time.time()
        agent = await _add_span(
            store, rid, aid, name="agent", attributes={"agent.name": "solver"}, start_time=now, end_time=now + 3
        )
        await _add_span(
            store,
            rid,
            aid,
            name="openai.chat.completion",
            parent_id=agent.span_id,
            attributes={
                "gen_ai.response.id": f"resp-{rid}",
                "gen_ai.prompt.0.role": "user",
                "gen_ai.prompt.0.content": str(rollout.input),
                "gen_ai.completion.0.role": "assistant",
                "gen_ai.completion.0.content": "ok",
                "prompt_token_ids": [1, 2],
                "response_token_ids": [3],
                **(extra_attributes or {}),
            },
            start_time=now + 1,
            end_time=now + 2,
        )
        await _add_span(
            store,
            rid,
            aid,
            name="agentlightning.annotation",
            parent_id=agent.span_id,
            attributes={"agentlightning.reward.0.name": "primary", "agentlightning.reward.0.value": 0.5},
            start_time=now + 2.5,
            end_time=now + 2.5,
        )
        status = "failed" if rollout.input in fail_inputs else "succeeded"
        await store.update_attempt(rid, aid, status=status)
        done += 1


def _messages(caplog: pytest.LogCaptureFixture) -> List[str]:
    return [record.getMessage() for record in caplog.records if record.name == LOGGER]


async def test_baseline_enqueues_everything_and_logs_rollouts_attempts_spans_and_adapted_data(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = InMemoryLightningStore()
    baseline = Baseline(polling_interval=0.02, max_queue_length=0)
    baseline.set_store(store)
    baseline.set_initial_resources({"main_prompt": PromptTemplate(template="Q: {q}", engine="f-string")})
    adapter = TracerTraceToTriplet()
    baseline.set_adapter(adapter)
    queue_lengths: List[int] = []

    with caplog.at_level(logging.INFO, logger=LOGGER):
        await asyncio.wait_for(
            asyncio.gather(
                baseline.run(train_dataset=["alpha", "beta"], val_dataset=["gamma"]),
                run_worker(store, 3, fail_inputs=("beta",), queue_lengths=queue_lengths),
            ),
            timeout=60,
        )
    lines = _messages(caplog)
    text = "\n".join(lines)

    # Back-pressure: with max_queue_length=0 the queue never holds more than one waiting rollout.
    assert max(queue_lengths) <= 1

    rollouts = await store.query_rollouts()
    assert sorted((r.input, r.mode, r.status) for r in rollouts) == [
        ("alpha", "train", "succeeded"),
        ("beta", "train", "failed"),
        ("gamma", "val", "succeeded"),
    ]
    assert {r.resources_id for r in rollouts} == {"default"}
    assert (await store.get_resources_by_id("default")) is not None

    assert lines[0].startswith("Initial resources set: {'main_prompt': PromptTemplate(")
    assert "Proceeding epoch 1/1." in lines
    by_input = {r.input: r for r in rollouts}
    for sample, mode in (("alpha", "train"), ("beta", "train"), ("gamma", "val")):
        rid = by_input[sample].rollout_id
        assert f"Enqueued rollout {rid} in {mode} mode with sample: {sample}" in lines
        assert any(line.startswith(f"[Rollout {rid}] Status is initialized to ") for line in lines)
        status = by_input[sample].status
        assert re.search(rf"^\[Rollout {rid}\] Finished with status {status} in \d+\.\d\d seconds\.$", text, re.M)
        attempt = (await store.query_attempts(rid))[0]
        assert f"[Rollout {rid} | Attempt 1] ID: {attempt.attempt_id}. Status: {status}. Worker: Worker-0" in lines
        span_lines = [
            line for line in lines if line.startswith(f"[Rollout {rid} | Attempt {attempt.attempt_id} | Span ")
        ]
        assert [re.search(r"#(\d+) \(([^)]+)\)", line).groups() for line in span_lines] == [  # type: ignore[union-attr]
            ("1", "agent"),
            ("2", "openai.chat.completion"),
            ("3", "agentlightning.annotation"),
        ]
        assert "Attribute keys: ['agentlightning.reward.0.name', 'agentlightning.reward.0.value']" in span_lines[2]
        assert re.search(r"From \d{4}-\d\d-\d\dT[\d:.]+, to \d{4}-\d\d-\d\dT[\d:.]+, 1\.00 seconds\. ", span_lines[1])
        adapted = [line for line in lines if line.startswith(f"[Rollout {rid}] Adapted data: ")]
        assert len(adapted) == 1
        assert "Triplet(prompt={'token_ids': [1, 2]" in adapted[0] and "reward=0.5" in adapted[0]
        assert f"'response_id': 'resp-{rid}'" in adapted[0] and "'agent_name': 'solver'" in adapted[0]
    assert "Waiting for 3 harvest tasks to complete..." in lines
    assert lines[-1] == "Finished 3 rollouts."


async def test_key_values_verbosity_and_epochs(caplog: pytest.LogCaptureFixture) -> None:
    store = InMemoryLightningStore()
    baseline = Baseline(n_epochs=2, polling_interval=0.02, span_verbosity="key_values")
    baseline.set_store(store)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        await asyncio.wait_for(asyncio.gather(baseline.run(train_dataset=["only"]), run_worker(store, 2)), timeout=60)
    lines = _messages(caplog)
    assert "Proceeding epoch 1/1." not in lines and "Proceeding epoch 2/2." in lines
    assert len(await store.query_rollouts()) == 2
    assert {r.resources_id for r in await store.query_rollouts()} == {None}  # no initial resources
    assert any("Attributes: {'agentlightning.reward.0.name': 'primary'" in line for line in lines)
    assert not any("Adapted data" in line for line in lines)  # no adapter set
    assert lines[-1] == "Finished 2 rollouts."


async def test_no_span_lines_with_verbosity_none_and_adapter_errors_are_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = InMemoryLightningStore()
    baseline = Baseline(polling_interval=0.02, span_verbosity="none")
    baseline.set_store(store)
    adapter = TraceToMessages()
    baseline.set_adapter(adapter)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        await asyncio.wait_for(
            asyncio.gather(
                baseline.run(val_dataset=["x"]),
                # An invalid role makes the adapter fail on this rollout: the failure is logged, the run goes on.
                run_worker(store, 1, extra_attributes={"gen_ai.prompt.0.role": "wizard"}),
            ),
            timeout=60,
        )
    lines = _messages(caplog)
    assert not any("| Span " in line for line in lines)
    assert any(re.match(r"\[Rollout \S+ \| Attempt 1\] ID: ", line) for line in lines)
    assert any(line.endswith("The adapter failed on this rollout's spans.") for line in lines)
    assert lines[-1] == "Finished 1 rollouts."


async def test_empty_datasets_log_an_error_and_enqueue_nothing(caplog: pytest.LogCaptureFixture) -> None:
    store = InMemoryLightningStore()
    baseline = Baseline()
    baseline.set_store(store)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        await baseline.run(train_dataset=[], val_dataset=None)
    assert [r.levelname for r in caplog.records if r.name == LOGGER] == ["ERROR"]
    assert len(await store.query_rollouts()) == 0
