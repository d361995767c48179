"""Text completions (``/v1/completions``) in SFT: read from the OpenAI SDK's ``openai.completion`` spans and from the
gateway's ``agentbolt.llm_call`` spans, trained on their token ids, else on their raw text without a chat template,
and exported in TRL's standard layout (``{"prompt": "...", "completion": "..."}``). The calls are written to a real
SQLite store file with the attributes the recorders build (:func:`agentbolt.llm_call_attributes.llm_call_attributes`).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import List, Optional

import pytest

import agentbolt as agl
from agentbolt.algorithm.sft.data import ChatSample, tokenize_sample
from agentbolt.algorithm.sft.export import ExportFilter, close_store, export_store, open_store, store_samples
from agentbolt.algorithm.sft.offline import train_from_messages, train_from_store
from agentbolt.llm_call_attributes import CompletionRecord, llm_call_attributes
from agentbolt.store.sqlite import SqliteLightningStore

PROMPT = "The capital of France is"
COMPLETION = " Paris."


async def _record_text_completion(
    path: Path, span_name: str, token_ids: bool, stop_reason: Optional[str] = None
) -> None:
    """One succeeded rollout with one text completion (rewarded 1) recorded as a ``span_name`` span (ended by the
    stop string ``stop_reason`` when given, as vLLM and ``agentbolt serve`` name it)."""
    store = SqliteLightningStore(path)
    try:
        rollout = await store.start_rollout(input={"prompt": PROMPT}, mode="train")
        rollout_id, attempt_id = rollout.rollout_id, rollout.attempt.attempt_id
        choice = {"index": 0, "text": COMPLETION, "finish_reason": "stop", "stop_reason": stop_reason}
        response = {"id": "cmpl-1", "model": "tiny", "choices": [choice]}
        if token_ids:
            choice["token_ids"] = [7, 8]
            response["prompt_token_ids"] = [3, 4, 5]
        attributes = llm_call_attributes(
            {"model": "tiny", "prompt": PROMPT}, CompletionRecord.from_completion(response), operation="text_completion"
        )
        call = agl.Span.from_attributes(
            attributes=attributes,
            name=span_name,
            rollout_id=rollout_id,
            attempt_id=attempt_id,
            sequence_id=1,
            start_time=1.0,
            end_time=2.0,
        )
        reward = agl.Span.from_attributes(
            attributes={"agentlightning.reward.0.name": "primary", "agentlightning.reward.0.value": 1.0},
            name="agentlightning.annotation",
            rollout_id=rollout_id,
            attempt_id=attempt_id,
            sequence_id=2,
            start_time=3.0,
            end_time=3.0,
        )
        await store.add_span(call)
        await store.add_span(reward)
        await store.update_attempt(rollout_id, attempt_id, status="succeeded")
    finally:
        await store.close()


def _store(tmp_path: Path, span_name: str, token_ids: bool, stop_reason: Optional[str] = None) -> Path:
    path = tmp_path / "store.db"
    asyncio.run(_record_text_completion(path, span_name, token_ids, stop_reason))
    return path


def _samples(path: Path, filters: Optional[ExportFilter] = None) -> List[ChatSample]:
    async def read() -> List[ChatSample]:
        store = open_store(path)
        try:
            return await store_samples(store, filters)
        finally:
            await close_store(store)

    return asyncio.run(read())


def _tokenizer(model_dir: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


def test_a_text_completion_traced_by_the_openai_sdk_is_trained_on_its_token_ids(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    store = _store(tmp_path, "openai.completion", token_ids=True)
    result = train_from_store(store, model=str(tiny_model_dir), data="tokens")
    assert result.finished and result.data["samples/from_tokens"] == 1


@pytest.mark.parametrize("span_name", ["openai.completion", "agentbolt.llm_call"])
def test_a_text_completion_without_token_ids_is_learned_as_raw_text_not_as_a_chat(
    tmp_path: Path, tiny_model_dir: Path, span_name: str
) -> None:
    (sample,) = _samples(_store(tmp_path, span_name, token_ids=False))
    assert sample.raw_text
    tokenizer = _tokenizer(tiny_model_dir)
    tokenized, stats = tokenize_sample(sample, tokenizer)
    assert tokenized is not None and stats.from_messages == 1
    # The prompt as a completions server tokenizes it, then the generated text and, as the model ended it
    # (finish_reason "stop"), the EOS token; no chat template around either.
    prompt = tokenizer(PROMPT).input_ids
    completion = [*tokenizer(COMPLETION, add_special_tokens=False).input_ids, tokenizer.eos_token_id]
    assert tokenized.input_ids == [*prompt, *completion]
    assert tokenized.loss_mask == [False] * len(prompt) + [True] * len(completion)


@pytest.mark.parametrize("span_name", ["openai.completion", "agentbolt.llm_call"])
def test_a_text_completion_a_stop_string_ended_learns_to_write_it_not_eos(
    tmp_path: Path, tiny_model_dir: Path, span_name: str
) -> None:
    (sample,) = _samples(_store(tmp_path, span_name, token_ids=False, stop_reason="\nQ:"))
    assert (sample.finish_reason, sample.stop_string) == ("stop", "\nQ:")
    assert ChatSample.from_record(json.loads(json.dumps(sample.to_record()))).stop_string == "\nQ:"
    tokenizer = _tokenizer(tiny_model_dir)
    tokenized, _ = tokenize_sample(sample, tokenizer)
    assert tokenized is not None
    # The model wrote the stop string, which the server cut from the text: it is learned, and no EOS after it.
    prompt = tokenizer(PROMPT).input_ids
    completion = tokenizer(COMPLETION + "\nQ:", add_special_tokens=False).input_ids
    assert tokenized.input_ids == [*prompt, *completion] and tokenizer.eos_token_id not in completion


def test_a_recorded_text_completion_with_ids_is_rendered_as_raw_text_when_messages_are_asked_for(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    (sample,) = _samples(_store(tmp_path, "agentbolt.llm_call", token_ids=True))
    tokenizer = _tokenizer(tiny_model_dir)
    tokenized, _ = tokenize_sample(sample, tokenizer, use_token_ids=False)
    assert tokenized is not None
    assert tokenizer.decode(tokenized.input_ids, skip_special_tokens=True) == PROMPT + COMPLETION


def test_text_completions_are_exported_in_trls_standard_layout_and_trained_back(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    out = tmp_path / "samples.jsonl"
    assert asyncio.run(_export(_store(tmp_path, "openai.completion", token_ids=False), out)) == 1
    (record,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert record["prompt"] == PROMPT and record["completion"] == COMPLETION
    assert ChatSample.from_record(record).raw_text
    result = train_from_messages(out, model=str(tiny_model_dir))
    assert result.finished and result.data["samples/from_messages"] == 1


async def _export(path: Path, out: Path) -> int:
    store = open_store(path)
    try:
        return await export_store(store, out)
    finally:
        await close_store(store)


def test_a_student_prompt_skips_text_completions_which_have_no_chat_to_rewrite(tmp_path: Path) -> None:
    from agentbolt.algorithm.sft.algorithm import LLM_CALL_SPANS
    from agentbolt.algorithm.sft.data import CallTraceToTriplet, samples_from_triplets

    path = _store(tmp_path, "openai.completion", token_ids=False)

    async def spans() -> list:
        store = open_store(path)
        try:
            (rollout,) = await store.query_rollouts()
            return list(await store.query_spans(rollout.rollout_id))
        finally:
            await close_store(store)

    triplets = CallTraceToTriplet(llm_call_match=LLM_CALL_SPANS).adapt(asyncio.run(spans()))
    samples, stats = samples_from_triplets(triplets, final_reward=1.0, student_prompt=lambda messages: messages)
    assert samples == [] and stats.without_data == 1
