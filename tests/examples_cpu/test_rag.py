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

from examples.rag.agent import RagAgent, answer_scores, parse_answer, training_f1
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


YEAR = next(q for q in load_questions("test") if q["kind"] == "year")
OTHER_NAME = next(  # another founder, sharing no word with the gold answer
    q["answers"][0]
    for q in load_questions("test")
    if q["kind"] == "founder" and not set(q["answers"][0].split()) & set(GOLD.split())
)


@pytest.mark.parametrize(
    ("reply", "task"),
    [
        (f"ANSWER: {YEAR['answers'][0]} {int(YEAR['answers'][0]) + 1}", YEAR),  # two years
        (f"ANSWER: {int(YEAR['answers'][0]) - 1} {YEAR['answers'][0]} {int(YEAR['answers'][0]) + 1}", YEAR),
        (f"ANSWER: {GOLD} {OTHER_NAME}", TASK),  # two people
        (f"ANSWER: {OTHER_NAME} {GOLD}", TASK),
        (f"ANSWER: {GOLD} {GOLD}", TASK),
    ],
)
def test_listing_candidates_earns_no_training_credit(reply: str, task: dict) -> None:
    assert answer_scores(reply, task)["em"] == 0.0
    assert training_f1(reply, task) == 0.0


def test_listing_two_candidates_never_beats_committing_to_the_likelier() -> None:
    # The gold answer is one of two names, the first with probability p >= 0.5. Committing to the first earns p on
    # average; a reply mixing both must earn no more, whichever words of the two it lists.
    other_task = {**TASK, "answers": [OTHER_NAME]}
    (first, last), (other_first, other_last) = GOLD.split(), OTHER_NAME.split()
    mixes = [f"{GOLD} {OTHER_NAME}", f"{first} {other_first}", f"{first} {other_last}", f"{last} {other_first}"]
    for p in (0.5, 0.6, 0.9):
        committed = p * training_f1(f"ANSWER: {GOLD}", TASK)
        for mix in mixes:
            expected = p * training_f1(f"ANSWER: {mix}", TASK) + (1 - p) * training_f1(f"ANSWER: {mix}", other_task)
            assert expected <= committed + 1e-9, (mix, p)


@pytest.mark.parametrize(
    ("reply", "score"),
    [
        (f"ANSWER: {GOLD}", 1.0),
        (f"The passage says so.\nANSWER: {GOLD.lower()}.", 1.0),
        (f"ANSWER: the {GOLD}", 1.0),  # an article is not a word of the answer
        (f"ANSWER: {GOLD.split()[0]}", pytest.approx(2 / 3)),  # partly right: F1's partial credit stays
        ("ANSWER: Ada Brook", 0.0),
        ("no answer line", 0.0),
    ],
)
def test_training_f1_pays_one_committed_answer(reply: str, score: float) -> None:
    assert training_f1(reply, TASK) == score


@pytest.mark.parametrize("written", ["1,262", "1262", "1,262."])
def test_digit_group_commas_are_one_number(written: str) -> None:
    task = {**YEAR, "answers": ["1262"]}
    assert parse_answer(f"ANSWER: {written}") == "1262"
    assert answer_scores(f"ANSWER: {written}", task) == {"em": 1.0, "f1": 1.0}  # type: ignore[arg-type]
    assert training_f1(f"ANSWER: {written}", task) == 1.0  # type: ignore[arg-type]


@pytest.mark.parametrize("listed", ["1262,1263", "1,262, 1263", "1262, 1263", "12,62"])
def test_commas_between_numbers_are_still_a_list(listed: str) -> None:
    assert parse_answer(f"ANSWER: {listed}") is None


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
