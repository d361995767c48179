"""Train the Flow-GRPO planner with agentbolt's GRPO: ``python -m examples.flow_grpo.train --config cpu``.

Only the planner's LLM calls are trained (``agent_match="planner"``); every planner turn of a trajectory is trained
on that trajectory's final reward (``credit="final"``), and advantages are normalized within the group of rollouts
of the same question (``group_size`` rollouts per question). The other roles (query analyzer, executor, verifier,
solution generator, generalist tool) call a fixed model that never changes:

* ``cpu`` (``configs/cpu.yaml``): the embedded SmolLM2-135M-Instruct in every role. The planner is the model GRPO
  serves in process (base + LoRA adapter, through the LLM gateway, which records token ids); the fixed roles call
  the same base model without adapter, served by ``agentbolt serve`` in a child process.
* ``gpu`` (``configs/gpu.yaml``): a 1.5B planner with LoRA on a vLLM server (each update is loaded as a new adapter)
  and a 7B fixed model on a second vLLM server. Documented in ``docs/flow-grpo-training.md``; not runnable on a
  machine without a GPU.

Examples::

    python -m examples.flow_grpo.train --config cpu --summary-json runs/flow-grpo/summary.json
    python -m examples.flow_grpo.train --config cpu --steps 2 --output-dir /tmp/flow-smoke
    python -m examples.flow_grpo.train --config my-run.yaml --model /path/to/hf-model-dir

The run directory (``--output-dir``) receives ``config.json``, ``store.sqlite`` (every rollout, span and token id),
``logs/metrics.jsonl`` and ``logs/reward_curve.png``, ``checkpoints/step_*`` (the planner's LoRA adapter, loadable
with ``python -m examples.flow_grpo.solve --checkpoint DIR/checkpoints``) and ``summary.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List, Literal, Optional, Sequence

import yaml  # type: ignore[import-untyped]
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from agentbolt.algorithm.sft.config import Packing
from agentbolt.runner.agent import TRAINING_POLL_INTERVAL
from examples.flow_grpo.data import load_offline_dataset, load_tasks
from examples.flow_grpo.evaluation import PassComparison

__all__ = [
    "CONFIG_DIR",
    "DataSection",
    "FixedModelSection",
    "FlowTrainConfig",
    "SolverSection",
    "TrainSummary",
    "WarmStartSection",
    "build_grpo_config",
    "build_solver",
    "load_config",
    "load_split",
    "main",
    "run_training",
]

logger = logging.getLogger(__name__)

CONFIG_DIR = Path(__file__).resolve().parent / "configs"
"""Where the named configurations (``cpu.yaml``, ``gpu.yaml``) live."""

OWNED_GRPO_KEYS = frozenset(
    {"model", "served_model_name", "log_dir", "checkpoint_dir", "resume", "console", "init_adapter"}
)
"""GRPO options this script sets itself (from the top-level config and the run directory)."""


class FixedModelSection(BaseModel):
    """The fixed model behind the analyzer, executor, verifier, solution generator and generalist tool.

    Attributes:
        url: OpenAI-compatible base URL (ending in ``/v1``) of an already running server; None serves the planner's
            base model (without adapter) with ``agentbolt serve`` in a child process.
        model: Model name to request at ``url`` (required with ``url``).
        api_key: Bearer token of ``url``.
        max_batch_size: Sequences the local fixed server decodes together.
        startup_timeout: Seconds to wait for the local fixed server to answer ``/health``.
    """

    model_config = ConfigDict(extra="forbid")

    url: Optional[str] = None
    model: Optional[str] = None
    api_key: Optional[str] = None
    max_batch_size: int = Field(default=8, ge=1)
    startup_timeout: float = Field(default=600.0, gt=0)

    @model_validator(mode="after")
    def _url_needs_model(self) -> FixedModelSection:
        if self.url is not None and not self.model:
            raise ValueError("fixed.url needs fixed.model (the model name to request there)")
        return self


class SolverSection(BaseModel):
    """Settings of the solve loop (see :class:`examples.flow_grpo.solver.SolverConfig`)."""

    model_config = ConfigDict(extra="forbid")

    max_turns: int = Field(default=3, ge=1)
    planner_max_tokens: int = Field(default=128, ge=8)
    python_timeout: float = Field(default=10.0, gt=0)
    memory_result_chars: int = Field(default=400, ge=40)
    planner_examples: bool = True
    planner_guide: Literal["none", "tools", "question"] = "none"


class DataSection(BaseModel):
    """Training and held-out tasks.

    Attributes:
        train: ``"train"`` / ``"val"`` (the shipped offline dataset) or a JSONL/parquet file in the task schema.
        val: Same, for held-out validation.
        sources: Keep only tasks whose ``source`` is listed (None: all).
        train_limit: Use at most this many training tasks (None: all).
        val_limit: Use at most this many held-out tasks (None: all).
        val_offset: Skip this many held-out tasks first (after the source filter), e.g. to validate on questions
            that no configuration was chosen on.
    """

    model_config = ConfigDict(extra="forbid")

    train: str = "train"
    val: str = "val"
    sources: Optional[List[str]] = None
    train_limit: Optional[int] = Field(default=None, ge=1)
    val_limit: Optional[int] = Field(default=None, ge=1)
    val_offset: int = Field(default=0, ge=0)


class WarmStartSection(BaseModel):
    """Supervised warm start of the planner before GRPO (:mod:`examples.flow_grpo.warmstart`).

    The training tasks are solved with their reference plans by the real fixed roles; the planner turns of the solves
    the strict reward accepts are the SFT data. The adapter is cached under ``cache_dir`` by a digest of everything
    that shapes it, so later runs of the same configuration reuse it.

    Attributes:
        epochs: Passes over the planner conversations.
        learning_rate: Peak learning rate of the LoRA adapters.
        train_batch_size: Conversations per optimizer step.
        micro_batch_size: Conversations per forward pass.
        packing: Layout of each micro-batch (:attr:`agentbolt.algorithm.sft.SFTConfig.packing`): ``"prefix"``
            computes the system prompt and the earlier turns the conversations share once per micro-batch. Every
            layout trains the same adapter (up to float rounding), so it is not part of the cache key.
        tasks: Training tasks solved with their reference plans, taken in turn from each source (None: all).
        workers: Reference solves run concurrently during collection.
        cache_dir: Where warm starts are kept (one folder per digest).
    """

    model_config = ConfigDict(extra="forbid")

    epochs: int = Field(default=2, ge=1)
    learning_rate: float = Field(default=1e-3, gt=0)
    train_batch_size: int = Field(default=8, ge=1)
    micro_batch_size: int = Field(default=8, ge=1)
    packing: Packing = "none"
    tasks: Optional[int] = Field(default=None, ge=1)
    workers: int = Field(default=12, ge=1)
    cache_dir: str = "runs/flow-grpo/warmstart"


class FlowTrainConfig(BaseModel):
    """One training configuration (a YAML file under ``configs/`` or anywhere).

    Attributes:
        name: Short name shown in the summary.
        description: What the configuration is for.
        model: The planner's base model (registry name, local Hugging Face directory or hub id).
        runnable_here: False for configurations that need hardware this machine lacks (the GPU one); the script
            still runs them, after a warning.
        dtype: Weights dtype of the trained planner and of the local fixed server.
        threads: torch threads of the local engines (None: torch's choice).
        runners: Runner processes executing rollouts concurrently.
        fixed: The fixed model.
        solver: The solve loop.
        data: The tasks.
        train_format_bonus: Training-only reward credit for a well-formed trajectory (every planner step names a
            real tool or the stop action, and a tool ran), added to the binary reward; held-out validation always
            uses the strict binary reward. 0 disables it.
        warm_start: Supervised warm start of the planner before GRPO (None: GRPO starts from the base model).
        grpo: :class:`agentbolt.algorithm.grpo.GRPOConfig` options, except those the script sets itself
            (:data:`OWNED_GRPO_KEYS`). ``agent_match`` defaults to ``"planner"`` and ``credit`` to ``"final"``.
    """

    model_config = ConfigDict(extra="forbid")

    name: str
    description: str = ""
    model: str
    runnable_here: bool = True
    dtype: str = "bfloat16"
    threads: Optional[int] = Field(default=None, ge=1)
    runners: int = Field(default=4, ge=1)
    fixed: FixedModelSection = Field(default_factory=FixedModelSection)
    solver: SolverSection = Field(default_factory=SolverSection)
    data: DataSection = Field(default_factory=DataSection)
    train_format_bonus: float = Field(default=0.0, ge=0.0, lt=1.0)
    warm_start: Optional[WarmStartSection] = None
    grpo: Dict[str, Any] = Field(default_factory=dict)

    @field_validator("grpo")
    @classmethod
    def _valid_grpo(cls, value: Dict[str, Any]) -> Dict[str, Any]:
        owned = sorted(OWNED_GRPO_KEYS & set(value))
        if owned:
            raise ValueError(f"grpo.{owned[0]} is set by the training script; remove it from the config")
        from agentbolt.algorithm.grpo.config import GRPOConfig

        GRPOConfig(**{"agent_match": "planner", "credit": "final", **value})  # raises on unknown or bad options
        return value


def load_config(name_or_path: str | os.PathLike[str], overrides: Optional[Dict[str, Any]] = None) -> FlowTrainConfig:
    """Read a configuration: ``"cpu"``/``"gpu"`` (shipped under ``configs/``) or a YAML file path.

    Args:
        name_or_path: Configuration name or file.
        overrides: Top-level fields replaced after reading (``{"model": ...}``); a ``grpo`` or ``solver`` dict is
            merged into the file's section of that name.

    Raises:
        FileNotFoundError: No such configuration.
        ValueError: The file is not a YAML mapping, or a field is invalid (the message names it).
    """
    path = Path(name_or_path)
    if not path.suffix and not path.exists():
        path = CONFIG_DIR / f"{name_or_path}.yaml"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in CONFIG_DIR.glob("*.yaml")))
        raise FileNotFoundError(f"no configuration {str(name_or_path)!r} (named ones: {known}; or give a YAML path)")
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise ValueError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: expected a mapping of options at the top level")
    for key, value in (overrides or {}).items():
        if key in ("grpo", "solver"):
            raw[key] = {**(raw.get(key) or {}), **value}
        else:
            raw[key] = value
    try:
        return FlowTrainConfig(**raw)
    except ValidationError as exc:
        raise ValueError(f"{path}: invalid configuration:\n{exc}") from None


def build_grpo_config(
    config: FlowTrainConfig, model_path: str, run_dir: Path, console: bool = True, init_adapter: Optional[str] = None
) -> Any:
    """The :class:`~agentbolt.algorithm.grpo.GRPOConfig` of a run: the file's options plus the ones owned here
    (``init_adapter``: the warm start's adapter, or None)."""
    from agentbolt.algorithm.grpo.config import GRPOConfig

    options: Dict[str, Any] = {"agent_match": "planner", "credit": "final", "dtype": config.dtype}
    if config.threads is not None:
        options["threads"] = config.threads
    options.update(config.grpo)
    options.update(
        model=model_path,
        served_model_name="planner",
        log_dir=str(run_dir / "logs"),
        checkpoint_dir=str(run_dir / "checkpoints"),
        resume=False,
        console=console,
        init_adapter=init_adapter,
    )
    return GRPOConfig(**options)


def build_solver(config: FlowTrainConfig) -> Any:
    """The solve loop of a configuration (the same for training, held-out validation and the warm start)."""
    from examples.flow_grpo.solver import FlowSolver, SolverConfig

    return FlowSolver(SolverConfig(**config.solver.model_dump()))


def load_split(
    spec: str, sources: Optional[Sequence[str]], limit: Optional[int], offset: int = 0
) -> List[Dict[str, Any]]:
    """Tasks of one split: a shipped split name or a file, filtered by source, the first ``offset`` skipped, cut to
    ``limit``.

    Raises:
        ValueError: No task left.
    """
    tasks = load_offline_dataset(spec) if spec in ("train", "val") else load_tasks(spec)
    if sources is not None:
        tasks = [t for t in tasks if t.get("source") in set(sources)]
    tasks = tasks[offset:] if limit is None else tasks[offset : offset + limit]
    if not tasks:
        raise ValueError(f"no task in {spec!r} (sources={sources})")
    return [dict(t) for t in tasks]


class CopiedQuestionSummary(BaseModel):
    """The copied-question check: every held-out question, and the expression written in it, scored as answers."""

    tasks: int
    candidates: int
    credited: int
    examples: List[str]


class TrainSummary(BaseModel):
    """What a run produced (the ``--summary-json`` document).

    Attributes:
        baseline_val_success: Held-out success rate before training (fraction of questions answered correctly).
        final_val_success: Held-out success rate after the last step; None when the run trained nothing (0 steps:
            the one validation pass is ``baseline_val_success``) or was interrupted before its final validation.
        interrupted: The run was stopped (Ctrl-C, SIGTERM) before its final validation pass; no ``summary.json``
            is written for it.
        steps: Training steps run.
        planner_samples: Planner turns the updates trained on (``samples/trained`` summed over the steps).
        wall_seconds: Wall time of the whole run (model loads, validations, training).
        evaluation: Per-source success before and after training with 95 % Wilson intervals, loop statistics
            (planner turns, tool calls, stop reasons, first actions) and the example questions; a run that
            validated once (0 steps, or interrupted) has that pass on both sides (only its ``before`` is shown).
            Every held-out question counts in both passes, one whose rollout failed or left no record as unsolved
            (stop reason ``rollout failed``...).
        copied_question_check: How many copied-back questions the run's reward credits (must be 0).
        trajectories: Markdown file with the example questions' trajectories before and after training.
        warm_start: The warm start GRPO started from (adapter, whether reused, build time, reference-solve counts,
            SFT figures); None without one. ``baseline_val_success`` is then the warm-started planner's.
    """

    config: str
    model: str
    baseline_val_success: float
    final_val_success: Optional[float]
    steps: int
    wall_seconds: float
    val_questions: int
    train_rollouts: int
    train_reward_first: Optional[float]
    train_reward_last: Optional[float]
    planner_samples: int
    other_role_calls_excluded: int
    rollout_seconds: float
    update_seconds: float
    run_dir: str
    checkpoint: Optional[str]
    metrics: str
    evaluation: Optional[PassComparison] = None
    copied_question_check: Optional[CopiedQuestionSummary] = None
    trajectories: Optional[str] = None
    warm_start: Optional[Dict[str, Any]] = None
    interrupted: bool = False


@contextlib.contextmanager
def fixed_model(config: FlowTrainConfig, model_path: str, log_path: Path) -> Iterator[Dict[str, Any]]:
    """The ``model_list`` entry of the fixed model, serving it with ``agentbolt serve`` in a child process when no URL
    is configured (a separate process keeps its threads out of the runner processes the trainer forks)."""
    fixed = config.fixed
    if fixed.url is not None:
        params: Dict[str, Any] = {"model": f"hosted_vllm/{fixed.model}", "api_base": fixed.url}
        if fixed.api_key:
            params["api_key"] = fixed.api_key
        yield {"model_name": str(fixed.model), "litellm_params": params}
        return
    from agentbolt.serving.process import LocalModelServer

    server = LocalModelServer(
        model_path,
        served_name="fixed",
        dtype=config.dtype,
        threads=config.threads,
        max_batch_size=fixed.max_batch_size,
        log_path=log_path,
        startup_timeout=fixed.startup_timeout,
    )
    with server:
        yield server.model_config()


def _summarize(
    config: FlowTrainConfig,
    history: List[Dict[str, float]],
    run_dir: Path,
    started: float,
    val_questions: int,
    max_steps: int,
) -> TrainSummary:
    accuracies = [r["val/accuracy"] for r in history if "val/accuracy" in r]
    if not accuracies:
        raise RuntimeError("validation did not run; see the log for the failure")
    # The final validation runs after the last step (step == max_steps); without it "after" was never measured.
    finals = [r["val/accuracy"] for r in history if "val/accuracy" in r and r.get("step") == max_steps]
    final = finals[-1] if finals and max_steps > 0 else None
    train = [r for r in history if "train/reward_mean" in r]
    checkpoints = sorted((run_dir / "checkpoints").glob("step_*"))
    return TrainSummary(
        config=config.name,
        model=config.model,
        baseline_val_success=accuracies[0],
        final_val_success=final,
        interrupted=max_steps > 0 and final is None,
        steps=len(train),
        wall_seconds=time.perf_counter() - started,
        val_questions=val_questions,
        train_rollouts=int(sum(r.get("rollouts/total", 0.0) for r in train)),
        train_reward_first=train[0]["train/reward_mean"] if train else None,
        train_reward_last=train[-1]["train/reward_mean"] if train else None,
        planner_samples=int(sum(r.get("samples/trained", 0.0) for r in train)),
        other_role_calls_excluded=int(sum(r.get("samples/other_agents", 0.0) for r in train)),
        rollout_seconds=sum(r.get("time/rollout_seconds", 0.0) for r in train),
        update_seconds=sum(r.get("time/update_seconds", 0.0) for r in train),
        run_dir=str(run_dir),
        checkpoint=str(checkpoints[-1]) if checkpoints else None,
        metrics=str(run_dir / "logs" / "metrics.jsonl"),
    )


def run_training(
    config: FlowTrainConfig, run_dir: Path, console: bool = True, adapter: Optional[Path] = None
) -> TrainSummary:
    """Validate, train the planner with GRPO, validate again; write ``summary.json`` into ``run_dir`` (not when the
    run was interrupted before its final validation: ``summary.interrupted``).

    ``adapter``: a LoRA adapter directory (a checkpoint's ``adapter/``) the planner starts from instead of the
    configuration's warm start; with ``grpo.max_steps`` 0 the run only validates it.

    Raises:
        FileExistsError: ``run_dir`` already holds a run.
        agentbolt.models.ModelNotAvailableError: The planner model cannot be found.
        RuntimeError: The fixed model server did not start, or validation did not run.
    """
    import agentbolt as agl
    from agentbolt.algorithm.grpo import GRPO
    from agentbolt.models import resolve_model
    from examples.flow_grpo import FlowGRPOAgent

    started = time.perf_counter()
    if (run_dir / "store.sqlite").exists() or (run_dir / "checkpoints").exists():
        raise FileExistsError(f"{run_dir} already holds a run; choose another --output-dir")
    run_dir.mkdir(parents=True, exist_ok=True)
    train = load_split(config.data.train, config.data.sources, config.data.train_limit)
    val = load_split(config.data.val, config.data.sources, config.data.val_limit, config.data.val_offset)
    model_path = str(resolve_model(config.model).path)
    logger.info("Flow-GRPO run %s: %d training / %d held-out tasks", run_dir, len(train), len(val))
    solver = build_solver(config)
    with fixed_model(config, model_path, run_dir / "logs" / "fixed-server.log") as fixed:
        warm_start = None
        init_adapter = None if adapter is None else str(adapter)
        if config.warm_start is not None and adapter is None:
            from examples.flow_grpo.warmstart import ensure_warm_start

            warm_start = ensure_warm_start(config, model_path, fixed, train)
            init_adapter = str(warm_start.adapter_dir)
        grpo_config = build_grpo_config(config, model_path, run_dir, console=console, init_adapter=init_adapter)
        (run_dir / "config.json").write_text(
            json.dumps({"flow": config.model_dump(), "grpo": grpo_config.model_dump()}, indent=1, default=str),
            encoding="utf-8",
        )
        algorithm = GRPO(grpo_config)
        tracer = agl.OtelTracer()
        trainer = agl.Trainer(
            algorithm=algorithm,
            store=run_dir / "store.sqlite",
            tracer=tracer,
            # One process per runner: a tracer records one rollout at a time per process, and separate processes
            # let rollouts overlap so each engine decodes them as one batch.
            n_runners=config.runners,
            port=0,
            runner=agl.LitAgentRunner(tracer=tracer, poll_interval=TRAINING_POLL_INTERVAL),
            # The fixed roles call the fixed model through a gateway of their own, recording into the run's store:
            # the trace then holds every call with its token ids, and agent_match="planner" keeps them out of
            # training.
            initial_resources={"fixed_llm": agl.LLMProxy(model_list=[fixed], launch_mode="thread")},
        )
        agent = FlowGRPOAgent(solver=solver, train_format_bonus=config.train_format_bonus)
        trainer.fit(agent, train_dataset=train, val_dataset=val)
    summary = _summarize(config, algorithm.history, run_dir, started, len(val), grpo_config.max_steps)
    if warm_start is not None:
        summary.warm_start = {
            "adapter_dir": str(warm_start.adapter_dir),
            "reused": warm_start.reused,
            "build_seconds": warm_start.wall_seconds,
            "collect": warm_start.collect,
            "sft": warm_start.sft,
        }
    from agentbolt.store.sqlite import SqliteLightningStore

    # The trainer closed the store it opened (the file alone holds the run); read it back without writing.
    store = SqliteLightningStore(run_dir / "store.sqlite", read_only=True)
    try:
        _add_evaluation(summary, store, val, agent, run_dir)
    finally:
        asyncio.run(store.close())
    if not summary.interrupted:
        (run_dir / "summary.json").write_text(summary.model_dump_json(indent=2) + "\n", encoding="utf-8")
    return summary


def _add_evaluation(summary: TrainSummary, store: Any, val: List[Dict[str, Any]], agent: Any, run_dir: Path) -> None:
    """Fill the summary's evaluation from the validation passes recorded in ``store``; write the trajectories."""
    from examples.flow_grpo.evaluation import (
        compare,
        complete_pass,
        copied_question_credit,
        read_validation_records,
        trajectories_markdown,
    )

    check = copied_question_credit(val, agent.reward)
    summary.copied_question_check = CopiedQuestionSummary(**vars(check))
    passes = read_validation_records(store)
    if not passes:
        logger.warning("No validation pass was recorded; no per-source evaluation.")
        return
    # With one pass (a run of 0 steps, such as --untrained, or an interrupted one) "before" and "after" are that
    # pass; only "before" is shown then, and there are no before/after trajectories.
    # Every held-out question counts in both passes: one whose rollout failed or is missing counts as unsolved.
    before, after = complete_pass(passes[min(passes)], val), complete_pass(passes[max(passes)], val)
    summary.evaluation = compare(before, after, val)
    if summary.final_val_success is None:
        return
    path = run_dir / "trajectories.md"
    path.write_text(trajectories_markdown(before, after, summary.evaluation.example_indices), encoding="utf-8")
    summary.trajectories = str(path)


def _parse_args(argv: Optional[List[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m examples.flow_grpo.train",
        description="Train the Flow-GRPO planner with GRPO (only planner calls; trajectory reward on every turn).",
    )
    parser.add_argument("--config", default="cpu", help="'cpu', 'gpu' or a YAML file (default: cpu).")
    parser.add_argument("--steps", type=int, default=None, help="Training steps (overrides grpo.max_steps).")
    parser.add_argument("--summary-json", type=Path, default=None, help="Also write the run summary here.")
    parser.add_argument("--output-dir", type=Path, default=None, help="Run directory (default: runs/flow-grpo/...).")
    parser.add_argument("--model", default=None, help="Planner base model (overrides the config's).")
    parser.add_argument("--val-limit", type=int, default=None, help="Held-out questions used (default: config).")
    parser.add_argument(
        "--val-offset", type=int, default=None, help="Held-out questions skipped first (default: config, 0)."
    )
    parser.add_argument(
        "--untrained",
        action="store_true",
        help="Only validate the untrained planner (no warm start, worked examples shown, no steps): the baseline.",
    )
    parser.add_argument(
        "--adapter",
        type=Path,
        default=None,
        help="Start the planner from this LoRA adapter (a checkpoint's adapter/) instead of the warm start; "
        "with --steps 0, only validate it.",
    )
    parser.add_argument("--runners", type=int, default=None, help="Runner processes (default: config).")
    parser.add_argument("--quiet", action="store_true", help="No progress bars (training or weight loading).")
    parser.add_argument("-v", "--verbose", action="store_true", help="Show library logs.")
    args = parser.parse_args(argv)
    for name in ("steps", "val_limit", "val_offset", "runners"):
        value = getattr(args, name)
        if value is not None and value < (0 if name in ("steps", "val_offset") else 1):
            parser.error(f"--{name.replace('_', '-')} must be {'>= 0' if name in ('steps', 'val_offset') else '>= 1'}")
    if args.adapter is not None:
        if args.untrained:
            parser.error("--adapter and --untrained exclude each other")
        if not (args.adapter / "adapter_config.json").is_file():
            parser.error(
                f"--adapter {args.adapter}: no adapter_config.json there (give a checkpoint's adapter/ folder)"
            )
    return args


def _overrides(args: argparse.Namespace) -> Dict[str, Any]:
    overrides: Dict[str, Any] = {}
    if args.model is not None:
        overrides["model"] = args.model
    if args.runners is not None:
        overrides["runners"] = args.runners
    if args.steps is not None:
        overrides["grpo"] = {"max_steps": args.steps}
    if args.untrained:
        # The untrained planner at its best: no warm start, its worked examples shown, validated once.
        overrides.update(warm_start=None, solver={"planner_examples": True}, grpo={"max_steps": 0})
    return overrides


def _print_summary(summary: TrainSummary) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"Flow-GRPO training ({summary.config})", show_header=False)
    table.add_row("planner model", summary.model)
    table.add_row("held-out success before", f"{100 * summary.baseline_val_success:.1f}% of {summary.val_questions}")
    if summary.final_val_success is not None:
        gain = 100.0 * (summary.final_val_success - summary.baseline_val_success)
        table.add_row("held-out success after", f"{100 * summary.final_val_success:.1f}% ({gain:+.1f} points)")
    elif summary.interrupted:
        table.add_row("held-out success after", "not measured (interrupted)")
    reward = (
        f"{summary.train_reward_first:.2f} -> {summary.train_reward_last:.2f}"
        if summary.train_reward_first is not None and summary.train_reward_last is not None
        else "-"
    )
    table.add_row("training", f"{summary.steps} steps, {summary.train_rollouts} rollouts, train reward {reward}")
    table.add_row(
        "samples",
        f"{summary.planner_samples} planner turns trained on; {summary.other_role_calls_excluded} other calls excluded",
    )
    table.add_row(
        "wall time",
        f"{summary.wall_seconds:.0f} s (rollouts {summary.rollout_seconds:.0f} s, updates {summary.update_seconds:.0f} s)",
    )
    table.add_row("checkpoint", summary.checkpoint or "(none)")
    table.add_row("run directory", summary.run_dir)
    console = Console()
    console.print(table)
    if summary.evaluation is not None:
        measured_after = summary.final_val_success is not None
        console.print(_evaluation_table(summary.evaluation, measured_after))
        loops = Table(title="Solve loop on the held-out questions", show_header=True)
        for column in ("", "planner turns / question", "tool calls / question", "stop reasons", "first actions"):
            loops.add_column(column)
        passes = [("before", summary.evaluation.loop_before)]
        if measured_after:
            passes.append(("after", summary.evaluation.loop_after))
        for label, stats in passes:
            loops.add_row(
                label,
                f"{stats.mean_planner_turns:.2f}",
                f"{stats.mean_tool_calls:.2f}",
                ", ".join(f"{k} {v}" for k, v in stats.stop_reasons.items()),
                ", ".join(f"{k} {v}" for k, v in list(stats.first_actions.items())[:4]),
            )
        console.print(loops)
    if summary.copied_question_check is not None:
        check = summary.copied_question_check
        console.print(
            f"Copied-question check: {check.credited} of {check.candidates} copied-back answers "
            f"({check.tasks} questions and the expressions in them) earn credit."
        )
    if summary.trajectories:
        console.print(f"Example trajectories before/after: {summary.trajectories}")


def _evaluation_table(evaluation: PassComparison, measured_after: bool = True) -> Any:
    """Per-source held-out success before and after (only before when ``measured_after`` is False), with 95 % Wilson
    intervals."""
    from rich.table import Table

    table = Table(title="Held-out success per source (greedy; 95 % Wilson intervals)", show_header=True)
    if not measured_after:
        for column in ("source", "before"):
            table.add_column(column)
        for row in evaluation.before:
            table.add_row(row.source, row.text())
        return table
    for column in ("source", "before", "after", "change"):
        table.add_column(column)
    after = {row.source: row for row in evaluation.after}
    for row in evaluation.before:
        new = after.get(row.source)
        change = f"{100 * (new.rate - row.rate):+.1f} points" if new is not None else "-"
        table.add_row(row.source, row.text(), new.text() if new is not None else "-", change)
    return table


def exit_cleanly_on_sigterm() -> None:
    """Make SIGTERM unwind like Ctrl-C in this process, so the fixed model server and the gateways are stopped.

    Forked runner processes inherit the handler; there it restores the default action and re-raises the signal, so
    they still end with the status the execution strategy expects.
    """
    main_pid = os.getpid()

    def handler(signum: int, _frame: Any) -> None:
        if os.getpid() == main_pid:
            sys.exit(128 + signum)
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    signal.signal(signal.SIGTERM, handler)


def main(argv: Optional[List[str]] = None) -> int:
    """Command-line entry point; returns the exit status (2 for bad arguments or configuration, 130 when interrupted
    before the final validation)."""
    args = _parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )
    try:
        config = load_config(args.config, _overrides(args))
    except (FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.val_limit is not None:
        config.data.val_limit = args.val_limit
    if args.val_offset is not None:
        config.data.val_offset = args.val_offset
    if not config.runnable_here:
        print(f"warning: configuration {config.name!r} is not meant for this machine: {config.description}")
    exit_cleanly_on_sigterm()
    if args.quiet:
        from agentbolt.logging import quiet_model_loading

        quiet_model_loading()
    run_dir = args.output_dir or Path("runs") / "flow-grpo" / f"{config.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    try:
        summary = run_training(config, run_dir, console=not args.quiet, adapter=args.adapter)
    except FileExistsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if summary.interrupted:
        _print_summary(summary)
        print("error: interrupted before the final validation; no summary.json written", file=sys.stderr)
        return 130
    if args.summary_json is not None:
        args.summary_json.parent.mkdir(parents=True, exist_ok=True)
        args.summary_json.write_text(summary.model_dump_json(indent=2) + "\n", encoding="utf-8")
    _print_summary(summary)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
