"""The environment-variable readers: override first, then the variable, then the fallback."""

from __future__ import annotations

import pytest

from agentbolt.env_var import LightningEnvVar, resolve_bool_env_var, resolve_int_env_var, resolve_str_env_var

PORT = LightningEnvVar.AGL_SERVER_PORT


@pytest.mark.parametrize("word", ["1", "true", "YES", " on "])
def test_bool_truthy_words(monkeypatch: pytest.MonkeyPatch, word: str) -> None:
    monkeypatch.setenv("AGL_MANAGED_STORE", word)
    assert resolve_bool_env_var(LightningEnvVar.AGL_MANAGED_STORE) is True


@pytest.mark.parametrize("word", ["0", "False", "no", "OFF"])
def test_bool_falsy_words(monkeypatch: pytest.MonkeyPatch, word: str) -> None:
    monkeypatch.setenv("AGL_MANAGED_STORE", word)
    assert resolve_bool_env_var(LightningEnvVar.AGL_MANAGED_STORE, fallback=True) is False


@pytest.mark.parametrize("word", ["y", "t", "maybe", ""])
def test_bool_other_words_name_the_variable(monkeypatch: pytest.MonkeyPatch, word: str) -> None:
    monkeypatch.setenv("AGL_MANAGED_STORE", word)
    with pytest.raises(ValueError, match="AGL_MANAGED_STORE must be a boolean"):
        resolve_bool_env_var(LightningEnvVar.AGL_MANAGED_STORE)


def test_override_wins_over_a_set_or_broken_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGL_MANAGED_STORE", "not a boolean")
    monkeypatch.setenv("AGL_SERVER_PORT", "not a number")
    assert resolve_bool_env_var(LightningEnvVar.AGL_MANAGED_STORE, override=False, fallback=True) is False
    assert resolve_int_env_var(PORT, override=4848, fallback=1) == 4848
    assert resolve_str_env_var("AGL_SERVER_PORT", override="x") == "x"


def test_unset_variable_gives_the_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AGL_SERVER_PORT", raising=False)
    assert resolve_int_env_var(PORT, fallback=4747) == 4747
    assert resolve_int_env_var(PORT) is None
    assert resolve_str_env_var(PORT, fallback="h") == "h"
    assert resolve_bool_env_var("AGENTBOLT_TEST_UNSET_FLAG", fallback=True) is True


def test_int_and_str_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGL_SERVER_PORT", "5151")
    assert resolve_int_env_var(PORT, fallback=1) == 5151
    assert resolve_str_env_var(PORT) == "5151"
    monkeypatch.setenv("AGL_SERVER_PORT", "51.5")
    with pytest.raises(ValueError, match="AGL_SERVER_PORT must be an integer"):
        resolve_int_env_var(PORT)
