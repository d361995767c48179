"""OpenAI Agents SDK agents, run by the real SDK against the local fake API, name their LLM calls in the traces.

The fake API calls the first tool it is offered when the last message is the user's: the triage agent, offered only
its handoff to the writer, hands off; the writer, offered no tool, answers. Each rollout therefore makes one call per
agent.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, Dict, Iterator, List, Sequence

import openai
import pytest
from support.fake_openai import FakeOpenAIServer

pytest.importorskip("agents", reason="install the 'agents' extra")

from agents import Agent, OpenAIChatCompletionsModel, RunConfig, Runner, TracingProcessor
from agents.tracing import get_trace_provider, set_trace_processors, set_tracing_disabled
from agents.tracing.processors import default_processor
from openai import AsyncOpenAI

from agentbolt.adapter import TracerTraceToTriplet
from agentbolt.instrumentation.openai import SPAN_NAME
from agentbolt.store.memory import InMemoryLightningStore
from agentbolt.tracer import AgentOpsTracer
from agentbolt.tracer.openai_agents import instrument_openai_agents, is_openai_agents_instrumented
from agentbolt.tracer.openai_agents_provider import AGENT_SPAN_PREFIX, AgentSpanRecorder
from agentbolt.types import AttemptedRollout, Span


class RecordingProcessor(TracingProcessor):
    """A user's own trace processor: keeps the type of every span the SDK ends."""

    def __init__(self) -> None:
        self.ended: List[str] = []

    def on_trace_start(self, trace: Any) -> None:
        pass

    def on_trace_end(self, trace: Any) -> None:
        pass

    def on_span_start(self, span: Any) -> None:
        pass

    def on_span_end(self, span: Any) -> None:
        self.ended.append(span.span_data.type)

    def shutdown(self) -> None:
        pass

    def force_flush(self) -> None:
        pass


@pytest.fixture(scope="module")
def server() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer() as running:
        yield running


@pytest.fixture
def store() -> InMemoryLightningStore:
    return InMemoryLightningStore(thread_safe=True)


@pytest.fixture
def tracer(store: InMemoryLightningStore) -> Iterator[AgentOpsTracer]:
    tracer = AgentOpsTracer()
    with tracer.lifespan(store):
        yield tracer
    assert not isinstance(get_trace_provider(), AgentSpanRecorder)


@pytest.fixture
def sdk_tracing_disabled() -> Iterator[None]:
    """The SDK's tracing switched off as the frameworks agents do (its traces would go to OpenAI's platform)."""
    set_tracing_disabled(True)
    try:
        yield
    finally:
        set_tracing_disabled(False)


def triage_agent(server: FakeOpenAIServer) -> Agent[Any]:
    model = OpenAIChatCompletionsModel(
        model="fake-model", openai_client=AsyncOpenAI(base_url=server.base_url, api_key="test", max_retries=0)
    )
    writer = Agent(name="writer", instructions="Write the answer.", model=model)
    return Agent(name="triage", instructions="Hand the question to the writer.", model=model, handoffs=[writer])


async def run_rollout(
    tracer: AgentOpsTracer,
    store: InMemoryLightningStore,
    rollout: AttemptedRollout,
    agent: Agent[Any],
    question: str,
    run_config: Any = None,
) -> List[Span]:
    async with tracer.trace_context(
        rollout.rollout_id, rollout_id=rollout.rollout_id, attempt_id=rollout.attempt.attempt_id
    ):
        result = await Runner.run(agent, question, run_config=run_config)
    assert result.last_agent.name == "writer"
    return list(await store.query_spans(rollout.rollout_id))


def call_agents(spans: Sequence[Span]) -> List[Any]:
    """The agent name of each LLM call, in call order, as the default adapter gives them."""
    return [triplet.metadata["agent_name"] for triplet in TracerTraceToTriplet().adapt(list(spans))]


async def test_each_agent_of_a_handoff_names_its_own_calls(
    tracer: AgentOpsTracer, store: InMemoryLightningStore, server: FakeOpenAIServer, sdk_tracing_disabled: None
) -> None:
    rollout = await store.start_rollout(input={"task": "handoff"})
    spans = await run_rollout(tracer, store, rollout, triage_agent(server), "hello")
    by_id: Dict[str, Span] = {span.span_id: span for span in spans}
    agent_spans = [span for span in spans if span.name.startswith(AGENT_SPAN_PREFIX)]
    assert sorted(span.attributes["agent.name"] for span in agent_spans) == ["triage", "writer"]
    (root,) = [span for span in spans if span.parent_id is None]
    assert all(span.parent_id == root.span_id for span in agent_spans)
    calls = sorted((span for span in spans if span.name == SPAN_NAME), key=lambda span: span.start_time or 0)
    assert [by_id[str(call.parent_id)].attributes["agent.name"] for call in calls] == ["triage", "writer"]
    assert list(by_id[str(calls[0].parent_id)].attributes["agent.handoffs"]) == ["writer"]
    assert call_agents(spans) == ["triage", "writer"]


async def test_agent_match_selects_only_the_writers_calls(
    tracer: AgentOpsTracer, store: InMemoryLightningStore, server: FakeOpenAIServer, sdk_tracing_disabled: None
) -> None:
    rollout = await store.start_rollout(input={"task": "handoff"})
    spans = await run_rollout(tracer, store, rollout, triage_agent(server), "hello")
    (triplet,) = TracerTraceToTriplet(agent_match="^writer$").adapt(spans)
    assert triplet.metadata["agent_name"] == "writer"
    assert triplet.response["raw_content"][0]["content"] == "Echo: hello"


async def test_agents_are_recorded_when_tracing_is_disabled_for_the_run(
    tracer: AgentOpsTracer, store: InMemoryLightningStore, server: FakeOpenAIServer
) -> None:
    rollout = await store.start_rollout(input={"task": "handoff"})
    config = RunConfig(tracing_disabled=True)
    spans = await run_rollout(tracer, store, rollout, triage_agent(server), "hello", run_config=config)
    assert call_agents(spans) == ["triage", "writer"]


async def test_the_users_trace_processors_still_receive_the_sdks_spans(
    tracer: AgentOpsTracer, store: InMemoryLightningStore, server: FakeOpenAIServer
) -> None:
    processor = RecordingProcessor()
    set_trace_processors([processor])
    try:
        rollout = await store.start_rollout(input={"task": "handoff"})
        spans = await run_rollout(tracer, store, rollout, triage_agent(server), "hello")
    finally:
        set_trace_processors([default_processor()])
    assert processor.ended.count("agent") == 2 and processor.ended.count("generation") == 2
    assert "handoff" in processor.ended
    assert call_agents(spans) == ["triage", "writer"]


async def test_concurrent_rollouts_keep_their_agents_apart(
    tracer: AgentOpsTracer, store: InMemoryLightningStore, server: FakeOpenAIServer, sdk_tracing_disabled: None
) -> None:
    server.config.delay = 0.05  # both rollouts' calls are in flight together
    try:
        rollouts = [await store.start_rollout(input={"n": n}) for n in range(2)]
        questions = ["question one", "question two"]
        results = await asyncio.gather(
            *(
                run_rollout(tracer, store, rollout, triage_agent(server), question)
                for rollout, question in zip(rollouts, questions, strict=True)
            )
        )
    finally:
        server.config.delay = 0.0
    for rollout, question, spans in zip(rollouts, questions, results, strict=True):
        by_id = {span.span_id: span for span in spans}
        (root,) = [span for span in spans if span.parent_id is None]
        agent_spans = [span for span in spans if span.name.startswith(AGENT_SPAN_PREFIX)]
        assert len(agent_spans) == 2 and all(span.parent_id == root.span_id for span in agent_spans)
        for call in (span for span in spans if span.name == SPAN_NAME):
            assert call.parent_id in by_id and by_id[call.parent_id].name.startswith(AGENT_SPAN_PREFIX)
        assert {span.rollout_id for span in spans} == {rollout.rollout_id}
        triplets = TracerTraceToTriplet().adapt(spans)
        assert [t.metadata["agent_name"] for t in triplets] == ["triage", "writer"]
        assert triplets[1].response["raw_content"][0]["content"] == f"Echo: {question}"


def test_recording_is_installed_once_and_removed_on_teardown(store: InMemoryLightningStore) -> None:
    tracer = AgentOpsTracer()
    with tracer.lifespan(store):
        instrument_openai_agents()  # again: still one recorder
        provider = get_trace_provider()
        assert isinstance(provider, AgentSpanRecorder) and not isinstance(provider.inner, AgentSpanRecorder)
    assert not isinstance(get_trace_provider(), AgentSpanRecorder)
    assert get_trace_provider() is provider.inner
    assert not is_openai_agents_instrumented()


def test_the_sdk_imported_after_the_tracer_started_is_recorded_and_never_imported_by_the_tracer(
    tmp_path: Path,
) -> None:
    script = textwrap.dedent(
        """
        import sys
        from agentbolt.store.memory import InMemoryLightningStore
        from agentbolt.tracer import AgentOpsTracer

        tracer = AgentOpsTracer()
        with tracer.lifespan(InMemoryLightningStore()):
            assert "agents" not in sys.modules
            from agents.tracing import get_trace_provider
            from agentbolt.tracer.openai_agents_provider import AgentSpanRecorder

            assert isinstance(get_trace_provider(), AgentSpanRecorder)
            assert not any(type(finder).__name__ == "_InstallOnImport" for finder in sys.meta_path)
        assert not isinstance(get_trace_provider(), AgentSpanRecorder)
        print("ok")
        """
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


async def test_a_failing_agent_run_still_ends_its_span(
    tracer: AgentOpsTracer, store: InMemoryLightningStore, server: FakeOpenAIServer, sdk_tracing_disabled: None
) -> None:
    rollout = await store.start_rollout(input={"task": "fails"})
    server.config.fail_next = 1
    try:
        with pytest.raises(openai.InternalServerError):
            await run_rollout(tracer, store, rollout, triage_agent(server), "hello")
    finally:
        server.config.fail_next = 0
    spans = list(await store.query_spans(rollout.rollout_id))
    (agent_span,) = [span for span in spans if span.name.startswith(AGENT_SPAN_PREFIX)]
    (call,) = [span for span in spans if span.name == SPAN_NAME]
    assert call.parent_id == agent_span.span_id and call.status.status_code == "ERROR"
    assert agent_span.status.status_code == "ERROR"  # the SDK reports the failed run on the agent's span
