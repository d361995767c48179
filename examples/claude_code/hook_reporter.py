"""A Claude Code hook command that records each hook event as a span of the running rollout.

Claude Code runs the commands configured under ``hooks`` in its settings file for events such as ``PreToolUse``,
``PostToolUse``, ``UserPromptSubmit`` and ``Stop``, passing the event as a JSON object on standard input
(``session_id``, ``hook_event_name``, ``tool_name``, ``tool_input``, ``tool_response``...). This script reads it and
writes one span, ``claude_code.<hook_event_name>``, to the rollout named by the environment the driver sets:

* ``AGENTBOLT_STORE_URL``: the store server (``agl store``) the trainer uses;
* ``AGENTBOLT_ROLLOUT_ID`` and ``AGENTBOLT_ATTEMPT_ID``: the rollout attempt Claude Code works for.

Tool events carry the tool's name, its input and its output under the ``tool.*`` keys the rest of agentbolt uses. A
hook must never break the coding session: any failure is written to standard error and the script exits 0.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any, Dict

import agentbolt as agl
from agentbolt.store.client_server import LightningStoreClient

ENV_STORE, ENV_ROLLOUT, ENV_ATTEMPT = "AGENTBOLT_STORE_URL", "AGENTBOLT_ROLLOUT_ID", "AGENTBOLT_ATTEMPT_ID"


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)


def span_attributes(event: Dict[str, Any]) -> Dict[str, Any]:
    """The span attributes of one hook event."""
    attributes: Dict[str, Any] = {
        "claude_code.hook_event_name": str(event.get("hook_event_name", "")),
        "claude_code.session_id": str(event.get("session_id", "")),
    }
    if "tool_name" in event:
        attributes["tool.name"] = str(event["tool_name"])
        attributes["tool.parameters"] = _text(event.get("tool_input", {}))
    if "tool_response" in event:
        attributes["tool.output"] = _text(event["tool_response"])
    if "prompt" in event:
        attributes["claude_code.prompt"] = str(event["prompt"])
    return attributes


async def report(event: Dict[str, Any], store_url: str, rollout_id: str, attempt_id: str) -> None:
    """Write the event as a span of the rollout attempt, through the store server."""
    # Short retries and timeouts: Claude Code stops a hook after its timeout (30 s in the driver's settings).
    store = LightningStoreClient(store_url, retry_delays=(0.5,), request_timeout=10.0)
    tracer = agl.OtelTracer(write_timeout=5.0)
    tracer.init_worker(0, store)
    try:
        async with tracer.trace_context(rollout_id=rollout_id, attempt_id=attempt_id) as otel:
            otel.start_span(
                f"claude_code.{event.get('hook_event_name', 'event')}", attributes=span_attributes(event)
            ).end()
    finally:
        tracer.teardown_worker(0)
        await store.close()


def main() -> int:
    try:
        event = json.loads(sys.stdin.read() or "{}")
        missing = [name for name in (ENV_STORE, ENV_ROLLOUT, ENV_ATTEMPT) if not os.environ.get(name)]
        if missing:
            raise RuntimeError(f"not reporting: {', '.join(missing)} not set")
        asyncio.run(report(event, os.environ[ENV_STORE], os.environ[ENV_ROLLOUT], os.environ[ENV_ATTEMPT]))
    except Exception as exc:  # a hook must not stop the coding session
        print(f"agentbolt hook reporter: {exc}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
