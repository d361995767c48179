"""A scripted OpenAI-compatible chat server: a stand-in for a model that answers exactly as a test needs.

A tiny random model never writes a tool call or a well-formed answer, so the paths that follow one (an MCP tool
run, a retrieval, a graded answer) are driven by this stand-in: each request gets the next scripted assistant
message (text, or tool calls), the last one repeating. It is a real HTTP server on 127.0.0.1 that the real OpenAI
SDK and LangChain talk to; :attr:`ScriptedChat.requests` keeps every request body and :attr:`ScriptedChat.agents`
the ``x-agentbolt-agent-name`` header of each.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Dict, List, Optional, Union

__all__ = ["ScriptedChat", "tool_call"]

Reply = Union[str, Dict[str, Any]]


def tool_call(name: str, arguments: Dict[str, Any], call_id: str = "call_1") -> Dict[str, Any]:
    """An assistant message calling one tool."""
    call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}
    return {"role": "assistant", "content": None, "tool_calls": [call]}


class ScriptedChat:
    """Context manager serving ``replies`` in order (a ``str`` is a text reply; a dict is the whole message)."""

    def __init__(self, replies: List[Reply]) -> None:
        self.replies = list(replies)
        self.requests: List[Dict[str, Any]] = []
        self.agents: List[Optional[str]] = []
        self._lock = threading.Lock()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                return None

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))) or b"{}")
                message = owner._next(body, self.headers.get("x-agentbolt-agent-name"))
                payload = {
                    "id": f"chatcmpl-{len(owner.requests)}",
                    "object": "chat.completion",
                    "created": 0,
                    "model": body.get("model", "scripted"),
                    "choices": [
                        {
                            "index": 0,
                            "message": message,
                            "finish_reason": "tool_calls" if message.get("tool_calls") else "stop",
                        }
                    ],
                    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
                }
                data = json.dumps(payload).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def _next(self, body: Dict[str, Any], agent: Optional[str]) -> Dict[str, Any]:
        with self._lock:
            self.requests.append(body)
            self.agents.append(agent)
            reply = self.replies.pop(0) if len(self.replies) > 1 else self.replies[0]
        return {"role": "assistant", "content": reply} if isinstance(reply, str) else reply

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:<port>/v1``."""
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def __enter__(self) -> ScriptedChat:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._server.shutdown()
        self._server.server_close()
