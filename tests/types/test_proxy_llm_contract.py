"""ProxyLLM against the contract (§2.2): ``get_base_url`` validates its inputs; reading ``endpoint`` directly warns."""

from __future__ import annotations

import copy
import logging
import pickle
from typing import Any, Callable, List

import pydantic_core
import pytest

from agentbolt.store.memory import InMemoryLightningStore
from agentbolt.types import ProxyLLM, Rollout

LOGGER = "agentbolt.types.resources"


def _llm() -> ProxyLLM:
    return ProxyLLM(endpoint="http://h:1/v1/", model="m", sampling_parameters={"temperature": 0.1})


def _endpoint_warnings(caplog: pytest.LogCaptureFixture) -> List[logging.LogRecord]:
    return [r for r in caplog.records if r.name == LOGGER and r.levelno == logging.WARNING]


@pytest.mark.parametrize(
    ("endpoint", "expected"),
    [
        ("http://h:1/v1", "http://h:1/rollout/R/attempt/A/v1"),
        ("http://h:1/v1/", "http://h:1/rollout/R/attempt/A/v1"),
        ("http://h:1", "http://h:1/rollout/R/attempt/A"),
        ("http://h:1/", "http://h:1/rollout/R/attempt/A"),
        ("http://h:1/api/v1", "http://h:1/api/rollout/R/attempt/A/v1"),
        ("http://h:1/v12", "http://h:1/v12/rollout/R/attempt/A"),
    ],
)
def test_get_base_url_inserts_the_rollout_before_a_trailing_v1(endpoint: str, expected: str) -> None:
    assert ProxyLLM(endpoint=endpoint, model="m").get_base_url("R", "A") == expected


def test_get_base_url_without_ids_is_the_raw_endpoint() -> None:
    assert _llm().get_base_url(None, None) == "http://h:1/v1/"


@pytest.mark.parametrize(
    ("rollout_id", "attempt_id"),
    [("R", None), (None, "A"), (1, "A"), ("R", 2), (b"R", "A"), ("R", ["A"])],
)
def test_get_base_url_rejects_anything_but_two_strings_or_two_nones(rollout_id: Any, attempt_id: Any) -> None:
    with pytest.raises(ValueError):
        _llm().get_base_url(rollout_id, attempt_id)


def test_reading_endpoint_directly_logs_one_warning_naming_get_base_url(caplog: pytest.LogCaptureFixture) -> None:
    llm = _llm()
    caplog.set_level(logging.WARNING, logger=LOGGER)
    assert llm.endpoint == "http://h:1/v1/"
    (record,) = _endpoint_warnings(caplog)
    assert "get_base_url(rollout_id, attempt_id)" in record.getMessage()


USES_WITHOUT_WARNING: List[Callable[[ProxyLLM], Any]] = [
    lambda llm: llm.get_base_url("R", "A"),
    lambda llm: llm.get_base_url(None, None),
    repr,
    lambda llm: llm.model_dump(),
    lambda llm: llm.model_dump_json(),
    lambda llm: pydantic_core.to_json(llm),
    lambda llm: llm.model_copy(),
    copy.deepcopy,
    lambda llm: pickle.loads(pickle.dumps(llm)),
    lambda llm: llm == _llm(),
    lambda llm: ProxyLLM.model_validate(llm.model_dump()),
]


@pytest.mark.parametrize("use", USES_WITHOUT_WARNING)
def test_construction_and_library_uses_do_not_warn(
    use: Callable[[ProxyLLM], Any], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)
    use(_llm())
    assert _endpoint_warnings(caplog) == []


async def test_storing_and_reading_back_a_proxy_llm_does_not_warn(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)
    store = InMemoryLightningStore()
    await store.add_resources({"llm": _llm()})
    latest = await store.get_latest_resources()
    assert latest is not None and isinstance(latest.resources["llm"], ProxyLLM)
    assert latest.resources["llm"].get_base_url("R", "A") == "http://h:1/rollout/R/attempt/A/v1"
    assert _endpoint_warnings(caplog) == []


@pytest.mark.parametrize(
    ("endpoint", "expected"),
    [
        ("http://h:1/v1?x=1", "http://h:1/rollout/R/attempt/A/v1?x=1"),
        ("http://h:1/v1/?x=1", "http://h:1/rollout/R/attempt/A/v1?x=1"),
        ("http://h:1?x=1", "http://h:1/rollout/R/attempt/A?x=1"),
        ("http://h:1/v1#top", "http://h:1/rollout/R/attempt/A/v1#top"),
        ("http://u:p@h:1/v1", "http://u:p@h:1/rollout/R/attempt/A/v1"),
    ],
)
def test_get_base_url_inserts_the_rollout_into_the_path_before_a_query_or_fragment(
    endpoint: str, expected: str
) -> None:
    assert ProxyLLM(endpoint=endpoint, model="m").get_base_url("R", "A") == expected


@pytest.mark.parametrize(
    ("rollout_id", "attempt_id", "expected"),
    [
        ("ro-1", "at-1", "http://h:1/rollout/ro-1/attempt/at-1/v1"),
        ("r?x", "a#b", "http://h:1/rollout/r%3Fx/attempt/a%23b/v1"),
        ("r x", "é", "http://h:1/rollout/r%20x/attempt/%C3%A9/v1"),
        ("r%2F", "a", "http://h:1/rollout/r%252F/attempt/a/v1"),
    ],
)
def test_get_base_url_percent_encodes_the_ids(rollout_id: str, attempt_id: str, expected: str) -> None:
    assert _llm().get_base_url(rollout_id, attempt_id) == expected


@pytest.mark.parametrize(
    ("rollout_id", "attempt_id", "named"),
    [
        ("", "A", "rollout_id"),
        ("R", "", "attempt_id"),
        ("r/1", "A", "rollout_id"),
        ("..", "A", "rollout_id"),
        ("R", ".", "attempt_id"),
    ],
)
def test_get_base_url_rejects_ids_that_are_not_one_path_segment(rollout_id: str, attempt_id: str, named: str) -> None:
    with pytest.raises(ValueError, match=named):
        _llm().get_base_url(rollout_id, attempt_id)


def test_with_attempted_rollout_rejects_a_rollout_without_attempt() -> None:
    rollout = Rollout(rollout_id="ro-1", input=1, start_time=0.0)
    with pytest.raises(ValueError, match="AttemptedRollout"):
        _llm().with_attempted_rollout(rollout)  # type: ignore[arg-type]
