"""Context distillation: calls made with a teacher's prompt are learned from the student's prompt."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List

import pytest
from pydantic import ValidationError

from agentbolt.algorithm.sft import SFTConfig
from agentbolt.algorithm.sft.data import (
    DataError,
    load_student_prompt,
    samples_from_triplets,
    tokenize_sample,
)
from agentbolt.types import Triplet
from agentbolt.utils.imports import ImportReferenceError

SYSTEM = {"role": "system", "content": "Use the calculator."}
TEACHER_SHOT = [
    {"role": "user", "content": "What is 2 + 3?"},
    {"role": "assistant", "content": "### 5 ###"},
]
QUESTION = {"role": "user", "content": "What is 6 * 7?"}
TOOL_TURNS = [
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "calculator", "arguments": '{"expression": "6*7"}'}}
        ],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "42"},
]
TOOLS = [{"name": "calculator", "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}}}]


def without_teacher_shots(messages: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """The student's prompt: the system prompt, then the conversation from the question on."""
    start = max(i for i, m in enumerate(messages) if m["role"] == "user")
    return [messages[0], *messages[start:]]


def _teacher_call(prompt: List[Dict[str, Any]], reply: Dict[str, Any], reward=None) -> Triplet:
    return Triplet(
        prompt={"token_ids": [1, 2, 3], "raw_content": prompt},
        response={"token_ids": [4], "raw_content": [reply]},
        reward=reward,
        metadata={"agent_name": "solver", "request": {"functions": TOOLS}},
    )


def test_each_call_keeps_its_reply_and_reward_but_is_asked_with_the_student_prompt() -> None:
    teacher = [SYSTEM, *TEACHER_SHOT, QUESTION]
    calls = [
        _teacher_call(teacher, TOOL_TURNS[0]),
        _teacher_call([*teacher, *TOOL_TURNS], {"role": "assistant", "content": "### 42 ###"}),
    ]
    samples, stats = samples_from_triplets(calls, final_reward=1.0, student_prompt=without_teacher_shots)
    assert (stats.calls, stats.student_prompts, stats.without_data) == (2, 2, 0)
    first, second = samples
    assert first.messages == [SYSTEM, QUESTION, TOOL_TURNS[0]]
    assert second.messages == [SYSTEM, QUESTION, *TOOL_TURNS, {"role": "assistant", "content": "### 42 ###"}]
    assert [s.reward for s in samples] == [1.0, 1.0] and first.tools == [{"type": "function", "function": TOOLS[0]}]
    # The recorded token ids encode the teacher's prompt: the samples keep none and are learned from messages.
    assert all(s.prompt_token_ids is None and s.response_token_ids is None for s in samples)
    # The recorded call is left as it was.
    assert calls[0].prompt["raw_content"] == teacher


def test_the_student_sample_trains_on_the_student_prompt_and_the_teacher_reply(tiny_model_dir: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    call = _teacher_call([SYSTEM, *TEACHER_SHOT, QUESTION], TOOL_TURNS[0])
    (sample,), _ = samples_from_triplets([call], final_reward=1.0, student_prompt=without_teacher_shots)
    tokens, stats = tokenize_sample(sample, tokenizer)
    assert tokens is not None and stats.from_messages == 1
    student = tokenizer.apply_chat_template(
        [SYSTEM, QUESTION], tools=sample.tools, add_generation_prompt=True, tokenize=False
    )
    prompt_ids = tokenizer(student, add_special_tokens=False).input_ids
    assert tokens.input_ids[: len(prompt_ids)] == prompt_ids and not any(tokens.loss_mask[: len(prompt_ids)])
    targets = tokenizer.decode([t for t, m in zip(tokens.input_ids, tokens.loss_mask, strict=True) if m])
    assert targets == '<tool_call>\n{"name": "calculator", "arguments": {"expression": "6*7"}}\n</tool_call><|im_end|>'
    assert "2 + 3" not in tokenizer.decode(tokens.input_ids)


def test_a_call_without_messages_cannot_be_rewritten_and_is_counted() -> None:
    bare = Triplet(prompt={"token_ids": [1, 2]}, response={"token_ids": [3]}, metadata={})
    samples, stats = samples_from_triplets([bare], final_reward=1.0, student_prompt=without_teacher_shots)
    assert samples == [] and stats.without_data == 1 and stats.student_prompts == 0
    # Without a student prompt the same call is a token sample.
    samples, _ = samples_from_triplets([bare], final_reward=1.0)
    assert samples[0].prompt_token_ids == [1, 2]


@pytest.mark.parametrize(
    ("result", "message"),
    [
        (None, "must return a non-empty list of messages"),
        ([], "must return a non-empty list of messages"),
        ([{"role": "robot", "content": "x"}], "robot"),
    ],
)
def test_a_student_prompt_returning_no_valid_messages_is_a_data_error(result: Any, message: str) -> None:
    call = _teacher_call([SYSTEM, QUESTION], {"role": "assistant", "content": "### 42 ###"})
    with pytest.raises(DataError, match=message):
        samples_from_triplets([call], final_reward=1.0, student_prompt=lambda _messages: result)


def test_the_student_prompt_gets_copies_of_the_messages() -> None:
    def destructive(messages: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
        messages[0]["content"] = "changed"
        return messages[:1]

    call = _teacher_call([SYSTEM, QUESTION], {"role": "assistant", "content": "### 42 ###"})
    (sample,), _ = samples_from_triplets([call], final_reward=1.0, student_prompt=destructive)
    assert sample.messages[0]["content"] == "changed" and call.prompt["raw_content"][0] == SYSTEM


def test_the_option_names_an_importable_function_and_needs_messages() -> None:
    reference = f"{__name__}:without_teacher_shots"
    assert load_student_prompt(reference) is without_teacher_shots and load_student_prompt(None) is None
    assert SFTConfig(student_prompt=reference).student_prompt == reference
    with pytest.raises(ValidationError, match="student_prompt"):
        SFTConfig(student_prompt="no colon")
    with pytest.raises(ValidationError, match="data='messages'"):
        SFTConfig(student_prompt=reference, data="tokens")
    with pytest.raises(ImportReferenceError, match="cannot import no_such_module"):
        load_student_prompt("no_such_module:f")
    with pytest.raises(ImportReferenceError, match="has no attribute 'missing'"):
        load_student_prompt(f"{__name__}:missing")
    with pytest.raises(ImportReferenceError, match="is not a function but list"):
        load_student_prompt(f"{__name__}:TEACHER_SHOT")
    json.dumps(SFTConfig(student_prompt=reference).model_dump())  # the option stays serializable
