"""Fixtures of the prompt-optimization tests: the scripted stand-in server and a client of it."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import pytest
from apo_standin import BASE_URL, Script, create_app
from support.fake_openai import FakeOpenAIServer


@pytest.fixture
def script() -> Script:
    return Script()


@pytest.fixture
def standin(script: Script) -> Iterator[FakeOpenAIServer]:
    """The stand-in server (see apo_standin.py), reachable by the test agent."""
    with FakeOpenAIServer(app=create_app(script)) as server:
        BASE_URL["url"] = server.base_url
        yield server
    BASE_URL.pop("url", None)


@pytest.fixture
def optimizer_client(standin: FakeOpenAIServer) -> Any:
    """An AsyncOpenAI client of the stand-in; no SDK retries, so the optimizer's own retries are what runs."""
    from openai import AsyncOpenAI

    return AsyncOpenAI(base_url=standin.base_url, api_key="stand-in", max_retries=0)


@pytest.fixture
def sqlite_path(tmp_path: Path) -> Path:
    return tmp_path / "apo.sqlite"
