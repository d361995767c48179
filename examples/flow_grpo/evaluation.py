"""Held-out evaluation a reader can check: per-source success with 95 % intervals, loop statistics, trajectories.

Each rollout of :class:`~examples.flow_grpo.solver.FlowGRPOAgent` records one *solve record* in its trace (an object
span, see :func:`solve_record`): the task's id and source, the answer, the strict reward, the planner turns, the tool
calls, why the loop stopped, and every step. :func:`read_validation_records` reads those records back from a run's
store, one list per validation pass, and :func:`compare` turns the first and last pass into the tables of the
training summary.

Every held-out task counts in every pass: a rollout that failed, timed out or left no solve record counts as
unsolved (:func:`failed_record`), as in GRPO's ``val/accuracy``, so a pass in which rollouts failed cannot look better
than it was. Given the held-out tasks, :func:`source_success` and :func:`compare` also count a task whose rollout is
missing from the store altogether.

The intervals are Wilson score intervals (:func:`wilson_interval`): with a few dozen questions per source a normal
approximation would reach below 0 or above 1.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Sequence

from pydantic import BaseModel

from agentbolt.utils.stats import wilson_interval
from examples.flow_grpo.tools.calculator import extract_expression

if TYPE_CHECKING:
    from agentbolt.store.base import LightningStore
    from examples.flow_grpo.reward import RewardFunction

__all__ = [
    "SOLVE_RECORD_KIND",
    "LoopStats",
    "SourceSuccess",
    "copied_question_credit",
    "compare",
    "complete_pass",
    "failed_record",
    "format_trajectory",
    "loop_stats",
    "pick_examples",
    "read_validation_records",
    "source_success",
    "wilson_interval",
]

SOLVE_RECORD_KIND = "flow_grpo.solve"
"""Value of the ``flow_grpo.kind`` attribute on the object span that holds a rollout's solve record."""


class SourceSuccess(BaseModel):
    """Success on one task source (or ``"all"``) in one validation pass, with its 95 % Wilson interval."""

    source: str
    solved: int
    total: int
    rate: float
    low: float
    high: float

    def text(self) -> str:
        """``12/36 = 33.3 % [19.6, 50.4]``."""
        return f"{self.solved}/{self.total} = {100 * self.rate:.1f} % [{100 * self.low:.1f}, {100 * self.high:.1f}]"


def failed_record(index: int, task: Mapping[str, Any], status: str = "missing") -> Dict[str, Any]:
    """The record of held-out task ``index`` whose rollout left no solve record (``status``: failed, timed out,
    missing from the store...): unsolved, with no steps, stop reason ``rollout <status>``."""
    from examples.flow_grpo.reward import gold_answers

    return {
        "index": index,
        "id": task.get("id", index),
        "source": str(task.get("source", "")),
        "question": str(task.get("question", "")),
        "gold": gold_answers(task),
        "answer": "",
        "reward": 0.0,
        "planner_turns": 0,
        "tool_calls": 0,
        "stop_reason": f"rollout {status}",
        "steps": [],
        "failed": True,
        "recorded": False,
    }


def complete_pass(records: Sequence[Mapping[str, Any]], tasks: Sequence[Mapping[str, Any]]) -> List[Dict[str, Any]]:
    """One record per held-out task, in dataset order: the pass's record of task ``i``, else :func:`failed_record`.

    Raises:
        ValueError: A record's index is not one of the tasks'.
    """
    by_index: Dict[int, Dict[str, Any]] = {}
    for record in records:
        by_index[int(record["index"])] = dict(record)
    unknown = sorted(i for i in by_index if not 0 <= i < len(tasks))
    if unknown:
        raise ValueError(f"records of task indices {unknown[:5]}, but there are {len(tasks)} held-out tasks")
    return [by_index.get(index) or failed_record(index, task) for index, task in enumerate(tasks)]


def _solved(record: Mapping[str, Any]) -> bool:
    return not record.get("failed") and float(record["reward"]) >= 1.0


def source_success(
    records: Sequence[Mapping[str, Any]], tasks: Optional[Sequence[Mapping[str, Any]]] = None
) -> List[SourceSuccess]:
    """Success per source (sorted by name), then ``"all"``: a record is solved when its rollout succeeded with a
    reward of 1.

    Args:
        records: One validation pass (a failed rollout's record counts as unsolved).
        tasks: The held-out tasks, when known: every one counts, a task without a record as unsolved.
    """
    if tasks is not None:
        records = complete_pass(records, tasks)
    by_source: Dict[str, List[bool]] = collections.defaultdict(list)
    for record in records:
        by_source[str(record["source"])].append(_solved(record))
    groups = [(source, by_source[source]) for source in sorted(by_source)]
    groups.append(("all", [solved for _, outcomes in groups for solved in outcomes]))
    rows = []
    for source, outcomes in groups:
        solved, total = sum(outcomes), len(outcomes)
        low, high = wilson_interval(solved, total)
        rows.append(SourceSuccess(source=source, solved=solved, total=total, rate=solved / total if total else 0.0,
                                  low=low, high=high))  # fmt: skip
    return rows


class LoopStats(BaseModel):
    """How the solve loop ran over one validation pass."""

    mean_planner_turns: float
    mean_tool_calls: float
    stop_reasons: Dict[str, int]
    first_actions: Dict[str, int]


def loop_stats(records: Sequence[Mapping[str, Any]]) -> LoopStats:
    """Mean planner turns and tool calls per question, and counts of stop reasons and first planner actions.

    A task whose rollout left no solve record (:func:`failed_record`) counts only among the stop reasons
    (``rollout failed``...): the means and first actions are over the solves that were recorded.

    Raises:
        ValueError: No records.
    """
    if not records:
        raise ValueError("no solve records")
    ran = [r for r in records if r.get("recorded", True)]
    n = max(1, len(ran))
    first = collections.Counter(str(r["steps"][0]["tool"]) if r["steps"] else "(none)" for r in ran)
    return LoopStats(
        mean_planner_turns=sum(int(r["planner_turns"]) for r in ran) / n,
        mean_tool_calls=sum(int(r["tool_calls"]) for r in ran) / n,
        stop_reasons=dict(collections.Counter(str(r["stop_reason"]) for r in records).most_common()),
        first_actions=dict(first.most_common()),
    )


@dataclass
class CopiedQuestionCheck:
    """How many copied-back answers the reward credits (must be 0 for the reward to mean anything)."""

    tasks: int
    candidates: int
    credited: int
    examples: List[str] = field(default_factory=list)


def copied_question_credit(tasks: Sequence[Mapping[str, Any]], reward: RewardFunction) -> CopiedQuestionCheck:
    """Score, for every task, its question text and the expressions written in it as answers.

    The expressions are the arithmetic the calculator reads in the question and every expression the rule reward
    refuses as copied from it (:func:`~examples.flow_grpo.reward.question_copies`: ``$\\frac{5}{2}$`` and
    ``(5)/(2)`` for "What is $\\frac{5}{2}$ as a decimal?"); an expression a gold answer is written as is the answer,
    not a copy, and is left out. An answer that only repeats the question must never earn credit; the returned
    count of credited candidates is what the training summary reports.
    """
    from examples.flow_grpo.reward import gold_answers, question_copies

    candidates = credited = 0
    examples: List[str] = []
    for task in tasks:
        question = str(task["question"])
        copies = [question]
        expression = extract_expression(question)
        if expression is not None:
            copies.append(expression)
        copies.extend(copy for copy in question_copies(question, gold_answers(task)) if copy not in copies)
        for copy in copies:
            candidates += 1
            if float(reward(task, copy)) > 0.0:
                credited += 1
                if len(examples) < 5:
                    examples.append(f"task {task.get('id')}: {copy!r}")
    return CopiedQuestionCheck(tasks=len(tasks), candidates=candidates, credited=credited, examples=examples)


async def _records_by_pass(store: LightningStore) -> Dict[int, List[Dict[str, Any]]]:
    from agentbolt.emitter import get_object_value

    passes: Dict[int, Dict[int, Dict[str, Any]]] = collections.defaultdict(dict)
    for rollout in await store.query_rollouts():
        if rollout.mode != "val":
            continue
        group = str((rollout.metadata or {}).get("grpo_group", ""))
        parts = group.split("-")
        if len(parts) != 3 or parts[0] != "val":
            continue
        step, index = int(parts[1]), int(parts[2])
        record: Optional[Dict[str, Any]] = None
        for span in await store.query_spans(rollout.rollout_id, "latest"):
            if (span.attributes or {}).get("flow_grpo.kind") == SOLVE_RECORD_KIND:
                value = get_object_value(span)
                if isinstance(value, dict):
                    record = {**value, "index": index}
                break
        task = rollout.input if isinstance(rollout.input, Mapping) else {}
        if record is None:
            record = failed_record(index, task, rollout.status if rollout.status != "succeeded" else "without record")
        elif rollout.status != "succeeded":
            # The rollout recorded its solve, then failed: it did not succeed, as GRPO's val/accuracy counts it.
            record.update(reward=0.0, failed=True, stop_reason=f"rollout {rollout.status}")
        kept = passes[step].get(index)
        if kept is None or (kept.get("failed") and not record.get("failed")):
            passes[step][index] = record
    return {step: [records[i] for i in sorted(records)] for step, records in passes.items()}


def read_validation_records(store: LightningStore) -> Dict[int, List[Dict[str, Any]]]:
    """The solve records of each validation pass in ``store``, keyed by the training step it ran at (0: before).

    Records are in dataset order, one per validation rollout in the store: a rollout that did not succeed, or left
    no solve record, gives a record that counts as unsolved (``"failed": True``; :func:`failed_record` when there
    is no solve record). A task whose rollout is not in the store at all is missing; :func:`complete_pass` with the
    held-out tasks adds it.
    """
    import asyncio

    return asyncio.run(_records_by_pass(store))


def pick_examples(before: Sequence[Mapping[str, Any]], after: Sequence[Mapping[str, Any]], count: int = 2) -> List[int]:
    """Dataset indices of ``count`` questions to show before and after training.

    Questions that training turned from failed to solved come first, from different sources when possible; then
    questions whose trajectory changed; then the first questions.
    """
    by_index = {int(r["index"]): r for r in after}
    pairs = [(b, by_index[int(b["index"])]) for b in before if int(b["index"]) in by_index]
    fixed = [b for b, a in pairs if b["reward"] < 1.0 <= a["reward"]]
    changed = [b for b, a in pairs if b not in fixed and _actions(b) != _actions(a)]
    chosen: List[Mapping[str, Any]] = []
    for pool in (fixed, changed, [b for b, _ in pairs]):
        for record in pool:
            if len(chosen) >= count or record in chosen:
                continue
            if pool is fixed and any(c["source"] == record["source"] for c in chosen):
                continue
            chosen.append(record)
        if pool is fixed:
            chosen.extend(r for r in fixed if r not in chosen and len(chosen) < count)
    return [int(r["index"]) for r in chosen[:count]]


def _actions(record: Mapping[str, Any]) -> List[str]:
    return [str(step["tool"]) for step in record["steps"]]


def format_trajectory(record: Mapping[str, Any]) -> str:
    """A solve record as readable Markdown lines (question, each turn's plan and result, answer, reward)."""
    lines = [
        f"**Q** ({record['source']}): {record['question']}  ",
        f"gold: {', '.join(record['gold'])}  ",
    ]
    for step in record["steps"]:
        lines.append(
            f"{step['turn']}. planner -> `{step['tool']}`" + (f" ({step['sub_goal']})" if step["sub_goal"] else "")
        )
        if step.get("tool_input") is not None:
            lines.append(f"   input `{step['tool_input']}` -> {step['result']}")
        if step.get("verifier_stop") is not None:
            lines.append(f"   verifier: {'stop' if step['verifier_stop'] else 'continue'}")
    lines.append(f"answer: **{record['answer']}** (stop: {record['stop_reason']}, reward {record['reward']:g})")
    return "\n".join(lines)


class PassComparison(BaseModel):
    """The first and last validation passes side by side (``summary.json``'s ``evaluation``)."""

    before: List[SourceSuccess]
    after: List[SourceSuccess]
    loop_before: LoopStats
    loop_after: LoopStats
    example_indices: List[int]


def compare(
    before: Sequence[Mapping[str, Any]],
    after: Sequence[Mapping[str, Any]],
    tasks: Optional[Sequence[Mapping[str, Any]]] = None,
) -> PassComparison:
    """Per-source success, loop statistics and example questions of two validation passes.

    Args:
        before: The first pass's records.
        after: The last pass's records.
        tasks: The held-out tasks: every one counts in both passes, a task without a record as unsolved.

    Raises:
        ValueError: Without ``tasks``, the passes hold records of different tasks (their rates would not compare).
    """
    if tasks is not None:
        before, after = complete_pass(before, tasks), complete_pass(after, tasks)
    else:
        indices = [sorted(int(r["index"]) for r in records) for records in (before, after)]
        if indices[0] != indices[1]:
            raise ValueError(
                f"the passes hold records of {len(before)} and {len(after)} tasks, not the same ones: give the "
                "held-out tasks so that every task counts"
            )
    return PassComparison(
        before=source_success(before),
        after=source_success(after),
        loop_before=loop_stats(before),
        loop_after=loop_stats(after),
        example_indices=pick_examples(before, after),
    )


def trajectories_markdown(
    before: Sequence[Mapping[str, Any]], after: Sequence[Mapping[str, Any]], indices: Sequence[int]
) -> str:
    """Markdown showing each chosen question's trajectory before and after training."""
    by_before = {int(r["index"]): r for r in before}
    by_after = {int(r["index"]): r for r in after}
    parts = ["# Example trajectories (held-out questions, greedy decoding)\n"]
    for index in indices:
        parts.append(f"## Question {index}\n\n### Before training\n\n{format_trajectory(by_before[index])}\n")
        parts.append(f"### After training\n\n{format_trajectory(by_after[index])}\n")
    return "\n".join(parts)
