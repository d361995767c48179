"""Hostile requests against both OpenAI-compatible servers: ``agentbolt serve`` and the gateway in front of it.

Every row is sent as raw bytes to each server; neither may answer 5xx, both must name the problem in an OpenAI-style
``{"error": {...}}`` body, and both must still serve an ordinary request afterwards. The gateway validates with the
same schema as serve, so most rows stop at its door; the rest (vocabulary, work limits, unsupported features) are
serve's to judge and reach the client through the gateway unchanged.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any, Dict, Iterator, List, NamedTuple, Optional

import httpx
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from support.models import serving

from agentbolt.gateway import Gateway, GatewaySettings, create_app
from agentbolt.serving.server import InferenceServer, ServingLimits
from agentbolt.utils.server_launcher import PythonServerLauncher, PythonServerLauncherArgs, pick_free_port

LIMIT = 64 * 1024
MESSAGES = [{"role": "user", "content": "hi"}]
TOOL = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}


class Case(NamedTuple):
    name: str
    path: str
    body: bytes
    status: int
    fragment: str
    content_type: Optional[str] = "application/json"
    method: str = "POST"


def _chat(**fields: Any) -> bytes:
    return json.dumps({"model": "tiny", "messages": MESSAGES, "max_tokens": 2, **fields}).encode()


def _text(**fields: Any) -> bytes:
    return json.dumps({"model": "tiny", "max_tokens": 2, **fields}).encode()


def _nested(depth: int) -> bytes:
    return (
        b'{"model": "tiny", "messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": {"a": '
        + (b"[" * depth + b"]" * depth)
        + b"}}"
    )


CHAT = "/v1/chat/completions"
TEXT = "/v1/completions"
CASES: List[Case] = [
    # sampling parameters that used to fail the whole batch
    Case("seed beyond 64 bits", CHAT, _chat(seed=1180591620717411303424), 400, "seed"),
    Case("seed + n - 1 beyond 64 bits", CHAT, _chat(seed=2**64 - 1, n=2), 400, "seed"),
    Case("seed + n - 1 beyond int64", CHAT, _chat(seed=2**63 - 1, n=2), 400, "seed + n - 1"),
    Case("seed below int64", TEXT, _text(prompt="a", seed=-(2**63) - 1), 400, "seed"),
    Case("an integer beyond 64 bits anywhere", CHAT, _chat(chat_template_kwargs={"k": [2**64]}), 400, "k[0]"),
    # text the tokenizer cannot encode, bytes that are not UTF-8, JSON that is not JSON
    Case("lone surrogate in a message", CHAT, _chat().replace(b'"hi"', b'"a\\ud800b"'), 400, "not valid JSON"),
    Case("lone surrogate in a prompt", TEXT, _text(prompt="a\\udc00b").replace(b"\\\\", b"\\"), 400, "JSON"),
    Case("invalid UTF-8", CHAT, _chat().replace(b'"hi"', b'"\xff\xfe"'), 400, "UTF-8"),
    Case("not JSON", CHAT, b"{oops", 400, "not valid JSON"),
    Case("a JSON array", CHAT, b"[1, 2]", 400, "JSON object"),
    Case("empty body", CHAT, b"", 400, "empty"),
    Case("nesting past the limit", CHAT, _nested(100), 400, "nested more than"),
    Case("nesting past the parser", CHAT, _nested(5000), 400, "JSON"),
    Case("wrong content type", CHAT, _chat(), 415, "application/json", content_type="text/plain"),
    Case("form content type", CHAT, _chat(), 415, "application/json", "application/x-www-form-urlencoded"),
    Case("body over the size limit", TEXT, _text(prompt="a" * (2 * LIMIT)), 413, "limit"),
    # types: strict, no coercion
    Case("stream as a string", CHAT, _chat(stream="yes"), 400, "stream"),
    Case("logprobs as a string", CHAT, _chat(logprobs="yes"), 400, "logprobs"),
    Case("max_tokens as a string", CHAT, _chat(max_tokens="5"), 400, "max_tokens"),
    Case("n as a float", CHAT, _chat(n=2.0), 400, "n"),
    Case("temperature as a boolean", CHAT, _chat(temperature=True), 400, "temperature"),
    Case("temperature out of range", CHAT, _chat(temperature=-0.5), 400, "temperature"),
    Case("no messages", CHAT, _chat(messages=[]), 400, "messages"),
    Case("unknown role", CHAT, _chat(messages=[{"role": "wizard", "content": "x"}]), 400, "role"),
    Case(
        "tool message without its call id",
        CHAT,
        _chat(messages=[{"role": "tool", "content": "x"}]),
        400,
        "tool_call_id",
    ),
    Case("top_logprobs without logprobs", CHAT, _chat(top_logprobs=2), 400, "requires logprobs"),
    # tools
    Case(
        "tool parameters not an object",
        CHAT,
        _chat(tools=[{**TOOL, "function": {"name": "f", "parameters": {"type": "string"}}}]),
        400,
        "parameters",
    ),
    Case("tool without a name", CHAT, _chat(tools=[{"type": "function", "function": {}}]), 400, "name"),
    Case(
        "tool name with spaces",
        CHAT,
        _chat(tools=[{"type": "function", "function": {"name": "get time"}}]),
        400,
        "name",
    ),
    Case("duplicate tool names", CHAT, _chat(tools=[TOOL, TOOL]), 400, "unique"),
    Case(
        "tool_choice naming no tool",
        CHAT,
        _chat(tools=[TOOL], tool_choice={"type": "function", "function": {"name": "nope"}}),
        400,
        "not among the tools",
    ),
    Case("tool_choice required without tools", CHAT, _chat(tool_choice="required"), 400, "needs 'tools'"),
    Case("tool_choice unknown word", CHAT, _chat(tools=[TOOL], tool_choice="sometimes"), 400, "tool_choice"),
    Case(
        "stream_options without a stream",
        CHAT,
        _chat(stream_options={"include_usage": True}),
        400,
        "only allowed when stream is true",
    ),
    # token ids and work: serve's to judge (the gateway passes its answer through)
    Case("stop token out of vocabulary", CHAT, _chat(stop_token_ids=[10**9]), 400, "stop_token_ids"),
    Case("negative stop token", CHAT, _chat(stop_token_ids=[-1]), 400, "stop_token_ids"),
    Case("prompt token out of vocabulary", TEXT, _text(prompt=[1, 10**9]), 400, "token ids"),
    Case("negative prompt token", TEXT, _text(prompt=[1, -3]), 400, "prompt"),
    Case("1000 prompts with n 128", TEXT, _text(prompt=["a"] * 1000, n=128), 400, "--max-prompts-per-request"),
    Case("n beyond 128", CHAT, _chat(n=129), 400, "n"),
    Case("context overflow", CHAT, _chat(max_tokens=10**6), 400, "maximum context length"),
    # beyond the context and the work limit at once: the context is named, not max_tokens
    Case("prompt beyond the context", TEXT, _text(prompt=[1] * 5_000, max_tokens=1), 400, "maximum context length"),
    Case("template kwargs set the messages", CHAT, _chat(chat_template_kwargs={"messages": []}), 400, "may not set"),
    Case(
        "template sent with a request", CHAT, _chat(chat_template_kwargs={"chat_template": "{{ 1 }}"}), 400, "may not"
    ),
    Case("template kwargs set the prefix", CHAT, _chat(chat_template_kwargs={"assistant_prefix": "x"}), 400, "may not"),
    Case("unsupported penalty", CHAT, _chat(presence_penalty=0.5), 400, "not supported"),
    Case("unsupported json output", CHAT, _chat(response_format={"type": "json_object"}), 400, "not supported"),
    Case("unknown model", CHAT, _chat(model="gpt-9"), 404, "gpt-9"),
    # routes
    Case("unknown route", "/v1/embeddings", _chat(), 404, "Unknown route"),
    Case("wrong method", CHAT, b"", 405, "not allowed", method="GET"),
]


@pytest.fixture(scope="module")
def serve(tiny_model_dir: Path) -> Iterator[InferenceServer]:
    options = {"limits": ServingLimits(max_request_bytes=LIMIT)}
    with serving(tiny_model_dir, max_batch_size=4, max_queued_tokens=100_000, server_options=options) as server:
        yield server


@pytest.fixture(scope="module")
def gateway_url(serve: InferenceServer) -> Iterator[str]:
    model_list = [{"model_name": "tiny", "litellm_params": {"model": "agentbolt/tiny", "api_base": serve.base_url}}]
    gateway = Gateway(model_list, store=None, settings=GatewaySettings(max_request_bytes=LIMIT))
    port = pick_free_port()
    launcher = PythonServerLauncher(
        create_app(gateway),
        PythonServerLauncherArgs(port=port, host="127.0.0.1", launch_mode="thread"),
        serve_context=gateway.serving,
    )
    asyncio.run(launcher.start())
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        asyncio.run(launcher.stop())


@pytest.fixture(params=["serve", "gateway"])
def root(request: pytest.FixtureRequest) -> str:
    if request.param == "serve":
        server: InferenceServer = request.getfixturevalue("serve")
        return f"http://{server.host}:{server.port}"
    return str(request.getfixturevalue("gateway_url"))


def _healthy(client: httpx.Client) -> None:
    response = client.post(CHAT, content=_chat(), headers={"content-type": "application/json"})
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["role"] == "assistant"


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_hostile_requests_get_a_clear_4xx_and_leave_the_server_healthy(root: str, case: Case) -> None:
    headers: Dict[str, str] = {"content-type": case.content_type} if case.content_type else {}
    with httpx.Client(base_url=root, timeout=120) as client:
        response = client.request(case.method, case.path, content=case.body, headers=headers)
        assert response.status_code == case.status, response.text
        error = response.json()["error"]
        assert case.fragment in error["message"], error
        assert error["type"] and "param" in error
        assert error["code"] is None or (isinstance(error["code"], str) and error["code"]), error  # OpenAI's form
        _healthy(client)


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"tool_choice": {"type": "function", "function": {"name": "get_time"}}}, "tool_choice"),
        ({"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),
    ],
)
def test_a_field_refused_for_what_another_says_is_the_param_of_the_error(
    root: str, fields: Dict[str, Any], param: str
) -> None:
    response = httpx.post(f"{root}{CHAT}", content=_chat(**fields), headers={"content-type": "application/json"})
    assert response.status_code == 400 and response.json()["error"]["param"] == param, response.text


def test_both_servers_publish_an_openapi_document_of_what_they_return(root: str) -> None:
    document = httpx.get(f"{root}/openapi.json").json()
    chat = document["paths"][CHAT]["post"]
    assert chat["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith("/ChatCompletionRequest")
    answers = chat["responses"]
    assert answers["200"]["content"]["application/json"]["schema"]["$ref"].endswith("/ChatCompletion")
    assert "text/event-stream" in answers["200"]["content"]
    assert {"400", "404", "413", "415"} <= set(answers) and "422" not in answers
    assert answers["400"]["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorResponse")
    schemas = document["components"]["schemas"]
    assert schemas["ChatCompletionRequest"]["properties"]["seed"]["anyOf"][0]["maximum"] == 2**63 - 1
