"""The VERL bridge's CPU parts, with verl installed (``make test-verl``, marker ``verl``).

Configuration composition and overrides, dataset wrapping through VERL's own dataloader, rollout -> batch
conversion with exact tokens and masks, and the daemon's lifecycle against a real store with runners calling a vLLM
stand-in through the gateway. VERL's GPU training loop (FSDP workers, vLLM replicas) cannot run here.
"""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path
from typing import Any, Dict, Iterator, List

import pytest

pytest.importorskip("verl", reason="the VERL bridge tests need the 'verl' extra (make test-verl)")

from support.vllm import stand_in_server

import agentbolt as agl
from agentbolt.execution.events import ThreadingEvent
from agentbolt.store.sqlite import SqliteLightningStore
from agentbolt.types import Triplet
from agentbolt.verl.configuration import compose_config
from agentbolt.verl.daemon import AgentModeDaemon, aggregate_rollout, build_batch, trim_to_multiple
from agentbolt.verl.dataset import AgentDataset, LoadedDataset

pytestmark = pytest.mark.verl


def _codes(text: str) -> List[int]:
    """The stand-in's tokenizer: one token per character."""
    return [ord(c) for c in text]


# ---------------------------------------------------------------------------------------------------------------
# configuration


def test_agl_verl_composes_the_packaged_config_over_verls_ppo_trainer() -> None:
    algorithm = agl.VERL(
        {
            "algorithm": {"adv_estimator": "grpo"},
            "data": {"train_batch_size": 32, "max_prompt_length": 4096},
            "actor_rollout_ref": {"rollout": {"n": 4, "multi_turn": {"format": "hermes"}}},
            "trainer": {"n_gpus_per_node": 1, "total_epochs": 2},
        }
    )
    from agentbolt.algorithm.verl import VERL

    assert isinstance(algorithm, VERL)
    config = algorithm.config
    assert config.algorithm.adv_estimator == "grpo"
    assert config.data.train_batch_size == 32 and config.data.max_prompt_length == 4096
    assert config.actor_rollout_ref.rollout.n == 4 and config.actor_rollout_ref.rollout.name == "vllm"
    assert config.actor_rollout_ref.rollout.multi_turn.format == "hermes"
    assert config.trainer.total_epochs == 2 and config.trainer.use_v1 is False
    # VERL's own defaults are there, untouched
    assert config.actor_rollout_ref.actor.ppo_epochs == 1 and config.critic is not None
    # agent mode's section and defaults
    assert config.agentbolt.port == 9999 and config.agentbolt.trace_aggregator.level == "transition"
    assert config.agentbolt.trace_aggregator.trajectory_max_response_length == 8192
    assert config.data.filter_overlong_prompts is False


def test_overrides_may_add_keys_and_the_reference_section_name_is_read_as_agentbolt() -> None:
    config = compose_config(
        {
            "agentlightning": {"port": 7777, "trace_aggregator": {"level": "trajectory"}},
            "trainer": {"my_new_key": 3},
        }
    )
    assert config.agentbolt.port == 7777 and config.agentbolt.trace_aggregator.level == "trajectory"
    assert config.agentbolt.trace_aggregator.trajectory_max_prompt_length == 2048  # the rest kept
    assert config.trainer.my_new_key == 3 and "agentlightning" not in config


def test_command_line_overrides_apply_before_the_dict() -> None:
    config = compose_config(
        {"data": {"train_batch_size": 8}}, cli_overrides=["data.train_batch_size=16", "trainer.nnodes=2"]
    )
    assert config.data.train_batch_size == 8 and config.trainer.nnodes == 2


@pytest.mark.parametrize(
    "overrides, error, message",
    [
        ("not a dict", TypeError, "must be a dict"),
        ({"actor_rollout_ref": {"rollout": {"name": "sglang"}}}, ValueError, "must be 'vllm'"),
        ({"agentbolt": {"trace_aggregator": {"level": "step"}}}, ValueError, "trace_aggregator.level"),
        ({"agentbolt": {"rollout_timout": 60}}, ValueError, r"unknown key agentbolt\.rollout_timout"),
        ({"agentlightning": {"port": "x"}}, TypeError, r"agentbolt\.port must be an integer"),
    ],
)
def test_a_broken_config_is_refused_with_the_key_named(overrides: Any, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        agl.VERL(overrides)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["agentbolt.store=http://127.0.0.1:1", "agentbolt.port=abc"], r"agentbolt\.port must be an integer"),
        (["agentbolt.store=http://127.0.0.1:1", "agentbolt.rollout_timout=5"], "rollout_timout"),
        (["data.train_batch_size=["], "train_batch_size"),
        ([], "set agentbolt.store"),
    ],
)
def test_the_command_line_refuses_bad_overrides_in_one_line(argv: List[str], message: str) -> None:
    from agentbolt.verl.entrypoint import main

    with pytest.raises(SystemExit, match=message) as failure:
        main(argv)
    assert str(failure.value.code).startswith("agentbolt.verl: error:")


def test_run_without_a_store_or_with_an_unshareable_one_is_refused() -> None:
    from agentbolt.store.memory import InMemoryLightningStore
    from agentbolt.verl.entrypoint import run_ppo

    algorithm = agl.VERL({})
    with pytest.raises(ValueError, match=r"use it with agl\.Trainer"):
        algorithm.run([{"q": 1}])
    with pytest.raises(ValueError, match="cannot be shared"):
        run_ppo(algorithm.config, [{"q": 1}], store=InMemoryLightningStore())


# ---------------------------------------------------------------------------------------------------------------
# datasets


def test_agent_dataset_batches_tasks_through_verls_dataloader() -> None:
    from torchdata.stateful_dataloader import StatefulDataLoader
    from verl.utils.dataset.rl_dataset import collate_fn

    tasks = [{"question": f"q{i}", "answer": i} for i in range(5)]
    loader = StatefulDataLoader(AgentDataset(tasks), batch_size=2, collate_fn=collate_fn, drop_last=True)
    batches = list(loader)
    assert len(batches) == 2
    assert list(batches[0]["task"]) == tasks[:2] and list(batches[1]["index"]) == [2, 3]


def test_loaded_dataset_reads_parquet_json_and_jsonl(tmp_path: Path) -> None:
    import pandas

    pandas.DataFrame([{"q": "a", "n": 1}, {"q": "b", "n": 2}]).to_parquet(tmp_path / "t.parquet")
    (tmp_path / "t.json").write_text(json.dumps([{"q": "c"}]))
    (tmp_path / "t.jsonl").write_text('{"q": "d"}\n\n{"q": "e"}\n')
    dataset = LoadedDataset([tmp_path / "t.parquet", tmp_path / "t.json", str(tmp_path / "t.jsonl")])
    assert [dataset[i]["task"]["q"] for i in range(len(dataset))] == ["a", "b", "c", "d", "e"]
    assert dataset[1]["task"]["n"] == 2


def test_bad_datasets_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no task"):
        AgentDataset([])
    with pytest.raises(TypeError, match="sequence of tasks"):
        AgentDataset({"q": 1})  # type: ignore[arg-type]
    (tmp_path / "t.csv").write_text("q\n1\n")
    with pytest.raises(ValueError, match=r"use \.parquet, \.json or \.jsonl"):
        LoadedDataset(tmp_path / "t.csv")
    (tmp_path / "o.json").write_text('{"q": 1}')
    with pytest.raises(ValueError, match="JSON list"):
        LoadedDataset(tmp_path / "o.json")


# ---------------------------------------------------------------------------------------------------------------
# rollout -> samples -> batch


def _triplet(prompt: List[int], response: List[int], logprobs: Any = None, agent: Any = None) -> Triplet:
    response_part: Dict[str, Any] = {"token_ids": response}
    if logprobs is not None:
        response_part["logprobs"] = logprobs
    return Triplet(prompt={"token_ids": prompt}, response=response_part, metadata={"agent_name": agent})


def test_transition_level_makes_one_sample_per_call_with_its_exact_tokens() -> None:
    calls = [_triplet([1, 2, 3], [4, 5], [-0.1, -0.2]), _triplet([1, 2, 3, 4, 5, 9], [6])]
    samples, stats = aggregate_rollout(calls, rollout_id="ro-1", uid="g", reward=0.5)
    assert [(s.prompt_ids, s.response_ids, s.response_mask) for s in samples] == [
        ([1, 2, 3], [4, 5], [1, 1]),
        ([1, 2, 3, 4, 5, 9], [6], [1]),
    ]
    assert samples[0].logprobs == [-0.1, -0.2] and samples[1].logprobs is None
    assert all(s.reward == 0.5 and s.uid == "g" and s.rollout_id == "ro-1" for s in samples)
    assert stats.calls == 2 and stats.mismatches == 0


def test_trajectory_level_joins_calls_and_masks_the_tokens_between_them() -> None:
    calls = [
        _triplet([1, 2, 3], [4, 5], [-0.1, -0.2]),
        _triplet([1, 2, 3, 4, 5, 7, 8], [6], [-0.3]),  # 7, 8: a tool result the model did not produce
    ]
    samples, stats = aggregate_rollout(calls, rollout_id="ro-1", uid="g", reward=1.0, level="trajectory")
    assert len(samples) == 1
    sample = samples[0]
    assert sample.prompt_ids == [1, 2, 3]
    assert sample.response_ids == [4, 5, 7, 8, 6] and sample.response_mask == [1, 1, 0, 0, 1]
    assert sample.logprobs == [-0.1, -0.2, 0.0, 0.0, -0.3]
    assert stats.mismatches == 0


def test_trajectory_mismatch_starts_a_new_sample_and_is_recorded_when_debugging() -> None:
    calls = [_triplet([1, 2], [3]), _triplet([1, 9, 3, 4], [5])]  # re-tokenized differently: 9 instead of 2
    samples, stats = aggregate_rollout(calls, rollout_id="ro-1", uid="g", reward=0.0, level="trajectory", debug=True)
    assert [s.prompt_ids for s in samples] == [[1, 2], [1, 9, 3, 4]]
    assert stats.mismatches == 1 and stats.mismatch_cases == [
        {"rollout_id": "ro-1", "context": [1, 2, 3], "prompt": [1, 9, 3, 4]}
    ]


def test_calls_without_tokens_or_of_other_agents_are_skipped_and_long_ones_dropped_or_cut() -> None:
    calls = [
        Triplet(prompt={}, response={"token_ids": [1]}, metadata={"agent_name": "writer"}),  # no prompt ids
        _triplet([1], [2], agent="critic"),
        _triplet(list(range(10)), [1, 2], agent="writer"),  # prompt too long
        _triplet([1], [2, 3, 4, 5], [-1.0, -1.0, -1.0, -1.0], agent="writer"),  # response cut to 3
    ]
    samples, stats = aggregate_rollout(
        calls, rollout_id="r", uid="g", reward=1.0, agent_match="writ", max_prompt_length=5, max_response_length=3
    )
    assert [(s.prompt_ids, s.response_ids, s.logprobs) for s in samples] == [([1], [2, 3, 4], [-1.0, -1.0, -1.0])]
    assert (stats.calls_without_tokens, stats.calls_of_other_agents) == (1, 1)
    assert (stats.prompts_too_long, stats.responses_cut) == (1, 1)


def test_batch_pads_prompts_left_and_responses_right_with_the_reward_on_the_last_token() -> None:
    calls = [_triplet([1, 2, 3], [4, 5], [-0.5, -0.25]), _triplet([1, 2, 3, 4, 5, 7], [6], [-1.0])]
    joined, _ = aggregate_rollout(calls, rollout_id="r1", uid="g1", reward=1.0, level="trajectory")
    single, _ = aggregate_rollout([_triplet([8], [9], [-2.0])], rollout_id="r2", uid="g2", reward=-1.0)
    tensors, non_tensors = build_batch(joined + single, max_prompt_length=4, max_response_length=5, pad_token_id=0)
    assert tensors["prompts"].tolist() == [[0, 1, 2, 3], [0, 0, 0, 8]]
    assert tensors["responses"].tolist() == [[4, 5, 7, 6, 0], [9, 0, 0, 0, 0]]
    assert tensors["response_mask"].tolist() == [[1, 1, 0, 1, 0], [1, 0, 0, 0, 0]]
    assert tensors["attention_mask"].tolist() == [[0, 1, 1, 1, 1, 1, 1, 1, 0], [0, 0, 0, 1, 1, 0, 0, 0, 0]]
    assert tensors["input_ids"].tolist() == [[0, 1, 2, 3, 4, 5, 7, 6, 0], [0, 0, 0, 8, 9, 0, 0, 0, 0]]
    assert tensors["position_ids"].tolist() == [[0, 0, 1, 2, 3, 4, 5, 6, 6], [0, 0, 0, 0, 1, 1, 1, 1, 1]]
    assert tensors["token_level_scores"].tolist() == [[0, 0, 0, 1.0, 0], [-1.0, 0, 0, 0, 0]]
    assert tensors["rollout_log_probs"].tolist() == [[-0.5, -0.25, 0, -1.0, 0], [-2.0, 0, 0, 0, 0]]
    assert list(non_tensors["uid"]) == ["g1", "g2"] and list(non_tensors["rollout_id"]) == ["r1", "r2"]

    without, _ = aggregate_rollout([_triplet([8], [9])], rollout_id="r3", uid="g3", reward=0.0)
    assert "rollout_log_probs" not in build_batch(joined + without, 4, 5, 0)[0]


def test_batch_refuses_empty_or_oversized_samples() -> None:
    with pytest.raises(ValueError, match="no training samples"):
        build_batch([], 4, 4, 0)
    samples, _ = aggregate_rollout([_triplet([1, 2, 3], [4])], rollout_id="r", uid="g", reward=0.0)
    with pytest.raises(ValueError, match="3 prompt and 1 response tokens"):
        build_batch(samples, 2, 4, 0)


def test_trim_to_multiple_keeps_a_multiple_of_the_ranks() -> None:
    samples, _ = aggregate_rollout([_triplet([i], [i]) for i in range(1, 8)], rollout_id="r", uid="g", reward=0.0)
    kept = trim_to_multiple(samples, 3, seed=1)
    assert len(kept) == 6 and all(s in samples for s in kept)
    assert trim_to_multiple(samples, 1) == samples
    with pytest.raises(ValueError, match="at least 8"):
        trim_to_multiple(samples, 8)


# ---------------------------------------------------------------------------------------------------------------
# the daemon against a real store, runners and a vLLM stand-in behind the gateway


class TwoTurnAgent(agl.LitAgent[Dict[str, Any]]):
    """Asks the question, then a follow-up in the same conversation; reward = the task's ``score``."""

    def rollout(self, task: Dict[str, Any], resources: agl.NamedResources, rollout: agl.Rollout) -> float:
        import openai

        llm = resources["main_llm"]
        assert isinstance(llm, agl.LLM)
        attempt = rollout.attempt.attempt_id if isinstance(rollout, agl.AttemptedRollout) else None
        client = openai.OpenAI(base_url=llm.get_base_url(rollout.rollout_id, attempt), api_key="x", max_retries=0)
        messages: List[Dict[str, Any]] = [{"role": "user", "content": task["question"]}]
        first = client.chat.completions.create(model=llm.model, messages=messages, max_tokens=40)  # type: ignore[arg-type]
        messages += [
            {"role": "assistant", "content": first.choices[0].message.content},
            {"role": "user", "content": "42"},
        ]
        client.chat.completions.create(model=llm.model, messages=messages, max_tokens=40)  # type: ignore[arg-type]
        return float(task["score"])


@pytest.fixture(scope="module")
def vllm_stand_in() -> Iterator[Any]:
    with stand_in_server() as server:
        yield server


@pytest.fixture
def runners(tmp_path: Path) -> Iterator[Any]:
    """A store and a runner thread serving it with :class:`TwoTurnAgent` (a tracer records one rollout at a time)."""
    store = SqliteLightningStore(tmp_path / "store.db")
    event = ThreadingEvent()
    threads = []
    for worker_id in range(1):
        runner = agl.LitAgentRunner(agl.OtelTracer(), poll_interval=0.05, heartbeat_interval=0)

        def serve(runner: Any = runner, worker_id: int = worker_id) -> None:
            with runner.run_context(agent=TwoTurnAgent(), store=store, worker_id=worker_id):
                asyncio.run(runner.iter(event=event))

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        threads.append(thread)
    yield store
    event.set()
    for thread in threads:
        thread.join(15)


def _daemon(store: Any, **kwargs: Any) -> AgentModeDaemon:
    options: Dict[str, Any] = {
        "adapter": agl.LlmProxyTraceToTriplet(),
        "train_rollout_n": 2,
        "max_prompt_length": 64,
        "max_response_length": 48,
        "rollout_timeout": 60,
    }
    options.update(kwargs)
    return AgentModeDaemon(store, **options)


def _address(server: Any) -> str:
    return server.root_url.removeprefix("http://")


@pytest.mark.parametrize("level", ["transition", "trajectory"])
def test_the_daemon_builds_verls_batch_from_runner_rollouts_with_the_engines_exact_tokens(
    vllm_stand_in: Any, runners: Any, level: str
) -> None:
    daemon = _daemon(runners, level=level)
    try:
        tasks = [{"question": "2+2", "score": 1.0}, {"question": "7*6", "score": 0.25}]
        daemon.set_up_data_and_server(tasks, [_address(vllm_stand_in)])
        assert daemon.run_until_all_finished() == {"succeeded": 4}
        batch, metrics = daemon.get_train_data_batch()
    finally:
        daemon.close()

    from verl.protocol import DataProto

    assert isinstance(batch, DataProto)
    assert metrics["agent_mode/rollouts"] == 4 and metrics["agent_mode/calls"] == 8
    assert metrics["agent_mode/reward_mean"] == pytest.approx((1.0 + 1.0 + 0.25 + 0.25) / 4)
    rows = len(batch)
    assert rows == (8 if level == "transition" else 4)
    uids = list(batch.non_tensor_batch["uid"])
    assert len(set(uids)) == 2 and all(uids.count(u) == rows // 2 for u in uids)  # one group per task
    for row in range(rows):
        prompt = [
            t
            for t, m in zip(
                batch.batch["prompts"][row].tolist(), batch.batch["attention_mask"][row][:64].tolist(), strict=True
            )
            if m
        ]
        response_len = int(batch.batch["attention_mask"][row][64:].sum())
        response = batch.batch["responses"][row][:response_len].tolist()
        mask = batch.batch["response_mask"][row][:response_len].tolist()
        text = "".join(chr(t) for t in prompt)
        question = text.split("<user>")[1].split("<assistant>")[0]
        first_prompt, first_answer = f"<user>{question}<assistant>", f"echo: {question}"
        follow_up = "<user>42<assistant>"  # the turn the model did not produce
        if level == "trajectory":
            assert text == first_prompt
            assert response == _codes(first_answer + follow_up + "echo: 42")
            assert mask == [1] * len(first_answer) + [0] * len(follow_up) + [1] * len("echo: 42")
        elif text == first_prompt:
            assert response == _codes(first_answer) and mask == [1] * len(first_answer)
        else:
            assert text == first_prompt + first_answer + follow_up
            assert response == _codes("echo: 42") and mask == [1] * len("echo: 42")
        score = 1.0 if question == "2+2" else 0.25
        scores = batch.batch["token_level_scores"][row].tolist()
        assert scores[response_len - 1] == score and sum(scores) == score
        assert batch.batch["rollout_log_probs"][row][:response_len].tolist() == [-0.5 if m else 0.0 for m in mask]


def test_rollouts_not_finished_in_time_are_cancelled_and_trained_as_failed(vllm_stand_in: Any, tmp_path: Path) -> None:
    store = SqliteLightningStore(tmp_path / "store.db")  # no runner serves it
    daemon = _daemon(store, rollout_timeout=0.5, train_rollout_n=1, reward_fillna_value=-1.0)
    try:
        daemon.set_up_data_and_server([{"question": "late", "score": 1.0}], [_address(vllm_stand_in)])
        assert daemon.run_until_all_finished() == {"cancelled": 1}
        with pytest.raises(ValueError, match="no training samples"):
            daemon.get_train_data_batch()
        assert daemon.get_test_metrics()["val/reward"] == -1.0
    finally:
        daemon.close()
        asyncio.run(store.close())


def test_the_daemon_refuses_empty_steps_and_unknown_levels(tmp_path: Path) -> None:
    store = SqliteLightningStore(tmp_path / "store.db")
    with pytest.raises(ValueError, match=r"trace_aggregator\.level"):
        AgentModeDaemon(store, adapter=agl.LlmProxyTraceToTriplet(), level="step")  # type: ignore[arg-type]
    daemon = AgentModeDaemon(store, adapter=agl.LlmProxyTraceToTriplet())
    try:
        with pytest.raises(ValueError, match="no tasks"):
            daemon.set_up_data_and_server([], ["127.0.0.1:1"])
        with pytest.raises(ValueError, match="no vLLM server address"):
            daemon.set_up_data_and_server([{"q": 1}], [])
    finally:
        daemon.close()
        asyncio.run(store.close())
