"""A text completion learned as raw text ends with the EOS token exactly when the model ended the generation.

The calls are recorded to a real SQLite store with the attributes the recorders build
(:func:`agentbolt.llm_call_attributes.llm_call_attributes`), read back through the SFT adapter and tokenized with the
tiny model's tokenizer.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest

import agentbolt as agl
from agentbolt.algorithm.sft.data import ChatSample, tokenize_sample
from agentbolt.algorithm.sft.export import close_store, open_store, store_samples
from agentbolt.llm_call_attributes import CompletionRecord, llm_call_attributes
from agentbolt.store.sqlite import SqliteLightningStore

PROMPT = "The capital of France is"
COMPLETION = " Paris."


async def _record(path: Path, span_name: str, choice: Dict[str, Any]) -> None:
    store = SqliteLightningStore(path)
    try:
        rollout = await store.start_rollout(input={"prompt": PROMPT}, mode="train")
        response = {"id": "cmpl-1", "model": "tiny", "choices": [{"index": 0, "text": COMPLETION, **choice}]}
        attributes = llm_call_attributes(
            {"model": "tiny", "prompt": PROMPT}, CompletionRecord.from_completion(response), operation="text_completion"
        )
        call = agl.Span.from_attributes(
            attributes=attributes,
            name=span_name,
            rollout_id=rollout.rollout_id,
            attempt_id=rollout.attempt.attempt_id,
            sequence_id=1,
            start_time=1.0,
            end_time=2.0,
        )
        await store.add_span(call)
        await store.update_attempt(rollout.rollout_id, rollout.attempt.attempt_id, status="succeeded")
    finally:
        await store.close()


def _recorded_sample(tmp_path: Path, span_name: str, **choice: Any) -> ChatSample:
    path = tmp_path / "store.db"
    asyncio.run(_record(path, span_name, choice))

    async def read() -> List[ChatSample]:
        store = open_store(path)
        try:
            return await store_samples(store)
        finally:
            await close_store(store)

    (sample,) = asyncio.run(read())
    assert sample.raw_text
    return sample


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


def _targets(sample: ChatSample, tokenizer: Any) -> List[int]:
    tokenized, stats = tokenize_sample(sample, tokenizer, use_token_ids=False)
    assert tokenized is not None and stats.from_messages == 1
    return [token for token, target in zip(tokenized.input_ids, tokenized.loss_mask, strict=True) if target]


def _text_ids(tokenizer: Any, text: str = COMPLETION) -> List[int]:
    return list(tokenizer(text, add_special_tokens=False).input_ids)


@pytest.mark.parametrize("span_name", ["openai.completion", "agentbolt.llm_call"])
def test_a_completion_the_model_stopped_learns_to_end_with_eos(tmp_path: Path, tokenizer: Any, span_name: str) -> None:
    sample = _recorded_sample(tmp_path, span_name, finish_reason="stop")
    assert sample.finish_reason == "stop"
    assert _targets(sample, tokenizer) == [*_text_ids(tokenizer), tokenizer.eos_token_id]


@pytest.mark.parametrize("span_name", ["openai.completion", "agentbolt.llm_call"])
def test_a_completion_cut_by_the_token_budget_gets_no_eos(tmp_path: Path, tokenizer: Any, span_name: str) -> None:
    sample = _recorded_sample(tmp_path, span_name, finish_reason="length")
    assert sample.finish_reason == "length"
    assert _targets(sample, tokenizer) == _text_ids(tokenizer)


def test_a_completion_whose_end_is_unknown_gets_no_eos(tmp_path: Path, tokenizer: Any) -> None:
    sample = _recorded_sample(tmp_path, "openai.completion")
    assert sample.finish_reason is None
    assert _targets(sample, tokenizer) == _text_ids(tokenizer)


def test_response_ids_ending_with_eos_say_the_model_stopped_when_no_reason_is_recorded(
    tmp_path: Path, tokenizer: Any
) -> None:
    ended = [*_text_ids(tokenizer), tokenizer.eos_token_id]
    sample = _recorded_sample(tmp_path, "openai.completion", token_ids=ended)
    assert sample.finish_reason is None and sample.response_token_ids == ended
    assert _targets(sample, tokenizer) == ended
    cut = _recorded_sample(tmp_path / "cut", "openai.completion", token_ids=_text_ids(tokenizer))
    assert _targets(cut, tokenizer) == _text_ids(tokenizer)


def test_a_completion_whose_text_already_ends_with_eos_gets_it_once(tmp_path: Path, tokenizer: Any) -> None:
    sample = ChatSample(
        messages=[{"role": "user", "content": PROMPT}, {"role": "assistant", "content": COMPLETION + "<|im_end|>"}],
        raw_text=True,
        finish_reason="stop",
    )
    assert tokenizer.eos_token == "<|im_end|>"
    assert _targets(sample, tokenizer) == [*_text_ids(tokenizer), tokenizer.eos_token_id]


@pytest.mark.parametrize(("finish_reason", "eos"), [("stop", True), ("length", False), (None, False)])
def test_the_finish_reason_survives_export_and_reading_back(
    tokenizer: Any, finish_reason: Optional[str], eos: bool
) -> None:
    sample = ChatSample(
        messages=[{"role": "user", "content": PROMPT}, {"role": "assistant", "content": COMPLETION}],
        raw_text=True,
        finish_reason=finish_reason,
    )
    record = json.loads(json.dumps(sample.to_record()))
    assert record.get("finish_reason") == finish_reason
    read = ChatSample.from_record(record)
    assert read.raw_text and read.finish_reason == finish_reason
    assert _targets(read, tokenizer) == _text_ids(tokenizer) + ([tokenizer.eos_token_id] if eos else [])
