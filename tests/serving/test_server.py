"""The OpenAI-compatible HTTP server on a real socket, with the tiny random Llama behind it."""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path
from typing import Any, Dict, List

import httpx
import openai
import pytest
from fastapi.testclient import TestClient

from agentbolt.models.tiny import TINY_SPECIAL_TOKENS
from agentbolt.serving import server as server_module
from agentbolt.serving.params import GenerationOutput, SequenceOutput
from agentbolt.serving.server import InferenceServer, create_app
from agentbolt.serving.transformers_engine import TransformersEngine

MESSAGES = [{"role": "user", "content": "Say something."}]
TOOLS = [{"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}]


@pytest.fixture
def http(server: InferenceServer) -> httpx.Client:
    return httpx.Client(base_url=server.base_url, timeout=60)


def _events(response: httpx.Response) -> List[Any]:
    events = []
    for line in response.iter_lines():
        if line.startswith("data: "):
            data = line[len("data: ") :]
            events.append(data if data == "[DONE]" else json.loads(data))
    return events


def test_health_and_models(server: InferenceServer, http: httpx.Client) -> None:
    health = httpx.get(f"http://{server.host}:{server.port}/health")
    assert health.status_code == 200 and health.json()["status"] == "ok"
    models = http.get("/models").json()
    assert models["object"] == "list" and models["data"][0]["id"] == "tiny"
    assert models["data"][0]["max_model_len"] == 2048
    # HEAD probes, and the SDK's models.retrieve()
    assert httpx.head(f"http://{server.host}:{server.port}/health").status_code == 200
    assert http.head("/models").status_code == 200
    assert http.get("/models/tiny").json() == models["data"][0]
    missing = http.get("/models/gpt-9")
    assert missing.status_code == 404 and "gpt-9" in missing.json()["error"]["message"]
    assert missing.json()["error"]["code"] == "model_not_found"


def test_chat_returns_token_ids_and_logprobs(server: InferenceServer, http: httpx.Client) -> None:
    body = {"model": "tiny", "messages": MESSAGES, "max_tokens": 6, "seed": 1, "return_token_ids": True}
    body.update({"logprobs": True, "top_logprobs": 2})
    data = http.post("/chat/completions", json=body).json()
    engine = server.engine
    assert data["object"] == "chat.completion" and data["model"] == "tiny"
    assert data["prompt_token_ids"] == engine.encode_chat(MESSAGES)
    choice = data["choices"][0]
    assert choice["message"]["role"] == "assistant"
    assert choice["message"]["content"] == engine.decode(choice["token_ids"])
    assert len(choice["logprobs"]["content"]) == len(choice["token_ids"])
    assert all(len(entry["top_logprobs"]) == 2 for entry in choice["logprobs"]["content"])
    usage = data["usage"]
    assert usage["prompt_tokens"] == len(data["prompt_token_ids"]) and usage["completion_tokens"] == len(
        choice["token_ids"]
    )
    again = http.post("/chat/completions", json=body).json()
    assert again["choices"][0]["token_ids"] == choice["token_ids"]
    plain = http.post("/chat/completions", json={"messages": MESSAGES, "max_tokens": 3}).json()
    assert "prompt_token_ids" not in plain and "token_ids" not in plain["choices"][0]


def test_streaming_chat_matches_non_streaming(http: httpx.Client) -> None:
    body = {"messages": MESSAGES, "max_tokens": 8, "seed": 7, "n": 2, "return_token_ids": True}
    whole = http.post("/chat/completions", json=body).json()
    stream_body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    with http.stream("POST", "/chat/completions", json=stream_body) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        events = _events(response)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert chunks[0]["prompt_token_ids"] == whole["prompt_token_ids"]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == whole["usage"]
    for index in range(2):
        mine = [c["choices"][0] for c in chunks[:-1] if c["choices"][0]["index"] == index]
        assert mine[0]["delta"]["role"] == "assistant"
        text = "".join(c["delta"].get("content", "") for c in mine)
        ids = [t for c in mine for t in c.get("token_ids", [])]
        expected = whole["choices"][index]
        assert (text, ids) == (expected["message"]["content"], expected["token_ids"])
        assert mine[-1]["finish_reason"] == expected["finish_reason"]


def test_streamed_completion_logprobs_have_the_whole_answers_text_offsets(http: httpx.Client) -> None:
    body = {"prompt": "abc", "max_tokens": 12, "temperature": 0, "logprobs": 1}
    text = http.post("/completions", json=body).json()["choices"][0]["text"]
    assert len(text) >= 4
    # A stop string that never matches but whose start does: the text from there on is held back a while.
    body["stop"] = text[len(text) // 2 : len(text) // 2 + 2] + "\u0001"
    whole = http.post("/completions", json=body).json()["choices"][0]["logprobs"]
    with http.stream("POST", "/completions", json={**body, "stream": True}) as response:
        chunks = [event for event in _events(response) if event != "[DONE]" and event["choices"]]
    streamed = [lp for c in chunks if (lp := c["choices"][0]["logprobs"]) is not None]
    assert [t for lp in streamed for t in lp["tokens"]] == whole["tokens"]
    assert [o for lp in streamed for o in lp["text_offset"]] == whole["text_offset"]


def test_a_finished_choice_names_the_stop_string_or_token_that_ended_it(http: httpx.Client) -> None:
    body = {"prompt": "abc", "max_tokens": 12, "temperature": 0, "return_token_ids": True}
    whole = http.post("/completions", json=body).json()["choices"][0]
    assert whole["finish_reason"] == "length" and whole["stop_reason"] is None
    text, ids = whole["text"], whole["token_ids"]
    stop = text[len(text) // 2 : len(text) // 2 + 2]
    cut = http.post("/completions", json={**body, "stop": ["\u0001never", stop]}).json()["choices"][0]
    assert (cut["finish_reason"], cut["stop_reason"], cut["text"]) == ("stop", stop, text[: text.index(stop)])
    with http.stream("POST", "/completions", json={**body, "stop": stop, "stream": True}) as response:
        chunks = [event for event in _events(response) if event != "[DONE]" and event["choices"]]
    assert [c["choices"][0].get("stop_reason", "absent") for c in chunks][-1] == stop
    assert all("stop_reason" not in c["choices"][0] for c in chunks[:-1])  # only a finished choice has one
    token = ids[3]
    by_token = http.post("/completions", json={**body, "stop_token_ids": [token]}).json()["choices"][0]
    assert (by_token["finish_reason"], by_token["stop_reason"]) == ("stop", token)
    chat = {"messages": MESSAGES, "max_tokens": 12, "temperature": 0}
    reply = http.post("/chat/completions", json=chat).json()["choices"][0]
    stop = reply["message"]["content"][2:4]
    ended = http.post("/chat/completions", json={**chat, "stop": stop}).json()["choices"][0]
    assert (ended["finish_reason"], ended["stop_reason"]) == ("stop", stop)


def test_openai_sdk_client(server: InferenceServer) -> None:
    client = openai.OpenAI(base_url=server.base_url, api_key="none", max_retries=0)
    completion = client.chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=4, temperature=0, extra_body={"return_token_ids": True}
    )
    assert completion.choices[0].finish_reason in {"stop", "length"}
    assert completion.model_extra and completion.model_extra["prompt_token_ids"]
    pieces = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=4, temperature=0, stream=True)
    streamed = "".join(chunk.choices[0].delta.content or "" for chunk in pieces if chunk.choices)
    assert streamed == completion.choices[0].message.content
    text = client.completions.create(model="tiny", prompt="abc", max_tokens=3, temperature=0)
    assert text.choices[0].finish_reason in {"stop", "length"}


def test_completions_batch_and_token_prompts(server: InferenceServer, http: httpx.Client) -> None:
    body = {"prompt": ["one", "two"], "n": 2, "max_tokens": 4, "return_token_ids": True, "logprobs": 1, "seed": 3}
    data = http.post("/completions", json=body).json()
    assert data["object"] == "text_completion"
    assert [c["index"] for c in data["choices"]] == [0, 1, 2, 3]
    assert data["choices"][2]["prompt_token_ids"] == server.engine.encode("two")
    first = data["choices"][0]
    assert len(first["logprobs"]["tokens"]) == len(first["token_ids"]) == len(first["logprobs"]["token_logprobs"])
    ids_body = {"prompt": server.engine.encode("one"), "max_tokens": 4, "seed": 3, "return_token_ids": True}
    by_ids = http.post("/completions", json=ids_body).json()
    assert by_ids["choices"][0]["token_ids"] == first["token_ids"]
    stream_body = {"prompt": "one", "max_tokens": 4, "seed": 3, "stream": True, "return_token_ids": True}
    with http.stream("POST", "/completions", json=stream_body) as response:
        events = _events(response)
    assert "".join(e["choices"][0]["text"] for e in events[:-1]) == first["text"]
    assert events[0]["choices"][0]["prompt_token_ids"] == server.engine.encode("one")


def test_tools_reach_the_template(server: InferenceServer, http: httpx.Client) -> None:
    history = [
        *MESSAGES,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "noon"},
    ]
    body = {"messages": history, "tools": TOOLS, "max_tokens": 2, "return_token_ids": True}
    data = http.post("/chat/completions", json=body).json()
    prompt = server.engine.tokenizer.decode(data["prompt_token_ids"])
    assert '"name": "get_time"' in prompt and "<tools>" in prompt
    assert '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>' in prompt
    assert "<tool_response>\nnoon\n</tool_response>" in prompt
    no_tools = http.post("/chat/completions", json={**body, "tool_choice": "none"}).json()
    assert "<tools>" not in server.engine.tokenizer.decode(no_tools["prompt_token_ids"])


def test_generated_tool_calls_become_openai_tool_calls(server: InferenceServer) -> None:
    # The random model cannot be made to write a tool call, so the response builder gets a real engine output
    # object with a tool call written into its text.
    from agentbolt.serving.protocol import ChatCompletionRequest

    handler = server.app.state.handler
    request = ChatCompletionRequest(messages=MESSAGES, tools=TOOLS, return_token_ids=True)
    text = 'ok <tool_call>{"name": "get_time", "arguments": {"tz": "UTC"}}</tool_call>'
    output = GenerationOutput(
        prompt_token_ids=[1, 2],
        choices=[SequenceOutput(index=0, token_ids=[5, 6], text=text, finish_reason="stop")],
    )
    message = handler.chat_response(request, output)["choices"][0]
    assert message["finish_reason"] == "tool_calls"
    assert message["message"]["content"] == "ok"
    call = message["message"]["tool_calls"][0]
    assert call["function"] == {"name": "get_time", "arguments": '{"tz": "UTC"}'} and call["type"] == "function"


@pytest.mark.parametrize(
    ("body", "status", "fragment", "code"),
    [
        ({"messages": []}, 400, "messages", None),
        ({"messages": "hi"}, 400, "messages", None),
        ({"messages": MESSAGES, "max_tokens": 4000}, 400, "maximum context length is 2048", "context_length_exceeded"),
        ({"messages": MESSAGES, "temperature": -0.5}, 400, "temperature", None),
        ({"messages": MESSAGES, "n": 0}, 400, "n: Input should be greater than or equal to 1", None),
        ({"messages": MESSAGES, "presence_penalty": 0.5}, 400, "not supported", "unsupported_parameter"),
        ({"messages": MESSAGES, "top_logprobs": 2}, 400, "requires logprobs", None),
        ({"messages": [{"role": "wizard", "content": "x"}]}, 400, "role", None),
        ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, 400, "text content", None),
        ({"messages": MESSAGES, "model": "gpt-9"}, 404, "does not exist", "model_not_found"),
        ({"messages": MESSAGES, "tools": TOOLS, "tool_choice": "required", "guided_regex": "a"}, 400, "guided", None),
        (
            {"messages": MESSAGES, "tools": TOOLS, "tool_choice": "required", "ignore_eos": True},
            400,
            "ignore_eos",
            None,
        ),
    ],
)
def test_bad_chat_requests_get_openai_errors(
    http: httpx.Client, body: Dict[str, Any], status: int, fragment: str, code: str
) -> None:
    response = http.post("/chat/completions", json=body)
    assert response.status_code == status
    error = response.json()["error"]
    assert fragment in error["message"] and error["type"]
    assert error["code"] == code  # OpenAI's string code, or null: never the HTTP status


TOOL_NAMES = ["get_time", "get_weather", "lookup"]
CHOICE_TOOLS = [
    {"type": "function", "function": {"name": name, "parameters": {"type": "object", "properties": {}}}}
    for name in TOOL_NAMES
]
_CALLED_NAME = re.compile(r'<tool_call>\n\{"name": "([^"]*)"')


def _called_names(choice: Dict[str, Any]) -> List[str]:
    """The functions a choice calls: its parsed tool calls, or the name its unfinished call block writes."""
    calls = choice["message"].get("tool_calls") or []
    if calls:
        return [call["function"]["name"] for call in calls]
    return _CALLED_NAME.findall(choice["message"]["content"] or "")


def test_required_tool_choice_calls_a_declared_tool(http: httpx.Client) -> None:
    body = {"messages": MESSAGES, "tools": CHOICE_TOOLS, "tool_choice": "required", "max_tokens": 64}
    data = http.post("/chat/completions", json={**body, "n": 8, "seed": 1}).json()
    for choice in data["choices"]:
        names = _called_names(choice)
        assert names and set(names) <= set(TOOL_NAMES), choice
    finished = [choice for choice in data["choices"] if choice["finish_reason"] == "tool_calls"]
    assert finished, "no choice finished its tool call within max_tokens"
    for choice in finished:
        assert choice["message"]["content"] is None
        for call in choice["message"]["tool_calls"]:
            assert isinstance(json.loads(call["function"]["arguments"]), dict)
    greedy = http.post("/chat/completions", json={**body, "temperature": 0, "stream": True})
    streamed = [e["choices"][0]["delta"] for e in _events(greedy)[:-1] if e["choices"]]
    text = "".join(delta.get("content") or "" for delta in streamed)
    calls = [call["function"]["name"] for delta in streamed for call in delta.get("tool_calls", [])]
    assert set(calls or _CALLED_NAME.findall(text)) <= set(TOOL_NAMES) and (calls or text)


def test_streamed_tool_call_answers_add_up_to_the_whole_answers(http: httpx.Client) -> None:
    body = {"messages": MESSAGES, "tools": CHOICE_TOOLS, "tool_choice": "required", "max_tokens": 96, "n": 6}
    body.update(seed=1, return_token_ids=True)
    whole = http.post("/chat/completions", json=body).json()["choices"]
    with http.stream("POST", "/chat/completions", json={**body, "stream": True}) as response:
        chunks = [event for event in _events(response)[:-1] if event["choices"]]
    for expected in whole:
        mine = [c["choices"][0] for c in chunks if c["choices"][0]["index"] == expected["index"]]
        assert [t for c in mine for t in c.get("token_ids", [])] == expected["token_ids"]  # the same answer, streamed
        content = "".join(c["delta"].get("content") or "" for c in mine) or None
        names = [call["function"]["name"] for c in mine for call in c["delta"].get("tool_calls", [])]
        message = expected["message"]
        assert content == message["content"], expected  # no whitespace between or after the calls
        assert names == [call["function"]["name"] for call in message.get("tool_calls") or []]


def test_named_tool_choice_calls_that_tool(http: httpx.Client) -> None:
    named = {"type": "function", "function": {"name": "get_weather"}}
    body = {"messages": MESSAGES, "tools": CHOICE_TOOLS, "tool_choice": named, "max_tokens": 64, "n": 8, "seed": 2}
    choices = http.post("/chat/completions", json=body).json()["choices"]
    assert all(_called_names(choice) == ["get_weather"] for choice in choices), choices
    for choice in choices:
        if choice["finish_reason"] == "tool_calls":
            assert isinstance(json.loads(choice["message"]["tool_calls"][0]["function"]["arguments"]), dict)


def test_logprob_bytes_are_each_tokens_own_bytes(http: httpx.Client) -> None:
    # The tiny tokenizer writes every byte as one token, so a non-ASCII character is split over several tokens,
    # each of which decodes alone to U+FFFD.
    body = {"messages": MESSAGES, "max_tokens": 48, "n": 4, "seed": 5, "logprobs": True, "top_logprobs": 3}
    choices = http.post("/chat/completions", json=body).json()["choices"]
    split = [c for choice in choices for c in choice["message"]["content"] if ord(c) > 127 and c != "\ufffd"]
    assert split, "no generated text holds a multi-byte character"
    for choice in choices:
        entries = [entry for entry in choice["logprobs"]["content"] if entry["token"] not in TINY_SPECIAL_TOKENS]
        joined = b"".join(bytes(entry["bytes"]) for entry in entries)
        assert joined.decode("utf-8", errors="replace") == choice["message"]["content"]
        for character in choice["message"]["content"]:
            if ord(character) > 127 and character != "\ufffd":
                assert character.encode() in joined
        for entry in entries:  # the text of a partial character stays U+FFFD, its bytes are one raw byte
            assert len(entry["bytes"]) == 1
            assert entry["token"] == bytes(entry["bytes"]).decode("utf-8", errors="replace")
            assert all(
                len(alt["bytes"]) == 1 for alt in entry["top_logprobs"] if alt["token"] not in TINY_SPECIAL_TOKENS
            )


@pytest.mark.parametrize("route", ["chat/completions", "completions"])
def test_health_answers_while_a_large_prompt_is_tokenized(
    server: InferenceServer, route: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = server.engine
    method = "encode_chat" if route == "chat/completions" else "encode"
    started, finished = threading.Event(), threading.Event()
    tokenize = getattr(engine, method)

    def observed(*args: Any, **kwargs: Any) -> Any:
        started.set()
        try:
            return tokenize(*args, **kwargs)
        finally:
            finished.set()

    monkeypatch.setattr(engine, method, observed)
    text = "hello world " * 200_000  # 2.4 MB: more than a second of tokenizing
    body = {"messages": [{"role": "user", "content": text}]} if method == "encode_chat" else {"prompt": text}
    answers: Dict[str, httpx.Response] = {}

    def send_large() -> None:
        answers["large"] = httpx.post(f"{server.base_url}/{route}", json=body, timeout=300)

    sender = threading.Thread(target=send_large)
    sender.start()
    try:
        assert started.wait(120), "the large prompt was never tokenized"
        health = httpx.get(f"http://{server.host}:{server.port}/health", timeout=300)
        tokenized_before_health = finished.is_set()
    finally:
        sender.join()
    assert health.status_code == 200
    assert not tokenized_before_health, "/health waited for the large prompt to be tokenized"
    large = answers["large"]
    assert large.status_code == 400 and large.json()["error"]["code"] == "context_length_exceeded"


def test_bad_completion_requests(http: httpx.Client) -> None:
    assert http.post("/completions", json={"prompt": [], "max_tokens": 2}).status_code == 400
    assert http.post("/completions", json={"prompt": "x", "echo": True}).status_code == 400
    assert http.post("/completions", json={"prompt": [1, 10**6]}).status_code == 400
    over = http.post("/completions", json={"prompt": ["a", "b" * 3000], "max_tokens": 2})
    assert over.status_code == 400 and "maximum context length" in over.json()["error"]["message"]
    stream = http.post("/completions", json={"prompt": ["a", "b"], "stream": True})
    assert stream.status_code == 400
    bad_stream = http.post("/chat/completions", json={"messages": MESSAGES, "stream": True, "max_tokens": 9999})
    assert bad_stream.status_code == 400


@pytest.mark.parametrize(
    ("route", "body", "param"),
    [
        ("/chat/completions", {"messages": MESSAGES, "max_tokens": 4000}, "messages"),
        ("/chat/completions", {"messages": MESSAGES, "max_tokens": 4000, "stream": True}, "messages"),
        ("/completions", {"prompt": "b" * 3000, "max_tokens": 2}, "prompt"),
        ("/completions", {"prompt": "b" * 3000, "max_tokens": 2, "stream": True}, "prompt"),
    ],
)
def test_a_prompt_beyond_the_context_is_refused_naming_the_prompt_field(
    http: httpx.Client, route: str, body: Dict[str, Any], param: str
) -> None:
    answer = http.post(route, json=body)
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert (error["param"], error["code"]) == (param, "context_length_exceeded"), error


def test_503_while_loading(tiny_model_dir: Path) -> None:
    engine = TransformersEngine(tiny_model_dir, dtype="float32")
    with TestClient(create_app(engine, load=False)) as client:
        assert client.get("/health").status_code == 503
        response = client.post("/v1/chat/completions", json={"messages": MESSAGES})
        assert response.status_code == 503 and response.json()["error"]["type"] == "service_unavailable"
        assert client.get("/v1/models").status_code == 503


def test_lora_endpoints(server: InferenceServer, http: httpx.Client, tiny_model_dir: Path, adapter_root: Path) -> None:
    from .test_engine import _make_adapter

    adapter = _make_adapter(tiny_model_dir, adapter_root / "adapter", seed=2)
    body = {"messages": MESSAGES, "max_tokens": 6, "temperature": 0, "ignore_eos": True, "return_token_ids": True}
    base = http.post("/chat/completions", json=body).json()["choices"][0]["token_ids"]
    loaded = http.post("/load_lora_adapter", json={"lora_name": "sql", "lora_path": str(adapter)})
    assert loaded.status_code == 200, loaded.text
    assert [m["id"] for m in http.get("/models").json()["data"]] == ["tiny", "sql"]
    tuned = http.post("/chat/completions", json={**body, "model": "sql"}).json()["choices"][0]["token_ids"]
    assert tuned != base
    assert http.post("/chat/completions", json=body).json()["choices"][0]["token_ids"] == base
    again = http.post("/load_lora_adapter", json={"lora_name": "sql", "lora_path": str(adapter)})
    assert again.status_code == 400 and "already loaded" in again.json()["error"]["message"]
    missing = http.post("/load_lora_adapter", json={"lora_name": "x", "lora_path": str(adapter_root / "nope")})
    assert missing.status_code == 400
    assert http.post("/unload_lora_adapter", json={"lora_name": "sql"}).status_code == 200
    assert http.post("/chat/completions", json={**body, "model": "sql"}).status_code == 404
    assert http.post("/unload_lora_adapter", json={"lora_name": "sql"}).status_code == 400


async def test_start_and_stop_from_a_running_event_loop(tiny_model_dir: Path) -> None:
    engine = TransformersEngine(tiny_model_dir, dtype="float32", served_name="tiny")
    server = InferenceServer(engine, port=0)
    server.start()
    try:
        assert engine.loaded
        async with httpx.AsyncClient() as client:
            health = await client.get(f"http://{server.host}:{server.port}/health")
        assert health.json()["status"] == "ok"
    finally:
        server.stop()
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://{server.host}:{server.port}/health")


def test_a_null_max_tokens_is_the_default_of_text_completions() -> None:
    from agentbolt.openai_api.schema import COMPLETION_DEFAULT_MAX_TOKENS, CompletionRequest
    from agentbolt.serving.protocol import completion_sampling_params

    for body in ({"prompt": "a"}, {"prompt": "a", "max_tokens": None}):
        params = completion_sampling_params(CompletionRequest.model_validate(body))
        assert params.max_tokens == COMPLETION_DEFAULT_MAX_TOKENS == 16


@pytest.mark.parametrize("route", ["chat/completions", "completions"])
def test_an_answer_too_large_to_build_on_the_event_loop_is_the_same_built_in_a_thread(
    http: httpx.Client, monkeypatch: pytest.MonkeyPatch, route: str
) -> None:
    """Answers with many log-probability entries are built and encoded in a worker thread (one of n=10 x 1,900 tokens
    x 20 alternatives held ``/health`` and every stream for seconds); what they say does not change."""
    body: Dict[str, Any] = {"model": "tiny", "max_tokens": 40, "temperature": 0, "ignore_eos": True, "n": 2}
    if route == "chat/completions":
        body.update({"messages": MESSAGES, "logprobs": True, "top_logprobs": 3})
    else:
        body.update({"prompt": "Say something.", "logprobs": 3})
    entries = 2 * 40 * (1 + 3)

    def answer(inline_below: int) -> Dict[str, Any]:
        monkeypatch.setattr(server_module, "_ANSWER_INLINE_ENTRIES", inline_below)
        data = http.post(f"/{route}", json=body).json()
        for volatile in ("id", "created"):
            data.pop(volatile)
        return data

    in_a_thread, on_the_loop = answer(entries), answer(entries + 1)
    assert len(in_a_thread["choices"]) == 2
    thread_leaves, loop_leaves = _leaves(in_a_thread), _leaves(on_the_loop)
    assert [path for path, _ in thread_leaves] == [path for path, _ in loop_leaves]
    for (path, built_in_a_thread), (_, built_on_the_loop) in zip(thread_leaves, loop_leaves, strict=True):
        if isinstance(built_on_the_loop, float):  # two runs of the same batch may differ in the last float bits
            assert built_in_a_thread == pytest.approx(built_on_the_loop, abs=1e-4), path
        else:
            assert built_in_a_thread == built_on_the_loop, path
    assert server_module._logprob_entries([]) == 0


def _leaves(value: Any, path: str = "") -> List[Any]:
    """``(path, value)`` of every scalar in a JSON document, in order."""
    if isinstance(value, dict):
        return [leaf for key, item in value.items() for leaf in _leaves(item, f"{path}.{key}")]
    if isinstance(value, list):
        return [leaf for index, item in enumerate(value) for leaf in _leaves(item, f"{path}[{index}]")]
    return [(path, value)]
