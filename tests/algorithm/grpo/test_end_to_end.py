"""Full stack: store, runners, LLM gateway, in-process engine and GRPO teach a tiny random model a toy task.

Task: the user says ``ping`` and the answer must be ``yes``. The model is a randomly initialised 2-layer Llama over
a 9-word vocabulary with small initial weights, so its first answers are close to uniform (chance is about 1 in 9)
and it must learn from the rewards alone. Everything is real: HTTP on 127.0.0.1, the OpenAI SDK in the agent, the gateway recording token
ids and log-probs, the store, the runners and the trainer.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

import agentbolt as agl
from agentbolt.algorithm.grpo.algorithm import GRPO

WORDS = ["<pad>", "<|im_start|>", "<|im_end|>", "user", "assistant", "ping", "pong", "yes", "no"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|> {{ m['role'] }} {{ m['content'] }} <|im_end|> {% endfor %}"
    "{% if add_generation_prompt %}<|im_start|> assistant {% endif %}"
)
TASKS = [{"prompt": "ping", "answer": "yes"}]


def build_word_model(path: Path) -> Path:
    """A random Llama whose tokenizer knows exactly the 9 words above (no download)."""
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


@agl.rollout
async def toy_agent(task: dict, llm: agl.LLM) -> float:
    from openai import AsyncOpenAI

    async with AsyncOpenAI(base_url=llm.endpoint, api_key="unused", max_retries=0) as client:
        response = await client.chat.completions.create(
            model=llm.model,
            messages=[{"role": "user", "content": task["prompt"]}],
            max_tokens=1,
            **llm.sampling_parameters,
        )
    answer = (response.choices[0].message.content or "").strip()
    return 1.0 if answer == task["answer"] else 0.0


def test_grpo_learns_the_toy_task_through_the_full_stack(tmp_path: Path) -> None:
    model_dir = build_word_model(tmp_path / "word-llama")
    algorithm = GRPO(
        model=str(model_dir),
        served_model_name="word-llama",
        finetune="full",
        batch_size=1,
        group_size=16,
        max_steps=10,
        learning_rate=2e-2,
        micro_batch_size=16,
        val_interval=5,
        checkpoint_dir=str(tmp_path / "ckpt"),
        checkpoint_interval=5,
        log_dir=str(tmp_path / "logs"),
        console=False,
        rollout_timeout=120,
        seed=0,
    )
    tracer = agl.OtelTracer()
    trainer = agl.Trainer(
        algorithm=algorithm,
        store=agl.InMemoryLightningStore(),
        strategy=agl.SharedMemoryExecutionStrategy(n_runners=1, main_thread="algorithm"),
        tracer=tracer,
        runner=agl.LitAgentRunner(tracer=tracer, poll_interval=0.05),
    )
    trainer.fit(toy_agent, train_dataset=TASKS, val_dataset=TASKS)

    history = algorithm.history
    train = [r for r in history if "train/reward_mean" in r]
    assert len(train) == 10 and history[0]["step"] == 0 and "val/accuracy" in history[0]
    # Starts near chance, ends above 0.9.
    assert train[0]["train/reward_mean"] < 0.5
    assert sum(r["train/reward_mean"] for r in train[-3:]) / 3 > 0.9
    assert history[-1]["val/accuracy"] == 1.0
    # Every rollout produced one trained sample with the engine's log-probs; the first update was on-policy.
    for record in train:
        counts = {k: v for k, v in record.items() if k.startswith(("rollouts/", "samples/"))}
        assert counts["rollouts/failed"] == 0 and counts["samples/calls"] == 16, counts
        assert counts["samples/missing_tokens"] == 0 and counts["samples/missing_logprobs"] == 0, counts
    first_update = next(r for r in train if "update/loss" in r)
    assert first_update["update/first_minibatch_ratio_max_dev"] < 1e-4
    # Artifacts: metrics log, reward curve, checkpoints.
    lines = [json.loads(line) for line in (tmp_path / "logs" / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == list(range(11))
    assert (tmp_path / "logs" / "reward_curve.png").stat().st_size > 0
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["step_000005", "step_000010"]
