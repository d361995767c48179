"""Calculator, BM25 search over the shipped corpus, the toolbox, and the generalist on a scripted endpoint."""

from __future__ import annotations

import re
from typing import List

import pytest

from examples.flow_grpo.agents import RoleLLM
from examples.flow_grpo.tools import (
    BM25Index,
    CalculatorTool,
    Document,
    GeneralistTool,
    SearchTool,
    Toolbox,
    ToolMetadata,
    default_toolbox,
    evaluate_expression,
    extract_expression,
    load_corpus,
    stem,
)

from .scripted_llm import FAIL, ScriptedLLM


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("12 ** 2", 144),
        ("(17 + 25) * 3", 126),
        ("2^10", 1024),
        ("sqrt(144)", 12.0),
        ("factorial(5) / 4", 30.0),
        ("-3 + 10 // 3", 0),
    ],
)
def test_calculator_evaluates(expression: str, value: float) -> None:
    assert evaluate_expression(expression) == value


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("__import__('os').system('true')", "unsupported"),
        ("open('x')", "unsupported"),
        ("9 ** 9 ** 9", "too large"),
        ("(2 ** 5000) ** 5000", "too large"),
        ("factorial(100000)", "too large"),
        ("1 +", "not a valid expression"),
        ("", "empty"),
    ],
)
def test_calculator_rejects_unsafe_or_malformed_input(expression: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        evaluate_expression(expression)


def test_calculator_tool_turns_errors_into_observations() -> None:
    tool = CalculatorTool()
    assert tool.execute("12 * 12").output == "144"  # the value alone: the memory shows the input next to it
    result = tool.execute("1 / 0")
    assert not result.ok and result.output == "Error: division by zero"
    # A sentence without a calculation stays an error, with the parser's message.
    result = tool.execute("Calculate 11 squared")
    assert not result.ok and result.output.startswith("Error: not a valid expression")


@pytest.mark.parametrize(
    ("text", "expression"),
    [
        ("What is 47 * 86 + 13?", "47 * 86 + 13"),
        ("Compute 7 * 42 - 9 * 7.", "7 * 42 - 9 * 7"),
        ("What is (10 + 21) * 2?", "(10 + 21) * 2"),
        ("In 1889 the tower was 300 m tall", None),
        ("What is 50% of 80?", None),
        ("2 apples and 3 pears", None),
    ],
)
def test_extract_expression_finds_the_calculation_written_in_a_sentence(text: str, expression: str | None) -> None:
    assert extract_expression(text) == expression


def test_calculator_evaluates_the_expression_inside_a_sentence() -> None:
    tool = CalculatorTool()
    assert tool.execute("What is 47 * 86 + 13?").output == "4055"
    assert tool.execute("Calculate 1688 - 1620").output == "68"
    result = tool.execute("Divide 5 / 0 please")
    assert not result.ok and result.output == "Error: division by zero"


def test_bm25_ranks_the_passage_with_the_rare_terms_first() -> None:
    docs = [
        Document("1", "Tower", "The tower is tall. The tower is old."),
        Document("2", "Eiffel", "The Eiffel tower was completed in 1889."),
        Document("3", "River", "A river flows."),
    ]
    hits = BM25Index(docs).search("Eiffel tower completed", k=3)
    assert [doc.doc_id for doc, _ in hits] == ["2", "1"]
    assert hits[0][1] > hits[1][1] > 0
    assert BM25Index(docs).search("volcano") == []


@pytest.mark.parametrize(
    ("pattern", "query"),
    [
        (r"^(\w+) is the river that flows through (\w+)\.$", "Find the river of {2}"),
        (r"^([\w ]+) was the designer of the ([\w ]+)\.$", "Find the designer of the {2}"),
        (r"^The ([\w ]+) was held in (\w+) in (\d+)\.$", "Find where the {1} was held"),
        (r"^The ([\w ]+) was held in (\w+) in (\d+)\.$", "Find the event held in {3}"),
    ],
)
def test_search_returns_the_one_shipped_passage_that_answers_a_sub_goal(pattern: str, query: str) -> None:
    # Every passage of this kind in the shipped corpus is found by the sub-goal a planner would write for it.
    passages = [doc.text for doc in load_corpus() if re.match(pattern, doc.text)]
    assert passages
    search = SearchTool()
    for passage in passages:
        match = re.match(pattern, passage)
        assert match is not None
        assert search.execute(query.format(None, *match.groups())).output == passage  # {1} is the first group


def test_stem_joins_inflections_of_a_word() -> None:
    assert {stem(w) for w in ("live", "lived", "lives")} == {"liv"}
    assert stem("building") == stem("build") == "build" and stem("completed") == stem("completion")
    assert stem("1889") == "1889" and stem("sea") == "sea"


WORLD = [
    Document("e1", "The Comet Regatta", "The Comet Regatta was held in Garford in 1812."),
    Document("e2", "The Lotus Regatta", "The Lotus Regatta was held in Belstead in 1790."),
    Document("c1", "Garford", "Nairn is the river that flows through Garford."),
    Document("c2", "Garford", "Garford was founded in 1142."),
    Document("c3", "Belstead", "Brenna is the river that flows through Belstead."),
]


def test_follow_up_search_moves_to_the_entity_the_last_result_found() -> None:
    question = "Which river flows through the city where the Comet Regatta was held?"
    search = SearchTool(WORLD)
    # One search with the whole question finds the event, not the river.
    assert search.execute(question).output == WORLD[0].text
    results: List[str] = []
    session = search.follow_up(question, lambda: results[-1] if results else "")
    for _ in range(3):
        results.append(session.execute(question).output)
    # The second search looks among Garford's passages (the city the first found), the third moves on.
    assert results == [WORLD[0].text, WORLD[2].text, WORLD[3].text]
    # A computed number is no passage title: the follow-up ranks the whole corpus with it.
    numbers: List[str] = ["1790"]
    found = search.follow_up("Which regatta was held in the year 1000 + 790?", lambda: numbers[-1])
    assert found.execute("Which regatta was held in the year 1000 + 790?").output == WORLD[1].text


def test_search_without_match_and_bad_corpus(tmp_path) -> None:  # type: ignore[no-untyped-def]
    result = SearchTool().execute("zzzz qqqq")
    assert not result.ok and "No passage" in result.output
    bad = tmp_path / "corpus.jsonl"
    bad.write_text('{"id": 1, "title": "a", "text": "b"}\n{"title": "no id"}\n')
    with pytest.raises(ValueError, match=r"corpus.jsonl:2"):
        load_corpus(bad)


def test_toolbox_matches_names_tolerantly_and_reports_unknown_tools() -> None:
    with ScriptedLLM({"generalist": ["Jupiter."]}) as llm:
        box = default_toolbox(RoleLLM.from_endpoint(llm.base_url, "m"))
        assert box.names == ["python", "calculator", "search", "generalist"]
        assert box.get("Calculator") is box.get("CALCULATOR ") is box.get("Math") is box.get("calculate")
        assert box.get("python_code") is box.get("python") and box.get("web-search") is box.get("search")
        assert box.execute("Generalist", "Largest planet?").output == "Jupiter."
    unknown = box.execute("wikipedia_search", "x")
    assert not unknown.ok and "unknown tool 'wikipedia_search'" in unknown.output and "calculator" in unknown.output
    for line in box.describe().splitlines():
        assert line.startswith("- ") and "Input:" not in line  # the input format is for the executor alone
    with pytest.raises(ValueError, match="duplicate"):
        Toolbox([CalculatorTool(), CalculatorTool()])

    class Lookup(CalculatorTool):
        metadata = ToolMetadata(name="lookup2", description="d", input_description="i", aliases=("Search",))

    with pytest.raises(ValueError, match="duplicate tool name 'search'"):
        Toolbox([SearchTool(), Lookup()])


def test_generalist_endpoint_failure_is_an_observation() -> None:
    with ScriptedLLM({"generalist": [FAIL]}) as llm:
        result = GeneralistTool(RoleLLM.from_endpoint(llm.base_url, "m")).execute("What is up?")
    assert not result.ok and result.output.startswith("Error: InternalServerError")
