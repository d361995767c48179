"""FewShotAPO: add worked examples, taken from the agent's own best training runs, to the prompt.

Small models follow an example far better than an instruction, and writing a useful critique is beyond them, so
this optimizer needs no optimizer model at all:

1. *Bootstrap*: run the seed prompt on ``bootstrap_tasks`` training tasks (``bootstrap_repeats`` times each, so a
   sampling agent gets several chances) and keep the runs whose reward reaches ``demo_min_reward``, best first, one
   per task. Each becomes a demonstration: the conversation the adapter extracted (the request, the tool calls with
   their arguments, the tool results, the final answer).
2. *Search*: build ``num_candidate_sets`` candidate prompts, each the seed plus a different selection of 1 to
   ``max_demos`` demonstrations (the first: the top ones; the rest: random draws, favouring high rewards); score
   them all on one shared validation batch, then the ``finalists`` best on the full validation set.

A demonstration goes into the prompt as text in the template (``demo_format="text"``: works with any agent) or as
chat turns in the template's ``examples`` (``demo_format="messages"``: the request, an assistant turn carrying the
real ``tool_calls``, the ``tool`` results and the answer, sent before the request by
:meth:`~agentbolt.types.PromptTemplate.format_messages`). Small models call tools far more reliably from the second.

The best prompt is the seed or the candidate with the highest full-validation score, under one guard against
repetition (:func:`echo_check`). A small model shown an example often answers every request with the example's
answer; when the grader rewards that answer on some tasks, the candidate gains without having learnt anything. So,
for each candidate, the demonstration answer it repeats most often on validation tasks is found, and the candidate
must beat the seed on the *other* tasks (summed reward, same tasks): a candidate whose whole gain sits on the tasks
where it gave that answer is refused, neither a finalist nor the best prompt. The repeated answer, its share of the
validation answers and the gain elsewhere are logged and reported per candidate (``summary()["echo_checks"]``).
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any, Collection, Dict, List, Literal, Mapping, Optional, Sequence, Tuple

from agentbolt.types import PromptTemplate
from agentbolt.utils.checks import check_finite

from .prompts import conversation_of, examples_position
from .search import (
    FULL_VAL,
    Evaluation,
    PromptSearch,
    RolloutResultForAPO,
    VersionedPromptTemplate,
    template_key,
)
from .templates import escape_literal

REFUSED_FULL_VAL = "val-full-refused"
"""Purpose the full-validation runs of a candidate refused by the repetition guard are filed under, so that a resumed
run does not take the candidate for the best prompt."""

__all__ = [
    "Demonstration",
    "EchoCheck",
    "FewShotAPO",
    "demonstration_messages",
    "echo_check",
    "final_answer",
    "render_demonstration",
]


@dataclass
class Demonstration:
    """One worked example.

    Attributes:
        task_key: Key of its training task (see :func:`~agentbolt.algorithm.apo.search.keyed`).
        reward: The reward its run earned.
        text: The example written as text (what ``demo_format="text"`` puts in the template).
        messages: The example as chat messages (what ``demo_format="messages"`` adds to the template's examples).
        answer: Its final answer, normalized (:func:`final_answer`); what a candidate could merely repeat.
    """

    task_key: str
    reward: float
    text: str
    messages: List[Dict[str, Any]] = field(default_factory=list)
    answer: str = ""


def _normalized(text: str) -> str:
    return " ".join(text.split()).casefold()


def final_answer(result: RolloutResultForAPO) -> Optional[str]:
    """A run's final answer: the text of its last assistant message, whitespace collapsed and case-folded.

    Returns:
        The answer, or None when the run has no assistant message with text.
    """
    conversation = result.get("conversation")
    return _conversation_answer(conversation_of(result["messages"]) if conversation is None else conversation)


def _conversation_answer(conversation: Sequence[Mapping[str, Any]]) -> Optional[str]:
    for message in reversed(conversation):
        if message.get("role") == "assistant":
            return _normalized(_message_text(message)) or None
    return None


@dataclass
class EchoCheck:
    """How much of a candidate's gain over the seed could be the repetition of a demonstration's answer.

    Attributes:
        answer: The demonstration answer the candidate gave most often on the evaluated tasks (None: it gave none).
        share: Share of the evaluated tasks answered with ``answer``.
        gain_elsewhere: On the other tasks, the candidate's summed reward minus the seed's, divided by the number of
            evaluated tasks (so it reads in the same units as a score).
        refused: ``answer`` is set and ``gain_elsewhere`` is not positive: the gain, if any, is only repetition.
    """

    answer: Optional[str]
    share: float
    gain_elsewhere: float
    refused: bool


def echo_check(evaluation: Evaluation, seed_rewards: Mapping[str, float], demo_answers: Collection[str]) -> EchoCheck:
    """Apply the repetition guard to one candidate's evaluation (see the module description).

    Args:
        evaluation: The candidate's scores and runs on some validation tasks.
        seed_rewards: The seed's reward per validation task key (a missing task counts 0).
        demo_answers: The normalized final answers of the candidate's demonstrations.
    """
    answers = [final_answer(outcome) if outcome is not None else None for outcome in evaluation.outcomes]
    answers += [None] * (len(evaluation.task_keys) - len(answers))  # cached scores carry no runs
    repeated = Counter(answer for answer in answers if answer is not None and answer in demo_answers)
    echoed = repeated.most_common(1)[0][0] if repeated else None
    gain = 0.0
    for key, reward, answer in zip(evaluation.task_keys, evaluation.rewards, answers, strict=True):
        if echoed is None or answer != echoed:
            gain += reward - seed_rewards.get(key, 0.0)
    total = max(1, len(evaluation.task_keys))
    share = repeated[echoed] / total if echoed is not None else 0.0
    return EchoCheck(echoed, share, gain / total, refused=echoed is not None and gain <= 0.0)


def _static_lines(template: PromptTemplate) -> set[str]:
    """Lines of the template that hold no placeholder: the instructions, as they appear in every request."""
    lines = set()
    for line in template.template.splitlines():
        if "{" not in line and line.strip():
            lines.add(line.strip())
    return lines


def _message_text(message: Mapping[str, Any]) -> str:
    """A message's content as text (structured content as JSON, none as the empty string)."""
    content = message.get("content")
    return content if isinstance(content, str) else json.dumps(content) if content else ""


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + " ..."


def render_demonstration(
    messages: Sequence[Mapping[str, Any]], seed: PromptTemplate, *, max_chars: int = 600
) -> Optional[str]:
    """Write a conversation as an example: request, tool calls, tool results, answer.

    The request keeps only what differs from the seed template's fixed lines (the task's own data), so an example
    does not repeat the instructions. Tool calls are written ``<tool_call>{"name": ..., "arguments": ...}</tool_call>``.

    Returns:
        The example text, or None when the conversation has no final answer.
    """
    instructions = _static_lines(seed)
    lines: List[str] = []
    answer: Optional[str] = None
    for message in messages:
        role = message.get("role")
        if role in ("system", "developer"):
            continue
        text = _message_text(message)
        if role == "user":
            kept = [line for line in text.splitlines() if line.strip() and line.strip() not in instructions]
            if kept:
                lines.append("Request: " + _clip("\n".join(kept), max_chars))
        elif role == "tool":
            lines.append("Tool result: " + _clip(text, max_chars))
        elif role == "assistant":
            for call in message.get("tool_calls") or []:
                function = call.get("function", {})
                arguments = function.get("arguments")
                with contextlib.suppress(json.JSONDecodeError):
                    arguments = json.loads(arguments) if isinstance(arguments, str) else arguments
                body = json.dumps({"name": function.get("name"), "arguments": arguments})
                lines.append(f"Assistant: <tool_call>{body}</tool_call>")
            if text.strip():
                answer = text.strip()
                lines.append("Assistant: " + _clip(answer, max_chars))
    return "\n".join(lines) if answer is not None else None


def demonstration_messages(messages: Sequence[Mapping[str, Any]], *, call_id_prefix: str) -> List[Dict[str, Any]]:
    """A traced conversation as worked-example chat turns: system turns dropped, tool calls and their results
    renumbered ``{call_id_prefix}_1, _2, ...`` (ids stay unique across examples), only the OpenAI fields kept.

    Returns:
        The turns, or an empty list when the conversation does not end with an assistant answer.
    """
    turns: List[Dict[str, Any]] = []
    renamed: Dict[str, str] = {}
    for message in messages:
        role = message.get("role")
        if role in ("system", "developer"):
            continue
        text = _message_text(message)
        if role == "assistant" and message.get("tool_calls"):
            calls = []
            for call in message.get("tool_calls") or []:
                function = call.get("function", {})
                arguments = function.get("arguments")
                new_id = f"{call_id_prefix}_{len(renamed) + 1}"
                renamed[str(call.get("id") or new_id)] = new_id
                calls.append(
                    {
                        "id": new_id,
                        "type": "function",
                        "function": {
                            "name": function.get("name"),
                            "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments),
                        },
                    }
                )
            turns.append({"role": "assistant", "content": text, "tool_calls": calls})
        elif role == "tool":
            call_id = str(message.get("tool_call_id") or "")
            turns.append({"role": "tool", "tool_call_id": renamed.get(call_id, call_id), "content": text})
        elif role in ("user", "assistant"):
            turns.append({"role": role, "content": text})
    if not turns or turns[-1]["role"] != "assistant" or turns[-1].get("tool_calls") or not turns[-1]["content"]:
        return []
    return turns


class FewShotAPO(PromptSearch):
    """Few-shot prompt optimization from the agent's own rewarded traces (see the module description).

    Args:
        async_openai_client: Not used (the search asks no optimizer model); accepted so that the three optimizers
            are built alike.
        max_demos: Most demonstrations in one prompt.
        bootstrap_tasks: Training tasks run with the seed to collect demonstrations (at most the training set).
        bootstrap_repeats: Runs per bootstrap task.
        demo_min_reward: Reward a run needs to become a demonstration.
        num_candidate_sets: Candidate selections of demonstrations scored on the validation batch.
        val_batch_size: Validation tasks shared by the candidates.
        finalists: Candidates (best on the batch) scored on the full validation set.
        demo_format: ``text``: the examples are written into the template (any agent); ``messages``: they are added
            to the template's ``examples`` as chat turns with real tool calls, which the agent sends with
            :meth:`~agentbolt.types.PromptTemplate.format_messages` (a warning says when an agent does not).
        demo_header: Line introducing the examples in the prompt (``text`` format).
        demo_position: Examples ``before`` (default) or ``after`` the seed's text (``text`` format). Before is safer
            for small models: with the examples last, they tend to continue the list of examples instead of
            answering.
        max_demo_chars: Longest message text kept in a demonstration written as text.
        **search_options: Options of :class:`~agentbolt.algorithm.apo.search.PromptSearch` (``run_id``,
            ``resume``, ``max_rollouts``, ``rollout_batch_timeout``, ``seed``...).
    """

    log_name = "agentbolt.algorithm.apo.fewshot"

    def __init__(
        self,
        async_openai_client: Any = None,
        *,
        max_demos: int = 3,
        bootstrap_tasks: int = 32,
        bootstrap_repeats: int = 1,
        demo_min_reward: float = 1.0,
        num_candidate_sets: int = 6,
        val_batch_size: int = 16,
        finalists: int = 2,
        demo_format: Literal["text", "messages"] = "text",
        demo_header: str = "Examples of solved tasks:",
        demo_position: Literal["before", "after"] = "before",
        max_demo_chars: int = 600,
        **search_options: Any,
    ) -> None:
        self._check_counts(1, max_demos=max_demos, bootstrap_tasks=bootstrap_tasks, bootstrap_repeats=bootstrap_repeats)
        self._check_counts(1, num_candidate_sets=num_candidate_sets, val_batch_size=val_batch_size, finalists=finalists)
        self._check_counts(1, max_demo_chars=max_demo_chars)
        check_finite(demo_min_reward, "demo_min_reward")
        if demo_position not in ("before", "after"):
            raise ValueError(f"demo_position must be 'before' or 'after', got {demo_position!r}")
        if demo_format not in ("text", "messages"):
            raise ValueError(f"demo_format must be 'text' or 'messages', got {demo_format!r}")
        super().__init__(async_openai_client, **search_options)
        self.max_demos = max_demos
        self.bootstrap_tasks = bootstrap_tasks
        self.bootstrap_repeats = bootstrap_repeats
        self.demo_min_reward = demo_min_reward
        self.num_candidate_sets = num_candidate_sets
        self.val_batch_size = val_batch_size
        self.finalists = finalists
        self.demo_format = demo_format
        self.demo_header = demo_header
        self.demo_position = demo_position
        self.max_demo_chars = max_demo_chars

    def _reset_run_state(self) -> None:
        super()._reset_run_state()
        self.demonstrations: List[Demonstration] = []
        self.echo_checks: Dict[str, EchoCheck] = {}
        """The repetition guard's verdict per candidate version (on the full validation set for finalists)."""

    def collect_demonstrations(
        self, results: Sequence[Tuple[str, float, RolloutResultForAPO]], seed: PromptTemplate
    ) -> List[Demonstration]:
        """The usable demonstrations among bootstrap runs: rewarded enough, one per task, best first.

        Args:
            results: ``(task key, reward, rollout)`` of each bootstrap run.
            seed: The seed template (its fixed lines are left out of each example's request).
        """
        best: Dict[str, Demonstration] = {}
        for key, reward, result in results:
            if reward < self.demo_min_reward or result["status"] != "succeeded":
                continue
            conversation = result.get("conversation")
            if conversation is None:
                conversation = conversation_of(result["messages"], seed.examples)
            text = render_demonstration(conversation, seed, max_chars=self.max_demo_chars)
            messages = demonstration_messages(conversation, call_id_prefix=f"example_{key}")
            if text is None or (self.demo_format == "messages" and not messages):
                continue
            current = best.get(key)
            if current is None or (reward, -len(text)) > (current.reward, -len(current.text)):
                best[key] = Demonstration(key, reward, text, messages, _conversation_answer(conversation) or "")
        return sorted(best.values(), key=lambda d: (-d.reward, len(d.text), d.task_key))

    def with_demonstrations(self, seed: PromptTemplate, demos: Sequence[Demonstration]) -> PromptTemplate:
        """``seed`` with ``demos``: after its own examples as chat turns (``messages``), or written into its text,
        escaped so that the engine leaves them verbatim (``text``)."""
        if self.demo_format == "messages":
            examples = list(seed.examples) + [message for demo in demos for message in demo.messages]
            return PromptTemplate(template=seed.template, engine=seed.engine, examples=examples)
        blocks = [f"Example {i}:\n{demo.text}" for i, demo in enumerate(demos, start=1)]
        section = escape_literal(self.demo_header + "\n\n" + "\n\n".join(blocks), seed.engine)
        text = f"{seed.template}\n\n{section}" if self.demo_position == "after" else f"{section}\n\n{seed.template}"
        return PromptTemplate(template=text, engine=seed.engine, examples=seed.examples)

    def candidate_selections(self, pool_size: int) -> List[Tuple[int, ...]]:
        """Distinct selections of demonstration indices: the top ones first, then random draws favouring the top."""
        if pool_size == 0:
            return []
        top = tuple(range(min(self.max_demos, pool_size)))
        selections: List[Tuple[int, ...]] = [top]
        weights = [1.0 / (rank + 1) for rank in range(pool_size)]
        attempts = 0
        while len(selections) < self.num_candidate_sets and attempts < 50 * self.num_candidate_sets:
            attempts += 1
            size = self.rng.randint(1, min(self.max_demos, pool_size))
            chosen: List[int] = []
            while len(chosen) < size:
                index = self.rng.choices(range(pool_size), weights=weights, k=1)[0]
                if index not in chosen:
                    chosen.append(index)
            selection = tuple(sorted(chosen))
            if selection not in selections:
                selections.append(selection)
        return selections

    def _check_examples_sent(self, candidate: VersionedPromptTemplate, evaluation: Evaluation) -> None:
        """Warn when the agent's traced requests do not carry the candidate's examples (it ignores them)."""
        examples = candidate.prompt_template.examples
        for outcome in evaluation.results:
            for call in outcome["messages"]:
                if examples_position(call.get("messages") or [], examples) is not None:
                    return
        if evaluation.results:
            self._log(
                logging.WARNING,
                "No traced request of the agent carries the prompt template's examples: with demo_format='messages' "
                "the agent must build its messages with prompt_template.format_messages(...).",
                prefix="[Search]",
            )

    async def _bootstrap(
        self, seed: VersionedPromptTemplate, train: List[Tuple[str, Any]]
    ) -> List[Tuple[str, float, RolloutResultForAPO]]:
        count = min(self.bootstrap_tasks, len(train))
        tasks = self.rng.sample(train, count) * self.bootstrap_repeats
        evaluation = await self.evaluate(seed, tasks, mode="train", purpose="bootstrap", prefix="[Bootstrap]")
        runs = [
            (key, reward, outcome)
            for key, reward, outcome in zip(evaluation.task_keys, evaluation.rewards, evaluation.outcomes, strict=True)
            if outcome is not None
        ]
        self._log(
            logging.INFO,
            f"Seed scores {evaluation.mean:.3f} on {len(tasks)} bootstrap runs; "
            f"{sum(1 for _, r, _ in runs if r >= self.demo_min_reward)} reach reward {self.demo_min_reward}.",
            prefix="[Bootstrap]",
        )
        return runs

    async def _search(self, seed: PromptTemplate, train: List[Tuple[str, Any]], val: List[Tuple[str, Any]]) -> None:
        """Bootstrap demonstrations and search over them."""
        if self.resume:
            await self._resume_state()
        seed_version = self._create_seed_version(seed)
        seed_rewards = (await self._validate_full(seed_version, val, prefix="[Seed]")).by_task()
        self.current_round = 1
        runs = await self._bootstrap(seed_version, train)
        self.demonstrations = self.collect_demonstrations(runs, seed)
        if not self.demonstrations:
            self._log(
                logging.WARNING,
                f"No bootstrap run reached reward {self.demo_min_reward}: no demonstration to add; the seed stays.",
            )
            return
        self._log(logging.INFO, f"{len(self.demonstrations)} demonstration(s) collected.")
        candidates = []
        demo_answers: Dict[str, List[str]] = {}
        for selection in self.candidate_selections(len(self.demonstrations)):
            demos = [self.demonstrations[i] for i in selection]
            candidate = self._create_versioned_prompt(self.with_demonstrations(seed, demos))
            demo_answers[candidate.version] = [d.answer for d in demos if d.answer]
            candidate.lineage = {
                "origin": "demonstrations",
                "parents": [seed_version.version],
                "note": "demonstrations from training tasks " + ", ".join(d.task_key for d in demos),
                "round": 1,
            }
            candidates.append(candidate)
        batch = self.rng.sample(val, min(self.val_batch_size, len(val)))
        admitted = []
        for candidate in candidates:
            prefix = f"[Search | Prompt {candidate.version}]"
            evaluation = await self.evaluate(candidate, batch, mode="val", purpose="val-batch", prefix=prefix)
            if self.demo_format == "messages" and candidate is candidates[0]:
                self._check_examples_sent(candidate, evaluation)
            if self._passes_echo_check(candidate, evaluation, seed_rewards, demo_answers, prefix=prefix):
                admitted.append(candidate)
        ranked = sorted(admitted, key=lambda c: c.score or 0.0, reverse=True)
        scores = ", ".join(f"{c.version}={c.score:.3f}" for c in ranked) or "none admitted"
        self._log(logging.INFO, f"Validation batch scores: {scores}", prefix="[Search]")
        for candidate in ranked[: self.finalists]:
            prefix = f"[Final | Prompt {candidate.version}]"
            evaluation = await self.evaluate(candidate, val, mode="val", purpose=FULL_VAL, prefix=prefix)
            if self._passes_echo_check(candidate, evaluation, seed_rewards, demo_answers, prefix=prefix):
                self._offer_best(candidate, evaluation, prefix=prefix)
            else:
                await self._file_as_refused(candidate, evaluation)

    async def _file_as_refused(self, candidate: VersionedPromptTemplate, evaluation: Evaluation) -> None:
        """Re-file a refused candidate's full-validation runs under :data:`REFUSED_FULL_VAL`."""
        self._full_val_cache.pop(template_key(candidate.prompt_template), None)
        for rollout_id in evaluation.rollout_ids:
            await self._update_tag(rollout_id, purpose=REFUSED_FULL_VAL)

    def _passes_echo_check(
        self,
        candidate: VersionedPromptTemplate,
        evaluation: Evaluation,
        seed_rewards: Mapping[str, float],
        demo_answers: Mapping[str, Sequence[str]],
        *,
        prefix: str,
    ) -> bool:
        """Apply :func:`echo_check` to ``candidate``, record and log the verdict; True when it is admitted."""
        check = echo_check(evaluation, seed_rewards, set(demo_answers.get(candidate.version, ())))
        self.echo_checks[candidate.version] = check
        if check.answer is not None:
            verdict = "refused: its gain is only repetition" if check.refused else "admitted"
            self._log(
                logging.WARNING if check.refused else logging.INFO,
                f"Repeats the demonstration answer {check.answer[:80]!r} on {check.share:.0%} of "
                f"{len(evaluation.task_keys)} validation tasks; gain over the seed on the others "
                f"{check.gain_elsewhere:+.3f}: {verdict}.",
                prefix=prefix,
            )
        return not check.refused

    def summary(self) -> Dict[str, Any]:
        """The search's summary (:meth:`PromptSearch.summary`) with the repetition guard's verdict per candidate."""
        return {**super().summary(), "echo_checks": {v: asdict(c) for v, c in self.echo_checks.items()}}
