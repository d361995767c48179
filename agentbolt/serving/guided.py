"""Guided decoding: every choice's text stays a prefix of a match of one regular expression.

This is vLLM's ``guided_regex`` (and ``guided_choice``, a regular expression of escaped alternatives) for the
transformers engine. At each step of a guided sequence the engine keeps only the tokens whose text extends the
sequence's text into something the pattern can still match in full (``regex``'s partial matching), plus the EOS
tokens once the text is a complete match; then it samples as usual among them.

What it changes and what it does not:

* Only the draw is restricted. Reported log-probabilities stay those of the unrestricted model, the distribution a
  trainer computes, so a policy-gradient ratio compares like with like.
* Greedy decoding picks the most likely allowed token, exactly. Sampling scans tokens from the most likely down and
  stops once the tokens not yet scanned hold less than :data:`UNSCANNED_MASS` of the allowed mass found so far
  (at the sampling temperature); the tail beyond that is left out.
* Tokens whose text is an incomplete UTF-8 character, and special tokens other than EOS, are never allowed: a
  guided answer is written with whole-character tokens.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable, List, Optional, Sequence

from agentbolt.serving.params import EngineError

if TYPE_CHECKING:
    import torch

__all__ = ["UNSCANNED_MASS", "RegexGuide", "TokenTexts", "choice_pattern", "guided_row"]

UNSCANNED_MASS = 1e-4
"""Sampling stops scanning once the unscanned tokens hold less than this share of the allowed probability mass."""

_SCAN_CHUNK = 64


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
) -> torch.Tensor:
    """``logits`` (one row) with every token the guide does not allow after ``text`` set to ``-inf``.

    Raises:
        EngineError: No token can continue ``text`` and it is not a complete match (or it is, but there is no EOS).
    """
    import torch

    allowed: List[int] = []
    if guide.is_complete(text):
        allowed.extend(token for token in eos_ids if token < logits.shape[0])
    order = torch.argsort(logits, descending=True)
    greedy = temperature <= 0
    probs = None if greedy else torch.softmax(logits / temperature, dim=-1)
    sorted_probs = None if probs is None else probs[order]
    unscanned = None if sorted_probs is None else (1.0 - sorted_probs.cumsum(0)).clamp_(min=0.0)
    allowed_mass = 0.0 if probs is None else float(probs[allowed].sum()) if allowed else 0.0
    found_first = False
    vocabulary = len(token_texts.texts)
    for start in range(0, order.shape[0], _SCAN_CHUNK):
        chunk = order[start : start + _SCAN_CHUNK].tolist()
        for token in chunk:
            piece = token_texts.texts[token] if token < vocabulary else None
            if piece is not None and guide.can_continue(text + piece):
                allowed.append(token)
                if probs is not None:
                    allowed_mass += float(probs[token])
                found_first = True
                if greedy:
                    break
        if greedy and found_first:
            break
        if unscanned is not None and allowed_mass > 0:
            end = min(start + _SCAN_CHUNK, order.shape[0]) - 1
            if float(unscanned[end]) <= UNSCANNED_MASS * allowed_mass:
                break
    if not allowed:
        raise EngineError(f"guided_regex: no token can continue the text {text[-80:]!r} towards a match")
    masked = torch.full_like(logits, float("-inf"))
    index = torch.tensor(allowed, dtype=torch.long, device=logits.device)
    masked[index] = logits[index]
    return masked
