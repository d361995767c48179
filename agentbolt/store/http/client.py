"""The store client: a :class:`LightningStore` reached over HTTP (aiohttp), with the reference's retry contract.

Each store method is implemented from its row in :mod:`agentbolt.store.http.routes`; the few with client-side
behaviour of their own (dequeue, waits, batches) are written out below.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import logging
import os
import threading
import time
from contextvars import ContextVar
from typing import Any, Dict, List, Literal, Optional, Sequence, Tuple
from urllib.parse import quote

import aiohttp
import yarl
from opentelemetry.sdk.trace import ReadableSpan

from agentbolt.env_var import API_KEY_ENV_VAR
from agentbolt.store.base import (
    ADDRESSED_IDS,
    ROUTE_WORDS,
    UNSET,
    LightningStore,
    LightningStoreCapabilities,
    Unset,
    check_addressable_id,
    queue_wait_seconds,
    rollout_wait_arguments,
)
from agentbolt.store.http.errors import LightningStoreHTTPError, error_from_response, is_auth_error
from agentbolt.store.http.routes import (
    API_V1_AGL_PREFIX,
    ROUTES,
    ROUTES_BY_METHOD,
    STORE_ID_HEADER,
    StoreRoute,
)
from agentbolt.store.outage import StoreUnreachableError, outage_tolerance
from agentbolt.store.utils import MAX_SHORT_WAIT_SECONDS
from agentbolt.types import EnqueueRolloutRequest, Rollout, Span
from agentbolt.types.wire import decode_json, encode_json_repairing
from agentbolt.utils.collector import collection_paused

__all__ = ["LightningStoreClient"]

logger = logging.getLogger("agentbolt.store.client")


async def _awaited(result: Any) -> None:
    """Await ``result`` if it is awaitable (aiohttp's ``close`` methods return an awaitable; old versions None)."""
    if inspect.isawaitable(result):
        await result


async def _release(session: aiohttp.ClientSession) -> None:
    """Release a session whose event loop is gone: its transports can no longer be shut down politely, so closing
    its connector here (aiohttp's close is awaitable, a coroutine in recent versions) marks it closed and drops them."""
    if session.closed:
        return
    connector = session.connector
    session.detach()
    if connector is not None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(_awaited(connector.close()), timeout=5.0)


_RETRYABLE_STATUSES = frozenset({408, 500, 502, 503, 504})
"""Answers after which a request may be sent again (the contract's 5xx and 408; 501 is final)."""

_maybe_applied: ContextVar[bool] = ContextVar("agentbolt_store_request_maybe_applied", default=False)
"""Whether the current task's last request was sent again after a failure that may have left it applied."""


class LightningStoreClient(LightningStore):
    """A :class:`LightningStore` living in a :class:`~agentbolt.store.http.server.LightningStoreServer`, over HTTP.

    One aiohttp session (keep-alive connection pool) per event loop.

    Retries (the reference's contract): a call is tried once, then once more after each delay of ``retry_delays``
    (``1 + len(retry_delays)`` attempts) when it fails with 5xx (except 501), 408, or a network error
    (``ServerDisconnectedError``, ``ClientConnectorError``, ``ClientOSError``, ``asyncio.TimeoutError``), as long
    as the server's health endpoint answers within ``health_retry_delays`` (one probe per delay plus a final one;
    an empty tuple skips probing). Other 4xx answers raise at once. One refinement keeps a retry from applying a
    call twice: calls that are not idempotent (``start_rollout``, ``enqueue_*``, ``start_attempt``,
    ``add_resources``, ``update_resources``) are sent again only when they certainly were not applied (the
    connection could not be opened, or the server answered 503 for a storage outage, which it guarantees changed
    nothing); after an ambiguous failure (connection lost mid-request, timeout) they raise. Dequeues are never
    retried and return nothing on failure.

    Inside :func:`~agentbolt.store.outage.ride_out_outages` (as a runner opens around each rollout), retryable
    calls keep retrying for the block's total time instead, whether or not the health endpoint answers, and a call
    that still fails raises :class:`~agentbolt.store.outage.StoreUnreachableError` rather than returning ``None``:
    a store paused or restarted for a few seconds only delays the caller. Inside
    :func:`~agentbolt.store.outage.without_retries` (a process that was asked to stop), calls are sent once: a
    retryable failure raises :class:`~agentbolt.store.outage.StoreUnreachableError` at once, without retries or
    health probes.

    An outage is logged as a warning when the client first meets it and when the store answers again; the calls that
    fail in between log at DEBUG level, so a process waiting for its store does not log a warning per retry.

    Errors answered by the server raise :class:`~agentbolt.store.http.errors.LightningStoreHTTPError` (an
    :class:`aiohttp.ClientResponseError`) carrying the server's message.

    Args:
        server_address: Base URL of the server, e.g. ``http://127.0.0.1:4747``.
        retry_delays: Seconds to wait before each retry.
        health_retry_delays: Delays between health probes after a failure (empty: do not probe).
        request_timeout: Total seconds allowed per request.
        connection_timeout: Seconds allowed to open a connection.
        api_key: Bearer token; defaults to ``$AGENTBOLT_API_KEY``.
        expected_server_id: The ``server_id`` of the server this client works for. When given, every request
            carries it and any other server refuses the request (409, ``StoreIdentityMismatch``) instead of serving
            it.
        long_waits: Accept ``wait_for_rollouts`` timeouts above 0.1 s (and ``None``), splitting them into
            server-side waits of at most :attr:`wait_slice_seconds`. By default, as in the reference, longer
            timeouts raise ``ValueError`` so that no request blocks a connection for long.
    """

    wait_slice_seconds: float = 10.0
    """Longest server-side wait of one ``wait_for_rollouts`` request (``long_waits=True``)."""

    def __init__(
        self,
        server_address: str,
        *,
        retry_delays: Sequence[float] = (1.0, 2.0, 5.0),
        health_retry_delays: Sequence[float] = (0.1, 0.2, 0.5),
        request_timeout: float = 30.0,
        connection_timeout: float = 5.0,
        api_key: Optional[str] = None,
        expected_server_id: Optional[str] = None,
        long_waits: bool = False,
    ) -> None:
        if not isinstance(server_address, str) or not server_address.startswith(("http://", "https://")):
            raise ValueError(f"server_address must be an http:// or https:// URL, got {server_address!r}")
        root = server_address.rstrip("/")
        if root.endswith(API_V1_AGL_PREFIX):  # the API's own URL, as the server prints it
            root = root[: -len(API_V1_AGL_PREFIX)]
        self.server_address_root = root
        self.server_address = self.server_address_root + API_V1_AGL_PREFIX
        self._retry_delays = tuple(retry_delays)
        self._health_retry_delays = tuple(health_retry_delays)
        self._request_timeout = request_timeout
        self._connection_timeout = connection_timeout
        self._api_key = api_key if api_key is not None else (os.environ.get(API_KEY_ENV_VAR) or None)
        self.expected_server_id = expected_server_id
        self.long_waits = long_waits
        # Loops are held (not weakly referenced) so that a session outliving its loop is still closed, by the next
        # call from another loop or by close(), instead of being dropped open when the loop is collected.
        self._sessions: Dict[asyncio.AbstractEventLoop, aiohttp.ClientSession] = {}
        self._sessions_lock = threading.Lock()  # threads with loops of their own share the client
        self._dequeue_succeeded = False
        self._dequeue_failure_logged = False
        self._queue_waits_unsupported = False
        self._unreachable_since: Optional[float] = None  # when a call last gave up on an unreachable store

    def __getstate__(self) -> Dict[str, Any]:
        state = self.__dict__.copy()
        state["_sessions"] = None
        state["_sessions_lock"] = None
        return state

    def __setstate__(self, state: Dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._sessions = {}
        self._sessions_lock = threading.Lock()

    @property
    def capabilities(self) -> LightningStoreCapabilities:
        """All capabilities (the server provides them)."""
        return LightningStoreCapabilities(thread_safe=True, async_safe=True, zero_copy=True, otlp_traces=True)

    def otlp_traces_endpoint(self) -> str:
        """OTLP/HTTP traces URL of the server."""
        return f"{self.server_address_root}/v1/traces"

    # -- transport ----------------------------------------------------------------------------------------------

    def _headers(self) -> Dict[str, str]:
        headers = {"Accept": "application/json"}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        if self.expected_server_id:
            headers[STORE_ID_HEADER] = self.expected_server_id
        return headers

    async def get_server_id(self) -> Optional[str]:
        """The ``server_id`` the server at this address reports (one health request, no retries).

        Returns:
            The id, or None when the server reports none (another kind of server).

        Raises:
            aiohttp.ClientError: Nothing answers at this address.
            LightningStoreHTTPError: The health route answered with an error.
        """
        data = await self._request_json("get", "/health", retry=False)
        server_id = data.get("server_id") if isinstance(data, dict) else None
        return server_id if isinstance(server_id, str) else None

    async def _get_session(self) -> aiohttp.ClientSession:
        """The session of the running event loop (one per loop: a session cannot be used from another)."""
        loop = asyncio.get_running_loop()
        session = self._sessions.get(loop)
        if session is not None and not session.closed:
            return session
        with self._sessions_lock:
            # Sessions of finished event loops cannot be used any more.
            stale = [self._sessions.pop(other) for other in list(self._sessions) if other.is_closed()]
            session = self._sessions.get(loop)
            if session is None or session.closed:
                timeout = aiohttp.ClientTimeout(total=self._request_timeout, connect=self._connection_timeout)
                connector = aiohttp.TCPConnector(limit=100, keepalive_timeout=15.0)
                session = aiohttp.ClientSession(timeout=timeout, connector=connector, headers=self._headers())
                self._sessions[loop] = session
        for old in stale:
            await _release(old)
        return session

    async def close(self) -> None:
        """Close the HTTP sessions this client opened, on every event loop that used it.

        A session belongs to the loop that created it: it is closed there when that loop still runs (e.g. the span
        writer's thread), and released without I/O when that loop is gone.
        """
        try:
            loop: Optional[asyncio.AbstractEventLoop] = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        with self._sessions_lock:
            sessions = list(self._sessions.items())
            self._sessions = {}
        for session_loop, session in sessions:
            if session.closed:
                continue
            if session_loop is loop:
                await session.close()
            elif session_loop.is_running() and not session_loop.is_closed():
                future = asyncio.run_coroutine_threadsafe(session.close(), session_loop)
                try:
                    await asyncio.wait_for(asyncio.wrap_future(future), timeout=5.0)
                except Exception as exc:  # the other loop is stopping or too busy; the process may be exiting
                    logger.debug("Could not close the session of another event loop: %r", exc)
            else:
                await _release(session)

    async def _send(
        self, method: str, path: str, body: Optional[bytes], params: Optional[Any], timeout: Optional[float] | Unset
    ) -> bytes:
        session = await self._get_session()
        kwargs: Dict[str, Any] = {}
        if body is not None:
            kwargs["data"] = body
            kwargs["headers"] = {"Content-Type": "application/json"}
        if params is not None:
            kwargs["params"] = params
        if not isinstance(timeout, Unset):
            kwargs["timeout"] = aiohttp.ClientTimeout(total=timeout, connect=self._connection_timeout)
        url: Any = self.server_address + path
        if "%2E" in path:
            # An id "." or "..": as sent, without the normalization that would make it step out of the path.
            url = yarl.URL(url, encoded=True)
        async with session.request(method, url, **kwargs) as response:
            self._store_answered()
            payload = await response.read()
            if response.status >= 400:
                raise error_from_response(response, payload)
            return payload

    async def _probe_health(self) -> bool:
        """Whether the server's health endpoint answers, probing once per health delay plus a final time."""
        if not self._health_retry_delays:
            return True
        session = await self._get_session()
        timeout = aiohttp.ClientTimeout(total=self._connection_timeout)
        for delay in (*self._health_retry_delays, None):
            try:
                async with session.get(self.server_address + "/health", timeout=timeout) as response:
                    if response.status == 200:
                        self._store_answered()
                        return True
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
                pass
            if delay is not None:
                await asyncio.sleep(delay)
        return False

    def _store_answered(self) -> None:
        """Note that the server answered; log it once when calls had been giving up on it."""
        since, self._unreachable_since = self._unreachable_since, None
        if since is not None:
            logger.warning(
                "The store at %s answers again (after %.1f s unreachable)",
                self.server_address_root,
                time.monotonic() - since,
            )

    def _store_unreachable(self) -> None:
        """Note that a call gave up on an unreachable server (from now on, failures log at DEBUG level)."""
        if self._unreachable_since is None:
            self._unreachable_since = time.monotonic()

    def _log_failure(self, message: str, *args: Any) -> None:
        """Log a failed call: a warning, or DEBUG while the server is known to be unreachable (one line per outage)."""
        level = logging.DEBUG if self._unreachable_since is not None else logging.WARNING
        logger.log(level, message, *args)

    @staticmethod
    def _may_resend(exc: BaseException, idempotent: bool) -> bool:
        """Whether a request that failed with ``exc`` may be sent again (noted in :data:`_maybe_applied` when the
        failed send may have been applied)."""
        if isinstance(exc, LightningStoreHTTPError):
            if exc.status not in _RETRYABLE_STATUSES:
                return False
            # 408: the server gave up before reading the whole request, so it did nothing with it.
            if exc.not_applied or exc.status == 408:
                return True
        elif isinstance(exc, aiohttp.ClientConnectorError):
            return True  # the connection was never opened: nothing was sent
        elif not isinstance(exc, (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError, asyncio.TimeoutError)):
            return False
        if idempotent:
            _maybe_applied.set(True)
        return idempotent

    async def _request_json(self, method: Literal["get", "post"], path: str, **options: Any) -> Any:
        """Send a request (see :meth:`_request`) and return its answer parsed (``None`` for an empty answer)."""
        raw = await self._request(method, path, **options)
        if not raw:
            return None
        with collection_paused():
            return decode_json(raw)

    async def _request(
        self,
        method: Literal["get", "post"],
        path: str,
        *,
        json: Any = None,
        params: Optional[Any] = None,
        idempotent: bool = True,
        timeout: Optional[float] | Unset = UNSET,
        retry: bool = True,
    ) -> bytes:
        """Send a request and return the raw JSON answer, retrying per the client's policy.

        Args:
            method: HTTP method.
            path: Path under ``/v1/agl``.
            json: Body; serialized with pydantic-core (models allowed). ``None`` sends no body.
            params: Query parameters.
            idempotent: Whether resending after an ambiguous failure is harmless.
            timeout: Total timeout override for this request (``None``: no limit).
            retry: Whether to retry at all.

        Raises:
            LightningStoreHTTPError: The server answered with an error.
            aiohttp.ClientError: The server could not be reached.
        """
        body = encode_json_repairing(json) if json is not None else None
        _maybe_applied.set(False)
        delays = self._retry_delays if retry else ()
        tolerance = outage_tolerance() if delays else None
        if tolerance is not None:
            return await self._request_riding_out(method, path, body, params, timeout, idempotent, delays, tolerance)
        attempt = 0
        while True:
            try:
                return await self._send(method.upper(), path, body, params, timeout)
            except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                if attempt >= len(delays) or not self._may_resend(exc, idempotent):
                    raise
                failure: BaseException = exc
                self._log_failure("%s %s failed (%s); will retry", method.upper(), path, _describe(exc))
            if not await self._probe_health():
                self._log_failure(
                    "Server %s is not healthy; giving up %s %s (later failures while it is unreachable are logged "
                    "at DEBUG level)",
                    self.server_address_root,
                    method,
                    path,
                )
                self._store_unreachable()
                raise failure
            await asyncio.sleep(delays[attempt])
            attempt += 1
            logger.info("Retrying %s %s (retry %d of %d)", method.upper(), path, attempt, len(delays))

    async def _request_riding_out(
        self,
        method: str,
        path: str,
        body: Optional[bytes],
        params: Optional[Any],
        timeout: Optional[float] | Unset,
        idempotent: bool,
        delays: Tuple[float, ...],
        tolerance: float,
    ) -> bytes:
        """Send a request inside :func:`~agentbolt.store.outage.ride_out_outages`: retry for up to ``tolerance`` s.

        The health endpoint is not consulted (a server being restarted does not answer it either); the waits are
        ``delays`` with the last one repeated, cut to the time left; a ``tolerance`` of 0 (inside
        :func:`~agentbolt.store.outage.without_retries`) allows no retry at all. Which failures may be retried is
        decided as outside the block (:meth:`_may_resend`); a 500 answer (the server failing rather than unreachable)
        is retried only ``len(delays)`` times, as outside the block.

        Raises:
            StoreUnreachableError: Retryable failures went on for ``tolerance`` seconds.
        """
        verb = method.upper()
        started = time.monotonic()
        attempt = 0
        while True:
            try:
                answer = await self._send(verb, path, body, params, timeout)
            except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                if not self._may_resend(exc, idempotent):
                    raise
                # A 500 is the server failing, not the store being away: it gets only the usual retries.
                if isinstance(exc, LightningStoreHTTPError) and exc.status == 500 and attempt >= len(delays):
                    raise
                waited = time.monotonic() - started
                if not tolerance:  # sent once, as asked: the caller reports what could not be done
                    self._store_unreachable()
                    message = f"{verb} {path} failed (not retried): {_describe(exc)}"
                    logger.debug("%s", message)
                    raise StoreUnreachableError(message) from exc
                if waited >= tolerance:
                    message = (
                        f"{verb} {path} gave up: the store at {self.server_address_root} stayed unreachable for "
                        f"{waited:.1f} s (limit {tolerance:g} s); last error: {_describe(exc)}"
                    )
                    logger.error("%s", message)
                    self._store_unreachable()
                    raise StoreUnreachableError(message) from exc
                if attempt == 0:
                    self._log_failure(
                        "%s %s failed (%s); retrying for up to %g s while the store is unreachable",
                        verb,
                        path,
                        _describe(exc),
                        tolerance,
                    )
                await asyncio.sleep(min(delays[min(attempt, len(delays) - 1)], tolerance - waited))
                attempt += 1
                continue
            if attempt:
                logger.info("%s %s succeeded after %.1f s of store outage", verb, path, time.monotonic() - started)
            return answer

    async def _call_route(self, route: StoreRoute, values: Dict[str, Any]) -> Any:
        """Run one store call through its route: build the request from the call's arguments, decode the answer."""
        idempotent = route.resendable(values)
        arguments = dict(values)
        for name in set(route.path_params) & ADDRESSED_IDS:
            if route.verb == "GET" and values[name] in ROUTE_WORDS:
                return None  # no stored id is a route word (see check_addressable_id); the path would name the route
            check_addressable_id(values[name], name)
        path = route.path.format(**{name: _path_segment(values.pop(name)) for name in route.path_params})
        if route.body_param is not None:
            payload: Any = values[route.body_param]
        elif route.bundled:
            (payload,) = values.values()
        else:
            payload = {name: value for name, value in values.items() if not isinstance(value, Unset)} or None
        json, params = (None, _query_params(payload)) if route.verb == "GET" else (payload, None)
        try:
            raw = await self._request(
                "get" if route.verb == "GET" else "post",
                path,
                json=json,
                params=params,
                idempotent=idempotent,
                retry=route.retried,
            )
            with collection_paused():
                answer = route.decode(raw)
            if answer is None and route.refetch is not None and _maybe_applied.get():
                # An earlier send was applied and its answer lost: the resend found its own result already there.
                return await route.refetch(self, arguments)
            return answer
        except Exception as exc:
            # Inside ride_out_outages a call that still fails raises, so that "no answer" is not taken for "none".
            if route.on_failure == "raise" or is_auth_error(exc) or (route.retried and outage_tolerance() is not None):
                raise
            self._log_swallowed_failure(route, exc)
            return None if route.on_failure == "none" else []

    def _log_swallowed_failure(self, route: StoreRoute, exc: BaseException) -> None:
        if route.on_failure == "empty":  # dequeue: polled constantly, so one warning after it last worked
            if self._dequeue_succeeded and not self._dequeue_failure_logged:
                logger.warning("%s on %s failed: %s", route.store_method, self.server_address_root, _describe(exc))
                self._dequeue_failure_logged = True
            else:
                logger.debug("%s on %s failed: %s", route.store_method, self.server_address_root, _describe(exc))
            return
        logger.error("%s %s failed: %s", route.verb, route.path, _describe(exc))

    # -- store methods with client-side behaviour of their own ---------------------------------------------------

    async def enqueue_many_rollouts(self, rollouts: Sequence[EnqueueRolloutRequest]) -> Sequence[Rollout]:
        """See :meth:`LightningStore.enqueue_many_rollouts`; an empty list sends nothing."""
        if not rollouts:
            return []
        return await self._call_route(ROUTES_BY_METHOD["enqueue_many_rollouts"], {"rollouts": list(rollouts)})  # type: ignore[no-any-return]

    async def dequeue_rollout(self, worker_id: Optional[str] = None) -> Optional[Any]:
        """See :meth:`LightningStore.dequeue_rollout`; failures (other than auth) yield ``None``."""
        claimed = await self.dequeue_many_rollouts(limit=1, worker_id=worker_id)
        return claimed[0] if claimed else None

    async def dequeue_many_rollouts(self, *, limit: int = 1, worker_id: Optional[str] = None) -> Sequence[Any]:
        """See :meth:`LightningStore.dequeue_many_rollouts`; never retried, failures (other than auth) yield ``[]``."""
        if limit <= 0:
            return []
        route = ROUTES_BY_METHOD["dequeue_many_rollouts"]
        claimed = await self._call_route(route, {"limit": limit, "worker_id": worker_id})
        if claimed:
            self._dequeue_succeeded = True
            self._dequeue_failure_logged = False
        return claimed  # type: ignore[no-any-return]

    async def add_many_spans(self, spans: Sequence[Span]) -> Sequence[Span]:
        """See :meth:`LightningStore.add_many_spans`; one request for the whole batch."""
        spans = list(spans)
        if not spans:
            return []
        positions = await self._call_route(ROUTES_BY_METHOD["add_many_spans"], {"spans": spans})
        return [spans[i] for i in positions]

    async def add_spans_with_new_sequence_ids(self, spans: Sequence[Span]) -> Sequence[Span]:
        """See :meth:`LightningStore.add_spans_with_new_sequence_ids`; one request for the whole batch.

        Safe to resend: the store skips spans it already holds (same attempt and span id).
        """
        spans = list(spans)
        if not spans:
            return []
        data = await self._call_route(ROUTES_BY_METHOD["add_spans_with_new_sequence_ids"], {"spans": spans})
        return [
            spans[i].model_copy(update={"sequence_id": sequence_id})
            for i, sequence_id in zip(data["inserted"], data["sequence_ids"], strict=True)
        ]

    async def get_many_span_sequence_ids(self, rollout_attempt_ids: Sequence[Tuple[str, str]]) -> Sequence[int]:
        """See :meth:`LightningStore.get_many_span_sequence_ids`; one request for all pairs."""
        pairs = [[rollout_id, attempt_id] for rollout_id, attempt_id in rollout_attempt_ids]
        if not pairs:
            return []
        route = ROUTES_BY_METHOD["get_many_span_sequence_ids"]
        return await self._call_route(route, {"rollout_attempt_ids": pairs})  # type: ignore[no-any-return]

    async def add_otel_span(
        self, rollout_id: str, attempt_id: str, readable_span: ReadableSpan, sequence_id: int | None = None
    ) -> Optional[Span]:
        """Convert the span here and send it (asking the server for a sequence id when none is given)."""
        if sequence_id is None:
            sequence_id = await self.get_next_span_sequence_id(rollout_id, attempt_id)
        return await self.add_span(Span.from_opentelemetry(readable_span, rollout_id, attempt_id, sequence_id))

    async def wait_for_rollouts(self, *, rollout_ids: List[str], timeout: Optional[float] = None) -> List[Rollout]:
        """See :meth:`LightningStore.wait_for_rollouts`.

        Raises:
            ValueError: ``timeout`` above 0.1 s on a client created without ``long_waits=True`` (as in the
                reference, the client refuses long blocking requests).
        """
        rollout_ids, timeout = rollout_wait_arguments(rollout_ids, timeout)
        if not self.long_waits:
            if timeout is not None and timeout > MAX_SHORT_WAIT_SECONDS:
                raise ValueError(
                    f"wait_for_rollouts timeout {timeout:g} s is too long for a LightningStoreClient: use at most "
                    f"{MAX_SHORT_WAIT_SECONDS:g} s and poll, or create the client with long_waits=True"
                )
            return await self._wait(rollout_ids, timeout, request_timeout=None if timeout is None else UNSET)
        deadline = None if timeout is None else time.monotonic() + timeout
        finished: Dict[str, Rollout] = {}
        pending = list(dict.fromkeys(rollout_ids))
        while True:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            wait = self.wait_slice_seconds if remaining is None else min(self.wait_slice_seconds, remaining)
            started = time.monotonic()
            for rollout in await self._wait(pending, wait, request_timeout=wait + self._request_timeout):
                finished[rollout.rollout_id] = rollout
            pending = [rid for rid in pending if rid not in finished]
            # A server-side wait that ends before its slice means every known rollout finished (unknown ids are
            # never waited for); only a slice that ran out calls for another one.
            returned_early = time.monotonic() - started < wait * 0.9
            if not pending or returned_early or (deadline is not None and time.monotonic() >= deadline):
                break
        return [finished[rid] for rid in rollout_ids if rid in finished]

    async def wait_for_queued_rollouts(self, timeout: float) -> bool:
        """See :meth:`LightningStore.wait_for_queued_rollouts`: one request, answered when a rollout is queued or the
        timeout has passed on the server.

        A server without this route (another implementation of the store API) is waited out by sleeping, as a store
        that cannot tell does; the client asks such a server once and then remembers.

        Raises:
            ValueError: ``timeout`` is not a finite number of seconds in range (nothing is sent).
            aiohttp.ClientError: The server could not be reached (the wait is not retried: the caller polls again).
        """
        timeout = queue_wait_seconds(timeout)
        if not self._queue_waits_unsupported:
            route = ROUTES_BY_METHOD["wait_for_queued_rollouts"]
            try:
                raw = await self._request(
                    "post",
                    route.path,
                    json={"timeout": timeout},
                    timeout=timeout + self._request_timeout,
                    retry=False,
                )
                return route.decode(raw)  # type: ignore[no-any-return]
            except LightningStoreHTTPError as exc:
                if exc.status not in (404, 405):
                    raise
                self._queue_waits_unsupported = True
                logger.info(
                    "The store at %s cannot wait for queued rollouts; runners poll it instead",
                    self.server_address_root,
                )
        return await super().wait_for_queued_rollouts(timeout)

    async def _wait(
        self, rollout_ids: List[str], timeout: Optional[float], *, request_timeout: Optional[float] | Unset
    ) -> List[Rollout]:
        route = ROUTES_BY_METHOD["wait_for_rollouts"]
        raw = await self._request(
            "post",
            route.path,
            json={"rollout_ids": rollout_ids, "timeout": timeout},
            timeout=request_timeout,
        )
        return route.decode(raw)  # type: ignore[no-any-return]


def _path_segment(value: Any) -> str:
    """``value`` escaped as one path segment; the ids ``.`` and ``..`` too, which would otherwise name the current or
    the parent folder of the path."""
    segment = quote(str(value), safe="")
    return segment.replace(".", "%2E") if segment in (".", "..") else segment


def _query_params(payload: Any) -> Optional[List[Tuple[str, str]]]:
    """Query parameters of a ``GET`` route: the non-``None`` fields of the request (lists as repeated keys)."""
    if payload is None:
        return None
    fields = payload.model_dump() if hasattr(payload, "model_dump") else dict(payload)
    params: List[Tuple[str, str]] = []
    for name, value in fields.items():
        if value is None:
            continue
        for item in value if isinstance(value, list) else [value]:
            params.append((name, str(item)))
    return params


def _describe(exc: BaseException) -> str:
    if isinstance(exc, aiohttp.ClientResponseError):
        return f"{exc.status} {exc.message}"
    return repr(exc)


def _route_method(route: StoreRoute) -> Any:
    """The client method of ``route``: binds the arguments like the :class:`LightningStore` method it implements."""
    declared = getattr(LightningStore, route.method)
    signature = inspect.signature(declared)

    @functools.wraps(declared)
    async def method(self: LightningStoreClient, *args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(self, *args, **kwargs)
        bound.apply_defaults()
        values = dict(bound.arguments)
        del values["self"]
        return await self._call_route(route, values)

    return method


for _route in ROUTES:
    if _route.method not in vars(LightningStoreClient):
        setattr(LightningStoreClient, _route.method, _route_method(_route))
