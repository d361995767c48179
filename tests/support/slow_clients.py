"""Clients that send their requests too slowly, over raw sockets: a request head or body trickled a byte at a time.

Each sends until the server answers or closes the connection (never for a fixed time, so no test depends on how
fast the machine is), then reads the answer and whether the server closed the connection after it.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from typing import Dict, Optional

import orjson

__all__ = ["SlowAnswer", "trickle"]

GIVE_UP_SECONDS = 60.0
"""Longest a slow client waits for the server to act: guards against a hang only."""


@dataclass
class SlowAnswer:
    """What the server answered a slow client."""

    status: Optional[int]
    """The answer's status; None when the server closed the connection without answering."""
    headers: Dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    closed: bool = False
    """Whether the server closed the connection after its answer."""
    sent: int = 0
    """Bytes of the trickled part the server received before it acted."""

    def json(self) -> object:
        return orjson.loads(self.body)


async def trickle(
    address: str, prefix: bytes, trickled: bytes, *, interval: float = 0.05, give_up: float = GIVE_UP_SECONDS
) -> SlowAnswer:
    """Send ``prefix`` to ``address`` (``http://host:port``) at once, then ``trickled`` one byte every ``interval``
    seconds until the server answers or closes the connection; read the answer and whether the connection closes.
    With ``trickled`` empty, the client waits without sending.

    Raises:
        AssertionError: The server neither answered nor closed the connection within ``give_up`` seconds, or the
            client sent all of ``trickled`` before the server acted.
    """
    host, port = address.split("//", 1)[-1].rstrip("/").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    answer = SlowAnswer(status=None)
    try:
        if prefix:
            writer.write(prefix)
            await writer.drain()
        head = asyncio.ensure_future(_read_head(reader))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + give_up
        while not head.done():
            assert loop.time() < deadline, f"the server did not act within {give_up:g} s"
            if trickled:
                assert answer.sent < len(trickled), "the whole request was sent before the server acted"
                with contextlib.suppress(ConnectionError):
                    writer.write(trickled[answer.sent : answer.sent + 1])
                    await writer.drain()
                    answer.sent += 1
            await asyncio.wait({head}, timeout=interval)
        raw_head = head.result()
        if raw_head:
            lines = raw_head.decode("latin-1").split("\r\n")
            answer.status = int(lines[0].split(" ", 2)[1])
            answer.headers = {
                name.strip().lower(): value.strip()
                for name, _, value in (line.partition(":") for line in lines[1:] if line)
            }
            answer.body = await asyncio.wait_for(
                reader.readexactly(int(answer.headers.get("content-length", "0"))), give_up
            )
        answer.closed = await asyncio.wait_for(_closed(reader), give_up)
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()
    return answer


async def _read_head(reader: asyncio.StreamReader) -> bytes:
    """The answer's head, or b"" when the connection closes first."""
    try:
        return await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, ConnectionError):
        return b""


async def _closed(reader: asyncio.StreamReader) -> bool:
    """Wait until the server closes the connection (True), or sends more (False)."""
    try:
        return await reader.read(1) == b""
    except ConnectionError:
        return True
