"""Chat data as users write it: content parts, the developer role, files with blank lines, parquet files that are not
parquet. Each sample trains on what ``agentbolt serve`` would prompt the model with, and each bad input is named."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Dict, List

import pytest

from agentbolt.algorithm.sft.data import ChatSample, DataError, tokenize_sample, tokenize_samples
from agentbolt.algorithm.sft.export import read_records, write_records
from agentbolt.algorithm.sft.offline import load_chat_samples, train_from_messages


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


def _served_prompt(tokenizer: Any, messages: List[Dict[str, Any]]) -> List[int]:
    """The prompt ids ``agentbolt serve`` gives the model for ``messages`` (a chat request's body)."""
    from agentbolt.serving.chat_prompt import ChatPromptEncoder
    from agentbolt.serving.protocol import ChatCompletionRequest, normalize_messages

    body = ChatCompletionRequest.model_validate({"model": "tiny", "messages": messages})
    return ChatPromptEncoder(tokenizer).encode(normalize_messages(body))


def _context_of_completion(tokenizer: Any, record: Dict[str, Any]) -> List[int]:
    sample, stats = tokenize_sample(ChatSample.from_record(record), tokenizer)
    assert sample is not None, stats
    return sample.input_ids[: sample.loss_mask.index(True)]


@pytest.mark.parametrize(
    "prompt",
    [
        [{"role": "user", "content": [{"type": "text", "text": "What is "}, {"type": "text", "text": "6 * 7?"}]}],
        [{"role": "developer", "content": "Answer briefly."}, {"role": "user", "content": "What is 6 * 7?"}],
        [
            {"role": "system", "content": [{"type": "input_text", "text": "Be brief."}]},
            {"role": "user", "content": "?"},
        ],
    ],
    ids=["text-parts", "developer", "input-text"],
)
def test_a_turn_is_trained_in_the_context_the_server_prompts_with(tokenizer: Any, prompt: List[Dict[str, Any]]) -> None:
    record = {"prompt": prompt, "completion": [{"role": "assistant", "content": "42"}]}
    assert _context_of_completion(tokenizer, record) == _served_prompt(tokenizer, prompt)


def test_a_reply_written_as_text_parts_is_learned_as_its_text(tokenizer: Any) -> None:
    reply = {"role": "assistant", "content": [{"type": "text", "text": "4"}, {"type": "text", "text": "2"}]}
    sample, _ = tokenize_sample(
        ChatSample.from_record({"messages": [{"role": "user", "content": "q"}, reply]}), tokenizer
    )
    assert sample is not None
    assert tokenizer.decode([t for t, m in zip(sample.input_ids, sample.loss_mask, strict=True) if m]) == "42<|im_end|>"


def test_an_image_part_skips_the_sample_with_a_warning_naming_it_and_the_part(
    tokenizer: Any, caplog: pytest.LogCaptureFixture
) -> None:
    image = {"type": "image_url", "image_url": {"url": "https://example.org/cat.png"}}
    record = {
        "prompt": [{"role": "user", "content": [{"type": "text", "text": "What is this?"}, image]}],
        "completion": [{"role": "assistant", "content": "a cat"}],
    }
    plain = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}
    samples = [ChatSample.from_record(plain), ChatSample.from_record({**record, "rollout_id": "ro-1"})]
    with caplog.at_level(logging.WARNING):
        kept, stats = tokenize_samples(samples, tokenizer)
    assert len(kept) == 1 and stats.unusable == 1
    assert "Sample 2 (rollout ro-1) is skipped" in caplog.text
    assert "message 0 (user): content[1]: only text content parts are supported, got 'image_url'" in caplog.text


def test_a_bad_record_of_a_chat_file_is_named_by_its_line_when_training(tmp_path: Path, tiny_model_dir: Path) -> None:
    path = tmp_path / "chat.jsonl"
    good = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}
    bad = {"messages": [{"role": "robot", "content": "q"}, {"role": "assistant", "content": "a"}]}
    path.write_text(json.dumps(good) + "\n\n\n" + json.dumps(bad) + "\n")
    with pytest.raises(DataError, match=r"chat\.jsonl:4: Invalid chat message role 'robot'"):
        train_from_messages(path, model=str(tiny_model_dir))


def test_a_bad_row_of_a_parquet_file_is_named_by_its_row(tmp_path: Path) -> None:
    path = tmp_path / "chat.parquet"
    good = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}
    write_records([good, {"text": "hi"}], path)
    with pytest.raises(DataError, match=r"chat\.parquet row 2: needs 'messages'"):
        load_chat_samples(path)


def test_a_file_that_is_not_parquet_is_a_data_error_naming_it(tmp_path: Path, tiny_model_dir: Path) -> None:
    path = tmp_path / "chat.parquet"
    path.write_text('{"messages": []}\n')
    with pytest.raises(DataError, match=r"chat\.parquet: not a readable parquet file \(.*magic bytes"):
        train_from_messages(path, model=str(tiny_model_dir))


def test_a_parquet_file_is_told_by_its_suffix_in_any_case(tmp_path: Path) -> None:
    records = [{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}]
    path = tmp_path / "CHAT.PARQUET"
    write_records(records, path)
    assert path.read_bytes()[:4] == b"PAR1"
    assert read_records(path) == records


def test_a_directory_given_as_chat_data_is_named_as_such(tmp_path: Path) -> None:
    for name in ("chat.jsonl", "chat.parquet"):
        (tmp_path / name).mkdir()
        with pytest.raises(DataError, match=rf"{name}: not a file"):
            load_chat_samples(tmp_path / name)


def test_a_parquet_file_of_conversations_and_calls_reads_back_both_layouts(tmp_path: Path) -> None:
    conversation = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}
    call = {"prompt": [{"role": "user", "content": "q2"}], "completion": [{"role": "assistant", "content": "a2"}]}
    path = tmp_path / "mixed.parquet"
    write_records([conversation, call], path)
    samples = load_chat_samples(path)
    assert [(s.train_turns, s.messages[-1]["content"]) for s in samples] == [("all", "a"), ("last", "a2")]


def test_an_assistant_turn_of_weight_0_is_context_not_a_target(tokenizer: Any) -> None:
    conversation = [
        {"role": "user", "content": "q1"},
        {"role": "assistant", "content": "a wrong answer", "weight": 0},
        {"role": "user", "content": "q2"},
        {"role": "assistant", "content": "right", "weight": 1},
    ]
    sample = ChatSample.from_record({"messages": conversation})
    tokens, _ = tokenize_sample(sample, tokenizer)
    assert tokens is not None
    assert (
        tokenizer.decode([t for t, m in zip(tokens.input_ids, tokens.loss_mask, strict=True) if m]) == "right<|im_end|>"
    )
    assert "a wrong answer" in tokenizer.decode(tokens.input_ids)
    assert ChatSample.from_record(sample.to_record()) == sample  # the weight is kept when written


@pytest.mark.parametrize(
    ("record", "message"),
    [
        (
            {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a", "weight": 0}]},
            "the conversation has no assistant message to learn (every one has weight 0)",
        ),
        (
            {
                "prompt": [{"role": "user", "content": "q"}],
                "completion": [{"role": "assistant", "content": "a", "weight": 0}],
            },
            "the completion has weight 0, so there is nothing to learn",
        ),
        (
            {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a", "weight": 0.5}]},
            "message 1 has weight 0.5; it must be 0 (not learned) or 1 (learned)",
        ),
        (
            {"messages": [{"role": "user", "content": "q", "weight": 1}, {"role": "assistant", "content": "a"}]},
            "message 0 (user) has a weight; only assistant turns have one",
        ),
    ],
)
def test_a_weight_that_leaves_nothing_to_learn_or_is_not_0_or_1_is_named(record: Dict[str, Any], message: str) -> None:
    with pytest.raises(DataError, match="^chat.jsonl:3: " + message.replace("(", r"\(").replace(")", r"\)")):
        ChatSample.from_record(record, "chat.jsonl:3")


def test_a_turn_ends_at_its_end_of_turn_token_when_the_eos_token_is_another(tiny_model_dir: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    tokenizer.eos_token = "<|endoftext|>"  # as in tokenizers whose EOS is not the token their template ends turns with
    conversation = [
        {"role": "user", "content": "q1"},
        {"role": "assistant", "content": "a1"},
        {"role": "user", "content": "q2"},
        {"role": "assistant", "content": "a2"},
    ]
    sample, _ = tokenize_sample(ChatSample.from_record({"messages": conversation}), tokenizer)
    assert sample is not None
    targets = [tokenizer.decode([t]) for t, m in zip(sample.input_ids, sample.loss_mask, strict=True) if m]
    assert targets == ["a", "1", "<|im_end|>", "a", "2", "<|im_end|>"]
