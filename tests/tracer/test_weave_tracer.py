"""WeaveTracer: Weave calls become stored spans, with no network and no W&B login (make test-weave)."""

from __future__ import annotations

import socket
from typing import Any, AsyncIterator, Dict, List

import pytest

weave = pytest.importorskip("weave")

from agentbolt.emitter import emit_message, emit_reward  # noqa: E402
from agentbolt.store.memory import InMemoryLightningStore  # noqa: E402
from agentbolt.tracer.weave import WeaveTracer, op_name_to_func_name, random_project_name  # noqa: E402
from agentbolt.types import Span  # noqa: E402

pytestmark = pytest.mark.weave


@weave.op
def add(a: int, b: int) -> int:
    return a + b


@weave.op
def solve(question: str) -> Dict[str, Any]:
    return {"answer": add(2, 3), "question": question}


@weave.op
def explode() -> None:
    raise ValueError("no answer")


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> List[Any]:
    """Every attempt to open a network connection is recorded and refused."""
    attempts: List[Any] = []

    def refuse(self: socket.socket, address: Any) -> None:
        attempts.append(address)
        raise OSError(f"network access attempted: {address}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    return attempts


@pytest.fixture
async def tracer() -> AsyncIterator[WeaveTracer]:
    tracer = WeaveTracer()
    yield tracer
    tracer.teardown_worker(0)


def by_name(spans: List[Span]) -> Dict[str, Span]:
    return {span.name: span for span in spans}


async def test_weave_calls_become_stored_spans(tracer: WeaveTracer, no_network: List[Any]) -> None:
    store = InMemoryLightningStore(thread_safe=True)
    tracer.init_worker(0, store)
    rollout = await store.start_rollout(input={})
    rollout_id, attempt_id = rollout.rollout_id, rollout.attempt.attempt_id
    async with tracer.trace_context("episode", rollout_id=rollout_id, attempt_id=attempt_id):
        assert solve("2+3?") == {"answer": 5, "question": "2+3?"}

    stored = list(await store.query_spans(rollout_id, sort_by="sequence_id"))
    assert [span.name for span in stored] == ["add", "solve", "episode"]
    assert [span.sequence_id for span in stored] == sorted({span.sequence_id for span in stored})
    spans = by_name(stored)
    assert spans["add"].parent_id == spans["solve"].span_id
    assert spans["solve"].parent_id == spans["episode"].span_id
    assert spans["episode"].parent_id is None
    assert len({span.trace_id for span in stored}) == 1
    assert spans["add"].attributes["agentlightning.operation.name"] == "add"
    assert spans["add"].attributes["agentlightning.operation.input.a"] == 2
    assert spans["add"].attributes["agentlightning.operation.output"] == 5
    assert spans["solve"].attributes["agentlightning.operation.output.answer"] == 5
    assert spans["episode"].attributes["agentlightning.operation.input.rollout_id"] == rollout_id
    for span in stored:
        assert span.rollout_id == rollout_id and span.attempt_id == attempt_id
        assert span.status.status_code == "OK"
        assert span.start_time is not None and span.end_time is not None and span.start_time <= span.end_time
        assert span.resource.attributes["agentlightning.tracer.name"] == "weave"
        assert span.resource.attributes["agentlightning.rollout_id"] == rollout_id
        assert span.resource.attributes["agentlightning.span_sequence_id"] == span.sequence_id
    assert [span.name for span in tracer.get_last_trace()] == ["add", "solve", "episode"]
    assert no_network == []


async def test_failed_call_is_an_error_span_and_the_exception_propagates(tracer: WeaveTracer) -> None:
    store = InMemoryLightningStore(thread_safe=True)
    tracer.init_worker(0, store)
    rollout = await store.start_rollout(input={})
    with pytest.raises(ValueError, match="no answer"):
        async with tracer.trace_context(rollout_id=rollout.rollout_id, attempt_id=rollout.attempt.attempt_id):
            explode()
    spans = by_name(list(await store.query_spans(rollout.rollout_id)))
    assert set(spans) == {"explode", tracer.project_name}
    for span in spans.values():
        assert span.status.status_code == "ERROR"
        assert span.attributes["exception.type"] == "ValueError"
        assert span.attributes["exception.message"] == "no answer"


async def test_emitters_and_operations_become_weave_calls(tracer: WeaveTracer) -> None:
    store = InMemoryLightningStore(thread_safe=True)
    tracer.init_worker(0, store)
    rollout = await store.start_rollout(input={})
    async with tracer.trace_context("episode", rollout_id=rollout.rollout_id, attempt_id=rollout.attempt.attempt_id):
        with tracer.operation_context("step", attributes={"phase": "plan"}) as op:
            emit_message("thinking")
            op.record_attributes({"tokens": 7})
        emit_reward(0.75)
    spans = by_name(list(await store.query_spans(rollout.rollout_id)))
    assert spans["step"].attributes["phase"] == "plan" and spans["step"].attributes["tokens"] == 7
    assert spans["agentlightning.message"].attributes["agentlightning.message.body"] == "thinking"
    assert spans["agentlightning.message"].parent_id == spans["step"].span_id
    reward = next(
        span for span in spans.values() if any(k.startswith("agentlightning.reward") for k in span.attributes)
    )
    assert 0.75 in reward.attributes.values()


async def test_without_ids_spans_stay_local(tracer: WeaveTracer) -> None:
    store = InMemoryLightningStore(thread_safe=True)
    tracer.init_worker(0, store)
    async with tracer.trace_context("local"):
        add(1, 1)
    spans = tracer.get_last_trace()
    assert [span.name for span in spans] == ["add", "local"]
    assert [span.sequence_id for span in spans] == [0, 1]
    assert {span.rollout_id for span in spans} == {"rollout-dummy"}
    assert (await store.statistics()).get("total_spans", 0) == 0


async def test_contract_errors(tracer: WeaveTracer) -> None:
    with pytest.raises(RuntimeError, match="init_worker"):
        async with tracer.trace_context():
            pass
    tracer.init_worker(0, InMemoryLightningStore(thread_safe=True))
    with pytest.raises(ValueError, match="all provided or all None"):
        async with tracer.trace_context(rollout_id="ro-1"):
            pass


def test_helpers() -> None:
    assert op_name_to_func_name("weave:///agl/weave-1/op/solve:0123abcd") == "solve"
    assert op_name_to_func_name("solve") == "solve"
    name = random_project_name()
    assert name.startswith("weave-") and len(name) == len("weave-") + 12


@weave.op
def shout(text: str) -> str:
    return text.upper()


def test_trainer_dev_runs_an_agent_under_weave_tracer() -> None:
    import asyncio

    import agentbolt as agl

    @agl.rollout
    def agent(task: Dict[str, Any], llm: Any) -> float:
        shout(task["text"])
        return 1.0

    store = InMemoryLightningStore(thread_safe=True)
    trainer = agl.Trainer(
        store=store,
        tracer=WeaveTracer(),
        n_runners=1,
        strategy="shm",
        runner={"type": "agentbolt.runner.LitAgentRunner", "poll_interval": 0.1, "heartbeat_interval": 1.0},
        algorithm=agl.Baseline(polling_interval=0.1, span_verbosity="none"),
        initial_resources={"main_llm": agl.LLM(endpoint="http://127.0.0.1:9/v1", model="unused")},
    )
    trainer.dev(agent, [{"text": "a"}, {"text": "b"}], progress=False)

    async def check() -> None:
        rollouts = await store.query_rollouts()
        assert len(rollouts) == 2 and {r.status for r in rollouts} == {"succeeded"}
        for rollout in rollouts:
            spans = by_name(list(await store.query_spans(rollout.rollout_id)))
            assert spans["shout"].attributes["agentlightning.operation.input.text"] == rollout.input["text"]
            assert spans["shout"].parent_id == spans[rollout.rollout_id].span_id  # the trace context's root call

    asyncio.run(check())
