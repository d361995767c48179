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

Examples::

    python -m examples.flow_grpo.warmstart --output-dir runs/flow-grpo/warmstart
    python -m examples.flow_grpo.train --config cpu     # builds the warm start first when it is missing
"""

from __future__ import annotations

import collections
import json
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence

from examples.flow_grpo.agents import RoleLLM
from examples.flow_grpo.diagnose import DEFAULT_ORACLE_TOOLS, OraclePlanner, oracle_steps
from examples.flow_grpo.reward import RuleReward
from examples.flow_grpo.solver import FlowSolver

__all__ = ["CollectSummary", "ReferenceSolve", "collect_reference_turns", "write_turns"]

logger = logging.getLogger(__name__)


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
    plans = [oracle_steps(task, DEFAULT_ORACLE_TOOLS) for task in tasks]
    missing = [task.get("id") for task, plan in zip(tasks, plans, strict=True) if plan is None]
    if missing:
        raise ValueError(f"tasks without a reference plan: {missing[:5]}")

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
