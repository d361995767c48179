"""Guided decoding: every choice's text stays a prefix of a match of one regular expression.

This is vLLM's ``guided_regex`` (and ``guided_choice``, a regular expression of escaped alternatives) for the
transformers engine. At each step of a guided sequence the engine keeps only the tokens whose text extends the
sequence's text into something the pattern can still match in full (``regex``'s partial matching), plus the EOS
tokens once the text is a complete match; then it samples as usual among them.

What it changes and what it does not:

* Only the draw is restricted. Reported log-probabilities stay those of the unrestricted model, the distribution a
  trainer computes, so a policy-gradient ratio compares like with like.
* Greedy decoding picks the most likely allowed token, exactly. Sampling draws from the model's tempered
  distribution and refuses disallowed tokens until one is allowed, which samples the allowed tokens exactly in
  proportion to their probabilities. Only with top-p, or after :data:`MAX_DRAWS` refusals in one step, are the
  allowed tokens found by scanning from the most likely down, which stops once the tokens not yet scanned hold less
  than :data:`UNSCANNED_MASS` of the allowed mass found so far: that tail is left out.
* Tokens whose text is an incomplete UTF-8 character, and special tokens other than EOS, are never allowed: a
  guided answer is written with whole-character tokens.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Iterable, List, Optional, Sequence

from agentbolt.serving.params import EngineError

if TYPE_CHECKING:
    import torch

__all__ = [
    "JSON_OBJECT",
    "MAX_DRAWS",
    "UNSCANNED_MASS",
    "RegexGuide",
    "TokenTexts",
    "choice_pattern",
    "guided_row",
    "with_json_objects",
]

UNSCANNED_MASS = 1e-4
"""Sampling stops scanning once the unscanned tokens hold less than this share of the allowed probability mass."""

MAX_DRAWS = 32
"""Draws a sampled guided token may refuse before the row is scanned instead."""

_SCAN_CHUNK = 64

JSON_OBJECT = "(?&json_object)"
"""Matches one JSON object in a pattern built by :func:`with_json_objects`."""

# JSON's grammar as named groups of the ``regex`` module (recursive, so objects and arrays nest to any depth).
# Whitespace is at most one space around punctuation, the way json.dumps and chat templates write JSON: a model
# cannot pad an answer with blank space forever.
_JSON_DEFINITIONS = (
    "(?(DEFINE)"
    r'(?<json_string>"(?:[^"\\\x00-\x1f]|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4})*")'
    r"(?<json_number>-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?)"
    r"(?<json_value>(?&json_string)|(?&json_number)|true|false|null|(?&json_object)|(?&json_array))"
    r"(?<json_object>\{[ ]?(?:(?&json_string)[ ]?:[ ]?(?&json_value)"
    r"(?:[ ]?,[ ]?(?&json_string)[ ]?:[ ]?(?&json_value))*)?[ ]?\})"
    r"(?<json_array>\[[ ]?(?:(?&json_value)(?:[ ]?,[ ]?(?&json_value))*)?[ ]?\])"
    ")"
)


def with_json_objects(pattern: str) -> str:
    """``pattern``, in which :data:`JSON_OBJECT` matches one JSON object, as a pattern :class:`RegexGuide` compiles."""
    return _JSON_DEFINITIONS + pattern


def choice_pattern(choices: Sequence[str]) -> str:
    """The regular expression that matches exactly one of ``choices`` (vLLM's ``guided_choice``).

    Raises:
        EngineError: ``choices`` is empty or holds something other than strings.
    """
    import regex

    if not choices or any(not isinstance(choice, str) for choice in choices):
        raise EngineError("guided_choice must be a non-empty list of strings")
    return "(?:" + "|".join(regex.escape(choice) for choice in choices) + ")"


class RegexGuide:
    """One compiled pattern, asked whether a text can still become a full match.

    Raises:
        EngineError: The pattern is not a string or does not compile.
    """

    def __init__(self, pattern: str):
        import regex

        if not isinstance(pattern, str) or not pattern:
            raise EngineError("guided_regex must be a non-empty string")
        try:
            self._compiled = regex.compile(pattern)
        except regex.error as exc:
            raise EngineError(f"guided_regex does not compile: {exc}") from None
        self.pattern = pattern

    def can_continue(self, text: str) -> bool:
        """Whether ``text`` is a full match or the beginning of one."""
        return self._compiled.fullmatch(text, partial=True) is not None

    def is_complete(self, text: str) -> bool:
        """Whether ``text`` is a full match."""
        return self._compiled.fullmatch(text) is not None


class TokenTexts:
    """Each token id's text, as the guide sees it: ``None`` for tokens a guided sequence may not use.

    Args:
        texts: The text of each token id decoded alone (``None`` where there is none).
        special_ids: Token ids never allowed as text (special tokens; EOS is handled apart).
    """

    def __init__(self, texts: Sequence[Optional[str]], special_ids: Iterable[int] = ()):
        self.texts: List[Optional[str]] = [None if not text or "\ufffd" in text else text for text in texts]
        for token in special_ids:
            if 0 <= token < len(self.texts):
                self.texts[token] = None

    @classmethod
    def of_tokenizer(cls, tokenizer: Any, vocab_size: int) -> TokenTexts:
        """The texts of a transformers tokenizer's tokens, decoded one by one without any clean-up; ids past the
        tokenizer's vocabulary (a padded embedding) have none."""
        known = min(vocab_size, len(tokenizer))
        texts: List[Optional[str]] = list(
            tokenizer.batch_decode(
                [[token] for token in range(known)], skip_special_tokens=False, clean_up_tokenization_spaces=False
            )
        )
        texts.extend([None] * (vocab_size - known))
        return cls(texts, getattr(tokenizer, "all_special_ids", []))

    def text_of(self, token_ids: Sequence[int]) -> str:
        """The text a guided sequence has written: its tokens' texts joined (EOS and the like add nothing)."""
        return "".join(self.texts[token] or "" for token in token_ids if token < len(self.texts))


def guided_row(
    logits: torch.Tensor,
    text: str,
    guide: RegexGuide,
    token_texts: TokenTexts,
    temperature: float,
    eos_ids: Iterable[int],
    top_p: float = 1.0,
    generator: Optional[torch.Generator] = None,
) -> torch.Tensor:
    """``logits`` (one row) restricted to what the guide allows after ``text``: the other tokens set to ``-inf``.

    Greedy (``temperature`` 0) keeps the most likely allowed token, found among the top tokens in growing windows.
    Sampling without top-p draws from the tempered distribution with ``generator`` and refuses disallowed tokens
    until one is allowed (up to :data:`MAX_DRAWS` draws; the first allowed token of draws without replacement follows
    the allowed tokens' renormalized distribution, so this is exact), and keeps only that token. With top-p, or
    after that many refusals, it scans tokens from the most likely down and keeps every allowed one until the
    unscanned tokens hold less than :data:`UNSCANNED_MASS` of the allowed mass; the caller's sampler then draws.

    Raises:
        EngineError: No token can continue ``text`` and it is not a complete match (or it is, but there is no EOS).
    """

    ends = {token for token in eos_ids if token < logits.shape[0]} if guide.is_complete(text) else set()
    vocabulary = len(token_texts.texts)

    def allowed(token: int) -> bool:
        if token in ends:
            return True
        piece = token_texts.texts[token] if token < vocabulary else None
        return piece is not None and guide.can_continue(text + piece)

    if temperature <= 0:
        best = _most_likely_allowed(logits, allowed)
        kept = [] if best is None else [best]
    else:
        kept = _sampled_or_scanned(logits, temperature, top_p, allowed, generator)
    if not kept:
        raise EngineError(f"guided_regex: no token can continue the text {text[-80:]!r} towards a match")
    return _keep(logits, kept)


def _sampled_or_scanned(
    logits: torch.Tensor,
    temperature: float,
    top_p: float,
    allowed: Callable[[int], bool],
    generator: Optional[torch.Generator],
) -> List[int]:
    """One allowed token drawn and refused as :func:`guided_row` describes, or every allowed token of a scan."""
    import torch

    if top_p >= 1.0:
        probs = torch.softmax(logits / temperature, dim=-1)
        for _ in range(MAX_DRAWS):
            cumulative = probs.cumsum(0)
            if not float(cumulative[-1]) > 0:  # the refused tokens held all the mass (a low temperature): scan
                break
            target = torch.rand(1, generator=generator, device=logits.device) * cumulative[-1]
            token = min(int(torch.searchsorted(cumulative, target, right=True)), probs.shape[0] - 1)
            if allowed(token):
                return [token]
            probs[token] = 0.0
    return _scan_allowed(logits, temperature, allowed)


def _keep(logits: torch.Tensor, tokens: Sequence[int]) -> torch.Tensor:
    import torch

    kept = torch.full_like(logits, float("-inf"))
    index = torch.tensor(list(tokens), dtype=torch.long, device=logits.device)
    kept[index] = logits[index]
    return kept


def _most_likely_allowed(logits: torch.Tensor, allowed: Callable[[int], bool]) -> Optional[int]:
    """The allowed token with the highest logit (the first among equals), looked for in growing top-k windows;
    None when no token is allowed."""
    import torch

    size = logits.shape[0]
    checked = 0
    window = 16
    while checked < size:
        window = min(window, size)
        for token in torch.topk(logits, window).indices.tolist()[checked:]:
            if allowed(token):
                return token
        checked, window = window, window * 16
    return None


def _scan_allowed(logits: torch.Tensor, temperature: float, allowed: Callable[[int], bool]) -> List[int]:
    """The allowed tokens, scanned from the most likely down until the unscanned ones hold less than
    :data:`UNSCANNED_MASS` of the allowed probability mass at ``temperature`` (empty when none is allowed)."""
    import torch

    order = torch.argsort(logits, descending=True)
    probs = torch.softmax(logits / temperature, dim=-1)
    unscanned = (1.0 - probs[order].cumsum(0)).clamp_(min=0.0)
    kept: List[int] = []
    kept_mass = 0.0
    for start in range(0, order.shape[0], _SCAN_CHUNK):
        for token in order[start : start + _SCAN_CHUNK].tolist():
            if allowed(token):
                kept.append(token)
                kept_mass += float(probs[token])
        end = min(start + _SCAN_CHUNK, order.shape[0]) - 1
        if kept_mass > 0 and float(unscanned[end]) <= UNSCANNED_MASS * kept_mass:
            break
    return kept
