"""The optimizer's prompt files, rendered by POML and by the plain fallback; prompt templates of every engine."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

import agentbolt as agl
from agentbolt.algorithm.apo.prompts import (
    APPLY_EDIT_PROMPT_FILES,
    GRADIENT_PROMPT_FILES,
    MERGE_PROMPT_FILES,
    REFLECT_PROMPT_FILES,
    conversation_of,
    examples_position,
    extract_template_text,
    format_experiments,
    render_prompt_file,
)
from agentbolt.algorithm.apo.templates import (
    PlaceholderMismatchError,
    check_placeholders,
    escape_literal,
    format_placeholders,
    template_placeholders,
    unsafe_constructs,
)

ALL_FILES = GRADIENT_PROMPT_FILES + APPLY_EDIT_PROMPT_FILES + REFLECT_PROMPT_FILES + MERGE_PROMPT_FILES
CONTEXT = {
    "prompt_template": "Book a room for {attendees} people.\nReply <with> the name & nothing else.",
    "placeholders": "{attendees}",
    "experiments": [],
    "experiments_text": "### Run 1: reward 0.0, status succeeded\n[user] hi",
    "critique": "Say which room.",
    "template_a": "A {attendees}",
    "template_b": "B {attendees}",
    "wins_a": 2,
    "wins_b": 1,
}
HAS_POML = importlib.util.find_spec("poml") is not None


@pytest.mark.parametrize("path", ALL_FILES, ids=lambda p: Path(p).name)
def test_plain_rendering_keeps_the_template_verbatim(path: Path) -> None:
    messages = render_prompt_file(path, CONTEXT, use_poml=False)
    assert [m["role"] for m in messages] == ["system", "user"]
    assert "{{" not in messages[1]["content"]
    if "prompt_template" in path.read_text():
        assert CONTEXT["prompt_template"] in messages[1]["content"]


@pytest.mark.skipif(not HAS_POML, reason="the poml package (extra agentbolt[apo]) is not installed")
def test_poml_and_the_plain_fallback_render_the_same_messages() -> None:
    for path in ALL_FILES:
        assert render_prompt_file(path, CONTEXT, use_poml=True) == render_prompt_file(path, CONTEXT, use_poml=False)


def test_plain_rendering_names_a_missing_value() -> None:
    with pytest.raises(KeyError, match="critique"):
        render_prompt_file(APPLY_EDIT_PROMPT_FILES[0], {"prompt_template": "x", "placeholders": ""}, use_poml=False)


def test_experiments_show_messages_tool_calls_reward_status_and_feedback() -> None:
    text = format_experiments(
        [
            {
                "status": "succeeded",
                "final_reward": None,
                "feedback": ["expected Atlas"],
                "messages": [
                    {
                        "messages": [
                            {"role": "user", "content": "Find a room"},
                            {
                                "role": "assistant",
                                "content": None,
                                "tool_calls": [{"function": {"name": "rooms", "arguments": "{}"}}],
                            },
                            {"role": "tool", "content": "x" * 50},
                        ]
                    }
                ],
            }
        ],
        max_message_chars=12,
    )
    assert text.splitlines() == [
        "### Run 1: reward none (counted as 0), status succeeded",
        "[user] Find a room",
        "[assistant calls tool] rooms({})",
        "[tool] xxxxxxxxxxxx [... 38 more characters]",
        "[feedback] expected Atlas",
    ]
    assert format_experiments([]) == "(no runs)"


def test_the_conversation_of_a_run_leaves_out_the_templates_worked_examples() -> None:
    examples = [{"role": "user", "content": "Capital of Peru?"}, {"role": "assistant", "content": "Lima"}]
    sent = [
        {"role": "system", "content": "Be brief."},
        *examples,
        {"role": "user", "content": "Capital of Chile?"},
        {"role": "assistant", "content": "Santiago"},
    ]
    assert examples_position(sent, examples) == 1
    assert conversation_of([{"messages": sent}], examples) == [sent[0], *sent[3:]]
    assert conversation_of([{"messages": sent}]) == sent  # no examples given: the whole conversation
    other = [{"role": "user", "content": "Capital of Spain?"}, {"role": "assistant", "content": "Madrid"}]
    assert examples_position(sent, other) is None and conversation_of([{"messages": sent}], other) == sent
    assert examples_position(sent, []) is None and conversation_of([], examples) == []


def test_the_template_is_taken_from_the_last_fenced_block() -> None:
    assert extract_template_text("Here:\n```\nfirst\n```\nbetter:\n```text\nNew {x}\n```") == "New {x}"
    assert extract_template_text("  Just the text {x} ") == "Just the text {x}"
    assert extract_template_text("   ") is None and extract_template_text(None) is None


TEMPLATE_WITH_A_FENCED_EXAMPLE = 'Solve: {question}\nReply in this format:\n```json\n{{"answer": 1}}\n```\nNo prose.'


def test_a_fenced_example_inside_the_template_stays_part_of_it() -> None:
    def keeps_question(text: str) -> bool:
        return "{question}" in text

    # The outer fence is removed and the inner one kept, the commentary around dropped.
    reply = f"Here is the new template:\n```\n{TEMPLATE_WITH_A_FENCED_EXAMPLE}\n```\nIt asks for JSON."
    assert extract_template_text(reply, usable=keeps_question) == TEMPLATE_WITH_A_FENCED_EXAMPLE
    assert extract_template_text(f"```text\n{TEMPLATE_WITH_A_FENCED_EXAMPLE}\n```") == TEMPLATE_WITH_A_FENCED_EXAMPLE
    # Without a fence around it, the template's own fenced example is not the template: it lacks the placeholder.
    assert (
        extract_template_text(TEMPLATE_WITH_A_FENCED_EXAMPLE, usable=keeps_question) == TEMPLATE_WITH_A_FENCED_EXAMPLE
    )
    assert extract_template_text("```\nunclosed {x}") == "```\nunclosed {x}"


def test_prompt_template_formats_with_every_engine() -> None:
    assert agl.PromptTemplate(template="Hi {name}", engine="f-string").format(name="Ann") == "Hi Ann"
    jinja = agl.PromptTemplate(template="Hi {{ name }}{% if vip %}!{% endif %}", engine="jinja")
    assert jinja.format(name="Ann", vip=True) == "Hi Ann!"
    with pytest.raises(ValueError, match="'name' is undefined"):
        jinja.format(vip=False)
    with pytest.raises(ValueError, match="Cannot render the jinja prompt template"):
        agl.PromptTemplate(template="{% if %}", engine="jinja").format()


@pytest.mark.skipif(not HAS_POML, reason="the poml package (extra agentbolt[apo]) is not installed")
def test_prompt_template_formats_poml() -> None:
    template = agl.PromptTemplate(template="<poml><p>Hello {{ name }}</p></poml>", engine="poml")
    assert template.format(name="Ann") == "Hello Ann"


def test_poml_engine_without_the_package_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "poml", None)
    with pytest.raises(ImportError, match=r"agentbolt\[apo\]"):
        agl.PromptTemplate(template="<p>x</p>", engine="poml").format()


def test_placeholders_of_each_engine() -> None:
    assert template_placeholders(agl.PromptTemplate(template="{a} {b.c} {d[0]} {{lit}}", engine="f-string")) == {
        "a",
        "b",
        "d",
    }
    assert template_placeholders(
        agl.PromptTemplate(template="{{ a }}{% for x in b %}{{ x }}{% endfor %}", engine="jinja")
    ) == {"a", "b"}
    assert template_placeholders(agl.PromptTemplate(template="<p>{{ a }} {{b.c}}</p>", engine="poml")) == {"a", "b"}
    with pytest.raises(ValueError, match="named placeholders"):
        template_placeholders(agl.PromptTemplate(template="{} {0}", engine="f-string"))


@pytest.mark.parametrize(
    ("engine", "written"),
    [("f-string", "{date}, {time}"), ("jinja", "{{ date }}, {{ time }}"), ("poml", "{{ date }}, {{ time }}")],
)
def test_placeholders_are_written_in_their_engines_syntax(engine: str, written: str) -> None:
    assert format_placeholders({"time", "date"}, engine) == written
    names = template_placeholders(agl.PromptTemplate(template=written, engine=engine))
    assert names == {"date", "time"}  # written so, they are the template's placeholders again
    assert format_placeholders(set(), engine) == "(none)"


def test_a_rewrite_must_keep_exactly_the_placeholders() -> None:
    required = frozenset({"date", "time"})
    check_placeholders(agl.PromptTemplate(template="{time} then {date}", engine="f-string"), required)
    with pytest.raises(PlaceholderMismatchError, match=r"dropped \['time'\] and added unknown \['when'\]"):
        check_placeholders(agl.PromptTemplate(template="{date} {when}", engine="f-string"), required)
    with pytest.raises(PlaceholderMismatchError, match="Single '}'"):
        check_placeholders(agl.PromptTemplate(template="{date} {time} }", engine="f-string"), required)


@pytest.mark.parametrize(
    ("text", "engine", "refused"),
    [
        ("{country:d} x", "f-string", "{country:d}"),
        ("{country.__class__} of {country}", "f-string", "{country.__class__}"),
        ("{country[0]} {country}", "f-string", "{country[0]}"),
        ("{country!r}", "f-string", "{country!r}"),
        ("{country:{country}}", "f-string", "{country:{country}}"),
        ("{{ country.__class__ }}", "jinja", "the attribute '__class__'"),
        ("{{ country['_x'] }}", "jinja", "the attribute '_x'"),
        ('{% include "other" %}{{ country }}', "jinja", "the include tag"),
        ("<p>{{ country.constructor.constructor('return process')() }}</p>", "poml", "{{ country.constructor"),
        ('<p if="country">{{ country }}</p>', "poml", "<p if='country'>"),
        ('<document src="/etc/passwd" />{{ country }}', "poml", "<document src='/etc/passwd'>"),
    ],
)
def test_a_rewrite_may_only_write_plain_placeholders(text: str, engine: str, refused: str) -> None:
    with pytest.raises(PlaceholderMismatchError, match=r"only plain .* placeholders are allowed") as raised:
        check_placeholders(agl.PromptTemplate(template=text, engine=engine), frozenset({"country"}))
    assert refused in str(raised.value)


@pytest.mark.parametrize(
    ("text", "engine"),
    [
        ("Capital of {country}? {{literal}}", "f-string"),
        ("{{ country | upper }}{% if country %}!{% endif %} {{ country[0] }}", "jinja"),
        ("<p>Capital of {{ country }}?</p>", "poml"),
    ],
)
def test_plain_placeholders_and_safe_engine_syntax_are_accepted(text: str, engine: str) -> None:
    template = agl.PromptTemplate(template=text, engine=engine)
    assert unsafe_constructs(template) == []
    check_placeholders(template, frozenset({"country"}))


def test_a_rewrite_may_keep_what_the_seed_itself_writes() -> None:
    seed = agl.PromptTemplate(template="Pay {price:.2f} for {item}.", engine="f-string")
    required = template_placeholders(seed)
    check_placeholders(
        agl.PromptTemplate(template="Total: {price:.2f}. Item: {item}.", engine="f-string"), required, seed=seed
    )
    with pytest.raises(PlaceholderMismatchError, match=r"\{price:d\}"):
        check_placeholders(agl.PromptTemplate(template="{price:d} {item}", engine="f-string"), required, seed=seed)
    poml_seed = agl.PromptTemplate(template='<p if="item">{{ item }}</p>', engine="poml")
    check_placeholders(
        agl.PromptTemplate(template='<p if="item">Buy {{ item }}</p>', engine="poml"),
        frozenset({"item"}),
        seed=poml_seed,
    )


def test_jinja_templates_render_in_a_sandbox() -> None:
    template = agl.PromptTemplate(template="{{ country.__class__.__mro__[-1].__subclasses__() }}", engine="jinja")
    with pytest.raises(ValueError, match=r"Cannot render the jinja prompt template: .*unsafe"):
        template.format(country="France")
    plain = agl.PromptTemplate(template="{{ country | upper }} {{ country[0] }}", engine="jinja")
    assert plain.format(country="France") == "FRANCE F"


ESCAPE_ENGINES = ["f-string", "jinja", pytest.param("poml", marks=pytest.mark.skipif(not HAS_POML, reason="no poml"))]


@pytest.mark.parametrize("engine", ESCAPE_ENGINES)
@pytest.mark.parametrize(
    "literal",
    [
        'Tool result: {"room": "Nova"} {{ x }} {% raw %} {% endraw %}',
        "{%endraw%} {%- endraw -%} {%+ endraw %} {{ secret }}",
        'a {{{ b }}} {"j": {{"x"}}} <b>bold</b> & &amp; "q" \\ 😀',
    ],
)
def test_escaped_text_comes_out_verbatim(engine: str, literal: str) -> None:
    placeholder = "{q}" if engine == "f-string" else "{{ q }}"
    template = agl.PromptTemplate(template=f"{escape_literal(literal, engine)} {placeholder}", engine=engine)
    assert template.format(q="Q", secret="leaked") == literal + " Q"
    assert template_placeholders(template) == {"q"}
