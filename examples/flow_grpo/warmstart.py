"""Warm-start the planner by supervised fine-tuning on reference trajectories: ``python -m examples.flow_grpo.warmstart``.

GRPO learns only from groups whose rollouts differ in reward. The untrained 135M planner solves none of the shipped
multi-step questions (it mostly names tools that do not exist), so every group is all-zero and GRPO has nothing to
learn from (docs/flow-grpo-training.md). The standard remedy, used before RL in most agent-training recipes, is a
short supervised warm start on demonstrations; here the demonstrations come from the dataset itself:

1. every *training* task carries a reference plan (the tool and sub-goal of each step, written by the dataset
   generator); a scripted planner follows it while the real fixed roles (analyzer, executor, verifier, solution
   generator) and tools run, so each planner prompt is exactly what a trained planner would see at that point;
2. only solves whose final answer the strict reward accepts are kept (the fixed roles fail some plans), and each of
   their planner turns becomes one chat conversation: the planner's prompt and the reference step as the answer;
3. LoRA adapters are trained on those conversations with agentbolt's offline SFT
   (:func:`agentbolt.algorithm.sft.train_from_messages`), and GRPO starts from them (``grpo.init_adapter``).

Held-out tasks are never used: their plans stay unseen, and held-out success measures the planner on new questions.
The output directory holds ``turns.jsonl`` (the conversations), ``collect.json`` (per-source solve counts) and
``adapter/`` (the PEFT adapter GRPO loads).

The configuration's ``warm_start`` section sets the SFT options; the warm start is cached under its ``cache_dir`` in
a folder named by a digest of the model, the solve loop, the training data, those options (but ``packing``: every
micro-batch layout trains the same adapter) and the LoRA shape, so a second run of the same configuration reuses it.

Examples::

    python -m examples.flow_grpo.warmstart --config cpu-warmstart     # builds (or finds) the cached warm start
    python -m examples.flow_grpo.train --config cpu-warmstart         # builds it first when it is missing
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import logging
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Sequence

from examples.flow_grpo.agents import RoleLLM
from examples.flow_grpo.diagnose import DEFAULT_ORACLE_TOOLS, OraclePlanner, oracle_steps
from examples.flow_grpo.reward import RuleReward
from examples.flow_grpo.solver import FlowSolver

if TYPE_CHECKING:
    from examples.flow_grpo.train import FlowTrainConfig

__all__ = [
    "CollectSummary",
    "ReferenceSolve",
    "WarmStart",
    "collect_reference_turns",
    "ensure_warm_start",
    "take_by_source",
    "warm_start_dir",
    "warm_start_sft_options",
    "write_turns",
]

logger = logging.getLogger(__name__)

_SOLVE_LOOP_MODULES = ("agents", "memory", "parsing", "prompts", "reward", "expressions", "schemas", "solver")
"""Modules of this package whose code shapes a demonstration (with every module of ``tools``)."""


@dataclass
class ReferenceSolve:
    """One training task solved by the scripted reference planner.

    Attributes:
        task_id: The task's id.
        source: The task's source (slice).
        reward: The strict reward of the final answer.
        turns: The planner's conversations, one per planner turn: its prompt messages, then the reference step as
            the assistant message.
        error: Why the solve failed to run (an endpoint error), else None.
    """

    task_id: Any
    source: str
    reward: float
    turns: List[List[Dict[str, str]]] = field(default_factory=list)
    error: Optional[str] = None


@dataclass
class CollectSummary:
    """Per-source counts of a collection: tasks solved by the reference plans, turns kept, wall time."""

    tasks: int
    solved: int
    turns: int
    errors: int
    by_source: Dict[str, Dict[str, int]]
    wall_seconds: float


def collect_reference_turns(
    tasks: Sequence[Mapping[str, Any]],
    fixed: Mapping[str, Any],
    solver: FlowSolver,
    *,
    workers: int = 12,
) -> List[ReferenceSolve]:
    """Solve each task with its reference plan and the real fixed roles; keep the planner's conversations.

    Args:
        tasks: Tasks with a reference plan (``extra_info.plan``) or a source :data:`DEFAULT_ORACLE_TOOLS` knows.
        fixed: ``{"base_url", "model", "api_key"}`` of the fixed model.
        solver: The solve loop (its settings must be the training run's, so prompts match).
        workers: Tasks solved concurrently (the fixed model's engine batches their calls).

    Raises:
        ValueError: A task has neither a plan nor a source with a default tool.
    """
    reward = RuleReward()
    missing = [task.get("id") for task in tasks if oracle_steps(task, DEFAULT_ORACLE_TOOLS) is None]
    if missing:
        raise ValueError(f"tasks without a reference plan: {missing[:5]}")
    # A planner guided to the question as its sub-goal (planner_guide: question) learns the plans' tools only.
    question_sub_goals = solver.config.planner_guide == "question"
    plans = [oracle_steps(task, DEFAULT_ORACLE_TOOLS, question_sub_goals) for task in tasks]

    def solve(index: int) -> ReferenceSolve:
        task, planner = tasks[index], OraclePlanner(plans[index] or [])
        record = ReferenceSolve(task_id=task.get("id"), source=str(task.get("source", "")), reward=0.0)
        llm = RoleLLM.from_endpoint(fixed["base_url"], fixed["model"], api_key=fixed.get("api_key"))
        try:
            result = solver.solve(str(task["question"]), planner, llm)
        except Exception as exc:  # an endpoint failure costs this task only
            record.error = f"{type(exc).__name__}: {exc}"
            return record
        finally:
            llm.close()
        record.reward = float(reward(task, result.answer))
        record.turns = planner.turns
        return record

    with ThreadPoolExecutor(max(1, workers)) as pool:
        return list(pool.map(solve, range(len(tasks))))


def summarize(solves: Sequence[ReferenceSolve], wall_seconds: float) -> CollectSummary:
    """Counts per source: tasks, solved, kept turns, errors."""
    by_source: Dict[str, Dict[str, int]] = collections.defaultdict(lambda: {"tasks": 0, "solved": 0, "turns": 0})
    for solve in solves:
        counts = by_source[solve.source]
        counts["tasks"] += 1
        if solve.reward >= 1.0:
            counts["solved"] += 1
            counts["turns"] += len(solve.turns)
    return CollectSummary(
        tasks=len(solves),
        solved=sum(1 for s in solves if s.reward >= 1.0),
        turns=sum(len(s.turns) for s in solves if s.reward >= 1.0),
        errors=sum(1 for s in solves if s.error is not None),
        by_source=dict(sorted(by_source.items())),
        wall_seconds=wall_seconds,
    )


def write_turns(solves: Sequence[ReferenceSolve], path: Path) -> int:
    """Write the planner conversations of the solved tasks as chat JSONL (``{"messages": [...]}`` per line).

    Returns:
        The number of conversations written.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [
        json.dumps({"messages": turn, "task_id": solve.task_id, "source": solve.source}, ensure_ascii=False)
        for solve in solves
        if solve.reward >= 1.0
        for turn in solve.turns
    ]
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return len(lines)


def collect_to(output_dir: Path, tasks: Sequence[Mapping[str, Any]], fixed: Mapping[str, Any], solver: FlowSolver,
               workers: int = 12) -> CollectSummary:  # fmt: skip
    """Collect the reference turns of ``tasks`` into ``output_dir/turns.jsonl`` and ``output_dir/collect.json``."""
    started = time.perf_counter()
    solves = collect_reference_turns(tasks, fixed, solver, workers=workers)
    summary = summarize(solves, time.perf_counter() - started)
    written = write_turns(solves, output_dir / "turns.jsonl")
    (output_dir / "collect.json").write_text(json.dumps(asdict(summary), indent=1) + "\n", encoding="utf-8")
    logger.info(
        "Reference plans solved %d of %d training tasks in %.0f s: %d planner turns kept",
        summary.solved,
        summary.tasks,
        summary.wall_seconds,
        written,
    )
    return summary


@dataclass
class WarmStart:
    """A built warm start: the adapter GRPO starts from, and how it was made.

    Attributes:
        adapter_dir: The PEFT adapter (``adapter_config.json`` and weights).
        directory: The warm start's folder (``turns.jsonl``, ``collect.json``, ``sft/``, ``warmstart.json``).
        reused: True when an earlier run had built it.
        collect: Per-source counts of the reference solves.
        sft: Training figures (optimizer steps, loss first/last, held-out NLL when measured).
        wall_seconds: Time spent building it in this process (0 when reused).
    """

    adapter_dir: Path
    directory: Path
    reused: bool
    collect: Dict[str, Any]
    sft: Dict[str, Any]
    wall_seconds: float


LORA_SHAPE_KEYS = ("lora_r", "lora_alpha", "lora_target_modules")
"""GRPO options that shape the adapters: the warm start trains with the same ones, so GRPO can load it."""


def _solve_loop_sources() -> str:
    """Digest of the code that writes the demonstrations: the roles' prompts, the solve loop, the tools, the reward."""
    from examples.flow_grpo import tools

    package = Path(__file__).parent
    files = [package / f"{name}.py" for name in _SOLVE_LOOP_MODULES]
    files += sorted(Path(tools.__file__).parent.glob("*.py"))
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def warm_start_dir(config: FlowTrainConfig, model_path: str, tasks: Sequence[Mapping[str, Any]]) -> Path:
    """The cache folder of a configuration's warm start: ``cache_dir/<name>-<digest>``.

    The digest covers everything that shapes the adapter: the model, the solve loop's settings and code (prompts,
    roles, tools, reward), the training tasks themselves, the warm start's options and the LoRA shape. Editing a
    prompt or regenerating the dataset therefore builds a new warm start instead of reusing a stale one.

    Raises:
        ValueError: The configuration has no ``warm_start`` section.
    """
    if config.warm_start is None:
        raise ValueError(f"configuration {config.name!r} has no warm_start section")
    shaping = {
        "model": model_path,
        "dtype": config.dtype,
        "solver": config.solver.model_dump(),
        "solve_loop_code": _solve_loop_sources(),
        "tasks": hashlib.sha256(json.dumps(list(tasks), sort_keys=True, default=str).encode()).hexdigest(),
        "data": config.data.model_dump(exclude={"val", "val_limit", "val_offset"}),
        # The micro-batch layout (packing) changes how a step is computed, not what it computes.
        "warm_start": config.warm_start.model_dump(exclude={"cache_dir", "workers", "packing"}),
        "lora": {key: config.grpo.get(key) for key in LORA_SHAPE_KEYS},
    }
    digest = hashlib.sha256(json.dumps(shaping, sort_keys=True, default=str).encode()).hexdigest()[:12]
    return Path(config.warm_start.cache_dir) / f"{config.name}-{digest}"


def fixed_endpoint(model_entry: Mapping[str, Any]) -> Dict[str, Any]:
    """``{"base_url", "model", "api_key"}`` of the fixed model from its gateway ``model_list`` entry."""
    params = model_entry["litellm_params"]
    return {
        "base_url": params["api_base"],
        "model": str(params["model"]).split("/", 1)[1],
        "api_key": params.get("api_key"),
    }


def collect_cached(
    directory: Path, config: FlowTrainConfig, fixed_model_entry: Mapping[str, Any], tasks: Sequence[Mapping[str, Any]]
) -> CollectSummary:
    """The reference turns of ``directory`` (collected by an earlier call), or collect them now."""
    from examples.flow_grpo.train import build_solver

    assert config.warm_start is not None
    summary_path = directory / "collect.json"
    if summary_path.is_file() and (directory / "turns.jsonl").is_file():
        logger.info("Reusing the reference turns in %s", directory)
        return CollectSummary(**json.loads(summary_path.read_text(encoding="utf-8")))
    directory.mkdir(parents=True, exist_ok=True)
    chosen = take_by_source(tasks, config.warm_start.tasks)
    return collect_to(
        directory, chosen, fixed_endpoint(fixed_model_entry), build_solver(config), config.warm_start.workers
    )


def take_by_source(tasks: Sequence[Mapping[str, Any]], limit: Optional[int]) -> List[Mapping[str, Any]]:
    """At most ``limit`` tasks, taken in turn from each source (in dataset order within a source); None: all."""
    if limit is None or limit >= len(tasks):
        return list(tasks)
    queues: Dict[str, collections.deque[Mapping[str, Any]]] = {}
    for task in tasks:
        queues.setdefault(str(task.get("source", "")), collections.deque()).append(task)
    chosen: List[Mapping[str, Any]] = []
    while len(chosen) < limit:
        for queue in queues.values():
            if queue and len(chosen) < limit:
                chosen.append(queue.popleft())
    return chosen


def warm_start_sft_options(config: FlowTrainConfig) -> Dict[str, Any]:
    """The :func:`~agentbolt.algorithm.sft.train_from_messages` options of a configuration's warm start.

    Raises:
        ValueError: The configuration has no ``warm_start`` section.
    """
    settings = config.warm_start
    if settings is None:
        raise ValueError(f"configuration {config.name!r} has no warm_start section")
    return {
        "epochs": settings.epochs,
        "learning_rate": settings.learning_rate,
        "train_batch_size": settings.train_batch_size,
        "micro_batch_size": settings.micro_batch_size,
        "packing": settings.packing,
        "lr_scheduler": "constant",
        "dtype": config.dtype,
        # The fixed model's server is idle while the adapters train: the update's thread count applies.
        "threads": config.grpo.get("update_threads", config.threads),
        **{key: config.grpo[key] for key in LORA_SHAPE_KEYS if key in config.grpo},
    }


def ensure_warm_start(
    config: FlowTrainConfig, model_path: str, fixed_model_entry: Mapping[str, Any], tasks: Sequence[Mapping[str, Any]]
) -> WarmStart:
    """Find the configuration's cached warm start, or build it: collect reference turns, then train LoRA adapters.

    Args:
        config: The training configuration (its ``warm_start``, ``solver``, ``dtype``, ``threads`` and LoRA shape).
        model_path: The planner's base model directory.
        fixed_model_entry: The fixed model's gateway ``model_list`` entry (the fixed roles of the reference solves).
        tasks: The training tasks (never held-out ones).

    Raises:
        ValueError: No warm_start section, or no reference solve succeeded (nothing to train on).
    """
    from agentbolt.algorithm.sft import train_from_messages

    assert config.warm_start is not None  # warm_start_dir raises first
    directory = warm_start_dir(config, model_path, tasks)
    record_path = directory / "warmstart.json"
    if record_path.is_file():
        record = json.loads(record_path.read_text(encoding="utf-8"))
        adapter_dir = Path(record["adapter_dir"])
        if (adapter_dir / "adapter_config.json").is_file():
            logger.info("Reusing the warm start in %s", directory)
            return WarmStart(adapter_dir, directory, True, record["collect"], record["sft"], 0.0)
    started = time.perf_counter()
    summary = collect_cached(directory, config, fixed_model_entry, tasks)
    if summary.turns == 0:
        raise ValueError(f"no reference solve of the {summary.tasks} training tasks succeeded; nothing to train on")
    result = train_from_messages(
        directory / "turns.jsonl", model=model_path, output_dir=directory / "sft", **warm_start_sft_options(config)
    )
    if result.adapter_dir is None:
        raise RuntimeError("the warm start's SFT run saved no adapter")
    losses = [row["loss"] for row in result.history if "loss" in row]
    sft = {
        "optimizer_steps": result.optimizer_steps,
        "packing": config.warm_start.packing,
        "train_seconds": sum(row["seconds"] for row in result.history),
        "tokens_computed": sum(row["tokens"] for row in result.history),
        "loss_first": losses[0] if losses else None,
        "loss_last": losses[-1] if losses else None,
        "samples": summary.turns,
    }
    wall = time.perf_counter() - started
    record = {"adapter_dir": str(result.adapter_dir), "collect": asdict(summary), "sft": sft, "wall_seconds": wall}
    record_path.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    logger.info("Warm start built in %.0f s: %d planner turns, adapter %s", wall, summary.turns, result.adapter_dir)
    return WarmStart(result.adapter_dir, directory, False, asdict(summary), sft, wall)


def main(argv: Optional[List[str]] = None) -> int:
    """Build (or find) the warm start of a configuration; prints where it is. Exit status 2 for bad arguments."""
    from examples.flow_grpo.train import exit_cleanly_on_sigterm, fixed_model, load_config, load_split

    parser = argparse.ArgumentParser(
        prog="python -m examples.flow_grpo.warmstart",
        description="Warm-start the Flow-GRPO planner by SFT on reference-plan solves of the training tasks.",
    )
    parser.add_argument("--config", default="cpu", help="'cpu' or a YAML file with a warm_start section.")
    parser.add_argument(
        "--collect-only", action="store_true", help="Only solve the training tasks with their reference plans."
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="Show library logs.")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )
    try:
        config = load_config(args.config)
        if config.warm_start is None:
            raise ValueError(f"configuration {config.name!r} has no warm_start section")
    except (FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    from agentbolt.models import resolve_model

    exit_cleanly_on_sigterm()  # so the fixed model server is stopped
    model_path = str(resolve_model(config.model).path)
    tasks = load_split(config.data.train, config.data.sources, config.data.train_limit)
    directory = warm_start_dir(config, model_path, tasks)
    with fixed_model(config, model_path, directory / "fixed-server.log") as entry:
        if args.collect_only:
            summary = collect_cached(directory, config, entry, tasks)
            print(f"reference solves: {summary.solved} of {summary.tasks} training tasks, {summary.turns} planner "
                  f"turns in {directory / 'turns.jsonl'}")  # fmt: skip
            return 0
        built = ensure_warm_start(config, model_path, entry, tasks)
    collect = built.collect
    print(
        f"warm start {'reused' if built.reused else 'built'}: {built.adapter_dir}\n"
        f"reference solves: {collect['solved']} of {collect['tasks']} training tasks, {collect['turns']} planner turns; "
        f"SFT: {built.sft['optimizer_steps']} optimizer steps, loss {built.sft['loss_first']} -> {built.sft['loss_last']}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
