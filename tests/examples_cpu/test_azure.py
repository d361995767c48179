"""The Azure OpenAI fine-tuning loop, run to the network boundary against a stand-in Azure (azure_stand_in.py)."""

from __future__ import annotations

import asyncio
import json
from typing import Iterator

import pytest
from support.examples import error_line, run_example
from support.fake_openai import FakeOpenAIServer
from support.servers import free_port

import agentbolt as agl
from examples.azure.aoai_finetune import (
    AzureFineTuningError,
    AzureOpenAIConfig,
    AzureOpenAIFinetune,
    AzureOpenAIFineTuning,
    RolledOut,
    fine_tune_jsonl,
    select_examples,
)
from examples.azure.capital_agent import CapitalTask, capital_agent, capital_reward, load_tasks

from .azure_stand_in import API_KEY, MANAGEMENT_TOKEN, AzureState, create_app


@pytest.fixture
def azure() -> Iterator[tuple[AzureState, AzureOpenAIConfig]]:
    state = AzureState()
    with FakeOpenAIServer(app=create_app(state)) as server:
        root = server.base_url.removesuffix("/v1")
        config = AzureOpenAIConfig(
            endpoint=root, api_key=API_KEY, subscription_id="sub", resource_group="rg", resource_name="acct",
            management_endpoint=root, management_token=MANAGEMENT_TOKEN,
        )  # fmt: skip
        yield state, config


def test_iterations_fine_tune_deploy_prune_and_evaluate(azure: tuple[AzureState, AzureOpenAIConfig]) -> None:
    state, config = azure
    tasks = load_tasks()[:6]
    algorithm = AzureOpenAIFinetune(
        config, n_iterations=2, max_deployments=1, poll_interval=0.01, data_filter_ratio=0.5
    )
    trainer = agl.Trainer(algorithm=algorithm, n_runners=1, port=free_port())
    trainer.fit(capital_agent, train_dataset=tasks[:4], val_dataset=tasks[4:])

    assert [record.deployment for record in algorithm.history] == ["gpt-4.1-mini-ft_v01", "gpt-4.1-mini-ft_v02"]
    # The second job fine-tunes the first job's model; the loop's older deployment is deleted past one.
    first_job, second_job = state.jobs.values()
    assert first_job["model"] == "gpt-4.1-mini-2025-04-14"
    assert second_job["model"] == first_job["fine_tuned_model"]
    assert state.calls.index("delete gpt-4.1-mini-ft_v01") < state.calls.index("deploy gpt-4.1-mini-ft_v02")
    assert set(state.deployments) == {"gpt-4.1-mini", "gpt-4.1-mini-ft_v02"}
    # Rollouts ran on the base deployment first, then on each new one (training and validation).
    assert state.chat_models[0] == "gpt-4.1-mini" and "gpt-4.1-mini-ft_v02" in state.chat_models
    for record in algorithm.history:
        assert record.train_reward == 1.0 and record.val_reward == 1.0 and record.examples == 2
    # The uploaded file is the chat fine-tuning format: the whole exchange, the tool offered.
    first = [json.loads(line) for line in next(iter(state.file_contents.values())).decode().splitlines()]
    assert len(first) == 2
    roles = [message["role"] for message in first[0]["messages"]]
    assert roles == ["system", "user", "assistant", "tool", "assistant"]
    assert first[0]["tools"][0]["function"]["name"] == "country_capital_lookup"


def test_a_failed_job_stops_the_loop_with_the_reason(azure: tuple[AzureState, AzureOpenAIConfig]) -> None:
    state, config = azure
    state.fail_jobs = True
    algorithm = AzureOpenAIFinetune(config, n_iterations=1, poll_interval=0.01)
    trainer = agl.Trainer(algorithm=algorithm, n_runners=1, port=free_port())
    with pytest.raises(AzureFineTuningError, match="ended failed: stand-in failure"):
        trainer.fit(capital_agent, train_dataset=load_tasks()[:2], val_dataset=load_tasks()[2:3])
    assert not [name for name in state.deployments if "-ft_" in name]


def test_wrong_credentials_are_refused_by_name(azure: tuple[AzureState, AzureOpenAIConfig]) -> None:
    _, config = azure
    config.management_token = "wrong"

    async def deploy() -> None:
        client = AzureOpenAIFineTuning(config, poll_interval=0.01)
        try:
            await client.deploy("x", "gpt-4.1-mini-2025-04-14")
        finally:
            await client.close()

    with pytest.raises(AzureFineTuningError, match="HTTP 401"):
        asyncio.run(deploy())


def test_the_stand_in_rejects_a_file_that_is_not_chat_fine_tuning_data(
    azure: tuple[AzureState, AzureOpenAIConfig],
) -> None:
    import openai

    _, config = azure

    async def upload() -> None:
        client = AzureOpenAIFineTuning(config, poll_interval=0.01)
        try:
            await client.upload_training_file(b'{"prompt": "x", "completion": "y"}\n', "bad.jsonl")
        finally:
            await client.close()

    with pytest.raises(openai.BadRequestError, match="no messages list"):
        asyncio.run(upload())


def test_configuration_from_the_environment_names_what_is_missing() -> None:
    with pytest.raises(ValueError, match="AZURE_OPENAI_API_KEY, AZURE_SUBSCRIPTION_ID"):
        AzureOpenAIConfig.from_env({"AZURE_OPENAI_ENDPOINT": "https://r.openai.azure.com/"})
    config = AzureOpenAIConfig.from_env(
        {name: "v" for name in AzureOpenAIConfig.ENV.values()}
        | {"AZURE_OPENAI_ENDPOINT": "https://r.openai.azure.com/"}
    )
    assert config.inference_base_url == "https://r.openai.azure.com/openai/v1"
    assert config.deployment_url("d").endswith("/accounts/v/deployments/d")


def test_selection_keeps_the_best_rewarded_share_and_the_reward_is_strict() -> None:
    rolled = [
        RolledOut(r, {"messages": [{"role": "assistant", "content": str(i)}]})
        for i, r in enumerate([0.0, 1.0, 0.5, 1.0])
    ]
    assert [c["messages"][0]["content"] for c in select_examples(rolled, 0.5)] == ["1", "3"]
    assert select_examples(rolled, 1.0) == [rolled[i].conversation for i in (1, 2, 3)]
    with pytest.raises(ValueError, match="data_filter_ratio"):
        select_examples(rolled, 0.0)
    assert fine_tune_jsonl([]) == b""
    task = load_tasks()[0]
    assert capital_reward("It is PARIS.", task) == 1.0
    assert capital_reward("", task) == 0.0 and capital_reward(task["question"], task) == 0.0


CAPITAL_TASK = load_tasks()[0]  # France, Paris


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        ("It is PARIS.", 1.0),
        ("The capital of France is Paris.", 1.0),
        ("Paris", 1.0),
        ("", 0.0),
        (CAPITAL_TASK["question"], 0.0),  # the question copied back
        ("Paris, Tokyo, Nairobi, Lima", 0.0),  # several capitals of the table
        ("It is Lyon or Paris.", 0.0),  # the gold among distractors
        ("Parisian cafés are famous.", 0.0),  # only inside a longer word
        ("The capital is Paris. " * 40, 0.0),  # very long
    ],
)
def test_the_capital_reward_pays_one_committed_answer_only(answer: str, expected: float) -> None:
    assert capital_reward(answer, CAPITAL_TASK) == expected


def _task(country: str) -> CapitalTask:
    return next(task for task in load_tasks() if task["country"] == country)


@pytest.mark.parametrize(
    "answer",
    [
        "Sydney and Canberra",
        "Sydney, Melbourne, Canberra, Perth",
        "Maybe Canberra, maybe Melbourne",
        "It is not Canberra.",
        "Canberra is not the capital; it's something else.",
        "I don't know. Canberra? Sydney?",
        "Canberra?",
        "Canberra / Sydney",
        "Perhaps Canberra.",
        "Sydney Canberra",  # a second city outside the table, capitalised
        "Canberra. Sydney.",
        "Canberra vs Melbourne",
    ],
)
def test_the_capital_reward_refuses_lists_negations_hedges_and_questions(answer: str) -> None:
    assert capital_reward(answer, _task("Australia")) == 0.0


@pytest.mark.parametrize(
    ("country", "answer"),
    [
        ("Australia", "Canberra"),
        ("Australia", "The capital of Australia is Canberra."),
        ("Australia", "Canberra is Australia\u2019s capital."),  # a typographic apostrophe
        ("Australia", "It's Canberra."),
        ("France", "The answer is **Paris**."),
        ("France", "According to the lookup tool the capital is Paris."),
        ("Brazil", "Brasilia"),  # without the accent
        ("Brazil", "The capital of Brazil is Brasília."),
        ("Brazil", "Bras\u0069\u0301lia"),  # a decomposed accent (NFD)
        ("Colombia", "Bogota"),
        ("Colombia", "BOGOTÁ"),
        ("Argentina", "Buenos Aires is the capital of Argentina."),
    ],
)
def test_the_capital_reward_pays_ordinary_phrasings_and_unaccented_spellings(country: str, answer: str) -> None:
    assert capital_reward(answer, _task(country)) == 1.0


def test_the_capital_reward_matches_whole_words_of_multi_word_capitals() -> None:
    mexico = next(task for task in load_tasks() if task["country"] == "Mexico")
    assert capital_reward("The capital is Mexico City.", mexico) == 1.0
    assert capital_reward(mexico["question"], mexico) == 0.0


def azure_environment(endpoint: str, **extra: str) -> dict[str, str]:
    """Every required Azure variable, the resource at ``endpoint``, plus ``extra``."""
    required = {AzureOpenAIConfig.ENV[name]: "v" for name in AzureOpenAIConfig.REQUIRED}
    return required | {"AZURE_OPENAI_ENDPOINT": endpoint} | extra


def test_the_loop_with_an_endpoint_that_refuses_connections_exits_2_naming_it() -> None:
    endpoint = f"http://127.0.0.1:{free_port()}"
    env = azure_environment(endpoint, AZURE_MANAGEMENT_TOKEN="t")
    line = error_line(run_example(["examples.azure.train_capital_agent"], env))
    assert line.startswith(f"error: cannot reach the Azure OpenAI resource at {endpoint}/openai/v1/models (")
    assert "AZURE_OPENAI_ENDPOINT" in line


def test_the_loop_without_a_management_token_exits_2_before_fine_tuning(
    azure: tuple[AzureState, AzureOpenAIConfig],
) -> None:
    state, config = azure
    env = azure_environment(config.endpoint, PATH="/nonexistent")  # no Azure CLI to ask for a token
    line = error_line(run_example(["examples.azure.train_capital_agent"], env))
    assert line.startswith("error: no AZURE_MANAGEMENT_TOKEN and the Azure CLI gave no token")
    assert not state.jobs and not state.file_contents


def test_a_job_failing_mid_run_ends_the_command_with_one_line(azure: tuple[AzureState, AzureOpenAIConfig]) -> None:
    state, config = azure
    state.fail_jobs = True
    env = azure_environment(
        config.endpoint,
        AZURE_OPENAI_API_KEY=API_KEY,
        AZURE_SUBSCRIPTION_ID="sub",
        AZURE_RESOURCE_GROUP="rg",
        AZURE_OPENAI_RESOURCE_NAME="acct",
        AZURE_MANAGEMENT_ENDPOINT=config.endpoint,
        AZURE_MANAGEMENT_TOKEN=MANAGEMENT_TOKEN,
    )
    argv = ["examples.azure.train_capital_agent", "--iterations", "1", "--n-runners", "1", "--poll-interval", "0.01"]
    result = run_example(argv, env)
    assert result.returncode == 1, result.stderr[-2000:]
    assert "Traceback" not in result.stderr, result.stderr[-2000:]
    [line] = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert "ended failed: stand-in failure" in line
    assert state.jobs  # the failure came from the fine-tuning job, after the rollouts
