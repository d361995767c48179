"""Property-based tests of both OpenAI-compatible servers against their own OpenAPI documents (slow suite).

schemathesis generates requests from each server's ``/openapi.json`` (valid ones and deliberately invalid ones) and
checks every answer: never a 5xx, a status and content type the document lists, a body that matches the documented
schema. serve runs the tiny random Llama with small work limits (so generated heavy requests are refused quickly);
the gateway sits in front of it.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, Iterator

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("schemathesis")

import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)
from support.models import serving

from agentbolt.gateway import Gateway, GatewaySettings, create_app
from agentbolt.serving.server import InferenceServer, ServingLimits
from agentbolt.utils.server_launcher import PythonServerLauncher, PythonServerLauncherArgs, pick_free_port

pytestmark = pytest.mark.slow
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


@pytest.fixture(scope="module")
def serve(tiny_model_dir: Path) -> Iterator[InferenceServer]:
    limits = ServingLimits(max_prompts_per_request=4, max_sequences_per_request=8, max_request_bytes=256 * 1024)
    with serving(tiny_model_dir, max_batch_size=8, max_queued_tokens=2048, server_options={"limits": limits}) as server:
        yield server


@pytest.fixture(scope="module")
def serve_schema(serve: InferenceServer) -> Any:
    return schemathesis.openapi.from_url(f"http://{serve.host}:{serve.port}/openapi.json")


@pytest.fixture(scope="module")
def gateway_schema(serve: InferenceServer) -> Iterator[Any]:
    model_list = [{"model_name": "tiny", "litellm_params": {"model": "agentbolt/tiny", "api_base": serve.base_url}}]
    gateway = Gateway(model_list, store=None, settings=GatewaySettings(max_request_bytes=256 * 1024))
    port = pick_free_port()
    launcher = PythonServerLauncher(
        create_app(gateway),
        PythonServerLauncherArgs(port=port, host="127.0.0.1", launch_mode="thread"),
        serve_context=gateway.serving,
    )
    asyncio.run(launcher.start())
    try:
        yield schemathesis.openapi.from_url(f"http://127.0.0.1:{port}/openapi.json")
    finally:
        asyncio.run(launcher.stop())


PROFILE = settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), database=None)


def _exercise(schema: Any) -> None:
    """Run generated cases of every operation of ``schema`` and check each answer."""
    operations = [result.ok() for result in schema.get_all_operations()]
    assert operations
    for operation in operations:

        @given(case=operation.as_strategy())
        @PROFILE
        def check(case: Any) -> None:
            case.call_and_validate(checks=CHECKS, timeout=120)

        check()


def test_serve_answers_as_its_document_says(serve_schema: Any) -> None:
    _exercise(serve_schema)


def test_the_gateway_answers_as_its_document_says(gateway_schema: Any) -> None:
    _exercise(gateway_schema)
