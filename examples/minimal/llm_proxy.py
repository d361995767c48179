"""Put the LLM gateway (``LLMProxy``) in front of a local ``agentbolt serve`` or a hosted OpenAI-compatible API.

The gateway binds each call to a rollout through its URL (``/rollout/{rollout_id}/attempt/{attempt_id}/v1/...``)
and records it in the store as one span. In front of ``agentbolt serve`` (provider ``agentbolt/``) the span carries
the prompt and response token ids and logprobs; in front of a hosted API (provider ``openai/``) the request is
forwarded unchanged and the span holds the messages, the reply and the usage.

Usage::

    # a local engine: attach to a running server, or let the script start one (the embedded model by default)
    agentbolt serve smollm2-135m-instruct --port 8000
    python -m examples.minimal.llm_proxy local --base-url http://127.0.0.1:8000/v1
    python -m examples.minimal.llm_proxy local --start smollm2-135m-instruct

    # a hosted OpenAI-compatible API: base URL and key from the environment (or --base-url)
    OPENAI_BASE_URL=https://api.openai.com/v1 OPENAI_API_KEY=sk-... \\
        python -m examples.minimal.llm_proxy hosted --model gpt-4o-mini
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Optional

import agentbolt as agl
from agentbolt.models import ModelNotAvailableError, resolve_model
from agentbolt.serving.process import LocalModelServer
from agentbolt.utils.server_launcher import pick_free_port
from examples.common.environment import (
    CONFIGURATION_ERROR,
    reporting_refusals,
    require_openai_service,
    require_reachable,
)

DEFAULT_HOSTED_BASE_URL = "https://api.openai.com/v1"
DEFAULT_LOCAL_MODEL = "smollm2-135m-instruct"


@dataclass
class ProxiedCall:
    """What one call through the gateway gave: the reply and the span the gateway stored for it."""

    reply: str
    rollout_id: str
    span: agl.Span


def local_backend(base_url: str, model: str) -> Dict[str, Any]:
    """A ``model_list`` entry for an ``agentbolt serve`` (or vLLM) server: token ids and logprobs recorded."""
    return {"model_name": model, "litellm_params": {"model": f"agentbolt/{model}", "api_base": base_url}}


def hosted_backend(model: str, base_url: Optional[str] = None, api_key: Optional[str] = None) -> Dict[str, Any]:
    """A ``model_list`` entry for a hosted OpenAI-compatible API.

    The base URL defaults to ``$OPENAI_BASE_URL`` (else OpenAI's), the key to ``$OPENAI_API_KEY``.
    """
    base_url = base_url or os.environ.get("OPENAI_BASE_URL") or DEFAULT_HOSTED_BASE_URL
    api_key = api_key or os.environ.get("OPENAI_API_KEY")
    if not api_key:
        raise SystemExit("hosted: set OPENAI_API_KEY (the key of the hosted API)")
    return {
        "model_name": model,
        "litellm_params": {"model": f"openai/{model}", "api_base": base_url, "api_key": api_key},
    }


async def call_through_gateway(backend: Dict[str, Any], question: str, max_tokens: int = 16) -> ProxiedCall:
    """Start a gateway on a free port in front of ``backend``, make one call bound to a rollout, return its span."""
    store = agl.InMemoryLightningStore()
    proxy = agl.LLMProxy(
        port=pick_free_port("127.0.0.1"), model_list=[backend], store=store, launch_mode="asyncio", num_retries=1
    )
    await proxy.start()
    try:
        resource = proxy.as_resource()
        rollout = await store.start_rollout(input={"question": question})
        base_url = resource.get_base_url(rollout.rollout_id, rollout.attempt.attempt_id)
        from openai import AsyncOpenAI

        async with AsyncOpenAI(base_url=base_url, api_key=resource.api_key or "none") as client:
            reply = await client.chat.completions.create(
                model=resource.model, messages=[{"role": "user", "content": question}], max_tokens=max_tokens
            )
        await proxy.flush()  # the span is written off the request path: wait for it
        [span] = await store.query_spans(rollout.rollout_id)
        return ProxiedCall(reply.choices[0].message.content or "", rollout.rollout_id, span)
    finally:
        await proxy.stop()


@contextlib.contextmanager
def local_server(base_url: Optional[str], start: Optional[str]) -> Iterator[str]:
    """The base URL of the local engine: the one given, or an ``agentbolt serve`` started for the block."""
    if base_url is not None:
        yield base_url
        return
    with LocalModelServer(start or DEFAULT_LOCAL_MODEL, served_name="local") as server:
        yield server.base_url


def served_model(base_url: str) -> str:
    """The first model a server lists in ``/v1/models``.

    Raises:
        ValueError: The server's answer is not an OpenAI model list with a model in it.
    """
    import httpx

    answer = httpx.get(f"{base_url}/models", timeout=10)
    try:
        return str(answer.json()["data"][0]["id"])
    except (ValueError, KeyError, IndexError, TypeError):
        raise ValueError(
            f"{base_url}/models answered HTTP {answer.status_code} without a model list: {answer.text[:120]!r}"
        ) from None


def summary(call: ProxiedCall) -> str:
    attributes = call.span.attributes
    prompt_ids = attributes.get("prompt_token_ids") or []
    response_ids = attributes.get("response_token_ids") or []
    return (
        f"reply: {call.reply!r}\nspan {call.span.name!r} of rollout {call.rollout_id}, sequence id "
        f"{call.span.sequence_id}: {len(prompt_ids)} prompt token ids, {len(response_ids)} response token ids"
    )


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m examples.minimal.llm_proxy", description=__doc__.split("\n")[0])
    parser.add_argument("--question", default="What is the capital of France?")
    backends = parser.add_subparsers(dest="backend", required=True)
    local = backends.add_parser("local", help="in front of agentbolt serve")
    where = local.add_mutually_exclusive_group()
    where.add_argument("--base-url", default=None, help="a running server's /v1 URL (default: start one)")
    where.add_argument("--start", default=None, help="model to serve when no --base-url is given")
    local.add_argument("--model", default=None, help="served model name (default: the server's first)")
    hosted = backends.add_parser("hosted", help="in front of a hosted OpenAI-compatible API")
    hosted.add_argument("--base-url", default=None, help="default: $OPENAI_BASE_URL, else OpenAI")
    hosted.add_argument("--model", default="gpt-4o-mini")
    args = parser.parse_args(argv)
    if args.backend == "hosted":
        environ = dict(os.environ)
        if args.base_url is not None:
            environ["OPENAI_BASE_URL"] = args.base_url
        require_openai_service(
            parser,
            needed_by="hosted",
            alternative="use the local backend (python -m examples.minimal.llm_proxy local), which needs no key",
            environ=environ,
        )
        with reporting_refusals(
            parser,
            service="the hosted API (through the gateway)",
            configure="check OPENAI_API_KEY (the key of the hosted API) and --model (a model it serves)",
        ):
            call = asyncio.run(call_through_gateway(hosted_backend(args.model, args.base_url), args.question))
    else:
        if args.base_url is not None:
            require_reachable(
                parser,
                f"{args.base_url.rstrip('/')}/models",
                service="the local engine",
                configure="start one (agentbolt serve smollm2-135m-instruct --port PORT) or drop --base-url to let "
                "this script start one",
            )
        else:
            try:  # before a server process is started for it
                resolve_model(args.start or DEFAULT_LOCAL_MODEL)
            except ModelNotAvailableError as exc:
                parser.exit(CONFIGURATION_ERROR, f"error: --start: {exc}\n")
        with local_server(args.base_url, args.start) as base_url:
            try:
                model = args.model or served_model(base_url)
            except ValueError as exc:
                parser.exit(CONFIGURATION_ERROR, f"error: --base-url: {exc}; pass --model, or a server's /v1 URL\n")
            backend = local_backend(base_url, model)
            call = asyncio.run(call_through_gateway(backend, args.question))
    print(summary(call))


if __name__ == "__main__":
    main()
