"""Tool-call extraction from generated text, whole and streamed in arbitrary pieces."""

from __future__ import annotations

import json

import pytest

from agentbolt.serving.guided import RegexGuide
from agentbolt.serving.tool_parser import ToolCallParser, forced_tool_call, parse_tool_calls

TEXT = (
    'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
    '<tool_call>{"name": "add", "arguments": "{\\"a\\": 1}"}</tool_call>'
)


def test_whole_text() -> None:
    content, calls = parse_tool_calls(TEXT)
    assert content == "Let me check."
    assert [c.name for c in calls] == ["get_weather", "add"]
    assert json.loads(calls[0].arguments) == {"city": "Paris"}
    assert calls[1].arguments == '{"a": 1}'
    assert calls[0].id.startswith("call_") and calls[0].id != calls[1].id
    assert calls[0].to_openai(index=0) == {
        "id": calls[0].id,
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
        "index": 0,
    }


def test_plain_text_is_untouched() -> None:
    assert parse_tool_calls("no calls here < tool") == ("no calls here < tool", [])


@pytest.mark.parametrize("body", ["not json", '{"arguments": {}}', "[1, 2]"])
def test_invalid_block_stays_content(body: str) -> None:
    text = f"a<tool_call>{body}</tool_call>b"
    assert parse_tool_calls(text) == (text, [])


def test_unterminated_block_with_complete_json_is_a_call() -> None:
    content, calls = parse_tool_calls('<tool_call>\n{"name": "f", "arguments": {}}')
    assert content is None and calls[0].name == "f" and calls[0].arguments == "{}"
    assert parse_tool_calls('x<tool_call>{"name": "f", "argu') == ('x<tool_call>{"name": "f", "argu', [])


@pytest.mark.parametrize("size", [1, 2, 3, 7, 1000])
def test_streaming_in_pieces_matches_whole(size: int) -> None:
    parser = ToolCallParser()
    content, names = "", []
    for start in range(0, len(TEXT), size):
        text, calls = parser.feed(TEXT[start : start + size])
        assert "<tool" not in text and "tool_call>" not in text
        content += text
        names += [c.name for c in calls]
    rest, more = parser.finish()
    content += rest
    names += [c.name for c in more]
    assert content == "Let me check."  # exactly the whole text's content: no whitespace around the calls
    assert names == ["get_weather", "add"]


@pytest.mark.parametrize(
    "text",
    [
        '<tool_call>{"name": "a", "arguments": {}}</tool_call>\n\n<tool_call>{"name": "b", "arguments": {}}</tool_call>\n',
        'Checking.\n<tool_call>{"name": "a", "arguments": {}}</tool_call>\nDone. \n',
        "no calls, trailing space \n",
        '<tool_call>{"name": "a", "argu',
    ],
)
@pytest.mark.parametrize("size", [1, 4, 1000])
def test_streamed_content_adds_up_to_the_whole_texts(text: str, size: int) -> None:
    parser = ToolCallParser()
    pieces = [parser.feed(text[start : start + size]) for start in range(0, len(text), size)]
    pieces.append(parser.finish())
    content = "".join(piece for piece, _ in pieces)
    whole, calls = parse_tool_calls(text)
    assert (content or None if calls else content) == whole
    assert [c.name for _, found in pieces for c in found] == [c.name for c in calls]


def test_streaming_releases_text_that_cannot_start_a_call() -> None:
    parser = ToolCallParser()
    assert parser.feed("hello <to") == ("hello", [])  # the space waits for what follows it
    assert parser.feed("day") == (" <today", [])
    assert parser.finish() == ("", [])


def test_a_required_call_names_a_declared_tool_and_completes_its_block() -> None:
    opening, pattern = forced_tool_call(["get_time", "get.weather"])
    guide = RegexGuide(pattern)
    assert opening == '<tool_call>\n{"name": "'
    assert guide.can_continue("get.w") and not guide.can_continue("get_w") and not guide.can_continue("getX")
    one = 'get_time", "arguments": {"tz": "UTC", "at": [1, {"x": null}]}}\n</tool_call>'
    assert guide.is_complete(one)
    assert [call.name for call in parse_tool_calls(opening + one)[1]] == ["get_time"]
    two = one + '\n<tool_call>\n{"name": "get.weather", "arguments": {}}\n</tool_call>'
    assert guide.is_complete(two) and len(parse_tool_calls(opening + two)[1]) == 2
    assert not guide.can_continue(one + '\n<tool_call>\n{"name": "other')
    assert not guide.can_continue('get_time", "arguments": "not an object"')
    _, single = forced_tool_call(["get_time", "get.weather"], parallel=False)
    assert RegexGuide(single).is_complete(one) and not RegexGuide(single).can_continue(one + "\n")


def test_a_named_call_writes_that_tools_arguments() -> None:
    opening, pattern = forced_tool_call(["get_time", "get.weather"], "get.weather")
    guide = RegexGuide(pattern)
    assert opening == '<tool_call>\n{"name": "get.weather", "arguments": '
    assert guide.is_complete('{"city": "Paris"}}\n</tool_call>') and not guide.can_continue("[")
    assert [call.name for call in parse_tool_calls(opening + '{"city": "Paris"}}\n</tool_call>')[1]] == ["get.weather"]
