"""A flaky TCP proxy in front of a real server: a stand-in for an unreliable network or load balancer.

Connections are forwarded byte for byte to the upstream server; on demand, the next requests whose request line
matches a path fragment are instead dropped before reaching the server (``"reset"``), forwarded with their answer
dropped (``"drop_answer"``: applied by the server, lost on the way back), delayed (``"delay"``), or answered by the
proxy itself with a status (``"status"``, e.g. 503 or 408). ``refuse()`` closes the listening socket (connections are
refused) until ``accept()``. Every request line seen is recorded in ``requests``.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from typing import List, Literal, Optional, Set

from support.servers import free_port

__all__ = ["FlakyProxy", "Fault"]

FaultMode = Literal["reset", "drop_answer", "delay", "status"]


@dataclass
class Fault:
    """What happens to the next ``count`` requests whose request line contains ``path``."""

    mode: FaultMode
    path: str
    count: int
    status: int = 503
    headers: List[str] = field(default_factory=list)
    delay: float = 0.0


class FlakyProxy:
    """``async with FlakyProxy(upstream_port) as proxy:``; clients use ``proxy.endpoint``."""

    def __init__(self, upstream_port: int, host: str = "127.0.0.1") -> None:
        self.upstream_port = upstream_port
        self.host = host
        self.port = free_port()
        self.endpoint = f"http://{host}:{self.port}"
        self.requests: List[str] = []
        self.faults: List[Fault] = []
        self._server: Optional[asyncio.base_events.Server] = None
        self._connections: Set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> FlakyProxy:
        await self.accept()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.refuse()
        for task in list(self._connections):
            task.cancel()
        for task in list(self._connections):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def accept(self) -> None:
        """Listen (again) on the proxy's port."""
        if self._server is None:
            self._server = await asyncio.start_server(self._on_connection, self.host, self.port, reuse_address=True)

    async def refuse(self) -> None:
        """Stop listening: new connections are refused; established ones are cut."""
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        for task in list(self._connections):
            task.cancel()

    def fail_next(self, mode: FaultMode, path: str, count: int = 1, **options: object) -> Fault:
        """Apply ``mode`` to the next ``count`` requests whose request line contains ``path``."""
        fault = Fault(mode, path, count, **options)  # type: ignore[arg-type]
        self.faults.append(fault)
        return fault

    def count(self, fragment: str) -> int:
        """How many requests seen so far had ``fragment`` in their request line."""
        return sum(1 for line in self.requests if fragment in line)

    def _fault_for(self, request_line: str) -> Optional[Fault]:
        for fault in self.faults:
            if fault.count > 0 and fault.path in request_line:
                fault.count -= 1
                return fault
        return None

    async def _on_connection(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        upstream_writer: Optional[asyncio.StreamWriter] = None
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(self.host, self.upstream_port)
            await self._relay(client_reader, client_writer, upstream_reader, upstream_writer)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError, OSError):
            pass
        finally:
            self._connections.discard(task)
            for writer in (client_writer, upstream_writer):
                if writer is not None:
                    writer.close()

    async def _relay(
        self,
        client_reader: asyncio.StreamReader,
        client_writer: asyncio.StreamWriter,
        upstream_reader: asyncio.StreamReader,
        upstream_writer: asyncio.StreamWriter,
    ) -> None:
        """One HTTP/1.1 request at a time: read it whole, apply a fault or forward it, then relay its answer."""
        while True:
            head = await client_reader.readuntil(b"\r\n\r\n")
            request_line = head.split(b"\r\n", 1)[0].decode("latin-1")
            body = await client_reader.readexactly(_content_length(head))
            self.requests.append(request_line)
            fault = self._fault_for(request_line)
            if fault is not None and fault.mode == "reset":
                return
            if fault is not None and fault.mode == "status":
                payload = b'{"detail": "answered by the flaky proxy"}'
                lines = [f"HTTP/1.1 {fault.status} Proxy Fault", "Content-Type: application/json", *fault.headers]
                lines += [f"Content-Length: {len(payload)}", "Connection: close", "", ""]
                client_writer.write("\r\n".join(lines).encode() + payload)
                await client_writer.drain()
                return
            if fault is not None and fault.mode == "delay":
                await asyncio.sleep(fault.delay)
            upstream_writer.write(head + body)
            await upstream_writer.drain()
            answer_head = await upstream_reader.readuntil(b"\r\n\r\n")
            answer_body = await upstream_reader.readexactly(_content_length(answer_head))
            if fault is not None and fault.mode == "drop_answer":
                return
            client_writer.write(answer_head + answer_body)
            await client_writer.drain()


def _content_length(head: bytes) -> int:
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value.strip())
    return 0
