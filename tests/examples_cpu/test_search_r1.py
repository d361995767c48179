"""The search_r1 example: its tag parsers and the search loop, on the rag example's corpus."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import agentbolt as agl

from .rollouts import run_rollouts
from .scripted_chat import ScriptedChat

pytest.importorskip("rank_bm25")

from examples.rag.corpus import Retriever, exact_match, f1_score, load_corpus, load_questions
from examples.search_r1.agent import SearchR1Agent, parse_answer, parse_search, solve

TWO_HOP = next(q for q in load_questions("test") if q["kind"] == "founder_of_birthplace")
ENGINEER = TWO_HOP["question"].removeprefix("Who founded the town where ").removesuffix(" was born?")
GOLD = TWO_HOP["answers"][0]


@pytest.mark.parametrize(
    ("text", "query", "answer"),
    [
        ("<search> Kelvar", "Kelvar", None),  # generation stopped at </search>
        ("<search> Kelvar </search>", "Kelvar", None),
        ("<answer> Ada Brook", None, "Ada Brook"),
        ("<answer> Ada Brook </answer>", None, "Ada Brook"),
        ("<search> </search>", None, None),
        ("<answer> Ada Brook, Bram Holt </answer>", None, None),  # several candidates
        ("<answer> 1,262 </answer>", None, "1262"),  # one number, written with a digit-group comma
        ("<answer> 1262,1263 </answer>", None, None),  # two numbers
        ("<answer> x </answer><answer> y </answer>", None, None),
        ("<answer> " + "word " * 10 + "</answer>", None, None),
        ("no tags at all", None, None),
    ],
)
def test_parsers(text: str, query: str, answer: str) -> None:
    assert parse_search(text) == query
    assert parse_answer(text) == answer


PASSAGE = next(p for p in load_corpus() if p["id"] == TWO_HOP["passages"][-1])  # the town's passage, holding GOLD


@pytest.mark.parametrize(
    ("text", "em", "f1"),
    [
        (f"<answer> {GOLD} </answer>", 1.0, 1.0),
        (f"<answer> {GOLD}", 1.0, 1.0),  # generation stopped at </answer>
        ("", 0.0, 0.0),
        ("<answer> </answer>", 0.0, 0.0),
        (TWO_HOP["question"], 0.0, 0.0),  # the question copied back
        (f"<answer> {TWO_HOP['question']} </answer>", 0.0, 0.0),
        (f"<answer> Ada Brook, {GOLD} </answer>", 0.0, 0.0),  # several candidates
        (f"<answer> Ada Brook or {GOLD} </answer>", 0.0, 0.0),  # the gold among distractors
        (f"<answer> {GOLD} </answer><answer> Ada Brook </answer>", 0.0, 0.0),
        (f"<answer> {PASSAGE['title']}: {PASSAGE['text']} </answer>", 0.0, 0.0),  # the whole passage pasted
        (f"<information> {PASSAGE['text']} </information>", 0.0, 0.0),  # the passage without an answer
        ("<answer> " + " ".join([GOLD] * 20) + " </answer>", 0.0, 0.0),  # very long
        (f"<search> {GOLD} </search>", 0.0, 0.0),  # a search is not an answer
    ],
)
def test_adversarial_answers_score_nothing(text: str, em: float, f1: float) -> None:
    answer = parse_answer(text)
    assert (exact_match(answer, TWO_HOP["answers"]), f1_score(answer, TWO_HOP["answers"])) == (em, f1)


def test_two_hop_question_with_two_searches() -> None:
    from openai import AsyncOpenAI

    town = Retriever().search(ENGINEER)[0]["text"].split(" born in ")[1].split(".")[0]
    script = [f"<search> {ENGINEER}", f"<search> {town}", f"<answer> {GOLD}"]

    async def conversation() -> object:
        async with AsyncOpenAI(base_url=chat.base_url, api_key="unused") as client:
            return await solve(client, "scripted", TWO_HOP["question"], Retriever())

    with ScriptedChat(script) as chat:
        trajectory = asyncio.run(conversation())
    assert trajectory.searches == [(ENGINEER, ENGINEER), (town, town)]
    assert trajectory.answer == GOLD and trajectory.turns == 3
    assert chat.requests[0]["stop"] == ["</search>", "</answer>"]
    assert chat.requests[2]["messages"][-1]["content"].startswith(f"<information> {town}: ")


def test_rollouts_reward_exact_match(tmp_path: Path) -> None:
    with ScriptedChat([f"<search> {ENGINEER}", "<answer> Nobody"]) as chat:
        rollouts = run_rollouts(SearchR1Agent(), agl.LLM(endpoint=chat.base_url, model="scripted"),
                                tmp_path / "store.sqlite", train=[TWO_HOP], val=[TWO_HOP])  # fmt: skip
    by_mode = {r.mode: r for r in rollouts}
    assert by_mode["train"].rewards["primary"] == pytest.approx(0.1)  # well formed, searched, wrong
    assert by_mode["val"].rewards == {"em": 0.0, "f1": 0.0}
