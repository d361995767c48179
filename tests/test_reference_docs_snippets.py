"""Snippets of the reference's documentation, ported by changing only the import, run against real local parts.

Each test is one snippet (or a few adjacent ones of the same page) as the reference documents it, with only what the
environment forces changed (ports, stores made thread-safe where a background writer needs it). The assertions are
what the reference's text says the snippet does.
"""

from __future__ import annotations

from typing import Any, Dict, List

import pytest
from opentelemetry.semconv.attributes import server_attributes

import agentbolt as agl
from agentbolt import emit_annotation, emit_object, operation
from agentbolt.emitter import find_final_reward
from agentbolt.utils.otel import (
    extract_links_from_attributes,
    make_link_attributes,
    make_tag_attributes,
    query_linked_spans,
)


def test_mongo_store_import_works_and_making_one_names_the_stores_that_exist() -> None:
    # tutorials/parallelize.md, "Parallelizing LightningStore"
    from agentbolt.store.mongo import MongoLightningStore

    with pytest.raises(
        NotImplementedError, match=r"^MongoDB is not a store backend of agentbolt: .*SqliteLightningStore"
    ):
        MongoLightningStore(mongo_uri="mongodb://localhost:27017/?replicaSet=rs0")


def test_trainer_strategy_adapter_and_tracer_specs_from_the_parallelize_page() -> None:
    # tutorials/parallelize.md, "Bundles and Execution Strategies"
    algorithm = agl.Baseline()

    trainer = agl.Trainer(algorithm=algorithm, n_runners=1, strategy="shm")
    assert isinstance(trainer.strategy, agl.SharedMemoryExecutionStrategy)

    trainer = agl.Trainer(
        algorithm=algorithm,
        strategy={"type": "shm", "n_runners": 8, "main_thread": "algorithm"},
    )
    assert isinstance(trainer.strategy, agl.SharedMemoryExecutionStrategy) and trainer.n_runners == 8

    strategy = agl.SharedMemoryExecutionStrategy(main_thread="algorithm", n_runners=4)
    trainer = agl.Trainer(algorithm=algorithm, strategy=strategy)
    assert trainer.strategy is strategy and trainer.n_runners == 4

    trainer = agl.Trainer(algorithm=algorithm, n_runners=8, strategy={"type": "cs", "server_port": 9999})
    assert isinstance(trainer.strategy, agl.ClientServerExecutionStrategy)
    assert trainer.strategy.server_port == 9999 and trainer.strategy.n_runners == 8

    trainer = agl.Trainer(algorithm=algorithm, adapter="agentbolt.adapter.TraceToMessages")
    assert isinstance(trainer.adapter, agl.TraceToMessages)

    trainer = agl.Trainer(algorithm=algorithm, adapter={"agent_match": "plan_agent", "repair_hierarchy": False})
    assert isinstance(trainer.adapter, agl.TracerTraceToTriplet)
    assert trainer.adapter.agent_match == "plan_agent" and trainer.adapter.repair_hierarchy is False


def test_client_server_strategy_reads_port_role_and_managed_store_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # tutorials/parallelize.md, "Bundles and Execution Strategies" (environment variables)
    monkeypatch.setenv("AGL_SERVER_PORT", "10000")
    monkeypatch.setenv("AGL_CURRENT_ROLE", "algorithm")
    monkeypatch.setenv("AGL_MANAGED_STORE", "0")

    trainer = agl.Trainer(algorithm=agl.Baseline(), n_runners=8, strategy="cs")

    assert isinstance(trainer.strategy, agl.ClientServerExecutionStrategy)
    assert (trainer.strategy.server_port, trainer.strategy.role, trainer.strategy.managed_store) == (
        10000,
        "algorithm",
        False,
    )


async def _spans_of(body: Any) -> List[agl.Span]:
    """Run ``body()`` inside an OtelTracer trace context of a fresh rollout and return the rollout's stored spans."""
    store = agl.InMemoryLightningStore(thread_safe=True)  # the tracer writes spans from a background thread
    tracer = agl.OtelTracer()
    tracer.init()
    tracer.init_worker(0, store)  # the contract deprecates trace_context(store=...), which traces.md still shows
    try:
        rollout = await store.start_rollout(input="snippet")
        async with tracer.trace_context(
            name="snippet", rollout_id=rollout.rollout_id, attempt_id=rollout.attempt.attempt_id
        ):
            body()
        return list(await store.query_spans(rollout.rollout_id))
    finally:
        tracer.teardown_worker(0)
        tracer.teardown()


async def test_emit_object_and_tag_snippets_send_the_documented_attributes() -> None:
    # tutorials/emitter.md, "Emitting Rewards, Messages, and More"
    def body() -> None:
        emit_object(
            {"name": "John Doe", "age": 30, "email": "john.doe@example.com"},
            attributes={server_attributes.SERVER_ADDRESS: "127.0.0.1", server_attributes.SERVER_PORT: 8080},
        )
        emit_annotation(make_tag_attributes(["tool", "calculator", "fast", "good"]))

    obj, tags = await _spans_of(body)

    assert obj.name == "agentlightning.object"
    assert obj.attributes == {
        "agentlightning.object.type": "dict",
        "agentlightning.object.json": '{"name": "John Doe", "age": 30, "email": "john.doe@example.com"}',
        "server.address": "127.0.0.1",
        "server.port": 8080,
    }
    assert tags.attributes == {
        "agentlightning.tag.0": "tool",
        "agentlightning.tag.1": "calculator",
        "agentlightning.tag.2": "fast",
        "agentlightning.tag.3": "good",
    }


def test_emitting_without_an_active_tracer_says_so_and_propagate_false_keeps_it_local() -> None:
    # tutorials/emitter.md, the tip after the emit_object example, and "Operations"
    with pytest.raises(RuntimeError, match=r"^No active tracer found\. Cannot emit"):
        emit_object({"name": "John Doe"})

    @agl.operation(propagate=False)
    def local_test() -> str:
        return "Not sent to backend"

    assert local_test() == "Not sent to backend"


async def test_link_attributes_find_the_operation_span_they_point_to() -> None:
    # tutorials/emitter.md, "Linking to Other Spans"
    def body() -> None:
        with operation(conversation_id="chat-42"):
            link_attrs = make_link_attributes({"conversation_id": "chat-42"})
            emit_annotation({**link_attrs, **make_tag_attributes(["reward", "good"])})

    spans = await _spans_of(body)
    annotation_span = next(span for span in spans if span.name == "agentlightning.annotation")
    operation_spans = [span for span in spans if span.name == "agentlightning.operation"]

    link_models = extract_links_from_attributes(annotation_span.attributes)
    matches = query_linked_spans(operation_spans, link_models)

    assert [span.span_id for span in matches] == [operation_spans[0].span_id]


async def test_runner_in_isolation_steps_one_rollout_and_the_store_holds_its_reward() -> None:
    # tutorials/debug.md, "Using Runner in Isolation" and "Hook into Runner's Lifecycle";
    # tutorials/traces.md, "Reading Rewards". The agent emits its reward without calling an LLM.
    @agl.rollout
    def apo_rollout(task: str, prompt_template: agl.PromptTemplate) -> None:
        assert prompt_template.format(any_question=task).startswith("You are a helpful assistant. ")
        agl.emit_reward(0.95)

    seen: Dict[str, List[str]] = {}

    class DebugHook(agl.Hook):
        async def on_trace_end(self, *, agent: Any, runner: Any, tracer: Any, rollout: Any) -> None:
            seen[rollout.rollout_id] = [span.name for span in tracer.get_last_trace()]

    tracer = agl.OtelTracer()
    runner = agl.LitAgentRunner(tracer)
    store = agl.InMemoryLightningStore(thread_safe=True)

    with runner.run_context(agent=apo_rollout, store=store, hooks=[DebugHook()]):
        resource = agl.PromptTemplate(template="You are a helpful assistant. {any_question}", engine="f-string")
        rollout = await runner.step(
            "Explain why the sky appears blue using principles of light scattering in 100 words.",
            resources={"main_prompt": resource},
        )

    assert [r.status for r in await store.query_rollouts()] == ["succeeded"]
    spans = await store.query_spans(rollout.rollout_id)
    assert find_final_reward(spans) == 0.95
    assert seen == {rollout.rollout_id: ["agentlightning.annotation"]}
