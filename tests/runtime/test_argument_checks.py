"""Bad arguments to the Trainer, the runner, the algorithms and the gateway fail at once, naming the argument.

Each of these used to be accepted and fail later, deep inside a run, or hang it (``max_rollouts=0``).
"""

from __future__ import annotations

from typing import Any, Dict

import pytest

import agentbolt as agl


@agl.rollout
def constant_agent(task: Any, llm: agl.LLM) -> float:
    return 1.0


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"max_rollouts": 0}, ValueError, "max_rollouts must be at least 1"),
        ({"max_rollouts": -1}, ValueError, "max_rollouts must be at least 1"),
        ({"n_runners": "2"}, TypeError, "n_runners must be an integer"),
        ({"n_runners": 1.5}, TypeError, "n_runners must be an integer"),
        ({"n_runners": 0}, ValueError, "n_runners must be at least 1"),
        ({"port": -5}, ValueError, "port must be at least 0"),
        ({"port": 70000}, ValueError, "port must be at most 65535"),
        ({"initial_resources": 42}, TypeError, "initial_resources must map names to resources"),
        ({"initial_resources": [agl.LLM(endpoint="http://x", model="m")]}, TypeError, "must map names"),
        ({"initial_resources": {"llm": 42}}, TypeError, r"initial_resources\['llm'\] must be an LLM"),
        ({"initial_resources": {1: agl.LLM(endpoint="http://x", model="m")}}, TypeError, "names must be strings"),
    ],
)
def test_trainer_refuses_bad_options_at_construction(kwargs: Dict[str, Any], error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        agl.Trainer(**kwargs)


def test_trainer_accepts_resources_as_objects_or_fields() -> None:
    llm = agl.LLM(endpoint="http://x", model="m")
    fields = {"resource_type": "prompt_template", "template": "Hi {name}", "engine": "f-string"}
    agl.Trainer(initial_resources={"llm": llm, "prompt": fields})


@pytest.mark.parametrize(
    ("agent", "message"),
    [
        (lambda task, llm: 1.0, r"agent must be a LitAgent instance \(decorate the function with @agl.rollout\)"),
        (agl.LitAgent, "agent must be a LitAgent instance, got type"),
    ],
)
def test_dev_refuses_an_agent_that_is_not_a_litagent(agent: Any, message: str) -> None:
    with pytest.raises(TypeError, match=message):
        agl.Trainer().dev(agent, [1])


@pytest.mark.parametrize("dataset", [42, "abc", {"a": 1}, (i for i in range(3))])
def test_run_refuses_datasets_without_length_and_index(dataset: Any) -> None:
    with pytest.raises(TypeError, match="train_dataset must be a sequence of tasks"):
        agl.Trainer().dev(constant_agent, dataset)
    with pytest.raises(TypeError, match="val_dataset must be a sequence of tasks"):
        agl.Trainer().fit(constant_agent, [1], val_dataset=dataset)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"tracer": None}, TypeError, "tracer must be a Tracer"),
        ({"max_rollouts": 0}, ValueError, "max_rollouts must be at least 1"),
        ({"poll_interval": 0}, ValueError, "poll_interval must be greater than 0"),
        ({"poll_interval": float("nan")}, ValueError, "poll_interval must be a finite number"),
    ],
)
def test_runner_refuses_bad_options(kwargs: Dict[str, Any], error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        agl.LitAgentRunner(**{"tracer": agl.OtelTracer(), **kwargs})


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: agl.SFT("x"), "config must be a SFTConfig or a dict of its fields, got str"),
        (lambda: agl.GRPO(42), "config must be a GRPOConfig or a dict of its fields, got int"),
        (lambda: agl.LLMProxy(middlewares="rollout_attempt"), "must be a list of aliases, got the string"),
        (lambda: agl.LLMProxy(litellm_config="x"), "litellm_config must be a dict, got str"),
    ],
)
def test_algorithm_and_gateway_options_of_the_wrong_kind_are_named(make: Any, message: str) -> None:
    with pytest.raises(TypeError, match=message):
        make()


def test_apo_prompt_files_must_be_a_list(tmp_path: Any) -> None:
    from openai import AsyncOpenAI

    prompt = tmp_path / "critique.poml"
    prompt.write_text("<poml>critique</poml>")
    client = AsyncOpenAI(api_key="unused", base_url="http://127.0.0.1:9")
    with pytest.raises(TypeError, match="wrap it in a list"):
        agl.APO(client, gradient_prompt_files=str(prompt))
    assert agl.APO(client, gradient_prompt_files=[prompt]).gradient_prompt_files == [prompt]


def test_apo_refuses_optimizer_clients_that_cannot_work() -> None:
    import openai

    with pytest.raises(TypeError, match="must be asynchronous"):
        agl.APO(openai.OpenAI(api_key="unused", base_url="http://127.0.0.1:9"))
    with pytest.raises(ValueError, match="must be a base URL"):
        agl.APO("sk-not-a-url")
    assert agl.APO("http://127.0.0.1:9/v1").async_openai_client is not None


@pytest.mark.parametrize(
    ("make", "error", "message"),
    [
        (lambda: agl.ClientServerExecutionStrategy(server_port=70000), ValueError, "server_port must be at most 65535"),
        (lambda: agl.ClientServerExecutionStrategy(n_runners=0), ValueError, "n_runners must be at least 1"),
        (lambda: agl.LLMProxy(port=-1), ValueError, "port must be at least 0"),
        (lambda: agl.SharedMemoryExecutionStrategy(n_runners=0), ValueError, "n_runners must be at least 1"),
        (lambda: agl.SharedMemoryExecutionStrategy(n_runners=3), ValueError, "use main_thread='algorithm'"),
    ],
)
def test_strategies_and_servers_check_ports_and_runner_counts(make: Any, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        make()


def test_stores_and_their_server_name_what_they_need(tmp_path: Any) -> None:
    from agentbolt.store.sqlite import SqliteLightningStore

    with pytest.raises(TypeError, match="tracker must be a metrics backend"):
        agl.InMemoryLightningStore(tracker="console")
    with pytest.raises(ValueError, match="give a file path"):
        SqliteLightningStore(":memory:")
    with pytest.raises(TypeError, match="store must be a LightningStore, got int"):
        agl.LightningStoreServer(42, "127.0.0.1", 0)  # type: ignore[arg-type]
