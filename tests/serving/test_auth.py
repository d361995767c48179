"""serve's API key and adapter directories: every refusal, and what stays open."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import httpx
import openai
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from support.models import serving

from agentbolt.serving.server import InferenceServer

from .test_engine import _make_adapter

KEY = "s3cret-key"
CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


@pytest.fixture(scope="module")
def adapters(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("adapters")
    _make_adapter(tiny_model_dir, root / "allowed" / "sql", seed=2)
    _make_adapter(tiny_model_dir, root / "elsewhere" / "sql", seed=2)
    (root / "allowed" / "escape").symlink_to(root / "elsewhere" / "sql")
    return root


@pytest.fixture(scope="module")
def protected(tiny_model_dir: Path, adapters: Path) -> Iterator[InferenceServer]:
    options = {"api_key": KEY, "adapter_dirs": [adapters / "allowed"]}
    with serving(tiny_model_dir, server_options=options) as server:
        yield server


def _root(server: InferenceServer) -> str:
    return f"http://{server.host}:{server.port}"


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"authorization": "Bearer wrong"},
        {"authorization": KEY},
        {"authorization": f"Basic {KEY}"},
        {"authorization": f"Bearer {KEY}x"},
        {"x-api-key": KEY},
    ],
)
@pytest.mark.parametrize(
    ("method", "route"),
    [
        ("GET", "/v1/models"),
        ("POST", "/v1/chat/completions"),
        ("POST", "/v1/completions"),
        ("POST", "/v1/load_lora_adapter"),
        ("POST", "/v1/unload_lora_adapter"),
        ("GET", "/v1/no-such-route"),
    ],
)
def test_every_route_but_health_needs_the_key(
    protected: InferenceServer, headers: dict, method: str, route: str
) -> None:
    response = httpx.request(method, _root(protected) + route, json=CHAT, headers=headers, timeout=60)
    assert response.status_code == 401
    assert response.headers["www-authenticate"] == "Bearer"
    error = response.json()["error"]
    assert error["type"] == "authentication_error" and "API key" in error["message"]
    assert error["code"] == "invalid_api_key"


def test_health_and_the_openapi_document_are_open(protected: InferenceServer) -> None:
    assert httpx.get(_root(protected) + "/health").json()["status"] == "ok"
    document = httpx.get(_root(protected) + "/openapi.json").json()
    assert document["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"


@pytest.mark.parametrize("scheme", ["Bearer", "bearer", "BEARER"])
def test_the_scheme_is_case_insensitive(protected: InferenceServer, scheme: str) -> None:
    response = httpx.post(
        f"{protected.base_url}/chat/completions", json=CHAT, headers={"authorization": f"{scheme} {KEY}"}, timeout=60
    )
    assert response.status_code == 200, response.text


def test_the_openai_sdk_sends_the_key(protected: InferenceServer) -> None:
    client = openai.OpenAI(base_url=protected.base_url, api_key=KEY, max_retries=0)
    assert client.models.list().data[0].id == "tiny"
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=protected.base_url, api_key="nope", max_retries=0).models.list()


def _load(server: InferenceServer, path: object, name: str = "sql") -> httpx.Response:
    return httpx.post(
        f"{server.base_url}/load_lora_adapter",
        json={"lora_name": name, "lora_path": str(path)},
        headers={"authorization": f"Bearer {KEY}"},
        timeout=60,
    )


@pytest.mark.parametrize(
    "path",
    [
        "elsewhere/sql",  # absolute below
        "allowed/../elsewhere/sql",
        "allowed/escape",  # a symbolic link out of the directory
        "/etc",
    ],
)
def test_adapters_load_only_from_the_configured_directories(
    protected: InferenceServer, adapters: Path, path: str
) -> None:
    target = path if path.startswith("/") else adapters / path
    response = _load(protected, target)
    assert response.status_code == 403
    error = response.json()["error"]
    assert "outside the directories" in error["message"] and "--lora-dir" in error["message"]
    assert error["param"] == "lora_path" and error["type"] == "permission_error"
    assert "sql" not in protected.engine.adapters


def test_an_adapter_inside_a_configured_directory_loads(protected: InferenceServer, adapters: Path) -> None:
    assert _load(protected, adapters / "allowed" / "sql", name="inside").status_code == 200
    relative = _load(protected, "sql", name="relative")  # relative paths are taken from the first directory
    assert relative.status_code == 200, relative.text
    assert {"inside", "relative"} <= set(protected.engine.adapters)


def test_without_directories_loading_adapters_over_http_is_refused(tiny_model_dir: Path, adapters: Path) -> None:
    with serving(tiny_model_dir) as server:
        response = httpx.post(
            f"{server.base_url}/load_lora_adapter",
            json={"lora_name": "sql", "lora_path": str(adapters / "allowed" / "sql")},
            timeout=60,
        )
    assert response.status_code == 403
    assert "disabled" in response.json()["error"]["message"] and "--lora-dir" in response.json()["error"]["message"]


def test_adapter_paths_that_cannot_be_loaded_are_named(protected: InferenceServer, adapters: Path) -> None:
    nul = _load(protected, "allowed/s\x00ql", name="nul")
    assert nul.status_code == 400 and "NUL" in nul.json()["error"]["message"]
    no_weights = adapters / "allowed" / "config-only"
    no_weights.mkdir()
    (no_weights / "adapter_config.json").write_text((adapters / "allowed" / "sql" / "adapter_config.json").read_text())
    answer = _load(protected, no_weights, name="config-only")
    assert answer.status_code == 400 and "holds no adapter weights" in answer.json()["error"]["message"]
