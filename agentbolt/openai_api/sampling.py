"""Which sampling parameters of an OpenAI-style request make an engine draw from another distribution than the
model's tempered softmax.

An RL trainer scores every sampled token under ``softmax(logits / T)``; a request that truncates or reshapes that
distribution (``top_p``, penalties...), keeps the best of several samples, or constrains the decoding (guided
decoding, logits processors, token lists: the engine masks the logits) gives it samples the policy did not draw. The
table below is the one place that says which parameters do that and which value of each leaves the distribution
unchanged: GRPO refuses them in its training ``sampling_parameters``, and the recorded LLM calls name the ones a
request set (``gen_ai.request.distribution_changing``), so that a trainer can count calls an agent sampled so.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

__all__ = ["DISTRIBUTION_CHANGING", "distribution_changing_parameters", "is_number"]


def is_number(value: Any) -> bool:
    """Whether ``value`` is an int or a float (a bool is not a number here)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


DISTRIBUTION_CHANGING: Dict[str, Tuple[Callable[[Any], bool], Optional[str]]] = {
    "top_p": (lambda v: is_number(v) and v >= 1, "1"),
    "top_k": (lambda v: is_number(v) and v in (0, -1), "-1"),
    "min_p": (lambda v: is_number(v) and v == 0, "0"),
    "typical_p": (lambda v: is_number(v) and v >= 1, "1"),
    "min_tokens": (lambda v: is_number(v) and v == 0, "0"),
    "repetition_penalty": (lambda v: is_number(v) and v == 1, "1"),
    "presence_penalty": (lambda v: is_number(v) and v == 0, "0"),
    "frequency_penalty": (lambda v: is_number(v) and v == 0, "0"),
    "logit_bias": (lambda v: not v, "{}"),
    "best_of": (lambda v: is_number(v) and v <= 1, "1"),
    "use_beam_search": (lambda v: v is False, "False"),
    "response_format": (lambda v: isinstance(v, dict) and v.get("type") == "text", '{"type": "text"}'),
    "guided_json": (lambda v: False, None),
    "guided_regex": (lambda v: False, None),
    "guided_choice": (lambda v: False, None),
    "guided_grammar": (lambda v: False, None),
    "structured_outputs": (lambda v: False, None),
    "structural_tag": (lambda v: False, None),
    "logits_processors": (lambda v: v == [], "[]"),
    "allowed_token_ids": (lambda v: v == [], "[]"),
    "bad_words": (lambda v: v == [], "[]"),
}
"""Parameter name -> (whether a value leaves the distribution unchanged, the value that does, if any)."""


def distribution_changing_parameters(request: Mapping[str, Any]) -> List[str]:
    """The parameters of ``request`` (its JSON body) set to a value that changes the sampled distribution, sorted."""
    return sorted(
        name
        for name, (unchanged, _) in DISTRIBUTION_CHANGING.items()
        if request.get(name) is not None and not unchanged(request[name])
    )
