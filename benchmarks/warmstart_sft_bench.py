"""The Flow-GRPO warm start's SFT, padded against prefix-packed, on its real planner conversations, in one run.

The warm start (``examples/flow_grpo/warmstart.py``) trains LoRA adapters on planner turns that all begin with the
same system prompt, and the later turns of one solve repeat the earlier ones. This script runs that SFT exactly as
``ensure_warm_start`` does (:func:`~examples.flow_grpo.warmstart.warm_start_sft_options` of the configuration:
epochs, learning rate, batch sizes, dtype, update threads, the GRPO section's LoRA shape) once per micro-batch
layout, ``--layouts`` in turn (``none``: padded, one conversation per row; ``prefix``: one prefix tree per
micro-batch), repeated ``--repeats`` times in alternating order (A B, B A, ...) so load changes fall on both alike.

It reports, per layout: the training seconds (the sum of the optimizer steps' own times: model loading and
tokenization are left out and reported apart as ``wall_seconds``), the tokens each optimizer step computed (padding
included for ``none``, tree nodes for ``prefix``), and the loss of every optimizer step; then ``speedup`` (padded
seconds / prefix seconds, medians over repeats), ``tokens_ratio`` and the largest relative difference between the two
layouts' step losses (``loss_max_rel_diff``: the first step's losses must agree to float rounding; later steps
drift apart only by the rounding the updates accumulate) and between their final LoRA weights. The report goes to
a result file, ``benchmarks/results/NAME.json`` (see ``benchmarks/result_files.py``).

Usage:
    flock /tmp/agentbolt-measure.lock nice -n -19 .venv/bin/python benchmarks/warmstart_sft_bench.py \\
        --result-name warmstart_sft_bench
    .venv/bin/python benchmarks/warmstart_sft_bench.py --model tiny --epochs 1 --no-result   # tiny random Llama
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List

import torch
from result_files import REPO_ROOT, RunRecord, add_result_options

DEFAULT_TURNS = REPO_ROOT / "runs" / "flow-grpo" / "warmstart" / "cpu-b378d5eb94d7" / "turns.jsonl"


def _model_path(name: str, scratch: Path) -> str:
    if name == "tiny":
        from agentbolt.models.tiny import create_tiny_model

        return str(create_tiny_model(scratch / "tiny", seed=0, max_position_embeddings=16384))
    from agentbolt.models import resolve_model

    return str(resolve_model(name).path)


def _run(turns: Path, model: str, options: Dict[str, Any], layout: str) -> Dict[str, Any]:
    from agentbolt.algorithm.sft import train_from_messages

    started = time.perf_counter()
    result = train_from_messages(turns, model=model, **{**options, "packing": layout})
    wall = time.perf_counter() - started
    lora = {name: p.detach().clone() for name, p in result.model.named_parameters() if "lora_" in name}
    return {
        "train_seconds": sum(row["seconds"] for row in result.history),
        "wall_seconds": wall,
        "tokens_per_step": [int(row["tokens"]) for row in result.history],
        "target_tokens": int(sum(row["target_tokens"] for row in result.history)),
        "losses": [row["loss"] for row in result.history],
        "lora": lora,
    }


def _max_rel_diff(a: List[float], b: List[float]) -> float:
    return max(abs(x - y) / max(abs(y), 1e-12) for x, y in zip(a, b, strict=True))


def main() -> None:
    record = RunRecord.start(__file__)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=Path, default=DEFAULT_TURNS, help="the warm start's turns.jsonl")
    parser.add_argument("--config", default="cpu", help="Flow-GRPO configuration whose warm_start is timed")
    parser.add_argument("--model", default=None, help="'tiny', a registry name or a directory (default: config's)")
    parser.add_argument("--epochs", type=int, default=None, help="passes over the turns (default: the config's)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: the config's update)")
    parser.add_argument("--layouts", nargs=2, default=["none", "prefix"], help="the two layouts compared")
    parser.add_argument("--repeats", type=int, default=1, help="runs of each layout, in alternating order")
    add_result_options(parser)
    args = parser.parse_args()

    sys.path.insert(0, str(REPO_ROOT))  # the examples package lives at the root
    from examples.flow_grpo.train import load_config
    from examples.flow_grpo.warmstart import warm_start_sft_options

    config = load_config(args.config)
    options = warm_start_sft_options(config)
    options.update({k: v for k, v in {"epochs": args.epochs, "threads": args.threads}.items() if v is not None})
    options["seed"] = 0
    torch.set_num_threads(int(options["threads"]))
    with tempfile.TemporaryDirectory() as scratch:
        model = _model_path(args.model or config.model, Path(scratch))
        runs: Dict[str, List[Dict[str, Any]]] = {layout: [] for layout in args.layouts}
        for repeat in range(args.repeats):
            order = args.layouts if repeat % 2 == 0 else list(reversed(args.layouts))
            for layout in order:
                runs[layout].append(_run(args.turns, model, options, layout))

    padded, packed = (runs[layout] for layout in args.layouts)
    seconds = {layout: statistics.median(r["train_seconds"] for r in runs[layout]) for layout in args.layouts}
    tokens = {layout: sum(runs[layout][0]["tokens_per_step"]) for layout in args.layouts}
    steps = len(padded[0]["losses"])
    weights_diff = max(
        float((packed[0]["lora"][name] - value).abs().max()) for name, value in padded[0]["lora"].items()
    )
    weights_scale = max(float(value.abs().max()) for value in padded[0]["lora"].values())
    report = {
        "benchmark": "warmstart_sft",
        "turns": str(args.turns.relative_to(REPO_ROOT) if args.turns.is_relative_to(REPO_ROOT) else args.turns),
        "samples": sum(1 for line in args.turns.read_text(encoding="utf-8").splitlines() if line.strip()),
        "model": args.model or config.model,
        "options": {k: v for k, v in options.items() if k != "packing"},
        "torch_threads": torch.get_num_threads(),
        "optimizer_steps": steps,
        "repeats": args.repeats,
        "layouts": {
            layout: {
                "train_seconds": round(seconds[layout], 2),
                "train_seconds_runs": [round(r["train_seconds"], 2) for r in runs[layout]],
                "wall_seconds_runs": [round(r["wall_seconds"], 2) for r in runs[layout]],
                "tokens_computed": tokens[layout],
                "tokens_per_step_mean": round(tokens[layout] / steps, 1),
                "target_tokens": runs[layout][0]["target_tokens"],
                "loss_first": round(runs[layout][0]["losses"][0], 6),
                "loss_last": round(runs[layout][0]["losses"][-1], 6),
            }
            for layout in args.layouts
        },
        "speedup": round(seconds[args.layouts[0]] / seconds[args.layouts[1]], 3),
        "tokens_ratio": round(tokens[args.layouts[0]] / tokens[args.layouts[1]], 3),
        "first_loss_rel_diff": _max_rel_diff(packed[0]["losses"][:1], padded[0]["losses"][:1]),
        "loss_max_rel_diff": _max_rel_diff(packed[0]["losses"], padded[0]["losses"]),
        "lora_max_abs_diff": weights_diff,
        "lora_max_abs": weights_scale,
    }
    record.finish(report, args)


if __name__ == "__main__":
    main()
