"""Training an example's agent with GRPO on the CPU, and reporting its held-out change per slice.

Every trained example (calc, sql, rag, search_r1) is an agent, its data and a :class:`TrainingConfig`; this module
is the rest, written once:

* :func:`train_example` runs :class:`agentbolt.GRPO` under an :class:`agentbolt.Trainer` (a SQLite store, runner
  processes, the in-process engine sharing the trained model, the gateway recording token ids), with a greedy
  held-out validation before the first step and after the last;
* it then reads both validation passes back from the store (each rollout's task and reward dimensions) and
  compares them per slice with 95 % intervals (:mod:`examples.common.heldout`);
* :func:`main` is the command line of every example's ``train.py``; it writes a result file under
  ``benchmarks/results/`` (``--result-name NAME``, or ``--no-result`` for none), as the benchmarks do.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import shlex
import sys
import time
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

from examples.common.heldout import SliceChange, TaskScore, compare, format_table

_BENCHMARKS = str(Path(__file__).resolve().parents[2] / "benchmarks")
if _BENCHMARKS not in sys.path:
    sys.path.insert(0, _BENCHMARKS)  # the result files of benchmarks/ (a folder of scripts, not a package)
from result_files import RunRecord, add_result_options  # noqa: E402

__all__ = [
    "ExampleSpec",
    "TrainingConfig",
    "TrainingResult",
    "main",
    "read_validation_passes",
    "train_example",
]

logger = logging.getLogger(__name__)


@dataclass
class TrainingConfig:
    """The GRPO run of an example; every example sets its own defaults.

    Attributes:
        model: Model to train (registry name or local Hugging Face directory).
        steps: GRPO training steps.
        batch_size: Training tasks per step.
        group_size: Rollouts per task (one GRPO group).
        learning_rate: Peak LoRA learning rate.
        lora_r: LoRA rank (alpha is twice the rank).
        temperature: Sampling temperature of training rollouts (validation is greedy).
        max_tokens: Completion budget of each LLM call.
        runners: Runner processes executing rollouts concurrently (the engine decodes their calls as one batch).
        dtype: Weights dtype; ``"auto"`` is bfloat16 where the CPU multiplies it natively, else float32.
        device: Device of the trained policy and its engine (None: CUDA when available, else the CPU).
        micro_batch_size: Samples per training forward/backward; a group's calls share their prompt when they share
            a micro-batch (shared-prompt packing).
        gradient_checkpointing: Recompute activations in the backward pass (prompts with worked examples are long).
        seed: Seed of sampling, task order and the trainer.
        threads: torch threads (None: torch's default).
        n_train: Use the first N training tasks (None: all).
        n_test: Use the first N held-out tasks (None: all).
        format_credit: Training-only partial credit the agent gives for steps done right (0: strict rewards).
        console: Show GRPO's per-step progress.
    """

    model: str = "smollm2-135m-instruct"
    steps: int = 4
    batch_size: int = 4
    group_size: int = 8
    learning_rate: float = 1e-3
    lora_r: int = 16
    temperature: float = 1.0
    max_tokens: int = 48
    runners: int = 8
    dtype: str = "auto"
    device: Optional[str] = None
    micro_batch_size: int = 16
    gradient_checkpointing: bool = True
    seed: int = 0
    threads: Optional[int] = None
    n_train: Optional[int] = None
    n_test: Optional[int] = None
    format_credit: float = 0.1
    console: bool = True


@dataclass(frozen=True)
class ExampleSpec:
    """What makes one example trainable: its agent, its data and how its held-out results are sliced.

    Attributes:
        name: The example's name (``calc``).
        description: One line for ``--help``.
        make_agent: Builds the agent for a configuration.
        load_train: The training tasks.
        load_test: The held-out tasks (each with an ``id``).
        slice_of: The slice a held-out task belongs to.
        metrics: Scores compared before/after: ``accuracy`` (reward >= 1) and reward dimensions the agent emits.
        defaults: The example's configuration.
        agent_match: Train only the LLM calls of the agents (``x-agentbolt-agent-name``) this pattern matches
            (None: every call).
    """

    name: str
    description: str
    make_agent: Callable[[TrainingConfig], Any]
    load_train: Callable[[], List[Dict[str, Any]]]
    load_test: Callable[[], List[Dict[str, Any]]]
    slice_of: Callable[[Mapping[str, Any]], str]
    metrics: Sequence[str] = ("accuracy",)
    defaults: TrainingConfig = field(default_factory=TrainingConfig)
    agent_match: Optional[str] = None


@dataclass
class TrainingResult:
    """What a training run produced.

    Attributes:
        example: The example's name.
        model: The trained model.
        dtype: The weights dtype the run used.
        config: The configuration.
        n_train, n_test: Task counts.
        steps: Training steps run.
        train_rollouts: Training rollouts executed.
        wall_seconds: Whole run, model load and both validations included.
        rollout_seconds, update_seconds: Training time spent generating rollouts vs updating the policy.
        train_reward_per_step: Mean training reward (with format credit) of each step.
        heldout: Per-slice rows (see :class:`examples.common.heldout.SliceChange`).
        run_dir, store_path, metrics_path, checkpoint_dir: Where the outputs are.
    """

    example: str
    model: str
    dtype: str
    config: Dict[str, Any]
    n_train: int
    n_test: int
    steps: int
    train_rollouts: int
    wall_seconds: float
    rollout_seconds: float
    update_seconds: float
    train_reward_per_step: List[float]
    heldout: List[Dict[str, Any]]
    run_dir: str
    store_path: str
    metrics_path: str
    checkpoint_dir: Optional[str]

    def row(self, slice_name: str = "all", metric: str = "accuracy") -> Dict[str, Any]:
        """The held-out row of one slice and metric.

        Raises:
            KeyError: No such row.
        """
        for row in self.heldout:
            if row["slice"] == slice_name and row["metric"] == metric:
                return row
        raise KeyError(f"no held-out row for slice {slice_name!r} and metric {metric!r}")

    def summary(self) -> Dict[str, Any]:
        """The result as a JSON-able dict; ``all_<metric>`` keys repeat the overall rows for quoting."""
        document = asdict(self)
        for row in self.heldout:
            if row["slice"] == "all":
                document[f"all_{row['metric']}"] = row
        return document


def _new_run_dir(output_dir: Path) -> Path:
    output_dir.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    run_dir, suffix = output_dir / f"run-{stamp}", 1
    while run_dir.exists():
        suffix += 1
        run_dir = output_dir / f"run-{stamp}-{suffix}"
    run_dir.mkdir()
    return run_dir


async def read_validation_passes(
    store_path: Path,
    task_ids: Sequence[str],
    slice_of: Callable[[Mapping[str, Any]], str],
    metrics: Sequence[str],
    metadata_key: str = "grpo_group",
) -> Dict[int, List[TaskScore]]:
    """Every validation pass recorded in a run's store: step -> one :class:`TaskScore` per held-out task.

    GRPO and SFT tag validation rollouts ``val-<step>-<index>`` (in ``metadata[metadata_key]``: ``"grpo_group"``
    for GRPO, ``"sft_task"`` for SFT); a task's scores are its final reward span's dimensions, ``accuracy`` being 1
    when the rollout succeeded with a primary reward of at least 1. A failed rollout scores 0 everywhere.
    """
    from agentbolt.emitter import find_reward_spans, get_rewards_from_span
    from agentbolt.store.sqlite import SqliteLightningStore

    store = SqliteLightningStore(store_path)
    try:
        passes: Dict[int, List[TaskScore]] = {}
        for rollout in await store.query_rollouts():
            group = str((rollout.metadata or {}).get(metadata_key, ""))
            if rollout.mode != "val" or not group.startswith("val-"):
                continue
            step, index = (int(part) for part in group.split("-")[1:3])
            task = rollout.input if isinstance(rollout.input, Mapping) else {}
            dimensions: Dict[str, float] = {}
            if rollout.status == "succeeded":
                spans = await store.query_spans(rollout.rollout_id, "latest")
                rewards = find_reward_spans(spans)
                if rewards:
                    dimensions = {r.name: float(r.value) for r in get_rewards_from_span(rewards[-1])}
            primary = next(iter(dimensions.values()), 0.0)
            scores = {"accuracy": 1.0 if primary >= 1.0 else 0.0}
            scores.update({m: dimensions.get(m, 0.0) for m in metrics if m != "accuracy"})
            passes.setdefault(step, []).append(
                TaskScore(task_id=str(task.get("id", task_ids[index])), slice=slice_of(task), scores=scores)
            )
        return passes
    finally:
        await store.close()


def train_example(spec: ExampleSpec, config: TrainingConfig, output_dir: Path) -> TrainingResult:
    """Train the example's agent with GRPO and compare the held-out passes before and after.

    Returns:
        Per-slice results, timings and where the outputs are.

    Raises:
        agentbolt.models.ModelNotAvailableError: The model cannot be found.
        RuntimeError: The run did not record both validation passes.
    """
    from agentbolt.serving.transformers_engine import configure_openmp

    configure_openmp()
    import agentbolt as agl
    from agentbolt.demo.run import resolve_demo_dtype, step_time_split
    from agentbolt.models import resolve_model
    from agentbolt.serving.server import find_free_port

    started = time.perf_counter()
    train = spec.load_train()[: config.n_train]
    test = spec.load_test()[: config.n_test]
    model_path = str(resolve_model(config.model).path)
    run_dir = _new_run_dir(output_dir)
    log_dir, checkpoint_dir, store_path = run_dir / "logs", run_dir / "checkpoints", run_dir / "store.sqlite"
    (run_dir / "config.json").write_text(json.dumps(asdict(config), indent=1), encoding="utf-8")
    dtype = resolve_demo_dtype(config.dtype)
    logger.info(
        "%s: run directory %s (%d train / %d held-out tasks, %s)", spec.name, run_dir, len(train), len(test), dtype
    )

    algorithm = agl.GRPO(
        model=model_path,
        served_model_name=config.model,
        dtype=dtype,
        device=config.device,
        threads=config.threads,
        lora_r=config.lora_r,
        lora_alpha=2.0 * config.lora_r,
        batch_size=config.batch_size,
        group_size=config.group_size,
        max_steps=config.steps,
        serve_max_batch_size=max(config.runners, 1),
        sampling_parameters={"temperature": config.temperature, "max_tokens": config.max_tokens},
        val_sampling_parameters={"temperature": 0.0, "max_tokens": config.max_tokens},
        learning_rate=config.learning_rate,
        micro_batch_size=config.micro_batch_size,
        gradient_checkpointing=config.gradient_checkpointing,
        seed=config.seed,
        val_before_train=True,
        val_interval=0,
        log_dir=str(log_dir),
        checkpoint_dir=str(checkpoint_dir),
        resume=False,
        console=config.console,
        rollout_timeout=1800.0,
        agent_match=spec.agent_match,
    )
    tracer = agl.OtelTracer()
    trainer = agl.Trainer(
        algorithm=algorithm,
        store=store_path,
        tracer=tracer,
        # One process per runner: a tracer records one rollout at a time per process, and separate processes let
        # the rollouts overlap so that the engine decodes their calls together.
        strategy=agl.ClientServerExecutionStrategy(
            n_runners=config.runners, server_host="127.0.0.1", server_port=find_free_port("127.0.0.1")
        ),
        runner=agl.LitAgentRunner(tracer=tracer, poll_interval=0.05),
    )
    import openai  # noqa: F401  # imported before the runners fork, so they share its modules' memory

    trainer.fit(spec.make_agent(config), train_dataset=train, val_dataset=test)

    passes = asyncio.run(read_validation_passes(store_path, [t["id"] for t in test], spec.slice_of, spec.metrics))
    if len(passes) < 2:
        raise RuntimeError(f"{spec.name}: the run recorded {len(passes)} validation pass(es), not 2; see the log")
    rows = compare(passes[min(passes)], passes[max(passes)], spec.metrics)
    train_records = [r for r in algorithm.history if "train/reward_mean" in r]
    split = step_time_split(log_dir / "metrics.jsonl")
    checkpoints = sorted(checkpoint_dir.glob("step_*")) if checkpoint_dir.exists() else []
    result = TrainingResult(
        example=spec.name,
        model=config.model,
        dtype=dtype,
        config=asdict(config),
        n_train=len(train),
        n_test=len(test),
        steps=len(train_records),
        train_rollouts=int(sum(r.get("rollouts/total", 0.0) for r in train_records)),
        wall_seconds=round(time.perf_counter() - started, 1),
        rollout_seconds=round(split["rollout_seconds"], 1),
        update_seconds=round(split["update_seconds"], 1),
        train_reward_per_step=[round(float(r["train/reward_mean"]), 4) for r in train_records],
        heldout=[row.as_dict() for row in rows],
        run_dir=str(run_dir),
        store_path=str(store_path),
        metrics_path=str(log_dir / "metrics.jsonl"),
        checkpoint_dir=str(checkpoints[-1]) if checkpoints else None,
    )
    (run_dir / "summary.json").write_text(json.dumps(result.summary(), indent=1), encoding="utf-8")
    return result


def _parser(spec: ExampleSpec) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"python -m examples.{spec.name}.train", description=spec.description)
    defaults = spec.defaults
    for item in fields(TrainingConfig):
        if item.name == "console":
            continue
        flag = "--" + item.name.replace("_", "-")
        default = getattr(defaults, item.name)
        if isinstance(default, bool):
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=default)
            continue
        kind = {"int": int, "float": float, "str": str}.get(str(item.type).replace("Optional[", "").rstrip("]"), str)
        parser.add_argument(flag, type=kind, default=default, help=f"(default: {default})")
    parser.add_argument("--output-dir", type=Path, default=Path(f"runs/{spec.name}"), help="where runs are written")
    parser.add_argument("--quiet", action="store_true", help="no per-step progress bar")
    add_result_options(parser)
    return parser


def main(spec: ExampleSpec, argv: Optional[Sequence[str]] = None) -> TrainingResult:
    """The command line of an example's ``train.py``: train, print the held-out table, write a result file.

    Every :class:`TrainingConfig` field is an option (``--steps``, ``--learning-rate``, ``--n-test``...).
    """
    words = list(sys.argv[1:] if argv is None else argv)
    args = _parser(spec).parse_args(words)
    record = replace(
        RunRecord.start(f"{spec.name}_train", words),
        command=shlex.join(["python", "-m", f"examples.{spec.name}.train", *words]),
    )
    values = {item.name: getattr(args, item.name) for item in fields(TrainingConfig) if item.name != "console"}
    config = replace(spec.defaults, **values, console=not args.quiet)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    result = train_example(spec, config, args.output_dir)
    print(format_table([SliceChange(**row) for row in result.heldout]))
    print(
        f"{result.steps} steps, {result.train_rollouts} training rollouts, {result.wall_seconds:.0f} s; {result.run_dir}"
    )
    record.finish(result.summary(), args)
    return result
