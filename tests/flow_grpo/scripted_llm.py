"""A scripted OpenAI-compatible chat server for the Flow-GRPO tests.

It stands in for hosted or large models, which cannot run here: each role (read from the
``x-agentbolt-agent-name`` header, as the solver sends it) gets its scripted answers in order, the last one repeating.
It is a real HTTP server on 127.0.0.1 (a free port) that the real OpenAI SDK talks to. ``FAIL`` as an answer makes
the server reply 500.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Dict, List, Optional

FAIL = "<<fail>>"


class ScriptedLLM:
    """Context manager running the server; :attr:`requests` records ``(role, body)`` of every call."""

    def __init__(self, script: Dict[str, List[str]]) -> None:
        self.script = {role: list(answers) for role, answers in script.items()}
        self.requests: List[tuple[Optional[str], Dict[str, Any]]] = []
        self._lock = threading.Lock()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                return None

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))) or b"{}")
                role = self.headers.get("x-agentbolt-agent-name")
                answer = owner._next(role, body)
                if answer == FAIL:
                    payload = {"error": {"message": "scripted failure", "type": "server_error", "code": 500}}
                    self._send(500, payload)
                    return
                self._send(
                    200,
                    {
                        "id": f"chatcmpl-{len(owner.requests)}",
                        "object": "chat.completion",
                        "created": 0,
                        "model": body.get("model", "scripted"),
                        "choices": [
                            {"index": 0, "message": {"role": "assistant", "content": answer}, "finish_reason": "stop"}
                        ],
                        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
                    },
                )

            def _send(self, status: int, payload: Dict[str, Any]) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def _next(self, role: Optional[str], body: Dict[str, Any]) -> str:
        with self._lock:
            self.requests.append((role, body))
            answers = self.script.get(role or "", [""])
            return answers.pop(0) if len(answers) > 1 else answers[0]

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:<port>/v1``."""
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def roles(self) -> List[Optional[str]]:
        """Roles of the calls received, in order."""
        return [role for role, _ in self.requests]

    def __enter__(self) -> ScriptedLLM:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._server.shutdown()
        self._server.server_close()
