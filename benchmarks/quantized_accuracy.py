"""How far block-quantized and bfloat16 serving move the logits from the float32 model's.

Teacher-forced decoding through the serving path (:class:`~agentbolt.serving.fast_forward.FastForward`: prefill the
prompt, then one decoding step per token of a fixed continuation, the fused kernels included) for every variant of
the same converted model, compared position by position with the float32 weights:

* ``gguf_blocks``: the model's own GGUF blocks (what ``agentbolt serve`` serves by default for the embedded model);
* ``q8_0`` / ``q4_1``: projections quantized at load from the float32 weights (``--quantization q8_0 / q4_1``);
* ``bfloat16``: the float weights rounded to bfloat16 (``--quantization none --dtype bfloat16``).

Reported per variant: max and mean absolute logit difference, mean KL(float32 || variant) in nats, and how often the
most likely token agrees. Prints JSON.

Usage:
    python benchmarks/quantized_accuracy.py [--model smollm2-135m-instruct] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from typing import Any, Dict, List

PROMPTS = [
    "What is the capital of France?",
    "Write a short story about a lighthouse.",
    "Explain what a hash table is in two sentences.",
    "List three prime numbers and add them up.",
]
CONTINUATION = " The answer takes a few sentences: first the facts, then an example, and finally a short summary."


def _logits_along(forward: Any, ids: List[int], prompt_length: int) -> Any:
    """Next-token logits at every position after the prompt: prefill, then one decoding step per token."""
    import torch

    from agentbolt.serving.kv_cache import KVCache

    cache = KVCache()
    tokens = torch.tensor([ids[:prompt_length]])
    positions = torch.arange(prompt_length).unsqueeze(0)
    mask = torch.ones_like(tokens)
    rows = [forward(tokens, positions, mask, cache)]
    for position in range(prompt_length, len(ids) - 1):
        mask = torch.ones(1, position + 1, dtype=torch.long)
        step = forward(torch.tensor([[ids[position]]]), torch.tensor([[position]]), mask, cache)
        rows.append(step)
    return torch.cat(rows).float()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agentbolt.models import resolve_model
    from agentbolt.serving.fast_forward import FastForward
    from agentbolt.serving.quantized import gguf_source, load_gguf_blocks, quantize_model

    torch.set_num_threads(args.threads)
    path = resolve_model(args.model).path
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    variants: Dict[str, Any] = {}
    source = gguf_source(path)
    if source is not None:
        variants["gguf_blocks"] = FastForward(model, blocks=load_gguf_blocks(source, model.config))
    variants["q8_0"] = FastForward(model, blocks=quantize_model(model, "q8_0"))
    variants["q4_1"] = FastForward(model, blocks=quantize_model(model, "q4_1"))
    reference = FastForward(model)
    bf16_model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).eval()
    variants["bfloat16"] = FastForward(bf16_model)

    started = time.perf_counter()
    sums: Dict[str, Dict[str, float]] = {name: {"max": 0.0, "abs": 0.0, "kl": 0.0, "agree": 0.0} for name in variants}
    positions = 0
    with torch.inference_mode():
        for prompt in PROMPTS:
            text = tokenizer.apply_chat_template(
                [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False
            )
            prompt_ids = tokenizer(text, add_special_tokens=False).input_ids
            ids = prompt_ids + tokenizer(CONTINUATION, add_special_tokens=False).input_ids
            expected = _logits_along(reference, ids, len(prompt_ids))
            expected_logp = torch.log_softmax(expected, dim=-1)
            positions += expected.shape[0]
            for name, forward in variants.items():
                got = _logits_along(forward, ids, len(prompt_ids))
                difference = (got - expected).abs()
                totals = sums[name]
                totals["max"] = max(totals["max"], float(difference.max()))
                totals["abs"] += float(difference.mean(dim=-1).sum())
                kl = (expected_logp.exp() * (expected_logp - torch.log_softmax(got, dim=-1))).sum(dim=-1)
                totals["kl"] += float(kl.sum())
                totals["agree"] += float((got.argmax(-1) == expected.argmax(-1)).sum())
    report = {
        "benchmark": "quantized_accuracy",
        "model": args.model,
        "reference": "float32 weights, same forward",
        "positions": positions,
        "variants": {
            name: {
                "max_abs_logit_diff": round(totals["max"], 5),
                "mean_abs_logit_diff": round(totals["abs"] / positions, 5),
                "mean_kl_nats": round(totals["kl"] / positions, 6),
                "top1_agreement": round(totals["agree"] / positions, 4),
                "bytes_per_token": _weight_bytes(variants[name]),
            }
            for name, totals in sums.items()
        },
        "seconds": round(time.perf_counter() - started, 1),
        "machine": {"cpus": os.cpu_count(), "processor": platform.processor() or platform.machine()},
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }
    print(json.dumps(report, indent=2))


def _weight_bytes(forward: Any) -> int:
    """Bytes of weights one decoding step reads (projections and head)."""
    if forward.blocks is not None:
        return int(forward.blocks.nbytes)
    model = forward.model
    return int(sum(p.numel() * p.element_size() for p in model.parameters()))


if __name__ == "__main__":
    main()
