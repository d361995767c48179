"""The one bearer-token rule every agentbolt HTTP server applies."""

from __future__ import annotations

import pytest

from agentbolt.utils.http_auth import BearerAuthMiddleware, bearer_token_matches


@pytest.mark.parametrize(
    "authorization",
    ["Bearer s3cret", "bearer s3cret", "BEARER s3cret", "  Bearer   s3cret  ", b"Bearer s3cret"],
)
def test_the_key_matches_whatever_the_scheme_case_and_spacing(authorization: object) -> None:
    assert bearer_token_matches(authorization, "s3cret")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "authorization",
    [None, "", "s3cret", "Basic s3cret", "Bearer", "Bearer s3cre", "Bearer s3cret2", "Bearers3cret", b"Token s3cret"],
)
def test_anything_else_does_not(authorization: object) -> None:
    assert not bearer_token_matches(authorization, "s3cret")  # type: ignore[arg-type]


def test_a_non_ascii_key_is_compared_as_the_bytes_a_client_sends() -> None:
    assert bearer_token_matches("Bearer clé".encode(), "clé")
    assert bearer_token_matches("Bearer clé", "clé")
    assert not bearer_token_matches("Bearer clé".encode("latin-1"), "clé")


def test_an_empty_key_is_refused() -> None:
    with pytest.raises(ValueError, match="api_key must not be empty"):
        BearerAuthMiddleware(app=None, api_key="", open_paths=(), refusal=lambda scope: None)  # type: ignore[arg-type]
