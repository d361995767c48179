"""How far apart the inference engine's and the GRPO trainer's log-probs of the same sampled tokens are.

For each configuration (``--dtypes`` x ``--adapters`` x ``--kernels``) a child process loads the model, wraps it
in a :class:`~agentbolt.algorithm.grpo.trainer.PolicyTrainer` (LoRA on the q/k/v/o projections, the CPU
configuration of Flow-GRPO), serves that same model object with the in-process transformers engine, and, for each
temperature in ``--temperatures``, samples ``--prompts`` chat prompts together (one decoding batch) with
log-probs, then recomputes the log-probs of the sampled tokens with ``PolicyTrainer.compute_logprobs``. It reports,
over all sampled tokens, the mean, 99th percentile and max of ``|engine - trainer|``, on the engine's convention
(untempered ``log_softmax(logits)``, vLLM's default).

``--adapters trained`` first runs ``--train-steps`` GRPO updates on responses the engine sampled (advantages +1 and
-1 alternating), so the adapter's ``B`` is no longer zero and the engine must have refreshed its fused weights;
``none`` keeps the freshly initialised adapter (an identity). ``--kernels off`` runs the child with
``AGENTBOLT_DECODE_KERNELS=0`` (decoding steps in Python). Each engine row is measured on two serving paths: the
lean CPU forward (``fast``, LoRA merged into the served weights) and the transformers forward through PEFT
(``transformers``, LoRA unmerged; only in the kernel-on children, it does not use the kernels).

To locate a disagreement, the same tokens are also scored by two copies of the policy: ``fp32`` (the policy in
float32, the closest thing to exact) and ``merged`` (the LoRA delta added into the weights in the policy's dtype,
then an ordinary full-sequence forward). ``decomposition`` reports mean ``|a - b|`` for each pair.

``--decode-timing`` instead times what serving a LoRA adapter unmerged costs: decoding steps of the lean forward
at batch ``--batch`` with the adapter (r=16 on q/k/v/o, non-zero ``B``) against the same model's base weights
(what a merged adapter cost), alternating, medians of ``--steps`` steps after a warm-up.

Usage:
    .venv/bin/python benchmarks/logprob_consistency.py                  # embedded SmolLM2-135M, full matrix
    .venv/bin/python benchmarks/logprob_consistency.py --model tiny     # tiny random Llama (seconds)
    .venv/bin/python benchmarks/logprob_consistency.py --dtypes bfloat16 --adapters trained --kernels on
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Sequence

from result_files import RunRecord, add_result_options

PROMPTS = (
    "What is the capital of France? Answer in one sentence.",
    "Write a short poem about the sea.",
    "Explain what a prime number is to a child.",
    "List three fruits that are red.",
    "How many legs does a spider have, and why?",
    "Give me a tip for learning a new language.",
    "What is 17 times 3? Show your reasoning.",
    "Describe a cat in two sentences.",
    "Why is the sky blue?",
    "Name a famous painter and one of their works.",
    "What should I pack for a weekend hike?",
    "Translate 'good morning' into Spanish and French.",
)


def _load_model(name: str) -> tuple[Any, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if name == "tiny":
        from agentbolt.models.tiny import create_tiny_model

        path = str(create_tiny_model(tempfile.mkdtemp(prefix="tiny-llama-"), hidden_size=64))
    else:
        from agentbolt.models import DEFAULT_MODEL, resolve_model

        path = str(resolve_model(DEFAULT_MODEL if name == "embedded" else name).path)
    # Loaded in float32 and cast by the trainer, as GRPO does.
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(path)


def _sample(engine: Any, prompts: Sequence[List[int]], temperature: float, max_tokens: int, seed: int) -> List[Any]:
    """Sample every prompt once, all in one decoding batch, with log-probs; return TokenSamples."""
    from agentbolt.algorithm.grpo.samples import TokenSample
    from agentbolt.serving.params import SamplingParams

    async def run() -> List[Any]:
        # Hold the engine while the requests are submitted, so they are admitted (and prefilled) together and the
        # batch composition, hence the rounding, does not depend on thread timing.
        with engine.weights_update():
            tasks = [
                asyncio.ensure_future(
                    engine.generate(
                        prompt,
                        SamplingParams(max_tokens=max_tokens, temperature=temperature, seed=seed + i, logprobs=True),
                    )
                )
                for i, prompt in enumerate(prompts)
            ]
            await asyncio.sleep(0.05)
        return list(await asyncio.gather(*tasks))

    outputs = asyncio.run(run())
    samples = []
    for i, (prompt, output) in enumerate(zip(prompts, outputs, strict=True)):
        choice = output.choices[0]
        samples.append(
            TokenSample(
                prompt_ids=list(prompt),
                response_ids=list(choice.token_ids),
                logprobs=list(choice.logprobs or []),
                reward=float(i % 2),
                group_id="g",
                rollout_id=f"r{i}",
                advantage=1.0 if i % 2 else -1.0,
                temperature=temperature,
            )
        )
    return samples


def _flat(rows: Sequence[Sequence[float]]) -> List[float]:
    return [float(v) for row in rows for v in row]


def _stats(a: Sequence[Sequence[float]], b: Sequence[Sequence[float]]) -> Dict[str, float]:
    import torch

    diff = (torch.tensor(_flat(a)) - torch.tensor(_flat(b))).abs()
    return {
        "mean": round(float(diff.mean()), 5),
        "p99": round(float(diff.quantile(0.99)), 5),
        "max": round(float(diff.max()), 5),
    }


def _child(options: Dict[str, Any]) -> Dict[str, Any]:
    import torch

    from agentbolt.algorithm.grpo.config import GRPOConfig
    from agentbolt.algorithm.grpo.trainer import PolicyTrainer
    from agentbolt.serving.transformers_engine import TransformersEngine

    torch.set_num_threads(options["threads"])
    seconds: Dict[str, float] = {}
    started = time.perf_counter()
    model, tokenizer = _load_model(options["model"])
    config = GRPOConfig(
        dtype=options["dtype"],
        lora_r=16,
        lora_alpha=32.0,
        learning_rate=options["learning_rate"],
        micro_batch_size=4,
        max_grad_norm=1.0,
        threads=options["threads"],
        seed=0,
        console=False,
    )
    trainer = PolicyTrainer(model, config, pad_token_id=tokenizer.pad_token_id or 0)
    adapter = trainer.model.active_adapter
    paths = {"fast": True, "transformers": False} if options["kernels"] else {"fast": True}
    engines = {}
    for path, fast_forward in paths.items():
        engine = TransformersEngine.from_model(
            trainer.model, tokenizer, served_name="policy", max_batch_size=16, fast_forward=fast_forward
        )
        engine.default_adapter = adapter
        engines[path] = engine
    prompts = [engines["fast"].encode_chat([{"role": "user", "content": text}]) for text in PROMPTS]
    prompts = prompts[: options["prompts"]]
    fast_engine = engines["fast"]
    kernels_used = bool(fast_engine._fast_forward_for_step() and fast_engine._fast_forward_for_step().uses_kernels)

    seconds["load"] = round(time.perf_counter() - started, 1)
    train_metrics: List[Dict[str, float]] = []
    if options["adapter"] == "trained":
        for step in range(options["train_steps"]):
            batch = _sample(fast_engine, prompts, 1.0, options["max_tokens"], seed=1000 * (step + 1))
            with fast_engine.weights_update():
                metrics = trainer.train_step(batch)
            train_metrics.append({k: round(v, 5) for k, v in metrics.items() if "logprob" in k or k == "grad_norm"})
        lora_b = [p.detach().float().abs().max() for n, p in trainer.model.named_parameters() if "lora_B" in n]
        lora_b_max = float(max(lora_b))
    else:
        lora_b_max = 0.0

    seconds["train"] = round(time.perf_counter() - started - seconds["load"], 1)
    references = {
        "fp32": PolicyTrainer(copy.deepcopy(trainer.model), config.model_copy(update={"dtype": "float32"})),
        "merged": PolicyTrainer(
            copy.deepcopy(trainer.model).merge_and_unload(), config.model_copy(update={"finetune": "full"})
        ),
    }
    rows = []
    for temperature in options["temperatures"]:
        for path, engine in engines.items():
            mark = time.perf_counter()
            samples = _sample(engine, prompts, temperature, options["max_tokens"], seed=7)
            seconds[f"sample_{path}_{temperature}"] = round(time.perf_counter() - mark, 1)
            mark = time.perf_counter()
            engine_lp = [s.logprobs for s in samples]
            trainer_lp = [t.tolist() for t in trainer.compute_logprobs(samples, tempered=False)]
            fp32_lp = [t.tolist() for t in references["fp32"].compute_logprobs(samples, tempered=False)]
            merged_lp = [t.tolist() for t in references["merged"].compute_logprobs(samples, tempered=False)]
            seconds[f"score_{path}_{temperature}"] = round(time.perf_counter() - mark, 1)
            rows.append(
                {
                    "dtype": options["dtype"],
                    "adapter": options["adapter"],
                    "kernels": kernels_used if path == "fast" else False,
                    "path": path,
                    "temperature": temperature,
                    "tokens": len(_flat(engine_lp)),
                    "engine_vs_trainer": _stats(engine_lp, trainer_lp),
                    "decomposition": {
                        "engine_vs_fp32": _stats(engine_lp, fp32_lp)["mean"],
                        "trainer_vs_fp32": _stats(trainer_lp, fp32_lp)["mean"],
                        "engine_vs_merged": _stats(engine_lp, merged_lp)["mean"],
                        "merged_vs_trainer": _stats(merged_lp, trainer_lp)["mean"],
                    },
                }
            )
    for engine in engines.values():
        engine.stop()
    return {"rows": rows, "train_steps": train_metrics, "lora_b_abs_max": round(lora_b_max, 6), "seconds": seconds}


def _decode_timing(options: Dict[str, Any]) -> Dict[str, Any]:
    import statistics

    import torch
    from peft import LoraConfig, get_peft_model

    from agentbolt.serving.fast_forward import FastForward
    from agentbolt.serving.kv_cache import KVCache

    torch.set_num_threads(options["threads"])
    torch.manual_seed(0)
    model, tokenizer = _load_model(options["model"])
    model = model.to(torch.bfloat16)
    lora = LoraConfig(r=16, lora_alpha=32.0, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
    model = get_peft_model(model, lora).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(std=1e-3)
    forwards = {"base weights": FastForward(model, None), "lora unmerged": FastForward(model, "default")}
    batch, prompt = options["batch"], 64
    ids = torch.randint(3, tokenizer.vocab_size, (batch, prompt))
    mask = torch.ones(batch, prompt, dtype=torch.long)
    positions = torch.arange(prompt).expand(batch, prompt)
    times: Dict[str, List[float]] = {name: [] for name in forwards}
    with torch.inference_mode():
        caches = {name: KVCache() for name in forwards}
        last = {name: forward(ids, positions, mask, caches[name]).argmax(-1) for name, forward in forwards.items()}
        for step in range(options["steps"] + 1):
            step_mask = torch.ones(batch, prompt + step + 1, dtype=torch.long)
            step_positions = torch.full((batch, 1), prompt + step)
            for name, forward in forwards.items():
                mark = time.perf_counter()
                logits = forward(last[name].unsqueeze(1), step_positions, step_mask, caches[name])
                elapsed = time.perf_counter() - mark
                last[name] = logits.argmax(-1)
                if step:  # the first step is a warm-up
                    times[name].append(elapsed)
    medians = {name: round(1000 * statistics.median(values), 2) for name, values in times.items()}
    return {
        "batch": batch,
        "kernels": forwards["lora unmerged"].uses_kernels,
        "ms_per_step_median": medians,
        "lora_overhead": round(medians["lora unmerged"] / medians["base weights"] - 1, 3),
    }


def main() -> None:
    record = RunRecord.start(__file__)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="embedded", help="'embedded', 'tiny', or a model directory / name")
    parser.add_argument("--dtypes", default="bfloat16,float32")
    parser.add_argument("--adapters", default="trained,none", help="comma list of 'trained' and 'none'")
    parser.add_argument("--kernels", default="on,off", help="comma list of 'on' and 'off'")
    parser.add_argument("--temperatures", default="0.7,1.0")
    parser.add_argument("--prompts", type=int, default=8, help=f"prompts sampled together (at most {len(PROMPTS)})")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--train-steps", type=int, default=3)
    parser.add_argument("--learning-rate", type=float, default=5e-4, help="the Flow-GRPO CPU configuration's")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--decode-timing", action="store_true", help="time unmerged LoRA decoding steps instead")
    parser.add_argument("--batch", type=int, default=8, help="rows per decoding step (--decode-timing)")
    parser.add_argument("--steps", type=int, default=40, help="decoding steps timed (--decode-timing)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    add_result_options(parser)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(_child(json.loads(args.child))))
        return
    if args.decode_timing:
        options = {"model": args.model, "threads": args.threads, "batch": args.batch, "steps": args.steps}
        record.finish({"measured": "lora_decode_timing", **_decode_timing(options)}, args)
        return

    started = time.time()
    results: List[Dict[str, Any]] = []
    for dtype in args.dtypes.split(","):
        for adapter in args.adapters.split(","):
            for kernels in args.kernels.split(","):
                options = {
                    "model": args.model,
                    "dtype": dtype,
                    "adapter": adapter,
                    "kernels": kernels == "on",
                    "temperatures": [float(t) for t in args.temperatures.split(",")],
                    "prompts": min(args.prompts, len(PROMPTS)),
                    "max_tokens": args.max_tokens,
                    "train_steps": args.train_steps,
                    "learning_rate": args.learning_rate,
                    "threads": args.threads,
                }
                env = dict(os.environ, AGENTBOLT_DECODE_KERNELS="1" if kernels == "on" else "0")
                env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
                done = subprocess.run(
                    [sys.executable, __file__, "--child", json.dumps(options)],
                    env=env,
                    capture_output=True,
                    text=True,
                    check=False,
                )
                if done.returncode != 0:
                    raise SystemExit(f"configuration {options} failed:\n{done.stderr[-4000:]}")
                result = json.loads(done.stdout.strip().splitlines()[-1])
                results.append({"options": options, **result})
                summary = ", ".join(
                    f"{row['path']} T={row['temperature']}: {row['engine_vs_trainer']['mean']}"
                    for row in result["rows"]
                )
                print(f"{dtype} adapter={adapter} kernels={kernels}: mean |diff| {summary}", file=sys.stderr)
    record.finish({"model": args.model, "seconds": round(time.time() - started, 1), "results": results}, args)


if __name__ == "__main__":
    main()
