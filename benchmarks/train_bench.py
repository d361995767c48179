"""GRPO update throughput and overhead against a bare torch training step.

For one fixed batch (``--batch`` samples of ``--prompt`` prompt tokens and ``--response`` response tokens) this
times:

* ``grpo``: one :meth:`PolicyTrainer.train_step` (behaviour log-probs given, as the engine returns them; one
  minibatch, one epoch), i.e. collate + forward + clipped loss + backward + grad clipping + AdamW + LR schedule;
* ``grpo_kl``: the same with ``kl_coef > 0`` (adds a no-grad reference forward with the adapters disabled);
* ``grpo_padded``: the ``grpo`` step with ``pack_shared_prefixes=False`` (left-padded batches);
* ``bare``: the minimal torch step over the same tokens on the same LoRA model: one forward keeping the response
  logits, mean token NLL of the response, backward, AdamW step.

and prints JSON with the update tokens/s, ``overhead_ratio = grpo / bare`` (target <= 1.25) and
``packing_speedup = grpo_padded / grpo``. With ``--shared-prompt`` every sample has the same prompt, as the first
calls of a GRPO group do, so packing computes it once (the bare step still computes it per sample). Times are
medians of ``--repeats`` runs after one warm-up run; the runs alternate so load changes affect all alike.

Usage:
    .venv/bin/python benchmarks/train_bench.py                 # embedded SmolLM2-135M, LoRA r=8, bf16, 2 threads
    .venv/bin/python benchmarks/train_bench.py --model tiny    # tiny random Llama (seconds)
    .venv/bin/python benchmarks/train_bench.py --dtype float32 --shared-prompt --prompt 500 --response 40 \
        --lora-r 16 --gradient-checkpointing                   # one group of the demo's first calls
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional

import torch
from result_files import RunRecord, add_result_options


def _load(model: str, dtype: str) -> Any:
    from transformers import AutoModelForCausalLM

    if model == "tiny":
        from agentbolt.models.tiny import create_tiny_model

        path = create_tiny_model(tempfile.mkdtemp(prefix="tiny-llama-"))
    else:
        from agentbolt.models import DEFAULT_MODEL, resolve_model

        path = resolve_model(DEFAULT_MODEL if model == "embedded" else model).path
    return AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype)).eval()


def _samples(args: argparse.Namespace, vocab: int) -> List[Any]:
    from agentbolt.algorithm.grpo.samples import TokenSample

    generator = torch.Generator().manual_seed(0)
    shared = torch.randint(3, vocab, (args.prompt,), generator=generator).tolist()
    samples = []
    for i in range(args.batch):
        tokens = torch.randint(3, vocab, (args.prompt + args.response,), generator=generator).tolist()
        samples.append(
            TokenSample(
                prompt_ids=shared if args.shared_prompt else tokens[: args.prompt],
                response_ids=tokens[args.prompt :],
                logprobs=None,
                reward=float(i % 2),
                group_id="g",
                rollout_id=f"r{i}",
                advantage=1.0 if i % 2 else -1.0,
            )
        )
    return samples


def _timed(fn: Callable[[], None]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def _interleaved_medians(fns: Dict[str, Callable[[], None]], repeats: int) -> Dict[str, float]:
    """Median time of each function after one warm-up, runs interleaved so load changes hit all alike."""
    for fn in fns.values():
        fn()
    times: Dict[str, List[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            times[name].append(_timed(fn))
            print(f"{name}: {times[name][-1]:.3f} s", file=sys.stderr, flush=True)
    return {name: statistics.median(values) for name, values in times.items()}


def _trainer(args: argparse.Namespace, kl_coef: float, pack: bool = True) -> Any:
    from agentbolt.algorithm.grpo.config import GRPOConfig
    from agentbolt.algorithm.grpo.trainer import PolicyTrainer

    config = GRPOConfig(
        lora_r=args.lora_r,
        lora_alpha=2.0 * args.lora_r,
        dtype=args.dtype,
        threads=args.threads,
        micro_batch_size=args.batch,
        kl_coef=kl_coef,
        learning_rate=1e-6,
        gradient_checkpointing=args.gradient_checkpointing,
        pack_shared_prefixes=pack,
    )
    return PolicyTrainer(_load(args.model, args.dtype), config)


def _bare_step(trainer: Any, samples: List[Any]) -> Callable[[], None]:
    """The minimal equivalent torch step on the trainer's own model and parameters."""
    from agentbolt.algorithm.grpo.trainer import collate

    batch = collate(samples)
    width = batch.response_width
    optimizer = torch.optim.AdamW(trainer.trainable_parameters, lr=1e-6)
    model = trainer.model

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        logits = model(
            input_ids=batch.input_ids,
            attention_mask=batch.attention_mask,
            position_ids=batch.position_ids,
            use_cache=False,
            logits_to_keep=width + 1,
        ).logits[:, -(width + 1) : -1, :]
        loss = torch.nn.functional.cross_entropy(
            logits.float().reshape(-1, logits.shape[-1]), batch.targets.reshape(-1)
        )
        loss.backward()
        optimizer.step()

    return step


def main() -> None:
    record = RunRecord.start(__file__)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="embedded", help="'embedded', 'tiny', or a model directory")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--prompt", type=int, default=192)
    parser.add_argument("--response", type=int, default=64)
    parser.add_argument("--lora-r", type=int, default=8)
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--shared-prompt", action="store_true", help="every sample has the same prompt (one group)")
    parser.add_argument("--gradient-checkpointing", action="store_true", help="recompute blocks in the backward")
    parser.add_argument(
        "--demo-metrics",
        help="metrics.jsonl of an 'agentbolt demo' run: adds its per-step split between rollouts and updates",
    )
    add_result_options(parser)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    results: Dict[str, float] = {}
    for kl_coef in (0.0, 1e-3):
        trainer = _trainer(args, kl_coef)
        samples = _samples(args, trainer.model.get_input_embeddings().num_embeddings)
        for sample, logp in zip(samples, trainer.compute_logprobs(samples), strict=True):
            sample.logprobs = logp.tolist()  # as returned by the engine: not part of the update
        step = functools.partial(trainer.train_step, samples)
        fns: Dict[str, Callable[[], None]] = {"grpo_kl" if kl_coef else "grpo": step}
        if not kl_coef:
            fns["bare"] = _bare_step(trainer, samples)
            padded = _trainer(args, kl_coef, pack=False)
            fns["grpo_padded"] = functools.partial(padded.train_step, samples)
        results.update(_interleaved_medians(fns, args.repeats))
        del trainer, fns, step

    tokens = args.batch * (args.prompt + args.response)
    demo_split: Optional[Dict[str, float]] = None
    if args.demo_metrics:
        from agentbolt.demo import step_time_split

        demo_split = {key: round(value, 3) for key, value in step_time_split(args.demo_metrics).items()}
    report = {
        "model": args.model,
        "finetune": f"lora r={args.lora_r}",
        "dtype": args.dtype,
        "threads": args.threads,
        "torch_threads": torch.get_num_threads(),
        "batch": {
            "samples": args.batch,
            "prompt_tokens": args.prompt,
            "response_tokens": args.response,
            "shared_prompt": args.shared_prompt,
        },
        "gradient_checkpointing": args.gradient_checkpointing,
        "tokens_per_step": tokens,
        "grpo_step_seconds": round(results["grpo"], 4),
        "grpo_kl_step_seconds": round(results["grpo_kl"], 4),
        "bare_step_seconds": round(results["bare"], 4),
        "grpo_padded_step_seconds": round(results["grpo_padded"], 4),
        "packing_speedup": round(results["grpo_padded"] / results["grpo"], 3),
        "update_tokens_per_second": round(tokens / results["grpo"], 1),
        "overhead_ratio": round(results["grpo"] / results["bare"], 3),
        "overhead_ratio_with_kl": round(results["grpo_kl"] / results["bare"], 3),
        "target_overhead_ratio": 1.25,
        "demo_step_split": demo_split,
    }
    record.finish(report, args)


if __name__ == "__main__":
    main()
