"""The Tinker bridge: real ``tinker.types`` values, the service behind the SDK's client interface replaced by a
stand-in on the tiny model (tinker_stand_in.py); the gateway, the chat server, the adapters and the loop are real."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List

import pytest
from support.servers import free_port, taken_port

pytest.importorskip("tinker")

import agentbolt as agl
from agentbolt.utils.server_launcher import pick_free_port
from examples.tinker.bridge import TinkerChatServer, TinkerGRPO, TracedRollout, group_advantages, rollout_datums
from examples.tinker.guess_number import extract_guess, play

from .scripted_chat import ScriptedChat
from .tinker_stand_in import ServiceClient


def triplet(prompt: List[int], response: List[int], logprobs: List[float]) -> agl.Triplet:
    return agl.Triplet(prompt={"token_ids": prompt}, response={"token_ids": response, "logprobs": logprobs})


def test_datums_align_targets_logprobs_and_advantages_with_the_sequence() -> None:
    rollouts = [
        TracedRollout("task-0", 1.0, [triplet([1, 2, 3], [4, 5], [-0.1, -0.2])]),
        TracedRollout("task-0", 0.0, [triplet([1, 2, 3], [6], [-0.3])]),
        TracedRollout("task-1", 1.0, [triplet([7, 8], [9], [-0.4])]),  # alone in its group: advantage 0
    ]
    assert group_advantages(rollouts) == [0.5, -0.5, 0.0]
    first, second = rollout_datums(rollouts)
    assert first.model_input.to_ints() == [1, 2, 3, 4]
    assert first.loss_fn_inputs["target_tokens"].data == [2, 3, 4, 5]
    assert first.loss_fn_inputs["logprobs"].data == pytest.approx([0.0, 0.0, -0.1, -0.2])
    assert first.loss_fn_inputs["advantages"].data == [0.0, 0.0, 0.5, 0.5]
    assert second.loss_fn_inputs["advantages"].data == [0.0, 0.0, -0.5]


def test_a_call_whose_logprobs_do_not_match_its_tokens_is_refused() -> None:
    rollouts = [TracedRollout("g", 1.0, [triplet([1], [2, 3], [-0.1])]), TracedRollout("g", 0.0, [])]
    with pytest.raises(ValueError, match="2 response tokens but 1 logprobs"):
        rollout_datums(rollouts)


def test_the_chat_server_samples_through_the_gateway_with_token_ids(tiny_model_dir: Path) -> None:
    async def scenario() -> Any:
        service = ServiceClient(tiny_model_dir)
        training = await service.create_lora_training_client(base_model="stand-in", rank=8)
        server = TinkerChatServer(await training.save_weights_and_get_sampling_client("s0"),
                                  training.get_tokenizer(), "tinker").start()  # fmt: skip
        store = agl.InMemoryLightningStore()
        proxy = agl.LLMProxy(port=pick_free_port("127.0.0.1"), model_list=[server.model_config()], store=store,
                             launch_mode="asyncio")  # fmt: skip
        await proxy.start()
        try:
            rollout = await store.start_rollout(input={})
            from openai import AsyncOpenAI

            url = proxy.as_resource().get_base_url(rollout.rollout_id, rollout.attempt.attempt_id)
            async with AsyncOpenAI(base_url=url, api_key="x") as client:
                reply = await client.chat.completions.create(
                    model="tinker", messages=[{"role": "user", "content": "hi"}], max_tokens=6
                )
            await proxy.flush()
            return reply, list(await store.query_spans(rollout.rollout_id)), training.get_tokenizer()
        finally:
            await proxy.stop()
            server.stop()

    reply, spans, tokenizer = asyncio.run(scenario())
    [triplet_] = agl.LlmProxyTraceToTriplet().adapt(spans)
    response_ids = triplet_.response["token_ids"]
    assert 0 < len(response_ids) <= 6 and len(triplet_.response["logprobs"]) == len(response_ids)
    assert tokenizer.decode(response_ids, skip_special_tokens=True) == reply.choices[0].message.content
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False
    )
    assert triplet_.prompt["token_ids"] == tokenizer.encode(rendered, add_special_tokens=False)


@agl.rollout
async def even_length_agent(task: Dict[str, Any], llm: agl.LLM) -> float:
    """A test agent whose reward varies between samples of a random model: 1.0 for a reply of even length."""
    from openai import AsyncOpenAI

    async with AsyncOpenAI(base_url=llm.endpoint, api_key="x") as client:
        reply = await client.chat.completions.create(
            model=llm.model, messages=[{"role": "user", "content": task["q"]}], max_tokens=5
        )
    return 1.0 if len(reply.choices[0].message.content or "") % 2 == 0 else 0.0


def test_the_loop_trains_through_forward_backward_and_optim_steps(tiny_model_dir: Path) -> None:
    service = ServiceClient(tiny_model_dir)
    algorithm = TinkerGRPO("Qwen/Qwen3-4B-Instruct-2507", service_client=service, lora_rank=8, group_size=4,
                           tasks_per_step=2, n_steps=2, learning_rate=1e-3)  # fmt: skip
    trainer = agl.Trainer(algorithm=algorithm, n_runners=2, port=free_port())
    trainer.fit(even_length_agent, train_dataset=[{"q": "a"}, {"q": "b"}], val_dataset=[{"q": "c"}])

    assert service.log.created == [{"base_model": "Qwen/Qwen3-4B-Instruct-2507", "rank": 8}]
    steps = [entry for entry in algorithm.history if "train_reward" in entry]
    assert [entry["step"] for entry in steps] == [1, 2]
    trained = [entry for entry in steps if entry["datums"] > 0]
    assert trained  # rewards of a random model vary within a group: at least one step has a signal
    assert len(service.log.forward_backward) == len(service.log.optim_steps) == len(trained)
    assert service.log.saved == ["step-0"] + [f"step-{entry['step']}" for entry in trained]
    assert [entry["step"] for entry in algorithm.history if "val_reward" in entry] == [0, 2]
    assert service.log.samples >= 2 * 4 * 2 + 2


def test_the_guess_number_agent_plays_with_feedback() -> None:
    async def game() -> float:
        from openai import AsyncOpenAI

        async with AsyncOpenAI(base_url=chat.base_url, api_key="x") as client:
            return await play(client, "scripted", secret=62)

    with ScriptedChat(["50", "75", "62"]) as chat:
        reward = asyncio.run(game())
    assert reward == 1.0
    assert chat.requests[1]["messages"][-1]["content"] == "Too low. Your guess?"
    assert chat.requests[2]["messages"][-1]["content"] == "Too high. Your guess?"
    assert [extract_guess(t) for t in ("42", "I guess 42", "", "42 or 43", "forty")] == [42, 42, None, None, None]


def run_training_command(base_url: str, *options: str, key: str = "tml-unused") -> subprocess.CompletedProcess[str]:
    """``python -m examples.tinker.train_guess_number`` with ``key`` and ``TINKER_BASE_URL=base_url`` (the timeout
    only guards the test run against a command that hangs)."""
    env = dict(os.environ, TINKER_API_KEY=key, TINKER_BASE_URL=base_url)
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])
    command = [sys.executable, "-m", "examples.tinker.train_guess_number", *options]
    return subprocess.run(command, cwd=env["PYTHONPATH"], env=env, capture_output=True, text=True, timeout=120)


def test_training_against_a_tinker_service_that_refuses_connections_exits_2_naming_the_address() -> None:
    base_url = f"http://127.0.0.1:{free_port()}"
    result = run_training_command(base_url)
    assert result.returncode == 2, result.stderr[-2000:]
    assert f"cannot reach the Tinker service at {base_url}/api/v1/healthz (ConnectError" in result.stderr
    assert "TINKER_BASE_URL" in result.stderr and "Traceback" not in result.stderr


def test_training_against_a_tinker_service_that_never_answers_exits_2_after_the_connect_timeout() -> None:
    with taken_port() as port:  # listening, never answering
        result = run_training_command(f"http://127.0.0.1:{port}", "--connect-timeout", "1")
    assert result.returncode == 2, result.stderr[-2000:]
    assert "(no answer within 1 s)" in result.stderr and "--connect-timeout" in result.stderr


def test_training_with_a_key_that_is_not_a_tinker_key_exits_2_before_any_connection() -> None:
    with taken_port() as port:  # listening, never answering: reaching it would take the whole connect timeout
        result = run_training_command(f"http://127.0.0.1:{port}", "--connect-timeout", "60", key="sk-openai-key")
    assert result.returncode == 2, result.stderr[-2000:]
    assert "TINKER_API_KEY is not a Tinker key" in result.stderr and "'tml-'" in result.stderr
    assert "Traceback" not in result.stderr
