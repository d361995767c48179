"""Full Flow-GRPO rollouts through the real stack: inference server, LLM gateway, store, runner, tracer, adapters.

Both LLM resources are gateway resources (``planner`` and ``fixed`` model names on the same tiny model), so every
role's call is recorded twice: by the gateway (tagged from the ``x-agentbolt-agent-name`` header) and by the
tracer's OpenAI instrumentation (inside the role's agent span). ``agent_match="planner"`` must select exactly the
planner's calls from either record, each carrying the trajectory reward.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, Dict, Iterator, List, Sequence

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from support.models import serving

import agentbolt as agl
from agentbolt.adapter import LlmProxyTraceToTriplet, TracerTraceToTriplet
from agentbolt.algorithm.grpo.samples import triplets_to_samples
from agentbolt.emitter import find_final_reward, get_object_value
from agentbolt.models.tiny import create_tiny_model
from agentbolt.semconv import LLM_AGENT_NAME
from agentbolt.serving.server import InferenceServer
from agentbolt.store.sqlite import SqliteLightningStore
from agentbolt.types import Span
from examples.flow_grpo import FlowGRPOAgent, FlowSolver, SolverConfig
from examples.flow_grpo.evaluation import SOLVE_RECORD_KIND

FAST_RUNNER = {"type": "agentbolt.runner.LitAgentRunner", "poll_interval": 0.1, "heartbeat_interval": 1.0}
TASK: Dict[str, Any] = {
    "id": 0,
    "question": "What is 12 * 12?",
    "result": "144",
    "source": "arithmetic",
    "extra_info": {"ground_truth": ["144"], "idx": 0},
}
# Greedy decoding; the random model's answers are noise, so a small budget keeps the test fast.
SAMPLING = {"temperature": 0.0, "max_tokens": 16}
# One JSON object valid for every role: analyzer, planner (the generalist tool), executor, verifier (continue),
# solution generator (the right answer).
UNIVERSAL = (
    '{"summary": "math", "sub_goal": "12*12", "tool_name": "generalist", "tool_input": "12*12", '
    '"stop": false, "answer": "144"}'
)


@pytest.fixture(scope="module")
def random_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InferenceServer]:
    # The tiny tokenizer spends about one token per character: the prompts with their worked examples need more
    # than the default 2048 positions.
    model = create_tiny_model(tmp_path_factory.mktemp("tiny-random"), seed=0, max_position_embeddings=8192)
    with serving(model) as server:
        yield server


def build_answering_model(path: Path, answer: str) -> Path:
    """A tiny Llama that answers ``answer`` to any chat prompt under greedy decoding.

    A randomly initialised model never writes valid JSON, so the executor and the tools would never run. This one
    has ``answer`` as one added token and weights set by hand: attention and MLP outputs are zero, so the next token
    depends only on the current one; the generation prompt's last token leads to the answer token, which leads to
    end-of-turn. It is still served, tokenized and recorded like any model.
    """
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    create_tiny_model(path, seed=0)
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.add_tokens([answer])
    answer_id = tokenizer.convert_tokens_to_ids(answer)
    generation_prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False
    )
    last_prompt_id = tokenizer(generation_prompt, add_special_tokens=False).input_ids[-1]
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=8192,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        embeddings, head = model.model.embed_tokens.weight, model.lm_head.weight
        embeddings.zero_()
        head.zero_()
        embeddings[last_prompt_id, 0] = 1.0
        embeddings[answer_id, 1] = 1.0
        head[answer_id, 0] = 10.0
        head[tokenizer.eos_token_id, 1] = 10.0
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def _run_rollout(server: InferenceServer, tmp_path: Path, max_turns: int) -> List[Span]:
    store = SqliteLightningStore(str(tmp_path / "store.db"))
    model_list = [
        {"model_name": name, "litellm_params": {"model": "agentbolt/tiny", "api_base": server.base_url}}
        for name in ("planner", "fixed")
    ]
    proxy = agl.LLMProxy(model_list=model_list, store=store, launch_mode="thread")
    asyncio.run(proxy.start())
    try:
        trainer = agl.Trainer(
            n_runners=1,
            strategy="shm",
            store=store,
            runner=FAST_RUNNER,
            algorithm=agl.Baseline(polling_interval=0.1, span_verbosity="none"),
            initial_resources={
                "planner_llm": proxy.as_resource(model="planner", sampling_parameters=SAMPLING),
                "fixed_llm": proxy.as_resource(model="fixed", sampling_parameters=SAMPLING),
            },
        )
        trainer.dev(FlowGRPOAgent(solver=FlowSolver(SolverConfig(max_turns=max_turns))), [TASK])
    finally:
        asyncio.run(proxy.stop())

    async def collect() -> List[Span]:
        try:
            [rollout] = await store.query_rollouts()
            assert rollout.status == "succeeded"
            return list(await store.query_spans(rollout.rollout_id, "latest"))
        finally:
            await store.close()

    return asyncio.run(collect())


def _roles_by_record(spans: Sequence[Span]) -> Dict[str, List[str]]:
    gateway = [s.attributes.get(LLM_AGENT_NAME) for s in spans if s.name == "agentbolt.llm_call"]
    agent_spans = [s.attributes.get("agent.name") for s in spans if s.attributes.get("agent.name")]
    return {"gateway": [str(r) for r in gateway], "agent_spans": [str(r) for r in agent_spans]}


def _check_planner_triplets(spans: Sequence[Span], planner_calls: int, reward: float) -> None:
    assert find_final_reward(spans) == reward
    for adapter in (LlmProxyTraceToTriplet(agent_match="planner"), TracerTraceToTriplet(agent_match="planner")):
        triplets = adapter.adapt(spans)
        assert len(triplets) == planner_calls, type(adapter).__name__
        for triplet in triplets:
            assert triplet.metadata["agent_name"] == "planner"
            assert triplet.reward == reward
            assert triplet.prompt["token_ids"] and triplet.response["token_ids"]
    # Without agent_match every role's call is a triplet.
    assert len(LlmProxyTraceToTriplet().adapt(spans)) == sum(s.name == "agentbolt.llm_call" for s in spans)


def test_rollout_with_a_random_tiny_model_trains_only_planner_turns(
    random_server: InferenceServer, tmp_path: Path
) -> None:
    # A random model never writes a valid step: each of the 2 turns records an invalid planner call, then the
    # verifier; the executor never runs. The answer is noise, so the reward is 0 on every planner turn.
    spans = _run_rollout(random_server, tmp_path, max_turns=2)
    roles = _roles_by_record(spans)
    expected = ["query_analyzer", "planner", "verifier", "planner", "verifier", "solution_generator"]
    assert roles["gateway"] == expected
    assert roles["agent_spans"] == expected
    assert sum(s.name == "openai.chat.completion" for s in spans) == len(expected)
    _check_planner_triplets(spans, planner_calls=2, reward=0.0)


def test_three_turn_rollout_trains_three_planner_samples_on_the_final_reward(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> None:
    # The answering model plays every role: the planner picks the generalist tool three times (the verifier keeps
    # saying "continue"), and the solution generator gives the right answer.
    model_dir = build_answering_model(tmp_path_factory.mktemp("tiny-answering"), UNIVERSAL)
    with serving(model_dir) as server:
        spans = _run_rollout(server, tmp_path, max_turns=3)
    turn = ["planner", "executor", "generalist", "verifier"]
    expected = ["query_analyzer", *turn, *turn, *turn, "solution_generator"]
    roles = _roles_by_record(spans)
    assert roles["gateway"] == expected
    assert roles["agent_spans"] == expected
    _check_planner_triplets(spans, planner_calls=3, reward=1.0)
    # What GRPO trains on (credit "final", agent_match "planner"): one sample per planner turn, each with the
    # trajectory's final reward, in the prompt that turn saw; the 10 fixed-role calls are excluded.
    samples, stats = triplets_to_samples(
        LlmProxyTraceToTriplet().adapt(spans),
        rollout_id="r",
        group_id="g",
        final_reward=find_final_reward(spans) or 0.0,
        credit="final",
        agent_match="planner",
    )
    assert [s.reward for s in samples] == [1.0, 1.0, 1.0]
    assert {s.agent_name for s in samples} == {"planner"} and stats.other_agents == len(expected) - 3
    # Each later turn's prompt holds the earlier turns' tool results: every turn is trained in its own state.
    assert len(samples[0].prompt_ids) < len(samples[1].prompt_ids) < len(samples[2].prompt_ids)
    # Token-level alignment: each sample's prompt ids are the chat template of that turn's own messages, exactly as
    # the engine tokenized them, and its response ids are the tokens the model sampled (the answer token, then
    # end-of-turn), not a re-tokenization of the answer text.
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    planner_triplets = LlmProxyTraceToTriplet(agent_match="planner").adapt(spans)
    sent = TracerTraceToTriplet(agent_match="planner").adapt(spans)  # the messages each planner call sent
    answer_id = tokenizer.convert_tokens_to_ids(UNIVERSAL)
    for sample, triplet in zip(samples, sent, strict=True):
        messages = [{"role": m["role"], "content": m["content"]} for m in triplet.prompt["raw_content"]]
        expected = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=True)["input_ids"]
        assert sample.prompt_ids == list(expected)
        assert sample.response_ids[0] == answer_id
        assert sample.response_ids[-1] == tokenizer.eos_token_id and len(sample.response_ids) <= 2
    assert [s.prompt_ids for s in samples] == [t.prompt["token_ids"] for t in planner_triplets]
    # The solve record for evaluation is in the trace too.
    records = [get_object_value(s) for s in spans if s.attributes.get("flow_grpo.kind") == SOLVE_RECORD_KIND]
    assert [(r["planner_turns"], r["tool_calls"], r["stop_reason"], r["reward"]) for r in records] == [
        (3, 3, "max_turns", 1.0)
    ]
