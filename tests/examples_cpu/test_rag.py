"""The rag example: its corpus and split, retrieval, the answer scores, the MCP retriever and rollouts."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from support.split_overlap import describe, find_overlaps

import agentbolt as agl

from .rollouts import run_rollouts
from .scripted_chat import ScriptedChat, tool_call

pytest.importorskip("mcp")
pytest.importorskip("rank_bm25")

from examples.rag.agent import RagAgent, answer_scores, parse_answer
from examples.rag.corpus import (
    DATA_DIR,
    ONE_HOP_KINDS,
    Retriever,
    exact_match,
    f1_score,
    load_corpus,
    load_questions,
    make_dataset,
)

TASK = next(q for q in load_questions("test") if q["kind"] == "founder")
GOLD = TASK["answers"][0]
PASSAGE = next(p for p in load_corpus() if p["id"] == TASK["passages"][0])
PASTED = f"{PASSAGE['title']}: {PASSAGE['text']}"


def test_shipped_data_is_the_generated_data() -> None:
    for name, rows in make_dataset().items():
        expected = "".join(json.dumps(row, sort_keys=True) + "\n" for row in rows)
        assert (DATA_DIR / f"{name}.jsonl").read_text(encoding="utf-8") == expected


def test_held_out_questions_use_no_training_evidence_or_wording() -> None:
    train, test = load_questions("train"), load_questions("test")
    train_passages = {p for q in train for p in q["passages"]}
    assert not [q for q in test if set(q["passages"]) & train_passages]
    overlaps = find_overlaps([q["question"] for q in train], [q["question"] for q in test])
    assert not overlaps, describe(overlaps)
    corpus_ids = {p["id"] for p in load_corpus()}
    assert all(set(q["passages"]) <= corpus_ids for q in train + test)


def test_retrieval_finds_the_evidence_of_one_hop_questions() -> None:
    retriever = Retriever()
    questions = load_questions("test", ONE_HOP_KINDS)
    hits = sum(retriever.search(q["question"], top_k=1)[0]["id"] == q["passages"][0] for q in questions)
    assert hits / len(questions) >= 0.9, f"{hits} of {len(questions)}"
    assert retriever.search("the of what", top_k=3) == []  # no searchable word
    with pytest.raises(ValueError):
        retriever.search("x", top_k=0)


@pytest.mark.parametrize(
    ("reply", "em", "f1"),
    [
        (f"ANSWER: {GOLD}", 1.0, 1.0),
        (f"It says so.\nanswer: {GOLD.upper()}.", 1.0, 1.0),
        (f"ANSWER: {GOLD.split()[0]}", 0.0, pytest.approx(2 / 3)),  # a partial name
        ("", 0.0, 0.0),
        (TASK["question"], 0.0, 0.0),  # the question copied back
        (f"ANSWER: Ada Brook, {GOLD}", 0.0, 0.0),  # several candidates
        (f"ANSWER: Ada Brook or {GOLD}", 0.0, 0.0),  # the gold among distractors
        (f"ANSWER: {GOLD}\nANSWER: Ada Brook", 0.0, 0.0),
        ("ANSWER: " + " ".join([GOLD] * 20), 0.0, 0.0),  # very long
        (PASTED, 0.0, 0.0),  # the whole passage pasted
        (f"ANSWER: {PASTED}", 0.0, 0.0),  # the whole passage as the answer
        (f"ANSWER: {PASSAGE['text'].split('. ')[1]}", 0.0, 0.0),  # the sentence holding the answer
        (f"ANSWER: {GOLD} {GOLD}", 0.0, pytest.approx(2 / 3)),  # repeated: no exact match, F1 pays precision
        (f"ANSWER: {TASK['question']}", 0.0, 0.0),  # the question as the answer
        ("word " * 5000 + f"\nANSWER: {GOLD}\nANSWER: x", 0.0, 0.0),  # very long, then two answers
    ],
)
def test_answer_scores(reply: str, em: float, f1: float) -> None:
    assert answer_scores(reply, TASK) == {"em": em, "f1": f1}


def test_scores_normalise_like_squad() -> None:
    assert exact_match("The  Glass Bells!", ["glass bells"]) == 1.0
    assert f1_score("glass", ["glass bells"]) == pytest.approx(2 / 3)
    assert exact_match(None, ["x"]) == 0.0 and f1_score("the", ["the"]) == 0.0
    assert parse_answer("ANSWER:") is None


def test_the_agent_retrieves_through_mcp_and_answers() -> None:
    from openai import AsyncOpenAI

    entity = TASK["question"].removeprefix("Who founded ").rstrip("?")

    async def conversation() -> object:
        async with AsyncOpenAI(base_url=chat.base_url, api_key="unused") as client:
            return await RagAgent().converse(client, "scripted", TASK["question"])

    with ScriptedChat([tool_call("retrieve", {"query": entity}), f"ANSWER: {GOLD}"]) as chat:
        episode = asyncio.run(conversation())
    ((name, _, passage),) = episode.tool_calls
    assert name == "retrieve" and passage.startswith(f"{entity}: ") and GOLD in passage
    assert answer_scores(episode.reply, TASK) == {"em": 1.0, "f1": 1.0}


def test_held_out_rollouts_emit_exact_match_and_f1(tmp_path: Path) -> None:
    with ScriptedChat([tool_call("retrieve", {"query": "nothing"}), f"ANSWER: {GOLD.split()[0]}"]) as chat:
        rollouts = run_rollouts(RagAgent(), agl.LLM(endpoint=chat.base_url, model="scripted"),
                                tmp_path / "store.sqlite", val=[TASK])  # fmt: skip
    assert [r.status for r in rollouts] == ["succeeded"]
    assert rollouts[0].rewards == {"em": 0.0, "f1": pytest.approx(2 / 3)}
