"""A tiny word-level chat model and the wiring that trains it through the full stack (no download).

The model is a randomly initialised 2-layer Llama over a 9-word vocabulary with small initial weights, so its first
answers are close to uniform. Everything :func:`fit` runs is real: the store, a runner, the agent's OpenAI SDK calls,
HTTP on 127.0.0.1, the gateway recording token ids and log-probs, the in-process engine and the trainer.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional, Sequence

import torch

import agentbolt as agl

WORDS = ["<pad>", "<|im_start|>", "<|im_end|>", "user", "assistant", "ping", "pong", "yes", "no"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|> {{ m['role'] }} {{ m['content'] }} <|im_end|> {% endfor %}"
    "{% if add_generation_prompt %}<|im_start|> assistant {% endif %}"
)


def build_word_model(path: Path) -> Path:
    """Save a random Llama whose tokenizer knows exactly the 9 words above to ``path``."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    backend = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(WORDS)}, unk_token="<pad>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token="<pad>",
        eos_token="<|im_end|>",
        additional_special_tokens=["<|im_start|>"],
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    config = LlamaConfig(
        vocab_size=len(WORDS),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        initializer_range=0.02,
        tie_word_embeddings=False,
        pad_token_id=0,
        bos_token_id=None,
        eos_token_id=2,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


async def ask(llm: agl.LLM, prompt: str, seed: Optional[int] = None, agent_name: Optional[str] = None) -> str:
    """One chat call of one token to the served policy (sampled with ``seed`` when given); the stripped answer.

    ``agent_name`` is sent in the gateway's agent-name header, so the call's span names its agent.
    """
    from openai import AsyncOpenAI

    from agentbolt.semconv import LLM_AGENT_NAME_HEADER

    headers = {LLM_AGENT_NAME_HEADER: agent_name} if agent_name else None
    async with AsyncOpenAI(base_url=llm.endpoint, api_key="unused", max_retries=0, default_headers=headers) as client:
        response = await client.chat.completions.create(
            model=llm.model,
            messages=[{"role": "user", "content": prompt}],
            max_tokens=1,
            seed=seed,
            **llm.sampling_parameters,
        )
    return (response.choices[0].message.content or "").strip()


def fit(
    algorithm: agl.Algorithm,
    agent: Any,
    train: Sequence[Any],
    val: Optional[Sequence[Any]] = None,
    store: Optional[agl.LightningStore] = None,
) -> None:
    """Train ``agent`` with ``algorithm`` through ``Trainer.fit``: one runner, rollouts in order, an in-memory store
    unless ``store`` is given."""
    tracer = agl.OtelTracer()
    trainer = agl.Trainer(
        algorithm=algorithm,
        store=store if store is not None else agl.InMemoryLightningStore(),
        strategy=agl.SharedMemoryExecutionStrategy(n_runners=1, main_thread="algorithm"),
        tracer=tracer,
        runner=agl.LitAgentRunner(tracer=tracer, poll_interval=0.05),
    )
    trainer.fit(agent, train_dataset=list(train), val_dataset=None if val is None else list(val))


class PingAgent(agl.LitAgent[dict]):
    """Asks the task's prompt with one-token answers; reward 1 when the answer is the task's. Each call is seeded by
    its rank (one runner takes the rollouts in order), so a run is deterministic; ``agent_name`` names the calls."""

    def __init__(self, agent_name: Optional[str] = None) -> None:
        super().__init__()
        self.calls = 0
        self.agent_name = agent_name

    async def rollout_async(self, task: dict, resources: agl.NamedResources, rollout: agl.Rollout) -> float:
        llm = resources["main_llm"]
        assert isinstance(llm, agl.LLM)
        attempt = rollout.attempt.attempt_id if isinstance(rollout, agl.AttemptedRollout) else None
        bound = agl.LLM(
            endpoint=llm.get_base_url(rollout.rollout_id, attempt),
            model=llm.model,
            sampling_parameters=llm.sampling_parameters,
        )
        self.calls += 1
        answer = await ask(bound, task["prompt"], seed=self.calls, agent_name=self.agent_name)
        return 1.0 if answer == task["answer"] else 0.0


ping_agent = PingAgent()
"""The agent configuration files name (``support.word_model:ping_agent``)."""
