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
import inspect
import json
import logging
import re
import shlex
import sys
import time
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

from agentbolt.demo.run import GrpoRunConfig, fit_grpo, new_run_dir, resolve_demo_dtype, step_time_split
from examples.common.arguments import count, number, require_writable_directory, torch_device
from examples.common.environment import CONFIGURATION_ERROR
from examples.common.heldout import SliceChange, TaskScore, compare, format_table
from examples.common.rewards import check_format_credit
from examples.common.tasks import TaskFileError

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
class TrainingConfig(GrpoRunConfig):
    """The GRPO run of an example (the settings of :class:`agentbolt.demo.run.GrpoRunConfig`); every example sets
    its own defaults.

    Attributes:
        n_train: Use the first N training tasks (None: all).
        n_test: Use the first N held-out tasks (None: all).
        format_credit: Training-only partial credit the agent gives for steps done right (0: strict rewards; below
            0.5, so that a wrong answer, which can earn it twice, earns less than a right one).

    Raises:
        ValueError: ``format_credit`` is negative or not below 0.5 (:data:`examples.common.rewards.FORMAT_CREDIT_LIMIT`).
    """

    n_train: Optional[int] = None
    n_test: Optional[int] = None
    format_credit: float = 0.1

    def __post_init__(self) -> None:
        check_format_credit(self.format_credit)


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


class TrainingInterrupted(RuntimeError):
    """The run stopped (Ctrl-C, SIGTERM) before its final validation pass: it has no "after" score."""


def train_example(spec: ExampleSpec, config: TrainingConfig, output_dir: Path) -> TrainingResult:
    """Train the example's agent with GRPO and compare the held-out passes before and after.

    Returns:
        Per-slice results, timings and where the outputs are.

    Raises:
        agentbolt.models.ModelNotAvailableError: The model cannot be found.
        TrainingInterrupted: The run stopped before its final validation pass (no ``summary.json`` is written).
        RuntimeError: The run did not record both validation passes.
    """
    started = time.perf_counter()
    train = spec.load_train()[: config.n_train]
    test = spec.load_test()[: config.n_test]
    run_dir = new_run_dir(output_dir)
    log_dir, checkpoint_dir, store_path = run_dir / "logs", run_dir / "checkpoints", run_dir / "store.sqlite"
    (run_dir / "config.json").write_text(json.dumps(asdict(config), indent=1), encoding="utf-8")
    dtype = resolve_demo_dtype(config.dtype)
    logger.info(
        "%s: run directory %s (%d train / %d held-out tasks, %s)", spec.name, run_dir, len(train), len(test), dtype
    )
    algorithm = fit_grpo(config, spec.make_agent(config), train, test, run_dir, agent_match=spec.agent_match)
    # Trainer.fit returns normally after Ctrl-C; the final validation (at step max_steps) then never ran.
    final_step = algorithm.config.max_steps
    if not any(r.get("step") == final_step and "val/accuracy" in r for r in algorithm.history):
        raise TrainingInterrupted(f"{spec.name}: the run stopped before its final validation (step {final_step})")

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


_DTYPES = ("auto", "float32", "bfloat16", "float16")


def _format_credit(text: str) -> float:
    """A format credit: a number at least 0 and below :data:`examples.common.rewards.FORMAT_CREDIT_LIMIT`."""
    try:
        return check_format_credit(number()(text))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


# The values each option accepts, checked as the command line is read (a usage error, exit 2) rather than after the
# model has loaded; unlisted options take any value of their type.
_OPTION_TYPES: Dict[str, Callable[[str], Any]] = {
    "steps": count(0),
    "batch_size": count(1),
    "group_size": count(2),  # GRPO's advantages compare the rollouts of a group
    "learning_rate": number(above=0.0),
    "lora_r": count(1),
    "temperature": number(above=0.0),  # greedy training rollouts agree, leaving GRPO no advantage to train on
    "max_tokens": count(1),
    "runners": count(1),
    "threads": count(1),
    "device": torch_device,
    "micro_batch_size": count(1),
    "seed": int,
    "n_train": count(1),
    "n_test": count(1),
    "format_credit": _format_credit,
}


def _field_help() -> Dict[str, str]:
    """Each configuration field's description, from the ``Attributes:`` sections of the config classes."""
    described: Dict[str, str] = {}
    for cls in reversed(TrainingConfig.__mro__):
        doc = inspect.getdoc(cls) if cls.__module__ != "builtins" else None
        if not doc or "Attributes:" not in doc:
            continue
        name = ""
        for line in doc.split("Attributes:", 1)[1].splitlines():
            match = re.match(r"^    (\w+): (.*)$", line)
            if match:
                name, described[match[1]] = match[1], match[2]
            elif name and line.startswith("        "):
                described[name] += " " + line.strip()
            elif line.strip():
                name = ""
    return {key: text.replace("``", "").replace("%", "%%") for key, text in described.items()}


def _parser(spec: ExampleSpec) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"python -m examples.{spec.name}.train", description=spec.description)
    defaults = spec.defaults
    described = _field_help()
    for item in fields(TrainingConfig):
        if item.name == "console":
            continue
        flag = "--" + item.name.replace("_", "-")
        default = getattr(defaults, item.name)
        text = f"{described.get(item.name, '')} (default: {default})".lstrip()
        if isinstance(default, bool):
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=default, help=text)
        elif item.name == "dtype":
            parser.add_argument(flag, choices=_DTYPES, default=default, help=text)
        else:
            parser.add_argument(flag, type=_OPTION_TYPES.get(item.name, str), default=default, help=text)
    parser.add_argument("--output-dir", type=Path, default=Path(f"runs/{spec.name}"), help="where runs are written")
    parser.add_argument("--quiet", action="store_true", help="no per-step progress bar")
    add_result_options(parser)
    return parser


def main(spec: ExampleSpec, argv: Optional[Sequence[str]] = None) -> TrainingResult:
    """The command line of an example's ``train.py``: train, print the held-out table, write a result file.

    Exits with status 2 and one line when an option is out of range, a task file is missing or malformed, the model
    cannot be found or ``--output-dir`` cannot be written (before anything starts), and with status 130 (no table, no result file) when the run was
    interrupted before its final validation.

    Every :class:`TrainingConfig` field is an option (``--steps``, ``--learning-rate``, ``--n-test``...).
    """
    from agentbolt.models import ModelNotAvailableError, resolve_model

    words = list(sys.argv[1:] if argv is None else argv)
    parser = _parser(spec)
    args = parser.parse_args(words)
    try:  # before the run directory, the runners and the engine
        spec.load_train()
        spec.load_test()
    except TaskFileError as exc:
        parser.exit(CONFIGURATION_ERROR, f"error: {exc}\n")
    try:
        resolve_model(args.model)
    except ModelNotAvailableError as exc:
        parser.exit(CONFIGURATION_ERROR, f"error: --model: {exc}\n")
    require_writable_directory(parser, "--output-dir", args.output_dir)
    record = replace(
        RunRecord.start(f"{spec.name}_train", words),
        command=shlex.join(["python", "-m", f"examples.{spec.name}.train", *words]),
    )
    values = {item.name: getattr(args, item.name) for item in fields(TrainingConfig) if item.name != "console"}
    config = replace(spec.defaults, **values, console=not args.quiet)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        result = train_example(spec, config, args.output_dir)
    except TrainingInterrupted as exc:
        print(f"{exc}; no result file written", file=sys.stderr)
        print("after: not measured (interrupted)")
        raise SystemExit(130) from None
    print(format_table([SliceChange(**row) for row in result.heldout]))
    print(
        f"{result.steps} steps, {result.train_rollouts} training rollouts, {result.wall_seconds:.0f} s; {result.run_dir}"
    )
    record.finish(result.summary(), args)
    return result
