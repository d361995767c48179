"""Store fixtures: every semantic test runs against every backend through the ``store`` fixture.

Backends: ``memory``, ``memory_thread_safe``, ``threaded`` (LightningStoreThreaded over memory), ``sqlite`` (a real
file in ``tmp_path``), ``postgres`` (a real PostgreSQL server started once per session from the machine's server
binaries, one schema per store), ``http_memory`` / ``http_sqlite`` / ``http_postgres`` (a real LightningStoreServer on
a free 127.0.0.1 port, used through a LightningStoreClient). Backends whose module or server is not available are
skipped, with the reason.
"""

from __future__ import annotations

import contextlib
import importlib
import threading
import uuid
from pathlib import Path
from typing import Any, AsyncIterator, Dict, Iterator, Optional, Tuple, Type

import pytest
from support.postgres import LocalPostgres, postgres_unavailable_reason
from support.servers import free_port

from agentbolt.store.base import LightningStore
from agentbolt.store.memory import InMemoryLightningStore
from agentbolt.store.threading import LightningStoreThreaded
from agentbolt.types import Span
from agentbolt.types.tracer import OtelResource, TraceStatus

IN_PROCESS_BACKENDS = ["memory", "memory_thread_safe", "threaded", "sqlite", "postgres"]
HTTP_BACKENDS = ["http_memory", "http_sqlite", "http_postgres"]
ALL_BACKENDS = IN_PROCESS_BACKENDS + HTTP_BACKENDS


def _import_or_skip(module: str) -> Any:
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name == module:
            pytest.skip(f"{module} is not available")
        raise


def _sqlite_store(path: Path, scan_debounce_seconds: float) -> LightningStore:
    sqlite = _import_or_skip("agentbolt.store.sqlite")
    return sqlite.SqliteLightningStore(str(path), scan_debounce_seconds=scan_debounce_seconds)


_POSTGRES: Dict[str, Any] = {}
_POSTGRES_LOCK = threading.Lock()


def postgres_server() -> LocalPostgres:
    """The PostgreSQL server of this test session (started on first use, by one thread; skips when none can be
    started)."""
    with _POSTGRES_LOCK:
        return _postgres_server()


def _postgres_server() -> LocalPostgres:
    if "server" not in _POSTGRES:
        reason = _POSTGRES.get("reason") or postgres_unavailable_reason()
        if reason is None:
            try:
                _POSTGRES["server"] = LocalPostgres()
            except Exception as exc:
                reason = f"PostgreSQL could not be started: {exc}"
        if reason is not None:
            _POSTGRES["reason"] = reason
            pytest.skip(reason)
    return _POSTGRES["server"]  # type: ignore[no-any-return]


def postgres_schema() -> str:
    """A fresh schema name: each store of a test gets its own tables in the session's database."""
    return "t_" + uuid.uuid4().hex[:16]


def drop_postgres_schema(schema: str) -> None:
    server = _POSTGRES.get("server")
    if server is not None:
        server.psql(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


def _postgres_store(scan_debounce_seconds: float) -> LightningStore:
    postgres = _import_or_skip("agentbolt.store.postgres")
    server = postgres_server()
    return postgres.PostgresLightningStore(
        server.dsn(), schema=postgres_schema(), scan_debounce_seconds=scan_debounce_seconds
    )


def pytest_sessionfinish(session: pytest.Session) -> None:
    server = _POSTGRES.pop("server", None)
    if server is not None:
        server.close()


async def _close(store: Any) -> None:
    close = getattr(store, "close", None)
    if close is not None:
        await close()
    schema = getattr(store, "schema", None)
    if isinstance(schema, str) and schema.startswith("t_"):
        drop_postgres_schema(schema)


def _inner_store(backend: str, tmp_path: Path, scan_debounce_seconds: float, **memory_kwargs: Any) -> LightningStore:
    if backend == "memory":
        return InMemoryLightningStore(scan_debounce_seconds=scan_debounce_seconds, **memory_kwargs)
    if backend == "memory_thread_safe":
        return InMemoryLightningStore(thread_safe=True, scan_debounce_seconds=scan_debounce_seconds, **memory_kwargs)
    if backend == "threaded":
        return LightningStoreThreaded(
            InMemoryLightningStore(scan_debounce_seconds=scan_debounce_seconds, **memory_kwargs)
        )
    if backend == "sqlite":
        return _sqlite_store(tmp_path / "store.db", scan_debounce_seconds)
    if backend == "postgres":
        return _postgres_store(scan_debounce_seconds)
    raise ValueError(f"unknown backend {backend!r}")


@contextlib.asynccontextmanager
async def make_store(
    backend: str, tmp_path: Path, *, scan_debounce_seconds: float = 10.0, **memory_kwargs: Any
) -> AsyncIterator[LightningStore]:
    """Build the store under test for ``backend`` and tear it down afterwards."""
    if backend in IN_PROCESS_BACKENDS:
        store = _inner_store(backend, tmp_path, scan_debounce_seconds, **memory_kwargs)
        try:
            yield store
        finally:
            await _close(store)
            if isinstance(store, LightningStoreThreaded):
                await _close(store.store)
        return
    client_server = _import_or_skip("agentbolt.store.client_server")
    inner_kind = {"http_memory": "memory_thread_safe", "http_sqlite": "sqlite", "http_postgres": "postgres"}[backend]
    inner = _inner_store(inner_kind, tmp_path, scan_debounce_seconds, **memory_kwargs)
    server = client_server.LightningStoreServer(inner, host="127.0.0.1", port=free_port())
    await server.start()
    # No retries: the server answers every request of these tests; a failure must surface at once.
    client = client_server.LightningStoreClient(server.endpoint, retry_delays=(), health_retry_delays=())
    try:
        yield client
    finally:
        await client.close()
        await server.stop()
        await _close(inner)


@pytest.fixture(params=ALL_BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    """Name of the backend under test."""
    return str(request.param)


@pytest.fixture
async def store(backend: str, tmp_path: Path) -> AsyncIterator[LightningStore]:
    """A fresh store of every backend kind."""
    async with make_store(backend, tmp_path) as created:
        yield created


@pytest.fixture(params=IN_PROCESS_BACKENDS)
def inproc_backend(request: pytest.FixtureRequest) -> str:
    """Name of an in-process backend (for tests controlling the clock or reading internals)."""
    return str(request.param)


def is_http(store: LightningStore) -> bool:
    """Whether ``store`` talks to a server over HTTP."""
    return type(store).__name__ == "LightningStoreClient"


@contextlib.contextmanager
def raises_store_error(
    store: LightningStore, exc_type: Type[BaseException], match: Optional[str] = None, http_status: Tuple[int, ...] = ()
) -> Iterator[None]:
    """Expect ``exc_type`` in process, or an HTTP error response (4xx, or one of ``http_status``) over HTTP.

    The server's message is checked against ``match`` in both cases.
    """
    if not is_http(store):
        with pytest.raises(exc_type, match=match):
            yield
        return
    import aiohttp

    with pytest.raises(aiohttp.ClientResponseError) as info:
        yield
    status = info.value.status
    assert (400 <= status < 500) or status in http_status, f"unexpected HTTP status {status}"
    if match is not None:
        import re

        assert re.search(match, str(info.value)), f"{match!r} not in {info.value}"


def make_span(rollout_id: str, attempt_id: str, sequence_id: int, span_id: str, **fields: Any) -> Span:
    """A stored-span model with deterministic ids."""
    values: dict[str, Any] = {
        "rollout_id": rollout_id,
        "attempt_id": attempt_id,
        "sequence_id": sequence_id,
        "trace_id": "0" * 31 + "1",
        "span_id": span_id,
        "parent_id": None,
        "name": "llm.call",
        "status": TraceStatus(status_code="OK"),
        "attributes": {"k": 1},
        "events": [],
        "links": [],
        "start_time": 1.0,
        "end_time": 2.0,
        "context": None,
        "parent": None,
        "resource": OtelResource(attributes={}, schema_url=""),
    }
    values.update(fields)
    return Span(**values)


def numbered_span(rollout_id: str, attempt_id: str, sequence_id: int) -> Span:
    """A span whose span id and ``step`` attribute are its sequence id."""
    return make_span(
        rollout_id,
        attempt_id,
        sequence_id,
        f"{sequence_id:016x}",
        trace_id="ab" * 16,
        name="work",
        attributes={"step": sequence_id},
    )
