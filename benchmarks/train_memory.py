"""Peak memory of one GRPO policy update on demo-shaped samples, per micro-batch size and checkpointing setting.

Loads the embedded model the way ``agentbolt demo`` does (LoRA r=16 on q/k/v/o), builds the inference engine's
lean forward next to it (the weights copy the demo's engine holds), then runs one :meth:`PolicyTrainer.train_step`
per configuration on the same samples: prompts of 480 or 530 tokens and responses of 15-35 tokens, the shape of the
demo's calls (tool schema and two worked conversations in every prompt). For each it prints the process's peak
resident memory above what it held before the step (``VmHWM`` after resetting it through ``/proc/self/clear_refs``),
what stays resident after the step, and the step's wall and CPU time. Each configuration runs in a fresh process
(memory an earlier step freed but kept would hide a later step's peak).

A configuration is a micro-batch size, with ``gc`` appended for activation checkpointing (``4gc``). The trainer fixes
glibc's mmap threshold on CPUs (``agentbolt.utils.memory``); ``--glibc-default`` measures without it.

Usage:
    .venv/bin/python benchmarks/train_memory.py                          # float32, configurations 8 and 4gc
    .venv/bin/python benchmarks/train_memory.py --dtype bfloat16 --configs 8,4,4gc --samples 8
    PYTHONPATH=/path/to/older/checkout .venv/bin/python benchmarks/train_memory.py --configs 8   # an older trainer
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from typing import Any, Dict, List

from result_files import RunRecord, add_result_options

MIB = 1024 * 1024


def _status() -> Dict[str, int]:
    """``VmRSS`` and ``VmHWM`` of this process in bytes."""
    values: Dict[str, int] = {}
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                values[key] = int(value.split()[0]) * 1024
    return values


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w", encoding="ascii") as clear:
        clear.write("5")  # resets VmHWM to the current resident size


def _samples(count: int, vocab: int, seed: int) -> List[Any]:
    from agentbolt.algorithm.grpo.samples import TokenSample

    rng = random.Random(seed)
    samples = []
    for index in range(count):
        prompt, response = rng.choice([480, 530]), rng.randint(15, 35)
        tokens = [rng.randrange(3, vocab) for _ in range(prompt + response)]
        samples.append(
            TokenSample(
                prompt_ids=tokens[:prompt],
                response_ids=tokens[prompt:],
                logprobs=[-1.0] * response,
                reward=float(index % 2),
                group_id=f"task-{index // 8}",
                rollout_id=f"rollout-{index}",
                advantage=1.0 if index % 2 else -1.0,
            )
        )
    return samples


def _parse(spec: str) -> Dict[str, Any]:
    checkpointing = spec.endswith("gc")
    size = spec[:-2] if checkpointing else spec
    if not size.isdigit() or int(size) < 1:
        raise argparse.ArgumentTypeError(f"bad configuration {spec!r}: a micro-batch size, optionally followed by 'gc'")
    return {"name": spec, "micro_batch_size": int(size), "gradient_checkpointing": checkpointing}


def _measure(config: Dict[str, Any], args: argparse.Namespace) -> Dict[str, Any]:
    """One update in this process (a fresh one per configuration: memory freed earlier would hide a peak)."""
    if args.glibc_default:
        import agentbolt.utils.memory as memory

        memory.return_large_blocks_to_os = lambda *_, **__: False  # type: ignore[assignment]

    import torch
    from transformers import AutoModelForCausalLM

    from agentbolt.algorithm.grpo.config import GRPOConfig
    from agentbolt.algorithm.grpo.trainer import PolicyTrainer
    from agentbolt.models import DEFAULT_MODEL, resolve_model
    from agentbolt.serving.fast_forward import FastForward

    torch.set_num_threads(args.threads)
    model = AutoModelForCausalLM.from_pretrained(str(resolve_model(DEFAULT_MODEL).path), dtype=args.dtype)
    options: Dict[str, Any] = {
        "dtype": args.dtype,
        "lora_r": 16,
        "lora_alpha": 32.0,
        "learning_rate": 1e-3,
        "micro_batch_size": config["micro_batch_size"],
    }
    if config["gradient_checkpointing"]:
        options["gradient_checkpointing"] = True  # absent from trainers that predate the option
    trainer = PolicyTrainer(model, GRPOConfig(**options), pad_token_id=2)
    engine_forward = FastForward.create(trainer.model, trainer.model.active_adapter)
    samples = _samples(args.samples, model.config.vocab_size, seed=0)
    before = _status()["VmRSS"]
    _reset_peak()
    wall, cpu = time.perf_counter(), time.process_time()
    trainer.train_step(samples)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    after = _status()
    del engine_forward
    return {
        "config": config["name"],
        "resident_before_mib": round(before / MIB, 1),
        "peak_above_before_mib": round((after["VmHWM"] - before) / MIB, 1),
        "resident_after_above_before_mib": round((after["VmRSS"] - before) / MIB, 1),
        "wall_s": round(wall, 1),
        "cpu_s": round(cpu, 1),
        "load_average": round(os.getloadavg()[0], 2),
    }


def main() -> int:
    record = RunRecord.start(__file__)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--configs", default="8,4gc", help="Comma-separated configurations (default: 8,4gc).")
    parser.add_argument("--samples", type=int, default=8, help="Samples per update (default 8).")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--glibc-default", action="store_true", help="Keep glibc's adaptive mmap threshold.")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    add_result_options(parser)
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(_measure(_parse(args.child), args)))
        return 0
    for spec in args.configs.split(","):
        _parse(spec)  # fail on a bad configuration before measuring anything
    results: List[Dict[str, Any]] = []
    for spec in args.configs.split(","):
        command = [sys.executable, __file__, "--child", spec, "--dtype", args.dtype]
        command += ["--samples", str(args.samples), "--threads", str(args.threads)]
        if args.glibc_default:
            command.append("--glibc-default")
        out = subprocess.run(command, capture_output=True, text=True, check=True)
        results.append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(json.dumps(results[-1]), file=sys.stderr, flush=True)
    report = {
        "dtype": args.dtype,
        "samples": args.samples,
        "glibc_default": args.glibc_default,
        "results": results,
    }
    record.finish(report, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
