"""SFT step throughput against bare PyTorch training loops on the same batch, in one interleaved run.

For one fixed batch (``--batch`` samples of ``--prompt`` prompt tokens and ``--response`` response tokens, the
response tokens being the targets) this times, on the same model and LoRA parameters:

* ``sft``: one :meth:`SFTTrainer.optimizer_step` (layout of the padded rows, forward projecting only the positions
  that predict a target, summed NLL over the step's targets, backward, gradient clipping, AdamW, LR schedule);
* ``sft_packed``: the same with ``packing=True`` (samples concatenated into rows, block-diagonal attention);
* ``bare_hf``: the loop most people write: ``model(input_ids, attention_mask, labels=...)`` with ``-100`` on the
  non-target tokens (transformers computes the logits of every position), ``loss.backward()``, ``AdamW.step()``;
* ``bare_targets``: a minimal loop doing the same work as ``sft``: the model body, the output projection of the
  target positions only, cross-entropy, backward, ``AdamW.step()``.

and prints JSON with samples/s of each and ``overhead_ratio`` = sft time / bare time for both bare loops (target:
at most 1.15 against ``bare_targets``, the loop that does the same work). The runs alternate, after one warm-up
each, and the medians of ``--repeats`` runs are reported, so load changes affect all alike. The report is written to
a result file, ``benchmarks/results/NAME.json`` (see ``benchmarks/result_files.py``).

The defaults are the SFT example's training set-up (``examples/sft/config.yaml``): the embedded SmolLM2-135M-Instruct
in float32 with LoRA r=16 on the attention projections, 2 threads, and a batch of 8 samples the length of the
example's calls (a prompt of about 320 tokens: system prompt, tool schema, worked example, question; a reply of
about 32). ``--gradient-checkpointing`` turns it on for every loop (the example uses it to bound memory).

Usage:
    flock /tmp/agentbolt-measure.lock nice -n -19 .venv/bin/python benchmarks/sft_bench.py --result-name sft_bench
    .venv/bin/python benchmarks/sft_bench.py --model tiny --no-result    # tiny random Llama (seconds)
"""

from __future__ import annotations

import argparse
import functools
from typing import Any, Callable, Dict, List

import torch
from result_files import RunRecord, add_result_options
from train_bench import _interleaved_medians, _load

from agentbolt.algorithm.sft.config import SFTConfig
from agentbolt.algorithm.sft.data import TokenSample
from agentbolt.algorithm.sft.trainer import SFTTrainer, layout_rows


def _samples(args: argparse.Namespace, vocab: int) -> List[TokenSample]:
    generator = torch.Generator().manual_seed(0)
    samples = []
    for _ in range(args.batch):
        ids = torch.randint(3, vocab, (args.prompt + args.response,), generator=generator).tolist()
        samples.append(TokenSample(input_ids=ids, loss_mask=[False] * args.prompt + [True] * args.response))
    return samples


def _trainer(args: argparse.Namespace, packing: bool) -> SFTTrainer:
    config = SFTConfig(
        lora_r=args.lora_r,
        lora_alpha=2.0 * args.lora_r,
        dtype=args.dtype,
        threads=args.threads,
        micro_batch_size=args.batch,
        train_batch_size=args.batch,
        packing=packing,
        gradient_checkpointing=args.gradient_checkpointing,
        learning_rate=1e-6,
    )
    return SFTTrainer(_load(args.model, args.dtype), config, max_length=args.batch * (args.prompt + args.response))


def _bare_hf_step(model: Any, samples: List[TokenSample]) -> Callable[[], None]:
    """The usual loop: transformers' own loss over labels with -100 on non-targets (logits of every position)."""
    batch = layout_rows([[s] for s in samples], pad_token_id=0, packed=False)
    labels = batch.input_ids.clone()
    mask = torch.zeros_like(batch.targets)
    mask[:, 1:] = batch.targets[:, :-1]
    labels[~mask] = -100
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-6)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        loss = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, labels=labels).loss
        loss.backward()
        optimizer.step()

    return step


def _bare_targets_step(model: Any, samples: List[TokenSample]) -> Callable[[], None]:
    """The minimal loop doing SFT's work: body forward, projection of the target positions only, CE, AdamW."""
    batch = layout_rows([[s] for s in samples], pad_token_id=0, packed=False)
    labels = batch.input_ids[:, 1:][batch.targets[:, :-1]]
    language_model = model.get_base_model()
    head = language_model.get_output_embeddings()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-6)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        hidden = language_model.base_model(
            input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False
        ).last_hidden_state[batch.targets]
        logits = torch.nn.functional.linear(hidden.float(), head.weight.float())
        torch.nn.functional.cross_entropy(logits, labels).backward()
        optimizer.step()

    return step


def main() -> None:
    record = RunRecord.start(__file__)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="embedded", help="'embedded', 'tiny', or a model directory")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--prompt", type=int, default=320)
    parser.add_argument("--response", type=int, default=32)
    parser.add_argument("--lora-r", type=int, default=16)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--gradient-checkpointing", action="store_true", help="recompute blocks in the backward")
    add_result_options(parser)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    trainer = _trainer(args, packing=False)
    packed = _trainer(args, packing=True)
    samples = _samples(args, trainer.model.get_input_embeddings().num_embeddings)
    fns: Dict[str, Callable[[], None]] = {
        "sft": functools.partial(trainer.optimizer_step, samples),
        "sft_packed": functools.partial(packed.optimizer_step, samples),
        "bare_hf": _bare_hf_step(trainer.model, samples),
        "bare_targets": _bare_targets_step(trainer.model, samples),
    }
    seconds = _interleaved_medians(fns, args.repeats)
    tokens = args.batch * (args.prompt + args.response)
    report = {
        "benchmark": "sft_step",
        "model": args.model,
        "finetune": f"lora r={args.lora_r}",
        "dtype": args.dtype,
        "threads": args.threads,
        "torch_threads": torch.get_num_threads(),
        "gradient_checkpointing": args.gradient_checkpointing,
        "batch": {"samples": args.batch, "prompt_tokens": args.prompt, "response_tokens": args.response},
        "tokens_per_step": tokens,
        "repeats": args.repeats,
        "step_seconds": {name: float(f"{value:.6g}") for name, value in seconds.items()},  # 6 significant digits
        "samples_per_second": {name: round(args.batch / value, 3) for name, value in seconds.items()},
        "overhead_ratio_vs_bare_targets": round(seconds["sft"] / seconds["bare_targets"], 3),
        "overhead_ratio_vs_bare_hf": round(seconds["sft"] / seconds["bare_hf"], 3),
        "target_overhead_ratio": 1.15,
    }
    record.finish(report, args)


if __name__ == "__main__":
    main()
