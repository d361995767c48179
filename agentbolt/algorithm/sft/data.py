"""SFT's data path: from the LLM calls of rollouts (or from files) to token sequences with a loss mask.

Two kinds of objects travel through it:

* :class:`ChatSample`: one conversation to learn from, with its reward and where it came from. A sample read from a
  trace is one LLM call: its prompt messages followed by the assistant reply (``train_turns="last"``), the tools it
  was offered, and, when the gateway recorded them, the exact prompt and response token ids. A sample read from a
  ``{"messages": [...]}`` file is a whole conversation whose assistant turns are all learned (``"all"``). Samples
  are written to and read from JSONL in the layouts TRL reads: ``{"prompt": [...], "completion": [...]}`` for a
  call, ``{"messages": [...]}`` for a conversation, with ``tools`` and our own fields beside them.
* :class:`TokenSample`: the token ids a sample trains on and, for each, whether it is a target of the loss.

:func:`tokenize_sample` makes one from the other: the recorded ids when they are to be used (the response tokens are
the targets), else the messages rendered with the model's chat template exactly as the inference engine renders a
prompt (template to text, then the tokenizer without special tokens) and cut into context and assistant segments;
each assistant segment is a target up to and including its end-of-turn token.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, Iterator, List, Literal, Optional, Sequence, Tuple, Union

from agentbolt.adapter.agent_match import select_calls
from agentbolt.adapter.messages import convert_to_openai_messages
from agentbolt.adapter.triplet import TracerTraceToTriplet, TraceTree, is_token_id_list
from agentbolt.algorithm.utils import task_key
from agentbolt.semconv import GEN_AI_OPERATION_NAME
from agentbolt.types import Span, Triplet
from agentbolt.utils.counters import Counters

__all__ = [
    "CallStats",
    "CallTraceToTriplet",
    "Counters",
    "ChatSample",
    "DataError",
    "describe_sample",
    "outside_vocabulary",
    "TokenSample",
    "finite_reward",
    "StudentPrompt",
    "TokenizeStats",
    "load_student_prompt",
    "propagate_rewards",
    "read_samples",
    "samples_from_triplets",
    "task_key",
    "tokenize_sample",
    "with_student_prompt",
    "write_samples",
]

logger = logging.getLogger(__name__)

TrainTurns = Literal["last", "all"]
RewardPropagation = Literal["backward", "final", "none"]
StudentPrompt = Callable[[List[Dict[str, Any]]], List[Dict[str, Any]]]
"""Maps the prompt messages of a recorded call to the prompt the trained model is asked with (context distillation)."""


class DataError(ValueError):
    """A file or a record cannot be read as SFT data; the message names the file and line."""


def finite_reward(reward: Optional[float]) -> Optional[float]:
    """``reward`` as a float when it is a finite number; None (no reward) for None, NaN and the infinities.

    A NaN reward is no measure of quality: it is never selected or ranked as a number, like the final rewards of
    :func:`agentbolt.utils.reward_spans.training_reward`.
    """
    if reward is None or not math.isfinite(reward):
        return None
    return float(reward)


@dataclass
class ChatSample:
    """One conversation to learn from.

    Attributes:
        messages: OpenAI chat messages (with ``tool_calls`` and ``tool`` results); for a call, the prompt messages
            followed by the assistant reply. An assistant message with ``"weight": 0`` (OpenAI's fine-tuning format)
            is context only, never a target.
        tools: The function tools offered (OpenAI ``{"type": "function", "function": {...}}`` entries), or None.
        train_turns: ``"last"``: learn the last message (an assistant reply); ``"all"``: learn every assistant turn.
        prompt_token_ids: The prompt exactly as the engine tokenized it (None when not recorded).
        response_token_ids: The tokens the engine generated for the reply (None when not recorded).
        reward: The reward this sample is ranked by (after propagation), None when unknown.
        final_reward: The final reward of the rollout it comes from.
        agent_name: The agent that made the call, when the trace names it.
        model: The model that answered the call, as its trace names it (``gen_ai.response.model``); its token ids
            belong to that model's tokenizer.
        raw_text: The call was a text completion (``/v1/completions``): ``messages`` are its prompt text (as one
            ``user`` message) and the generated text (as the ``assistant`` reply), learned as raw text, never
            rendered with a chat template. Written as TRL's standard layout, ``{"prompt": "...", "completion":
            "..."}``.
        rollout_id: The rollout it comes from.
        task_id: Id of the task; rollouts of the same task share it (best-of-n compares them).
        metadata: Anything else kept with the sample (attempt id, mode, status...).
        finish_reason: Why the call's generation ended, as its trace records it (``"stop"``: the model ended it;
            ``"length"``: the token budget did), None when unknown. A raw-text sample whose generation the model
            ended learns to end it with the tokenizer's EOS token, unless a stop string ended it.
        stop_string: The stop string that ended the generation, when the backend named it (vLLM's and
            ``agentbolt serve``'s ``stop_reason``); the generated text stops before it. A raw-text sample learns to
            write it, as the model did (its recorded token ids hold it too), instead of an EOS token.
    """

    messages: List[Dict[str, Any]]
    tools: Optional[List[Dict[str, Any]]] = None
    train_turns: TrainTurns = "last"
    prompt_token_ids: Optional[List[int]] = None
    response_token_ids: Optional[List[int]] = None
    reward: Optional[float] = None
    final_reward: Optional[float] = None
    agent_name: Optional[str] = None
    rollout_id: Optional[str] = None
    task_id: Optional[str] = None
    metadata: Dict[str, Any] = field(default_factory=dict)
    model: Optional[str] = None
    raw_text: bool = False
    finish_reason: Optional[str] = None
    stop_string: Optional[str] = None

    @property
    def has_token_ids(self) -> bool:
        """Both the prompt and the response token ids were recorded."""
        return bool(self.prompt_token_ids) and bool(self.response_token_ids)

    def group_key(self) -> str:
        """The task this sample belongs to: ``task_id``, else the conversation up to its first assistant turn."""
        if self.task_id:
            return self.task_id
        head = []
        for message in self.messages:
            if message.get("role") == "assistant":
                break
            head.append(message)
        return task_key(head)

    def to_record(self) -> Dict[str, Any]:
        """The JSON record: TRL's prompt-completion layout for a call, its messages layout for a conversation."""
        record: Dict[str, Any]
        if self.raw_text and self.messages:
            record = {"prompt": self.messages[0]["content"], "completion": self.messages[-1]["content"]}
        elif self.train_turns == "last":
            record = {"prompt": self.messages[:-1], "completion": self.messages[-1:]}
        else:
            record = {"messages": self.messages}
        record["tools"] = self.tools
        for name in ("prompt_token_ids", "response_token_ids", "reward", "final_reward", "agent_name"):
            record[name] = getattr(self, name)
        record["rollout_id"], record["task_id"] = self.rollout_id, self.task_id
        if self.model is not None:
            record["model"] = self.model
        if self.finish_reason is not None:
            record["finish_reason"] = self.finish_reason
        if self.stop_string is not None:
            record["stop_string"] = self.stop_string
        if self.metadata:
            record["metadata"] = self.metadata
        return record

    @classmethod
    def from_record(cls, record: Any, where: str = "record") -> ChatSample:
        """Read a record of :meth:`to_record`, or any ``{"messages": ...}`` / ``{"prompt", "completion"}`` dict.

        A record with no messages (``"prompt": [], "completion": []``, what a call recorded as token ids only is
        written as) is read when it holds both ``prompt_token_ids`` and ``response_token_ids``: it is trained on
        them. A record whose ``prompt`` and ``completion`` are strings (TRL's standard layout; a text completion)
        is raw text (:attr:`raw_text`). A reward that is not a finite number (NaN, an infinity) is read as no
        reward, with a warning.

        Raises:
            DataError: The record is not a dict, has neither layout, or holds a malformed message or id list.
        """
        if not isinstance(record, dict):
            raise DataError(f"{where}: expected a JSON object, got {type(record).__name__}")
        ids: Dict[str, Optional[List[int]]] = {}
        for name in ("prompt_token_ids", "response_token_ids"):
            value = record.get(name)
            if value is not None and not _is_id_list(value):
                raise DataError(f"{where}: {name} must be a list of non-negative integers")
            ids[name] = list(value) if value else None
        tokens_only = bool(ids["prompt_token_ids"]) and bool(ids["response_token_ids"])
        # A field that is null is absent: a parquet table of both layouts has every column in every row.
        prompt, completion = record.get("prompt"), record.get("completion")
        raw_text = record.get("messages") is None and isinstance(prompt, str) and isinstance(completion, str)
        if raw_text:  # a text completion: its two texts as a user and an assistant message, never templated
            prompt, completion = [{"role": "user", "content": prompt}], [{"role": "assistant", "content": completion}]
        if record.get("messages") is not None:
            raw, turns = record["messages"], "all"
        elif prompt is not None and completion is not None:
            empty = prompt == [] and completion == []
            if (
                not isinstance(prompt, list)
                or not isinstance(completion, list)
                or not (len(completion) == 1 or (empty and tokens_only))
            ):
                raise DataError(f"{where}: 'prompt' must be a list of messages and 'completion' a list of one")
            raw, turns = [*prompt, *completion], "last"
        else:
            raise DataError(f"{where}: needs 'messages', or 'prompt' and 'completion'")
        if raw == [] and tokens_only:
            messages: List[Dict[str, Any]] = []  # a call recorded as token ids only: trained on its ids
            tools: Optional[List[Dict[str, Any]]] = None
        else:
            messages, tools = _checked_conversation(raw, record.get("tools"), where)
            if turns == "last" and messages[-1]["role"] != "assistant":
                raise DataError(f"{where}: the completion must be an assistant message")
            if turns == "last" and not _learned(messages[-1]):
                raise DataError(f"{where}: the completion has weight 0, so there is nothing to learn")
            if turns == "all" and not any(_learned(m) for m in messages):
                raise DataError(
                    f"{where}: the conversation has no assistant message to learn"
                    + (" (every one has weight 0)" if any(m["role"] == "assistant" for m in messages) else "")
                )
        sample = cls(messages=messages, tools=tools, train_turns=turns, raw_text=raw_text, **ids)  # type: ignore[arg-type]
        for name in ("reward", "final_reward"):
            value = record.get(name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
                raise DataError(f"{where}: {name} must be a number or null, got {value!r}")
            if value is not None and finite_reward(value) is None:
                logger.warning("%s: %s %s is not a finite number: read as no reward", where, name, value)
            setattr(sample, name, finite_reward(value))
        for name in ("agent_name", "rollout_id", "task_id", "model", "finish_reason", "stop_string"):
            value = record.get(name)
            setattr(sample, name, value if isinstance(value, str) and value else None)
        metadata = record.get("metadata")
        sample.metadata = dict(metadata) if isinstance(metadata, dict) else {}
        return sample


def _is_id_list(value: Any) -> bool:
    return isinstance(value, list) and is_token_id_list(value)


def _checked_conversation(
    messages: Any, tools: Any, where: str
) -> Tuple[List[Dict[str, Any]], Optional[List[Dict[str, Any]]]]:
    """Messages and tools validated and normalised like trace messages (OpenAI shapes)."""
    if not isinstance(messages, list) or not messages:
        raise DataError(f"{where}: messages must be a non-empty list")
    functions = None
    if tools is not None:
        if not isinstance(tools, list):
            raise DataError(f"{where}: tools must be a list")
        functions = [tool.get("function", tool) if isinstance(tool, dict) else tool for tool in tools]
    try:
        (converted,) = convert_to_openai_messages([{"prompt": messages, "request": {"functions": functions}}])
    except ValueError as exc:
        raise DataError(f"{where}: {exc}") from None
    checked: List[Dict[str, Any]] = [dict(m) for m in converted["messages"]]
    for index, (raw, message) in enumerate(zip(messages, checked, strict=True)):
        if "weight" not in raw:
            continue
        weight = raw["weight"]
        if message["role"] != "assistant":
            raise DataError(f"{where}: message {index} ({message['role']}) has a weight; only assistant turns have one")
        if isinstance(weight, bool) or weight not in (0, 1):
            raise DataError(
                f"{where}: message {index} has weight {weight!r}; it must be 0 (not learned) or 1 (learned)"
            )
        message["weight"] = int(weight)
    return checked, converted["tools"]  # type: ignore[return-value]


def _learned(message: Dict[str, Any]) -> bool:
    """Whether ``message`` is an assistant turn to learn: one without ``"weight": 0`` (OpenAI's fine-tuning format
    marks a turn that is context only, not a target, with it)."""
    return message.get("role") == "assistant" and message.get("weight", 1) != 0


def read_samples(path: Union[str, os.PathLike[str]]) -> List[ChatSample]:
    """Read a JSONL file of chat samples (one JSON object per line; blank lines are skipped).

    Raises:
        DataError: The file is missing or a line is not valid JSON or not a valid record (named by line number).
    """
    return [ChatSample.from_record(record, f"{path}:{number}") for number, record in iter_jsonl(path)]


def write_samples(samples: Iterable[ChatSample], path: Union[str, os.PathLike[str]]) -> int:
    """Write samples as JSONL (:meth:`ChatSample.to_record`); returns how many were written."""
    count = 0
    with Path(path).open("w", encoding="utf-8") as handle:
        for sample in samples:
            handle.write(json.dumps(sample.to_record(), ensure_ascii=False) + "\n")
            count += 1
    return count


# --------------------------------------------------------------------------------------------------------------------
# From traces


def propagate_rewards(
    rewards: Sequence[Optional[float]], final_reward: Optional[float], mode: RewardPropagation
) -> List[Optional[float]]:
    """The reward each call of one rollout is ranked by.

    Args:
        rewards: The reward the adapter matched to each call, in the adapter's order (call order for calls made one
            after another; see :meth:`~agentbolt.adapter.TracerTraceToTriplet.adapt`), None where it has none.
        final_reward: The rollout's final reward.
        mode: ``"backward"``: a call gets the first reward at or after it (a later call's, or the final reward
            when no call after it was rewarded); ``"final"``: every call gets ``final_reward``; ``"none"``: a call
            keeps its own reward.

    A reward that is not a finite number counts as none (:func:`finite_reward`): it is neither kept nor propagated.
    """
    rewards = [finite_reward(reward) for reward in rewards]
    final_reward = finite_reward(final_reward)
    if mode == "final":
        return [final_reward] * len(rewards)
    if mode == "none":
        return list(rewards)
    propagated: List[Optional[float]] = []
    recent = final_reward
    for reward in reversed(rewards):
        if reward is not None:
            recent = reward
        propagated.append(recent)
    return propagated[::-1]


@dataclass
class CallStats(Counters):
    """The LLM calls of rollouts and those :func:`samples_from_triplets` could not turn into samples."""

    calls: int = 0
    """LLM calls seen."""
    other_agents: int = 0
    """Skipped: made by an agent ``agent_match`` does not select, or by no named agent while it is set."""
    without_data: int = 0
    """Skipped: the trace holds neither the call's messages nor its token ids (with a student prompt: no messages,
    or a text completion, whose prompt is no chat to rewrite)."""
    student_prompts: int = 0
    """Calls whose prompt was replaced by the student prompt (learned from messages)."""


class _CallTree(TraceTree):
    """A trace tree whose call triplets also say what kind of call each was (``metadata["operation"]``)."""

    def span_to_triplet(self, span: Span, agent_name: str) -> Triplet:
        triplet = super().span_to_triplet(span, agent_name)
        triplet.metadata["operation"] = span.attributes.get(GEN_AI_OPERATION_NAME)
        return triplet


class CallTraceToTriplet(TracerTraceToTriplet):
    """:class:`~agentbolt.adapter.TracerTraceToTriplet` whose triplets keep each call's operation
    (``metadata["operation"]``: ``"chat"`` or ``"text_completion"``, from ``gen_ai.operation.name``), so a text
    completion is learned as raw text, not as a chat."""

    tree_type = _CallTree


def _first_choice(raw: Any) -> List[Any]:
    if isinstance(raw, list):
        return raw[:1]
    if isinstance(raw, dict) and raw:
        return [raw]
    return []


def _triplet_messages(triplet: Triplet) -> Optional[Tuple[List[Dict[str, Any]], Optional[List[Dict[str, Any]]]]]:
    """The call's prompt messages plus its (first) reply, and the tools offered; None when the trace lacks them."""
    prompt = triplet.prompt.get("raw_content") if isinstance(triplet.prompt, dict) else None
    completion = _first_choice(triplet.response.get("raw_content") if isinstance(triplet.response, dict) else None)
    request = triplet.metadata.get("request")
    if not isinstance(prompt, list) or not prompt or not completion:
        return None
    try:
        (converted,) = convert_to_openai_messages(
            [{"prompt": prompt, "completion": completion, "request": request if isinstance(request, dict) else {}}]
        )
    except ValueError as exc:
        logger.warning("An LLM call with malformed messages is skipped: %s", exc)
        return None
    messages: List[Dict[str, Any]] = [dict(m) for m in converted["messages"]]
    if messages[-1].get("role") != "assistant":
        return None
    return messages, converted["tools"]  # type: ignore[return-value]


def _finish_reason(triplet: Triplet) -> Optional[str]:
    """Why the call's (first) generation ended: its choice's ``finish_reason``, else the response's first
    ``finish_reasons`` entry (``gen_ai.response.finish_reasons``); None when the trace records neither."""
    choice = _first_choice(triplet.response.get("raw_content") if isinstance(triplet.response, dict) else None)
    reason = choice[0].get("finish_reason") if choice and isinstance(choice[0], dict) else None
    if not isinstance(reason, str) or not reason:
        answered = triplet.metadata.get("response")
        reasons = answered.get("finish_reasons") if isinstance(answered, dict) else None
        reason = reasons[0] if isinstance(reasons, list) and reasons else reasons
    return reason if isinstance(reason, str) and reason else None


def _stop_string(triplet: Triplet) -> Optional[str]:
    """The stop string that ended the call's (first) generation, when its choice records the backend's
    ``stop_reason`` as one (a stop token's id, or none, is not a string)."""
    choice = _first_choice(triplet.response.get("raw_content") if isinstance(triplet.response, dict) else None)
    stop = choice[0].get("stop_reason") if choice and isinstance(choice[0], dict) else None
    return stop if isinstance(stop, str) and stop else None


def _token_ids(part: Any) -> Optional[List[int]]:
    ids = part.get("token_ids") if isinstance(part, dict) else None
    return list(ids) if _is_id_list(ids) and ids else None


def load_student_prompt(reference: Optional[str]) -> Optional[StudentPrompt]:
    """The function a ``student_prompt`` option (``"module:function"``) names; None for None.

    Raises:
        agentbolt.utils.imports.ImportReferenceError: It cannot be imported, or is not callable.
    """
    if reference is None:
        return None
    from agentbolt.utils.imports import ImportReferenceError, import_reference

    function = import_reference(reference, "student_prompt")
    if not callable(function):
        raise ImportReferenceError(f"student_prompt {reference!r} is not a function but {type(function).__name__}")
    return function  # type: ignore[no-any-return]


def with_student_prompt(sample: ChatSample, student_prompt: StudentPrompt) -> ChatSample:
    """``sample`` with its prompt (every message but the learned reply) replaced by ``student_prompt(prompt)``.

    Context distillation: the call was made with a richer prompt (a teacher's: more instructions, more worked
    examples); the returned sample asks the trained model with the prompt it gets when deployed and keeps the reply.
    The recorded token ids describe the other prompt, so the sample keeps none and is learned from its messages. The
    function receives copies of the messages and the tools stay as they were.

    Raises:
        DataError: The function's result is not a non-empty list of valid chat messages.
    """
    name = getattr(student_prompt, "__qualname__", repr(student_prompt))
    prompt = student_prompt([json.loads(json.dumps(m)) for m in sample.messages[:-1]])
    if not isinstance(prompt, list) or not prompt:
        raise DataError(f"student prompt {name} must return a non-empty list of messages, got {prompt!r:.80}")
    messages, _ = _checked_conversation([*prompt, sample.messages[-1]], None, f"student prompt {name}")
    return replace(sample, messages=messages, prompt_token_ids=None, response_token_ids=None)


def samples_from_triplets(
    triplets: Sequence[Triplet],
    *,
    final_reward: Optional[float],
    propagation: RewardPropagation = "backward",
    agent_match: Optional[str] = None,
    rollout_id: Optional[str] = None,
    task_id: Optional[str] = None,
    metadata: Optional[Dict[str, Any]] = None,
    student_prompt: Optional[StudentPrompt] = None,
) -> Tuple[List[ChatSample], CallStats]:
    """The chat samples of one rollout's LLM calls.

    Rewards are propagated over all the rollout's calls first, then calls of agents not matching ``agent_match``
    are dropped (so a reward matched to another agent's later call still reaches the trained agent's earlier ones).
    A call needs either its messages or both token id lists to become a sample.

    Args:
        triplets: The rollout's calls in order (from an adapter that keeps ``raw_content`` and token ids).
        final_reward: The rollout's final reward.
        propagation: See :func:`propagate_rewards`.
        agent_match: Regex searched in the call's agent name (a call without one is kept only when this is None;
            see :mod:`agentbolt.adapter.agent_match`).
        rollout_id: Recorded on each sample.
        task_id: Recorded on each sample.
        metadata: Recorded on each sample.
        student_prompt: Replace each call's prompt with the one this returns (:func:`with_student_prompt`); a call
            without recorded messages is then skipped (``without_data``).

    Returns:
        The samples, and the calls skipped (:class:`CallStats`).
    """
    selection = select_calls(triplets, agent_match, rollout_id)
    rewards = propagate_rewards([t.reward for t in triplets], final_reward, propagation)
    samples: List[ChatSample] = []
    stats = CallStats(calls=len(triplets))
    for triplet, reward, (agent, selected) in zip(triplets, rewards, selection, strict=True):
        if not selected:
            stats.other_agents += 1
            continue
        conversation = _triplet_messages(triplet)
        prompt_ids, response_ids = _token_ids(triplet.prompt), _token_ids(triplet.response)
        raw_text = triplet.metadata.get("operation") == "text_completion"
        if raw_text and student_prompt is not None:
            conversation = None  # a text prompt has no chat messages to rewrite
        if conversation is None and (student_prompt is not None or not (prompt_ids and response_ids)):
            stats.without_data += 1
            continue
        messages, tools = conversation if conversation is not None else ([], None)
        answered = triplet.metadata.get("response")
        model = answered.get("model") if isinstance(answered, dict) else None
        sample = ChatSample(
            messages=messages,
            tools=tools,
            train_turns="last",
            prompt_token_ids=prompt_ids,
            response_token_ids=response_ids,
            reward=reward,
            final_reward=finite_reward(final_reward),
            agent_name=agent,
            rollout_id=rollout_id,
            task_id=task_id,
            metadata=dict(metadata or {}),
            model=model if isinstance(model, str) and model else None,
            raw_text=raw_text and conversation is not None,
            finish_reason=_finish_reason(triplet),
            stop_string=_stop_string(triplet),
        )
        if student_prompt is not None:
            sample = with_student_prompt(sample, student_prompt)
            stats.student_prompts += 1
        samples.append(sample)
    return samples, stats


# --------------------------------------------------------------------------------------------------------------------
# Tokenization


@dataclass
class TokenSample:
    """Token ids to train on and the loss mask.

    Attributes:
        input_ids: The tokens.
        loss_mask: One flag per token: True where the token is a target of the loss (predicted from the tokens
            before it). The first token is never a target, even when flagged.
        reward: The sample's reward (selection ranks by it).
        final_reward: The final reward of its rollout (best-of-n compares it).
        task: Key of the task (rollouts of one task share it).
        rollout_id: The rollout it comes from (None for samples from files without one).
    """

    input_ids: List[int]
    loss_mask: List[bool]
    reward: Optional[float] = None
    final_reward: Optional[float] = None
    task: str = ""
    rollout_id: Optional[str] = None

    @property
    def num_targets(self) -> int:
        """Tokens the loss is computed on: the flagged ones after the first (nothing predicts the first token)."""
        return sum(self.loss_mask[1:])

    def dedup_key(self) -> str:
        """Equal for samples with the same tokens and targets."""
        digest = hashlib.sha1()
        digest.update(json.dumps([self.input_ids, [int(m) for m in self.loss_mask]]).encode())
        return digest.hexdigest()


@dataclass
class TokenizeStats(Counters):
    """What :func:`tokenize_sample` could not use, counted."""

    samples: int = 0
    """Samples seen."""
    from_tokens: int = 0
    """Samples trained on their recorded token ids."""
    from_messages: int = 0
    """Samples trained on their messages rendered with the chat template."""
    out_of_vocabulary: int = 0
    """Samples whose recorded token ids do not fit the trained model's vocabulary, trained on their messages instead
    (``data="auto"``)."""
    missing_tokens: int = 0
    """Skipped: token ids were required (``data="tokens"``) and not recorded."""
    unusable: int = 0
    """Skipped: neither usable messages nor token ids (or the chat template failed on them)."""
    too_long: int = 0
    """Skipped: longer than the limit with ``overlong="skip"`` (or nothing left to learn after truncation)."""
    truncated: int = 0
    """Kept with the start cut off (``overlong="truncate"``)."""


def _render(tokenizer: Any, messages: Sequence[Dict[str, Any]], tools: Any, generation_prompt: bool) -> str:
    return str(
        tokenizer.apply_chat_template(
            list(messages), tools=tools or None, add_generation_prompt=generation_prompt, tokenize=False
        )
    )


def _segments(
    tokenizer: Any, messages: Sequence[Dict[str, Any]], tools: Any, turns: TrainTurns
) -> List[Tuple[str, bool]]:
    """The rendered conversation cut into ``(text, is_target)`` segments.

    Raises:
        ValueError: The template does not render the conversation as a growing text (a turn's rendering is not a
            prefix of the next one), or fails.
    """
    full = _render(tokenizer, messages, tools, generation_prompt=False)
    positions = [i for i, m in enumerate(messages) if _learned(m)]
    if turns == "last":
        positions = positions[-1:] if positions and positions[-1] == len(messages) - 1 else []
    if not positions:
        raise ValueError("no assistant turn to learn")
    from agentbolt.serving.chat_prompt import special_token_texts

    # The end-of-turn token is the special token a turn ends with (only whitespace after it): the tokenizer's EOS
    # token is not always it (Gemma ends turns with <end_of_turn>, Qwen base tokenizers with <|im_end|>).
    eos = getattr(tokenizer, "eos_token", None)
    ends = tuple(sorted(special_token_texts(tokenizer) | ({eos} if isinstance(eos, str) and eos else set())))
    segments: List[Tuple[str, bool]] = []
    cursor = 0
    for index in positions:
        before = _render(tokenizer, messages[:index], tools, generation_prompt=True)
        through = _render(tokenizer, messages[: index + 1], tools, generation_prompt=False)
        if not (through.startswith(before) and full.startswith(through) and len(before) >= cursor):
            raise ValueError("the chat template does not render this conversation as a growing text")
        turn = through[len(before) :]
        stripped = turn.rstrip()
        end = len(stripped) if ends and stripped.endswith(ends) else len(turn)
        segments.append((full[cursor : len(before)], False))
        segments.append((turn[:end], True))
        cursor = len(before) + end
    segments.append((full[cursor:], False))
    return [(text, target) for text, target in segments if text]


def _tokenize_messages(tokenizer: Any, sample: ChatSample) -> Tuple[List[int], List[bool]]:
    """The token ids of a sample's rendered conversation and which of them are targets.

    Text of the conversation that holds a special token's text (``<|im_end|>`` in a tool result) is tokenized as
    plain text, the chat template's own control tokens as tokens: the rule of ``agentbolt serve``
    (:mod:`agentbolt.serving.chat_prompt`), so a sample trains on the ids the server would give the same text.

    Raises:
        ValueError: The template does not render the conversation as a growing text, or changes such text.
    """
    from agentbolt.serving.chat_prompt import encoder_for, template_message, unmark

    encoder = encoder_for(tokenizer)
    messages, tools = [], sample.tools
    for index, message in enumerate(sample.messages or []):
        try:  # the text agentbolt serve would prompt with
            messages.append(template_message(message))
        except ValueError as exc:
            raise ValueError(f"message {index} ({message.get('role')}): {exc}") from None
    marking = encoder.mark_client_text([messages, tools])
    markers = None
    if marking is not None:
        (messages, tools), markers = marking
    ids: List[int] = []
    mask: List[bool] = []
    texts: List[str] = []
    for text, target in _segments(tokenizer, messages, tools, sample.train_turns):
        tokens = encoder.encode_template_text(text) if markers is None else encoder.encode_marked(text, markers)
        if tokens is None:
            raise ValueError("the chat template cuts text that holds a special token's text")
        ids.extend(tokens)
        mask.extend([target] * len(tokens))
        texts.append(text)
    if markers is not None and not encoder.spells_the_same(ids, unmark("".join(texts), markers)):
        raise ValueError("the tokenizer tokenizes text that holds a special token's text differently on its own")
    return ids, mask


def _ended_by_the_model(sample: ChatSample, eos_id: int) -> bool:
    """Whether the sample's generation ended naturally: its finish reason is ``stop``, or, when the reason is not
    recorded, its recorded response ids end with ``eos_id``."""
    if sample.finish_reason is not None:
        return sample.finish_reason == "stop"
    return bool(sample.response_token_ids) and sample.response_token_ids[-1] == eos_id  # type: ignore[index]


def _tokenize_text(tokenizer: Any, sample: ChatSample) -> Tuple[List[int], List[bool]]:
    """The token ids of a text completion (:attr:`ChatSample.raw_text`) and which of them are targets: the prompt
    tokenized as ``agentbolt serve`` tokenizes a completion prompt (with the tokenizer's usual special tokens, such as
    BOS), then the generated text (without any), followed by the stop string that ended it when the trace names one
    (:attr:`ChatSample.stop_string`), or else, when the model ended the generation (:func:`_ended_by_the_model`),
    by the tokenizer's EOS token unless the text already ends with it; no chat template. A generation cut by the
    token budget, or whose end is unknown, gets neither."""
    prompt = list(tokenizer(sample.messages[0]["content"] or "").input_ids)
    generated = (sample.messages[-1]["content"] or "") + (sample.stop_string or "")
    completion = list(tokenizer(generated, add_special_tokens=False).input_ids)
    eos_id = getattr(tokenizer, "eos_token_id", None)
    ended = sample.stop_string is None and isinstance(eos_id, int) and _ended_by_the_model(sample, eos_id)
    if ended and completion[-1:] != [eos_id]:
        completion.append(eos_id)  # type: ignore[arg-type]
    return [*prompt, *completion], [False] * len(prompt) + [True] * len(completion)


def tokenize_sample(
    sample: ChatSample,
    tokenizer: Any,
    *,
    use_token_ids: bool = True,
    require_token_ids: bool = False,
    max_length: Optional[int] = None,
    overlong: Literal["skip", "truncate"] = "skip",
    vocab_size: Optional[int] = None,
    where: str = "a sample",
) -> Tuple[Optional[TokenSample], TokenizeStats]:
    """The token ids and loss mask of one sample (None when it cannot be used; the stats say why).

    Args:
        sample: The sample.
        tokenizer: The trained model's tokenizer (its chat template renders messages).
        use_token_ids: Train on the recorded ids when the sample has them (targets: the response tokens).
        require_token_ids: Skip samples without recorded ids (counted as ``missing_tokens``).
        max_length: Longest sample in tokens (None: no limit).
        overlong: ``"skip"`` or ``"truncate"`` (keep the last ``max_length`` tokens) a longer sample.
        vocab_size: Rows of the trained model's embedding (None: not checked). Recorded ids at or above it were
            made by another model's tokenizer: the sample is trained on its messages instead, unless ids are
            required or it has no messages.
        where: Names the sample in errors (``"sample 3 (rollout ro-1)"``).

    Raises:
        DataError: The recorded ids do not fit ``vocab_size`` and the sample cannot be trained without them.
    """
    stats = TokenizeStats(samples=1)
    ids: List[int]
    mask: List[bool]
    foreign = outside_vocabulary(sample, vocab_size) if use_token_ids and sample.has_token_ids else None
    if foreign is not None and (require_token_ids or not sample.messages):
        reason = "token ids are required (data='tokens')" if require_token_ids else "it has no messages to render"
        raise DataError(
            f"{where}: token id {foreign} is outside the vocabulary of the model being trained ({vocab_size} "
            f"tokens), so its ids were made by another model's tokenizer{_recorded_by(sample)}, and {reason}; train "
            "the model that recorded it, or on calls recorded with their messages (data='auto' or 'messages')"
        )
    if foreign is not None:
        stats.out_of_vocabulary = 1
    if use_token_ids and sample.has_token_ids and foreign is None:
        assert sample.prompt_token_ids is not None and sample.response_token_ids is not None
        ids = [*sample.prompt_token_ids, *sample.response_token_ids]
        mask = [False] * len(sample.prompt_token_ids) + [True] * len(sample.response_token_ids)
        stats.from_tokens = 1
    elif require_token_ids:
        stats.missing_tokens = 1
        return None, stats
    else:
        if not sample.messages:
            stats.unusable = 1
            return None, stats
        try:
            ids, mask = _tokenize_text(tokenizer, sample) if sample.raw_text else _tokenize_messages(tokenizer, sample)
        except Exception as exc:  # jinja errors on odd messages, or a template that rewrites history
            logger.warning(
                "%s is skipped: its messages cannot be rendered for training (%s)", where[:1].upper() + where[1:], exc
            )
            stats.unusable = 1
            return None, stats
        stats.from_messages = 1
    if mask and mask[0]:
        mask[0] = False  # nothing predicts the first token
    if max_length is not None and len(ids) > max_length:
        ids, mask = ids[-max_length:], mask[-max_length:]
        mask[0] = False
        if overlong == "skip" or not any(mask):
            stats.too_long = 1
            return None, stats
        stats.truncated = 1
    if not any(mask):
        stats.unusable = 1
        return None, stats
    return (
        TokenSample(
            input_ids=ids,
            loss_mask=mask,
            reward=sample.reward,
            final_reward=sample.final_reward,
            task=sample.group_key(),
            rollout_id=sample.rollout_id,
        ),
        stats,
    )


def outside_vocabulary(sample: ChatSample, vocab_size: Optional[int]) -> Optional[int]:
    """The largest recorded id of ``sample`` when it is ``vocab_size`` or above (None: every id fits)."""
    if vocab_size is None:
        return None
    largest = max([*(sample.prompt_token_ids or []), *(sample.response_token_ids or [])], default=-1)
    return largest if largest >= vocab_size else None


def _recorded_by(sample: ChatSample) -> str:
    return f" ({sample.model!r} answered the call)" if sample.model else ""


def describe_sample(sample: ChatSample, index: int) -> str:
    """``"sample 3 (rollout ro-1)"``: a sample by its position in the data, and its rollout when it has one."""
    return f"sample {index + 1}" + (f" (rollout {sample.rollout_id})" if sample.rollout_id else "")


def tokenize_samples(
    samples: Iterable[ChatSample], tokenizer: Any, **options: Any
) -> Tuple[List[TokenSample], TokenizeStats]:
    """:func:`tokenize_sample` over many samples; the usable ones and the summed stats.

    Samples are named in errors by their position (:func:`describe_sample`). Those trained on their messages
    because their ids do not fit the vocabulary are counted in one warning.

    Raises:
        DataError: A sample's ids do not fit ``vocab_size`` and it cannot be trained without them.
    """
    kept: List[TokenSample] = []
    total = TokenizeStats()
    for index, sample in enumerate(samples):
        tokenized, stats = tokenize_sample(sample, tokenizer, where=describe_sample(sample, index), **options)
        total.add(stats)
        if tokenized is not None:
            kept.append(tokenized)
    if total.out_of_vocabulary:
        logger.warning(
            "%d of %d samples hold token ids outside the vocabulary of the model being trained (%s tokens), made by "
            "another model's tokenizer: they are trained on their messages instead (counted as "
            "samples/out_of_vocabulary)",
            total.out_of_vocabulary,
            total.samples,
            options.get("vocab_size"),
        )
    return kept, total


def iter_jsonl(path: Union[str, os.PathLike[str]]) -> Iterator[Tuple[int, Any]]:
    """``(line number, parsed JSON)`` of each non-blank line of ``path``.

    Raises:
        DataError: The file is missing, or a line is not UTF-8 text or not valid JSON.
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such file" if not path.exists() else f"{path}: not a file")
    with path.open("rb") as handle:
        for number, raw in enumerate(handle, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise DataError(
                    f"{path}:{number}: not UTF-8 text (byte {exc.start + 1} of the line is 0x{raw[exc.start]:02x})"
                ) from None
            if not line.strip():
                continue
            try:
                yield number, json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataError(f"{path}:{number}: not valid JSON ({exc.msg})") from None
