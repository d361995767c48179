"""The orchestration behind ``agentbolt demo``: train the embedded model to use a calculator, end to end.

One call of :func:`run_demo` pulls the embedded model (cached after the first time), opens a SQLite store, and
runs :class:`~agentbolt.algorithm.grpo.GRPO` under an :class:`agentbolt.Trainer` with several runner processes
(:func:`fit_grpo`, which the trained examples under ``examples/`` use too). GRPO
serves the policy with the in-process transformers engine behind the LLM gateway; the runners execute the
:class:`~agentbolt.demo.agent.CalculatorAgent` (plain OpenAI-SDK code) against the gateway, which records token ids
and log-probs into the store; GRPO reads them back, updates LoRA adapters, and measures held-out accuracy before
and after training.
"""

from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Optional

from agentbolt.demo.agent import CalculatorAgent, RewardConfig
from agentbolt.demo.task import make_splits
from agentbolt.serving.transformers_engine import configure_openmp

if TYPE_CHECKING:
    from agentbolt.algorithm.grpo import GRPO

__all__ = [
    "DemoConfig",
    "DemoInterrupted",
    "DemoResult",
    "GrpoRunConfig",
    "fit_grpo",
    "new_run_dir",
    "resolve_demo_dtype",
    "run_demo",
    "step_time_split",
]

logger = logging.getLogger(__name__)


@dataclass
class GrpoRunConfig:
    """The settings of a GRPO run on the embedded model, shared by the demo and the trained examples.

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
        threads: torch threads (None: torch's default).
        dtype: Weights dtype of the policy (shared by the engine and the trainer); ``"auto"``: bfloat16 where the
            CPU multiplies bfloat16 natively (AVX-512, AMX), else float32 (bfloat16 is emulated, several times
            slower, on AVX2-only CPUs).
        device: Device of the policy and its engine (None: CUDA when available, else the CPU).
        micro_batch_size: Samples per training forward/backward (gradients accumulate over them). The trainer packs a
            micro-batch's samples as a prefix tree, so a group's calls, which share their long prompt, compute it
            once when they share a micro-batch: 16 holds a group's two calls per rollout.
        gradient_checkpointing: Recompute each transformer block in the backward pass instead of keeping its
            activations (prompts with worked examples are hundreds of tokens, so without it a micro-batch's
            activations take gigabytes).
        seed: Seed of sampling, task order and the trainer.
        console: Show GRPO's per-step progress.
    """

    model: str = "smollm2-135m-instruct"
    steps: int = 4
    batch_size: int = 4
    group_size: int = 8
    learning_rate: float = 1e-3
    lora_r: int = 16
    temperature: float = 1.0
    max_tokens: int = 40
    runners: int = 8
    threads: Optional[int] = None
    dtype: str = "auto"
    device: Optional[str] = None
    micro_batch_size: int = 16
    gradient_checkpointing: bool = True
    seed: int = 0
    console: bool = True


@dataclass
class DemoConfig(GrpoRunConfig):
    """Everything the demo run uses; the defaults are the measured configuration (docs/first-agent.md).

    The GRPO settings are those of :class:`GrpoRunConfig`; the demo adds:

    Attributes:
        output_dir: Where the run directory is created.
        n_train: Training questions generated.
        n_val: Held-out validation questions.
        tool_credit: Training reward for a well-formed calculator call when the answer is wrong.
        format_credit: Training reward for the ``ANSWER: <n>`` format when the answer is wrong.
    """

    output_dir: Path = field(default_factory=lambda: Path("agentbolt-demo"))
    n_train: int = 256
    n_val: int = 48
    tool_credit: float = 0.1
    format_credit: float = 0.1

    @classmethod
    def quick(cls, **overrides: Any) -> DemoConfig:
        """A reduced run (fewer steps and validation questions) for a first look or a test."""
        values: Dict[str, Any] = {"steps": 2, "n_val": 24}
        values.update(overrides)
        return cls(**values)


@dataclass
class DemoResult:
    """What a demo run produced.

    Attributes:
        model: The trained model.
        dtype: The weights dtype the run used (``DemoConfig.dtype`` resolved).
        baseline_val_accuracy: Held-out accuracy before training.
        final_val_accuracy: Held-out accuracy after the last step.
        steps: Training steps run.
        wall_seconds: Wall time of the whole run (model load, validations, training).
        train_rollouts: Training rollouts executed.
        rollout_seconds: Time spent generating training rollouts, summed over steps.
        update_seconds: Time spent in policy updates, summed over steps.
        run_dir: The run directory.
        metrics_path: Per-step metrics (JSON lines).
        curve_path: Reward / accuracy curve (PNG), if it was written.
        checkpoint_dir: Directory of the final checkpoint (a PEFT adapter under ``adapter/``).
        store_path: The SQLite store with every rollout, span and token id.
    """

    model: str
    dtype: str
    baseline_val_accuracy: float
    final_val_accuracy: float
    steps: int
    wall_seconds: float
    train_rollouts: int
    rollout_seconds: float
    update_seconds: float
    run_dir: str
    metrics_path: str
    curve_path: Optional[str]
    checkpoint_dir: Optional[str]
    store_path: str

    def summary(self) -> Dict[str, Any]:
        """The ``--summary-json`` document."""
        return asdict(self)


class DemoInterrupted(RuntimeError):
    """The run stopped (Ctrl-C, SIGTERM) before its final validation, so it has no "after" accuracy.

    Attributes:
        run_dir: The run directory, holding what the run wrote until then (store, metrics, checkpoints).
        steps_done: Training steps completed.
        steps: Training steps the run was to take.
    """

    def __init__(self, run_dir: Path, steps_done: int, steps: int) -> None:
        super().__init__(f"interrupted after {steps_done} of {steps} training steps; the partial run is in {run_dir}")
        self.run_dir = run_dir
        self.steps_done = steps_done
        self.steps = steps


def step_time_split(metrics_path: str | Path) -> Dict[str, float]:
    """Sum GRPO's per-step timings from a ``metrics.jsonl``: rollout generation vs policy update.

    Returns:
        ``{"steps", "rollout_seconds", "update_seconds", "step_seconds", "rollout_fraction"}`` over training steps
        (step 0, the validation before training, has no timings and is ignored).
    """
    totals = {"steps": 0.0, "rollout_seconds": 0.0, "update_seconds": 0.0, "step_seconds": 0.0}
    for line in Path(metrics_path).read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        if record.get("time/step_seconds") is None:
            continue
        totals["steps"] += 1
        for key in ("rollout_seconds", "update_seconds", "step_seconds"):
            totals[key] += float(record.get(f"time/{key}") or 0.0)
    busy = totals["rollout_seconds"] + totals["update_seconds"]
    totals["rollout_fraction"] = totals["rollout_seconds"] / busy if busy else math.nan
    return totals


def resolve_demo_dtype(dtype: str) -> str:
    """``dtype`` itself, or for ``"auto"`` bfloat16 when this CPU multiplies it natively and float32 otherwise."""
    if dtype != "auto":
        return dtype
    from agentbolt.serving.fast_forward import bfloat16_is_native

    return "bfloat16" if bfloat16_is_native() else "float32"


def new_run_dir(output_dir: Path) -> Path:
    """A new, empty ``run-<date>-<time>[-N]`` directory under ``output_dir``, this call's alone even when other
    runs create theirs at the same time."""
    output_dir.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    run_dir, suffix = output_dir / f"run-{stamp}", 1
    while True:
        try:
            run_dir.mkdir()  # fails if another run took the name: creating is the check
            return run_dir
        except FileExistsError:
            suffix += 1
            run_dir = output_dir / f"run-{stamp}-{suffix}"


def follow_grpo_updates(config: GrpoRunConfig) -> bool:
    """On a follower rank of a ``torchrun`` launch, take this rank's share of every update of rank 0's GRPO run.

    Returns:
        True once a follower rank's part is over (the caller has nothing else to do); False at once on rank 0 or
        outside ``torchrun``.
    """
    from agentbolt.algorithm.grpo.distributed import launched_rank

    if launched_rank()[0] == 0:
        return False
    configure_openmp()
    from agentbolt.algorithm.grpo import GRPO
    from agentbolt.models import resolve_model

    # The trainer is built from rank 0's options; only the model must be found here.
    GRPO(model=str(resolve_model(config.model).path), console=False).follow()
    return True


def fit_grpo(
    config: GrpoRunConfig,
    agent: Any,
    train: List[Any],
    val: List[Any],
    run_dir: Path,
    *,
    agent_match: Optional[str] = None,
) -> GRPO:
    """Train ``agent`` with GRPO under a :class:`agentbolt.Trainer`, validating greedily before and after.

    The run keeps a SQLite store (``store.sqlite``), the metrics (``logs/``) and the LoRA checkpoints
    (``checkpoints/``) in ``run_dir``; GRPO serves the policy with the in-process engine behind the gateway, and
    ``config.runners`` runner processes execute the rollouts.

    Args:
        config: The run's settings.
        agent: The ``LitAgent`` to train.
        train: Training tasks.
        val: Held-out tasks (validated before the first step and after the last).
        run_dir: The run directory (see :func:`new_run_dir`).
        agent_match: Train only the LLM calls of the agents this pattern matches (None: every call).

    Returns:
        The algorithm, whose ``history`` holds every step's metrics.

    Raises:
        agentbolt.models.ModelNotAvailableError: The model cannot be found or pulled.
    """
    configure_openmp()
    import agentbolt as agl
    from agentbolt.algorithm.grpo import GRPO
    from agentbolt.models import resolve_model
    from agentbolt.runner.agent import TRAINING_POLL_INTERVAL

    # One process per runner: a tracer records one rollout at a time per process, and separate processes let the
    # runners' rollouts overlap so the engine decodes them as one batch. Built first, so that a malformed or
    # contradictory AGL_* variable fails the run before the model is resolved (perhaps pulled) and loaded.
    strategy = agl.ClientServerExecutionStrategy(n_runners=config.runners, server_port=0)
    algorithm = GRPO(
        model=str(resolve_model(config.model).path),
        served_model_name=config.model,
        dtype=resolve_demo_dtype(config.dtype),  # type: ignore[arg-type]
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
        log_dir=str(run_dir / "logs"),
        checkpoint_dir=str(run_dir / "checkpoints"),
        resume=False,
        console=config.console,
        rollout_timeout=1800.0,
        agent_match=agent_match,
    )
    tracer = agl.OtelTracer()
    trainer = agl.Trainer(
        algorithm=algorithm,
        store=run_dir / "store.sqlite",
        tracer=tracer,
        strategy=strategy,
        runner=agl.LitAgentRunner(tracer=tracer, poll_interval=TRAINING_POLL_INTERVAL),
    )
    # The runner processes are forked from this one: with the agents' OpenAI SDK imported here they share its
    # modules' memory instead of importing a private copy each.
    import openai  # noqa: F401

    trainer.fit(agent, train_dataset=train, val_dataset=val)
    return algorithm


def _val_accuracies(history: List[Dict[str, float]]) -> List[float]:
    return [record["val/accuracy"] for record in history if "val/accuracy" in record]


def run_demo(config: DemoConfig) -> Optional[DemoResult]:
    """Run the demo: baseline validation, GRPO training, final validation.

    Under ``torchrun --nproc_per_node N`` the updates are data-parallel: rank 0 runs the demo as in one process and
    the other ranks only compute their share of each update (docs/scaling.md).

    Args:
        config: The run's settings.

    Returns:
        Accuracies, timings and where the outputs are; None on a follower rank of a data-parallel run.

    Raises:
        agentbolt.models.ModelNotAvailableError: The model cannot be found or pulled.
        DemoInterrupted: Ctrl-C (or SIGTERM) stopped the run before its final validation.
        ValueError: ``n_val`` is below 1, the split sizes cannot be generated (:func:`make_splits`), or the credits
            are out of range (:class:`RewardConfig`).
        RuntimeError: Validation did not run (no accuracy to report).
    """
    from agentbolt.algorithm.finetuning.trainer import latest_checkpoint

    started = time.perf_counter()
    if follow_grpo_updates(config):
        return None
    if config.n_val < 1:
        raise ValueError(f"n_val must be at least 1 (the demo reports held-out accuracy), got {config.n_val}")
    reward = RewardConfig(tool_credit=config.tool_credit, format_credit=config.format_credit)
    train, val = make_splits(config.n_train, config.n_val, seed=config.seed)
    run_dir = new_run_dir(Path(config.output_dir))
    log_dir, checkpoint_dir, store_path = run_dir / "logs", run_dir / "checkpoints", run_dir / "store.sqlite"
    (run_dir / "data.json").write_text(json.dumps({"train": train, "val": val}, indent=1), encoding="utf-8")
    (run_dir / "config.json").write_text(json.dumps(asdict(config), default=str, indent=1), encoding="utf-8")
    dtype = resolve_demo_dtype(config.dtype)
    logger.info(
        "Demo run directory %s (%d train / %d held-out questions, %s weights)", run_dir, len(train), len(val), dtype
    )
    agent = CalculatorAgent(
        reward=reward,
        max_tokens=config.max_tokens,
    )
    algorithm = fit_grpo(config, agent, train, val, run_dir)

    train_records = [r for r in algorithm.history if "train/reward_mean" in r]
    # Trainer.fit returns normally after Ctrl-C; the final validation (at step ``steps``) then never ran.
    if not any(r.get("step") == config.steps and "val/accuracy" in r for r in algorithm.history):
        raise DemoInterrupted(run_dir, len(train_records), config.steps)
    accuracies = _val_accuracies(algorithm.history)
    if len(accuracies) < (2 if config.steps > 0 else 1):
        raise RuntimeError("the demo did not complete its validations; see the log for the failure")
    split = step_time_split(log_dir / "metrics.jsonl")
    curve = log_dir / "reward_curve.png"
    checkpoint = latest_checkpoint(checkpoint_dir)
    return DemoResult(
        model=config.model,
        dtype=dtype,
        baseline_val_accuracy=accuracies[0],
        final_val_accuracy=accuracies[-1],
        steps=len(train_records),
        wall_seconds=time.perf_counter() - started,
        train_rollouts=int(sum(r.get("rollouts/total", 0.0) for r in train_records)),
        rollout_seconds=split["rollout_seconds"],
        update_seconds=split["update_seconds"],
        run_dir=str(run_dir),
        metrics_path=str(log_dir / "metrics.jsonl"),
        curve_path=str(curve) if curve.exists() else None,
        checkpoint_dir=str(checkpoint) if checkpoint is not None else None,
        store_path=str(store_path),
    )
