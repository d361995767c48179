"""Guided decoding (vLLM's ``guided_regex`` / ``guided_choice``) in the engine and over HTTP, on the tiny random
Llama (its tokenizer has one token per byte)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, Dict, List

import httpx
import pytest
import regex
import torch
from transformers import AutoModelForCausalLM

from agentbolt.serving.guided import MAX_DRAWS, RegexGuide, TokenTexts, choice_pattern, guided_row
from agentbolt.serving.params import EngineError, SamplingParams
from agentbolt.serving.server import InferenceServer
from agentbolt.serving.transformers_engine import TransformersEngine

STEP = r'\{"tool": "(search|calculator|finish)", "goal": "[a-z ]{0,8}"\}'
MESSAGES = [{"role": "user", "content": "Pick a tool."}]


def _prompt(engine: TransformersEngine) -> List[int]:
    return engine.encode_chat(MESSAGES)


def test_every_choice_matches_the_pattern_greedy_and_sampled(engine: TransformersEngine) -> None:
    greedy = engine.generate_sync(_prompt(engine), SamplingParams(max_tokens=60, temperature=0, guided_regex=STEP))
    sampled = engine.generate_sync(
        _prompt(engine), SamplingParams(max_tokens=60, temperature=4.0, n=12, seed=5, guided_regex=STEP)
    )
    for choice in greedy.choices + sampled.choices:
        assert regex.fullmatch(STEP, choice.text), choice.text
        assert choice.finish_reason == "stop"
    tools = {regex.fullmatch(STEP, choice.text).group(1) for choice in sampled.choices}  # type: ignore[union-attr]
    assert len(tools) >= 2, tools  # sampling explores the alternatives the pattern allows


def test_reported_logprobs_are_the_unguided_models(engine: TransformersEngine, tiny_model_dir: Path) -> None:
    prompt = _prompt(engine)
    out = engine.generate_sync(
        prompt, SamplingParams(max_tokens=40, temperature=1.0, seed=1, logprobs=True, guided_regex=STEP)
    ).choices[0]
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    ids = torch.tensor([prompt + out.token_ids])
    with torch.no_grad():
        logprobs = torch.log_softmax(model(ids).logits[0, len(prompt) - 1 : -1], dim=-1)
    expected = logprobs.gather(1, torch.tensor(out.token_ids).unsqueeze(1)).squeeze(1)
    assert out.logprobs is not None
    assert torch.allclose(torch.tensor(out.logprobs), expected, atol=1e-4)
    assert min(out.logprobs) < -3  # the guide forced tokens the bare model finds unlikely: not a renormalized value


def test_greedy_guided_picks_the_most_likely_allowed_token(engine: TransformersEngine) -> None:
    texts = TokenTexts.of_tokenizer(engine.tokenizer, engine.vocab_size)
    logits = torch.randn(engine.vocab_size, generator=torch.Generator().manual_seed(0))
    guide = RegexGuide("(ab|xy)z")
    row = guided_row(logits, "", guide, texts, 0.0, engine._eos_ids)
    allowed = [token for token, text in enumerate(texts.texts) if text is not None and guide.can_continue(text)]
    best = max(allowed, key=lambda token: float(logits[token]))
    assert torch.nonzero(~torch.isinf(row)).flatten().tolist() == [best]  # greedy keeps only the best allowed token


def test_sampling_draws_allowed_tokens_in_proportion_to_their_probabilities() -> None:
    texts = TokenTexts(["a", "b", "c", "ab", "\ufffd", "", "<eos>"], special_ids=[6])
    assert texts.texts == ["a", "b", "c", "ab", None, None, None]
    logits = torch.tensor([0.5, 0.375, 3.0, 0.25, 9.0, 9.0, 1.0])
    generator = torch.Generator().manual_seed(0)
    counts = [0] * len(logits)
    for _ in range(4000):
        row = guided_row(logits, "", RegexGuide("ab?"), texts, 1.0, eos_ids=[6], generator=generator)
        (kept,) = torch.nonzero(~torch.isinf(row)).flatten().tolist()
        assert row[kept] == logits[kept]  # the kept token keeps its logit
        counts[kept] += 1
    assert counts[0] + counts[3] == 4000  # only "a" and "ab" can start a match of "ab?"
    expected = float(torch.softmax(torch.tensor([0.5, 0.25]), dim=0)[0])  # 0.562
    assert abs(counts[0] / 4000 - expected) < 0.03


def test_top_p_rows_keep_every_allowed_token_for_the_nucleus() -> None:
    texts = TokenTexts(["a", "b", "c", "ab", "\ufffd", "", "<eos>"], special_ids=[6])
    logits = torch.tensor([0.5, 0.375, 3.0, 0.25, 9.0, 9.0, 1.0])
    row = guided_row(logits, "", RegexGuide("ab?"), texts, 1.0, eos_ids=[6], top_p=0.9)
    assert row.tolist() == [0.5, float("-inf"), float("-inf"), 0.25, float("-inf"), float("-inf"), float("-inf")]
    complete = guided_row(logits, "a", RegexGuide("ab?"), texts, 1.0, eos_ids=[6], top_p=0.9)
    assert complete.tolist() == [float("-inf"), 0.375, float("-inf"), float("-inf"), float("-inf"), float("-inf"), 1.0]


def test_a_sampled_row_refused_too_often_is_scanned() -> None:
    # More likely refused tokens than MAX_DRAWS: every draw is refused, then the scan finds "a".
    texts = TokenTexts(["a"] + ["c"] * (MAX_DRAWS + 8))
    logits = torch.tensor([-30.0] + [30.0] * (MAX_DRAWS + 8))
    row = guided_row(logits, "", RegexGuide("a"), texts, 1.0, eos_ids=[])
    assert row[0] == -30.0 and torch.isinf(row[1:]).all()


def test_a_refused_token_holding_all_the_mass_leads_to_a_scan_not_to_the_last_token() -> None:
    # At a low temperature the refused most likely token holds all the float32 probability: once it is refused, no
    # mass is left to draw from, and the draw must not fall off the end of the vocabulary onto its last token.
    texts = TokenTexts(["c", "a", "a"])
    logits = torch.tensor([10.0, 1.0, 0.5])
    row = guided_row(logits, "", RegexGuide("a"), texts, 0.01, eos_ids=[])
    assert torch.isfinite(row).tolist() == [False, True, True]  # the scan keeps every allowed token


def test_a_finished_match_can_only_end() -> None:
    texts = TokenTexts(["a", "b", "<eos>"], special_ids=[2])
    for temperature in (0.0, 0.7):
        row = guided_row(torch.tensor([5.0, 4.0, -2.0]), "ab", RegexGuide("ab"), texts, temperature, eos_ids=[2])
        assert row.tolist() == [float("-inf"), float("-inf"), -2.0]


@pytest.mark.parametrize(
    ("params", "fragment"),
    [
        (SamplingParams(guided_regex="(unclosed"), "does not compile"),
        (SamplingParams(guided_regex=""), "non-empty string"),
        (SamplingParams(guided_regex="a", ignore_eos=True), "ignore_eos"),
    ],
)
def test_bad_guides_are_refused_before_running(
    engine: TransformersEngine, params: SamplingParams, fragment: str
) -> None:
    with pytest.raises(EngineError, match=fragment):
        engine.generate_sync(_prompt(engine), params)


def test_an_unreachable_pattern_fails_its_request_only(engine: TransformersEngine) -> None:
    # Every byte token of a CJK character decodes to a partial character, which guided sequences never use.
    async def run() -> List[Any]:
        return await asyncio.gather(
            engine.generate(_prompt(engine), SamplingParams(max_tokens=5, guided_regex="\u4e00+")),
            engine.generate(_prompt(engine), SamplingParams(max_tokens=5, temperature=0)),
            return_exceptions=True,
        )

    failed, fine = asyncio.run(run())
    assert isinstance(failed, Exception) and "no token can continue" in str(failed)
    assert not isinstance(fine, BaseException) and len(fine.choices[0].token_ids) >= 1


def test_choice_pattern_escapes_and_validates() -> None:
    assert regex.fullmatch(choice_pattern(["a.b", "c"]), "a.b")
    assert not regex.fullmatch(choice_pattern(["a.b", "c"]), "axb")
    for bad in ([], ["a", 1]):
        with pytest.raises(EngineError, match="guided_choice"):
            choice_pattern(bad)  # type: ignore[arg-type]


def _chat(server: InferenceServer, **extra: Any) -> httpx.Response:
    body: Dict[str, Any] = {"messages": MESSAGES, "max_tokens": 30, **extra}
    return httpx.post(f"{server.base_url}/chat/completions", json=body, timeout=60)


def test_http_guided_choice_and_regex(server: InferenceServer) -> None:
    options = ["red", "green", "blue"]
    response = _chat(server, guided_choice=options, n=8, temperature=2.0, seed=2)
    assert response.status_code == 200, response.text
    answers = [choice["message"]["content"] for choice in response.json()["choices"]]
    assert set(answers) <= set(options)
    regex_response = _chat(server, guided_regex=STEP, temperature=0, max_tokens=80)
    assert regex.fullmatch(STEP, regex_response.json()["choices"][0]["message"]["content"])


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        ({"guided_regex": "(x"}, "does not compile"),
        ({"guided_regex": 3}, "guided_regex must be a string"),
        ({"guided_choice": "red"}, "guided_choice must be a list"),
        ({"guided_choice": []}, "guided_choice must be a non-empty list"),
        ({"guided_choice": ["a"], "guided_regex": "a"}, "not both"),
        ({"guided_json": {"type": "object"}}, "guided_json is not supported"),
    ],
)
def test_http_bad_guides_are_400(server: InferenceServer, extra: Dict[str, Any], fragment: str) -> None:
    response = _chat(server, **extra)
    assert response.status_code == 400
    assert fragment in response.json()["error"]["message"]
    assert _chat(server, temperature=0).status_code == 200  # the server serves on
