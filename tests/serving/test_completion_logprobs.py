"""``logprobs: k`` on ``/v1/completions``: the legacy format keys alternatives by their text, and tokens that are
each part of a UTF-8 character share the text U+FFFD."""

from __future__ import annotations

import httpx

from agentbolt.serving.server import InferenceServer


def test_alternatives_with_the_same_text_keep_the_most_likely_value(server: InferenceServer) -> None:
    body = {"prompt": "hi", "max_tokens": 12, "temperature": 0, "ignore_eos": True, "logprobs": 20}
    response = httpx.post(f"{server.base_url}/completions", json=body, timeout=60)
    assert response.status_code == 200, response.text
    logprobs = response.json()["choices"][0]["logprobs"]
    tokens, chosen, top = logprobs["tokens"], logprobs["token_logprobs"], logprobs["top_logprobs"]
    assert "\ufffd" in tokens  # the tiny model's byte tokens: the case this is about
    for token, value, alternatives in zip(tokens, chosen, top, strict=True):
        assert alternatives[token] == value  # greedy: the chosen token is the most likely of its text
        assert max(alternatives.values()) == value
