"""Options that could only fail or corrupt a run later are refused when the config is built, naming the field."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError

import agentbolt as agl
from agentbolt.algorithm.grpo.algorithm import GRPO
from agentbolt.algorithm.grpo.config import SAMPLING_PARAMETER_NAMES, GRPOConfig
from agentbolt.serving.params import SamplingParams


def _refused_field(**options: object) -> str:
    with pytest.raises(ValidationError) as caught:
        GRPOConfig(**options)  # type: ignore[arg-type]
    (error,) = caught.value.errors()
    return ".".join(str(part) for part in error["loc"])


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("learning_rate", math.inf),
        ("weight_decay", math.inf),
        ("kl_coef", math.inf),
        ("lora_alpha", math.inf),
        ("advantage_eps", math.inf),
        ("adam_eps", math.inf),
        ("clip_high", math.inf),
        ("val_success_reward", math.nan),
        ("val_success_reward", -math.inf),
    ],
)
def test_a_float_option_that_is_not_finite_is_refused(field: str, value: float) -> None:
    assert _refused_field(**{field: value}) == field


def test_betas_that_are_not_finite_are_refused() -> None:
    assert _refused_field(adam_betas=(math.nan, 0.999)).startswith("adam_betas")


@pytest.mark.parametrize("seed", [2**64, 2**70, -(2**63) - 1])
def test_a_seed_torch_cannot_take_is_refused(seed: int) -> None:
    assert _refused_field(seed=seed) == "seed"


@pytest.mark.parametrize("seed", [2**64 - 1, -(2**63), -1])
def test_every_seed_the_config_accepts_seeds_torch(seed: int) -> None:
    torch.Generator().manual_seed(GRPOConfig(seed=seed).seed)


def test_an_agent_match_that_is_not_a_regex_is_refused_at_construction() -> None:
    with pytest.raises(ValidationError, match="agent_match") as caught:
        GRPO(agent_match="(")
    assert caught.value.errors()[0]["loc"] == ("agent_match",)
    assert GRPOConfig(agent_match="^planner$").agent_match == "^planner$"


def test_a_device_that_is_not_a_torch_device_name_is_refused_at_construction() -> None:
    with pytest.raises(ValidationError, match="nonsense") as caught:
        GRPO(device="nonsense")
    assert caught.value.errors()[0]["loc"] == ("device",)
    assert GRPOConfig(device="cuda:1").device == "cuda:1"  # a valid name; its availability is checked when it is used


@pytest.mark.parametrize("temperature", [0, 0.0])
def test_greedy_training_sampling_is_refused_naming_the_field_and_why(temperature: float) -> None:
    with pytest.raises(ValidationError, match=r"sampling_parameters\['temperature'\]=0.* same answer") as caught:
        GRPOConfig(sampling_parameters={"temperature": temperature})
    assert caught.value.errors()[0]["loc"] == ("sampling_parameters",)


def test_greedy_validation_sampling_is_accepted() -> None:
    config = GRPOConfig(sampling_parameters={"temperature": 0.7}, val_sampling_parameters={"temperature": 0.0})
    assert config.val_sampling_parameters == {"temperature": 0.0}
    assert GRPOConfig().val_sampling_parameters == {"temperature": 0.0}


@pytest.mark.parametrize(
    ("name", "value"),
    [("top_p", 0.9), ("top_k", 20), ("min_p", 0.05), ("repetition_penalty", 1.1), ("logit_bias", {"5": 2.0})],
)
def test_training_sampling_that_is_not_the_policys_distribution_is_refused(name: str, value: object) -> None:
    with pytest.raises(ValidationError, match=rf"sampling_parameters\['{name}'\].* biased") as caught:
        GRPOConfig(sampling_parameters={"temperature": 1.0, name: value})
    assert caught.value.errors()[0]["loc"] == ("sampling_parameters",)
    assert GRPOConfig(val_sampling_parameters={"temperature": 0.0, name: value}).val_sampling_parameters[name] == value


def test_sampling_parameters_that_leave_the_policys_distribution_unchanged_are_accepted() -> None:
    neutral = {"temperature": 0.7, "top_p": 1.0, "top_k": -1, "min_p": 0.0, "max_tokens": 32, "stop": ["\n"]}
    assert GRPOConfig(sampling_parameters=neutral).sampling_parameters == neutral


@pytest.mark.parametrize(("field", "value"), [("max_steps", True), ("learning_rate", False), ("threads", True)])
def test_a_boolean_where_a_number_goes_is_refused(field: str, value: bool) -> None:
    with pytest.raises(ValidationError, match="not a boolean"):
        GRPOConfig(**{field: value})  # type: ignore[arg-type]


@pytest.mark.parametrize("url", ["localhost:8000/v1", "not a url", "ftp://host/v1"])
def test_a_policy_server_url_that_is_not_http_is_refused(url: str) -> None:
    assert _refused_field(policy_server_url=url) == "policy_server_url"
    assert GRPOConfig(policy_server_url="http://127.0.0.1:8000/v1").policy_server_url == "http://127.0.0.1:8000/v1"


def test_models_and_directories_may_be_given_as_path_objects(tmp_path: Path) -> None:
    config = GRPOConfig(
        model=tmp_path / "model", checkpoint_dir=tmp_path / "ckpt", log_dir=tmp_path / "logs", adapter_dir=tmp_path
    )
    assert (config.model, config.checkpoint_dir, config.log_dir) == tuple(
        str(tmp_path / name) for name in ("model", "ckpt", "logs")
    )
    assert config.adapter_dir == str(tmp_path)


@pytest.mark.parametrize("seed", [0, 42])
def test_a_seed_shared_by_every_training_call_is_refused(seed: int) -> None:
    # Every rollout of a task sends the same first prompt; with one seed they all sample the same answer.
    with pytest.raises(ValidationError, match=r"sampling_parameters\['seed'\].* same answer") as caught:
        GRPOConfig(sampling_parameters={"temperature": 1.0, "seed": seed})
    assert caught.value.errors()[0]["loc"] == ("sampling_parameters",)
    assert GRPOConfig(sampling_parameters={"temperature": 1.0, "seed": None}).sampling_parameters["seed"] is None
    assert (
        GRPOConfig(val_sampling_parameters={"temperature": 0.0, "seed": seed}).val_sampling_parameters["seed"] == seed
    )


@pytest.mark.parametrize(("name", "value"), [("best_of", 4), ("use_beam_search", True)])
def test_training_sampling_that_picks_among_several_samples_is_refused(name: str, value: object) -> None:
    with pytest.raises(ValidationError, match=rf"sampling_parameters\['{name}'\].* biased"):
        GRPOConfig(sampling_parameters={"temperature": 1.0, name: value})
    neutral = {"temperature": 1.0, "best_of": 1, "use_beam_search": False}
    assert GRPOConfig(sampling_parameters=neutral).sampling_parameters == neutral


@pytest.mark.parametrize("field", ["sampling_parameters", "val_sampling_parameters"])
@pytest.mark.parametrize(
    ("key", "meant"), [("temprature", "temperature"), ("max_token", "max_tokens"), ("topp", "top_p")]
)
def test_a_misspelt_sampling_key_is_refused_with_the_closest_name(field: str, key: str, meant: str) -> None:
    with pytest.raises(ValidationError, match=rf"unknown key '{key}' \(did you mean '{meant}'\?\)") as caught:
        GRPOConfig(**{field: {"temperature": 1.0, key: 8}})  # type: ignore[arg-type]
    assert caught.value.errors()[0]["loc"] == (field,)


def test_an_unknown_sampling_key_with_no_close_name_lists_the_known_keys() -> None:
    with pytest.raises(ValidationError, match=r"unknown key 'extra_body' \(known keys: .*max_tokens.*temperature"):
        GRPOConfig(sampling_parameters={"extra_body": {"top_k": 20}})


def test_every_parameter_the_serving_engine_takes_is_a_known_sampling_key() -> None:
    assert {f.name for f in dataclasses.fields(SamplingParams)} <= SAMPLING_PARAMETER_NAMES
    request = {"temperature": 1.0, "max_completion_tokens": 8, "stop": ["\n"], "logprobs": True, "top_logprobs": 2}
    assert GRPOConfig(sampling_parameters=request).sampling_parameters == request


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("response_format", {"type": "json_object"}),
        ("guided_json", {"type": "object"}),
        ("guided_regex", "[0-9]+"),
        ("guided_choice", ["yes", "no"]),
        ("guided_grammar", "root ::= 'a'"),
        ("logits_processors", ["my.processor"]),
        ("allowed_token_ids", [1, 2]),
    ],
)
def test_guided_decoding_of_training_rollouts_is_refused_and_allowed_in_validation(name: str, value: object) -> None:
    with pytest.raises(ValidationError, match=rf"sampling_parameters\['{name}'\].* another distribution.* biased"):
        GRPOConfig(sampling_parameters={"temperature": 1.0, name: value})
    assert GRPOConfig(val_sampling_parameters={"temperature": 0.0, name: value}).val_sampling_parameters[name] == value


def test_a_plain_text_response_format_is_accepted_for_training() -> None:
    text = {"temperature": 1.0, "response_format": {"type": "text"}}
    assert GRPOConfig(sampling_parameters=text).sampling_parameters == text


@pytest.mark.parametrize("choices", [2, 8])
def test_several_choices_per_training_call_are_refused_pointing_to_group_size(choices: int) -> None:
    # The gateway records the token ids of a call's first choice only: the others could never be trained on.
    with pytest.raises(ValidationError, match=rf"sampling_parameters\['n'\]={choices} .*first choice.*group_size"):
        GRPOConfig(sampling_parameters={"temperature": 1.0, "n": choices})
    assert GRPOConfig(sampling_parameters={"temperature": 1.0, "n": 1}).sampling_parameters["n"] == 1
    assert (
        GRPOConfig(val_sampling_parameters={"temperature": 0.0, "n": choices}).val_sampling_parameters["n"] == choices
    )


@pytest.mark.parametrize("temperature", [-0.5, "0.7", math.nan, True])
def test_a_validation_temperature_no_engine_takes_is_refused(temperature: object) -> None:
    with pytest.raises(ValidationError, match=r"val_sampling_parameters\['temperature'\]") as caught:
        GRPOConfig(val_sampling_parameters={"temperature": temperature})
    assert caught.value.errors()[0]["loc"] == ("val_sampling_parameters",)


async def test_a_run_with_a_checkpoint_interval_but_no_checkpoint_dir_is_refused_before_the_model_loads() -> None:
    # A script may still fill checkpoint_dir in, so the config alone accepts it; the model is never reached.
    algorithm = GRPO(checkpoint_interval=5, max_steps=10, model=object(), tokenizer=object())
    algorithm.set_store(agl.InMemoryLightningStore())
    with pytest.raises(ValueError, match="checkpoint_interval=5 needs a checkpoint_dir"):
        await algorithm.run(train_dataset=[{"prompt": "ping"}])
    assert algorithm.trainer is None


@pytest.mark.parametrize(
    "options",
    [
        {"warmup_steps": 10, "max_steps": 5},  # one optimizer step per training step: 5 in the run
        {"warmup_steps": 5, "max_steps": 5},  # the peak would be reached after the last step
        {"warmup_steps": 8, "max_steps": 100, "total_optimizer_steps": 8, "lr_scheduler": "cosine"},
    ],
)
def test_a_warmup_that_outlasts_the_schedule_is_refused(options: dict) -> None:
    with pytest.raises(ValidationError, match="warmup_steps"):
        GRPOConfig(**options)


def test_a_warmup_shorter_than_the_schedule_is_accepted() -> None:
    assert GRPOConfig(warmup_steps=4, max_steps=5).warmup_steps == 4
    assert GRPOConfig(warmup_steps=10, max_steps=0).warmup_steps == 10  # validation only: no schedule to run
    config = GRPOConfig(warmup_steps=5, max_steps=5, batch_size=2, group_size=2, minibatch_size=2)  # 2 per step
    assert config.schedule_steps() == 10
