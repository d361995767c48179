"""How far int8 activations (``agentbolt serve --int8-activations``) move the embedded model's next-token distribution.

The reference is the model's own GGUF blocks with float32 activations, which compute what the float32 model
converted from the file computes (tested in tests/serving/test_quantized.py). For each prompt it decodes
``--tokens`` greedy tokens with the reference, then feeds the same tokens (teacher forcing) to each variant and
compares the next-token distributions step by step, prefill included:

* ``int8``: the same blocks, each product's inputs quantized to int8 per block of 32 (the serving option);
* ``bfloat16``: the float model in bfloat16 through the same lean forward, the dtype training and default float
  serving use: the yardstick for what a rounding change costs.

Per variant: top-1 agreement with the reference, mean KL(reference || variant) in nats, mean and max absolute change
of the log-prob of the reference's token, the max absolute change of any logit, the mean number of greedy tokens
decoded identically before the first difference, and the prompts whose whole greedy continuation is identical.
Prints one JSON object and writes it to a result file.

Usage::

    python benchmarks/int8_accuracy.py [--prompts 16] [--tokens 48] [--threads 2]
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, Dict, List, Tuple

from result_files import RunRecord, add_result_options

PROMPTS = [
    "What is 17 + 25?",
    "Name the capital of France.",
    "Write a haiku about rain.",
    "Explain what a linked list is in one sentence.",
    "What is the boiling point of water at sea level?",
    "Translate 'good morning' into Spanish.",
    "List three primary colors.",
    "Who wrote Romeo and Juliet?",
    "What is 9 times 8?",
    "Give one tip for staying focused while studying.",
    "What does CPU stand for?",
    "Describe the moon in two sentences.",
    "Write a SQL query that counts the rows of a table named users.",
    "What is the square root of 144?",
    "Why is the sky blue?",
    "Suggest a name for a pet turtle.",
]


def _decode(forward: Any, prompt: List[int], tokens: List[int], steps: int) -> Tuple[List[int], List[Any]]:
    """Run ``steps`` decoding steps after ``prompt``: feed ``tokens`` (teacher forcing) or, past their end, the
    greedy choice. Returns the tokens fed or chosen and the float32 log-probs ``[vocab]`` before each."""
    import torch

    from agentbolt.serving.kv_cache import KVCache

    cache = KVCache()
    ids = torch.tensor([prompt])
    logits = forward(ids, torch.arange(len(prompt)).unsqueeze(0), torch.ones_like(ids), cache)[0]
    chosen: List[int] = []
    logprobs: List[Any] = []
    for index in range(steps):
        logprobs.append(torch.log_softmax(logits.float(), dim=-1))
        chosen.append(tokens[index] if index < len(tokens) else int(logits.argmax()))
        if index + 1 < steps:
            position = len(prompt) + index
            mask = torch.ones(1, position + 1, dtype=torch.long)
            logits = forward(torch.tensor([[chosen[-1]]]), torch.tensor([[position]]), mask, cache)[0]
    return chosen, logprobs


def _compare(reference: List[Any], variant: List[Any], tokens: List[int]) -> Dict[str, float]:
    """Per-step gaps between two sequences of log-probs over the same tokens (sums, and maxima)."""
    agree = kl = token_gap = max_token_gap = logit_gap = 0.0
    first_difference = len(tokens)
    for step, (ref, var, token) in enumerate(zip(reference, variant, tokens, strict=True)):
        same = int(ref.argmax()) == int(var.argmax())
        agree += float(same)
        if not same:
            first_difference = min(first_difference, step)
        kl += float((ref.exp() * (ref - var)).sum())
        gap = abs(float(ref[token] - var[token]))
        token_gap += gap
        max_token_gap = max(max_token_gap, gap)
        # log-softmax shifts every logit alike: a logit's change is that of the centred log-probs
        logit_gap = max(logit_gap, float(((ref - ref.mean()) - (var - var.mean())).abs().max()))
    return {
        "top1_agreement": agree,
        "mean_kl_nats": kl,
        "mean_abs_token_logprob_change": token_gap,
        "max_abs_token_logprob_change": max_token_gap,
        "max_abs_logit_change": logit_gap,
        "identical_greedy_prefix": float(first_difference),
    }


def main() -> None:
    record = RunRecord.start(__file__)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--prompts", type=int, default=len(PROMPTS), help=f"at most {len(PROMPTS)}")
    parser.add_argument("--tokens", type=int, default=48, help="greedy tokens decoded per prompt")
    parser.add_argument("--threads", type=int, default=2)
    add_result_options(parser)
    args = parser.parse_args()
    if not 1 <= args.prompts <= len(PROMPTS) or args.tokens < 1:
        parser.error(f"--prompts must be 1..{len(PROMPTS)} and --tokens at least 1")

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from agentbolt.models import resolve_model
    from agentbolt.serving.fast_forward import FastForward
    from agentbolt.serving.quantized import gguf_source, load_gguf_blocks

    torch.set_num_threads(args.threads)
    model_dir = resolve_model(args.model, progress=lambda message: print(message, file=sys.stderr)).path
    source = gguf_source(model_dir)
    if source is None:
        raise SystemExit(f"{model_dir} was not converted from a GGUF file: there are no blocks to compare")
    config = AutoConfig.from_pretrained(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(config)
    exact = FastForward(skeleton, blocks=load_gguf_blocks(source, config))
    int8_blocks = load_gguf_blocks(source, config)
    int8_blocks.use_int8_activations()
    variants = {
        "int8": FastForward(skeleton, blocks=int8_blocks),
        "bfloat16": FastForward(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).eval()),
    }
    sums: Dict[str, Dict[str, float]] = {name: {} for name in variants}
    identical = {name: 0 for name in variants}
    prompts = PROMPTS[: args.prompts]
    with torch.inference_mode():
        for text in prompts:
            chat = [{"role": "user", "content": text}]
            rendered = tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
            prompt = tokenizer.encode(rendered, add_special_tokens=False)
            tokens, reference = _decode(exact, prompt, [], args.tokens)
            for name, forward in variants.items():
                stats = _compare(reference, _decode(forward, prompt, tokens, args.tokens)[1], tokens)
                identical[name] += int(stats["identical_greedy_prefix"] == args.tokens)
                for key, value in stats.items():
                    previous = sums[name].get(key, 0.0)
                    sums[name][key] = max(previous, value) if key.startswith("max_") else previous + value
    steps = len(prompts) * args.tokens
    report_variants = {
        name: {
            **{
                key: round(value if key.startswith("max_") else value / steps, 6)
                for key, value in totals.items()
                if key != "identical_greedy_prefix"  # a per-prompt mean, not per step
            },
            "identical_greedy_prefix": round(totals["identical_greedy_prefix"] / len(prompts), 2),
            "prompts_with_identical_greedy_tokens": identical[name],
        }
        for name, totals in sums.items()
    }
    report = {
        "model": args.model,
        "reference": "GGUF blocks, float32 activations (= the float32 model)",
        "prompts": len(prompts),
        "tokens_per_prompt": args.tokens,
        "steps_per_variant": steps,
        "variants": report_variants,
    }
    record.finish(report, args)


if __name__ == "__main__":
    main()
