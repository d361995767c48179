"""The dashboard on the store server: its static single-page app, and the read routes its pages need.

The app is built from ``dashboard/`` in the repository (``make dashboard``) into ``agentbolt/dashboard/``
(``index.html`` and content-hashed files under ``assets/``), which ships in the package. :func:`install_dashboard`
adds to a store server's FastAPI app:

* ``/v1/agl/metrics`` (GET, POST): training metrics (:class:`~agentbolt.types.MetricsRecord`), written by algorithms
  and read by the Training page;
* ``/v1/agl/dashboard/rollouts`` (GET): one page of rollouts with the filters the store's own query lacks (mode,
  resources, worker, time range, reward, text in the input), each with its latest attempt and final reward;
* ``/v1/agl/dashboard/resources`` (GET): per resources version, the finished rollouts that used it and, per purpose
  of a prompt search (or per mode for other rollouts), their score as the prompt optimizers count it;
* ``/v1/agl/dashboard/workers`` (GET): the workers, each with its recent throughput;
* ``/assets/...`` (cached for a year: the names change with the content) and, for every other path outside
  ``/v1/``, the app's ``index.html`` (``/v1/...`` paths that match no route stay 404).

The pages read only these and the store's own ``/v1/agl`` routes. ``index.html`` gets a relative ``<base href>``
computed from the request path, so the app works behind a reverse proxy that serves it under a path prefix.
"""

from __future__ import annotations

import logging
import math
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Awaitable, Callable, Dict, List, Literal, Mapping, Optional, Sequence, Set, Tuple

from fastapi import FastAPI, Query, Request
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException
from starlette.responses import FileResponse, Response
from starlette.staticfiles import StaticFiles
from typing_extensions import Annotated

from agentbolt.types import AttemptedRollout, Rollout, RolloutStatus, Span
from agentbolt.types.wire import decode_json, encode_json_repairing
from agentbolt.utils.reward_spans import REWARD_SPAN_NAME, candidate_score, find_final_reward, training_reward

__all__ = [
    "DASHBOARD_DIR",
    "API_PATHS",
    "DashboardRolloutsRequest",
    "install_dashboard",
    "is_public_page",
]

logger = logging.getLogger("agentbolt.store.server")

DASHBOARD_DIR = Path(__file__).resolve().parent.parent / "dashboard"
"""Where the built dashboard lives inside the package."""

API_PATHS = ("/v1/", "/docs", "/redoc", "/openapi.json")
"""Path prefixes that are not pages of the dashboard (the bearer token guards them)."""

StoreCall = Callable[..., Awaitable[Any]]

_TERMINAL = ("succeeded", "failed", "cancelled")
_SORTABLE = ("start_time", "end_time", "status", "mode", "rollout_id", "resources_id", "duration", "reward")
_STORE_SORTABLE = ("start_time", "end_time", "status", "mode", "rollout_id", "resources_id")
_INPUT_PREVIEW_CHARS = 240
_REWARD_CACHE_SIZE = 50_000
_REWARD_SETTLE_SECONDS = 30.0
"""A rollout that ended this long ago gets no more spans in practice: its reward is cached."""
_THROUGHPUT_WINDOW_SECONDS = 600.0
_THROUGHPUT_SCAN = 1000
_PROMPT_SEARCH_KEY = "prompt_search"
"""Rollout metadata key of the prompt optimizers' tag (``agentbolt.algorithm.apo.search.METADATA_KEY``; the store
imports no algorithm)."""


def is_public_page(path: str) -> bool:
    """Whether ``path`` is a page or asset of the dashboard (served without the bearer token: it holds no data)."""
    return path != "/health" and not path.startswith(API_PATHS)


# ---------------------------------------------------------------------------------------------------------------
# Request models


class DashboardRolloutsRequest(BaseModel):
    """Query of ``GET /v1/agl/dashboard/rollouts``: filters are combined with AND."""

    status: Optional[List[RolloutStatus]] = None
    mode: Optional[List[Literal["train", "val", "test", "none"]]] = None
    resources_id: Optional[str] = None
    worker_id: Optional[str] = Field(default=None, description="Substring of the latest attempt's worker id.")
    start_after: Optional[float] = Field(
        default=None, allow_inf_nan=False, description="Started at or after (seconds since the epoch)."
    )
    start_before: Optional[float] = Field(default=None, allow_inf_nan=False, description="Started at or before.")
    reward_min: Optional[float] = Field(default=None, allow_inf_nan=False)
    reward_max: Optional[float] = Field(default=None, allow_inf_nan=False)
    text: Optional[str] = Field(default=None, max_length=500, description="Substring of the input or rollout id.")
    sort_by: Literal["start_time", "end_time", "status", "mode", "rollout_id", "resources_id", "duration", "reward"] = (
        "start_time"
    )
    sort_order: Literal["asc", "desc"] = "desc"
    limit: int = Field(default=50, ge=1, le=500)
    offset: int = Field(default=0, ge=0, le=2**53)


# ---------------------------------------------------------------------------------------------------------------
# Summaries


def _json(content: Any, status_code: int = 200) -> Response:
    return Response(content=encode_json_repairing(content), status_code=status_code, media_type="application/json")


def _orderable(value: Optional[float]) -> Optional[float]:
    """``value`` for comparisons: NaN, which has no order (it is in no range and sorts last), counts as missing."""
    return None if value is None or math.isnan(value) else value


def _input_text(rollout: Rollout) -> str:
    value = rollout.input
    if isinstance(value, str):
        return value
    try:
        return encode_json_repairing(value).decode()  # integers of any size as written, as the store keeps them
    except TypeError:  # an object JSON cannot carry, kept by an in-process memory store
        return str(value)


def _preview(text: str) -> str:
    return text if len(text) <= _INPUT_PREVIEW_CHARS else text[: _INPUT_PREVIEW_CHARS - 1] + "…"


def _duration(rollout: Rollout, now: float) -> float:
    """How long the rollout took, or, while it has not ended, how long it has been going by the server's clock (so
    that the longest-running rollouts sort first, and a browser's clock does not skew it)."""
    return (now if rollout.end_time is None else rollout.end_time) - rollout.start_time


def _search_purpose(rollout: Rollout) -> Optional[str]:
    """Why a prompt optimizer ran the rollout (``train``, ``val-batch``, ``val-full``...), from its tag; None when no
    optimizer tagged it."""
    tag = (rollout.metadata or {}).get(_PROMPT_SEARCH_KEY)
    purpose = tag.get("purpose") if isinstance(tag, Mapping) else None
    return purpose if isinstance(purpose, str) else None


@dataclass
class _PurposeScores:
    """The finished rollouts of one resources version run for one purpose and mode."""

    rollouts: int = 0
    with_reward: int = 0
    total: float = 0.0


@dataclass
class _VersionScores:
    """The finished rollouts of one resources version, pooled and per ``(purpose, mode)``."""

    rollouts: int = 0
    rewards: List[float] = field(default_factory=list)
    groups: Dict[Tuple[Optional[str], Optional[str]], _PurposeScores] = field(default_factory=dict)

    def add(self, rollout: Rollout, reward: Optional[float]) -> None:
        """Count one rollout with its training reward (see :func:`_training_reward`)."""
        self.rollouts += 1
        if reward is not None:
            self.rewards.append(reward)
        group = self.groups.setdefault((_search_purpose(rollout), rollout.mode), _PurposeScores())
        group.rollouts += 1
        if rollout.status == "succeeded" and reward is not None:
            group.with_reward += 1
        group.total += candidate_score(rollout.status, reward)

    def as_json(self, resources_id: str) -> Dict[str, Any]:
        # Tagged purposes first (alphabetical), then untagged rollouts by mode.
        groups = sorted(self.groups.items(), key=lambda item: (item[0][0] is None, item[0][0] or "", item[0][1] or ""))
        return {
            "resources_id": resources_id,
            "rollouts": self.rollouts,
            "rewarded": len(self.rewards),
            "mean_reward": sum(self.rewards) / len(self.rewards) if self.rewards else None,
            "by_purpose": [
                {
                    "purpose": purpose,
                    "mode": mode,
                    "rollouts": group.rollouts,
                    "with_reward": group.with_reward,
                    "score": group.total / group.rollouts,
                }
                for (purpose, mode), group in groups
            ],
        }


_RewardRule = Callable[[Sequence[Span], str], Optional[float]]
"""How one reward is read from the reward spans of a rollout's attempt (the spans, the rollout id)."""


def _final_reward(spans: Sequence[Span], rollout_id: str) -> Optional[float]:
    """The last reward as emitted (NaN and infinities kept): what the rollout lists show, filter and sort by."""
    return find_final_reward(spans)


def _training_reward(spans: Sequence[Span], rollout_id: str) -> Optional[float]:
    """The reward algorithms train and select on (:func:`~agentbolt.utils.reward_spans.training_reward`: one that is
    not a finite number is none): what the resource scores count."""
    return training_reward(spans, rollout_id, warn=False)


class _RewardCache:
    """Rewards of rollouts that ended a while ago, by ``(rollout_id, attempt_id)`` (least recently used out)."""

    def __init__(self, size: int = _REWARD_CACHE_SIZE) -> None:
        self._size = size
        self._items: OrderedDict[Tuple[str, str], Optional[float]] = OrderedDict()

    def lookup(self, key: Tuple[str, str]) -> Tuple[bool, Optional[float]]:
        """Whether ``key`` is cached, and its reward (None: the attempt has none)."""
        if key in self._items:
            self._items.move_to_end(key)
            return True, self._items[key]
        return False, None

    def put(self, key: Tuple[str, str], value: Optional[float]) -> None:
        self._items[key] = value
        self._items.move_to_end(key)
        while len(self._items) > self._size:
            self._items.popitem(last=False)


class _AttemptRewards:
    """One reward of each rollout's latest attempt, read from its reward spans by one :data:`_RewardRule`.

    Each page needs one kind of reward (the rollout lists the final one, the resource scores the training one), so
    each kind has its own reader and cache, and every reward span is parsed once per read.
    """

    def __init__(self, call: StoreCall, rule: _RewardRule) -> None:
        self._call = call
        self._rule = rule
        self._cache = _RewardCache()

    def _read(self, rollout_id: str, spans: Sequence[Span]) -> Optional[float]:
        """The reward of one attempt; a reward span an agent wrote wrongly is logged and counts as no reward (of this
        attempt only)."""
        try:
            return self._rule(spans, rollout_id)
        except (ValueError, TypeError) as exc:
            logger.warning("Rollout %s has a reward span that cannot be read: %s", rollout_id, exc)
            return None

    async def of(self, rollouts: Sequence[Rollout]) -> List[Optional[float]]:
        """The reward of each rollout's latest attempt, in order (None: no attempt, or no reward).

        The reward spans of every attempt not in the cache are read in one store call.
        """
        keys: List[Optional[Tuple[str, str]]] = []
        known: Dict[Tuple[str, str], Optional[float]] = {}
        unread: Dict[Tuple[str, str], AttemptedRollout] = {}
        for rollout in rollouts:
            if not isinstance(rollout, AttemptedRollout):
                keys.append(None)
                continue
            key = (rollout.rollout_id, rollout.attempt.attempt_id)
            keys.append(key)
            if key in known or key in unread:
                continue
            cached, value = self._cache.lookup(key)
            if cached:
                known[key] = value
            else:
                unread[key] = rollout
        if unread:
            spans_per_attempt = await self._call("query_spans_of_attempts", list(unread), name=REWARD_SPAN_NAME)
            now = time.time()
            for (key, rollout), spans in zip(unread.items(), spans_per_attempt, strict=True):
                known[key] = value = self._read(rollout.rollout_id, spans)
                settled = rollout.end_time is not None and now - rollout.end_time > _REWARD_SETTLE_SECONDS
                if settled and rollout.status in _TERMINAL:
                    self._cache.put(key, value)
        return [None if key is None else known[key] for key in keys]


class _Summaries:
    """Builds the rollout and worker summaries of the dashboard from the store's public methods."""

    def __init__(self, call: StoreCall) -> None:
        self._call = call
        self.final_rewards = _AttemptRewards(call, _final_reward)
        self.training_rewards = _AttemptRewards(call, _training_reward)

    def summary(self, rollout: Rollout, reward: Optional[float], now: float) -> Dict[str, Any]:
        attempt = rollout.attempt if isinstance(rollout, AttemptedRollout) else None
        return {
            "rollout_id": rollout.rollout_id,
            "status": rollout.status,
            "mode": rollout.mode,
            "resources_id": rollout.resources_id,
            "start_time": rollout.start_time,
            "end_time": rollout.end_time,
            "duration": _duration(rollout, now),
            "input_preview": _preview(_input_text(rollout)),
            "reward": reward,
            # Without its metadata, which may be of any size (the rollout page reads it from the attempts route).
            "attempt": None if attempt is None else attempt.model_dump(mode="json", exclude={"metadata"}),
        }

    async def status_counts(self) -> Dict[str, int]:
        counts: Dict[str, int] = {}
        for status in RolloutStatus.__args__:  # type: ignore[attr-defined]
            page = await self._call("query_rollouts", status_in=[status], limit=1)
            counts[status] = int(getattr(page, "total", len(page)))
        return counts

    async def rollouts(self, query: DashboardRolloutsRequest) -> Dict[str, Any]:
        """One page of rollout summaries, the total matching, and the number of rollouts per status."""
        needs_scan = (
            any(
                value is not None
                for value in (
                    query.mode,
                    query.resources_id,
                    query.worker_id,
                    query.start_after,
                    query.start_before,
                    query.reward_min,
                    query.reward_max,
                )
            )
            or bool(query.text)
            or query.sort_by not in _STORE_SORTABLE
        )
        if not needs_scan:
            # The store filters, sorts and pages: only one page is read.
            page = await self._call(
                "query_rollouts",
                status_in=query.status,
                sort_by=query.sort_by,
                sort_order=query.sort_order,
                limit=query.limit,
                offset=query.offset,
            )
            now = time.time()
            rewards = await self.final_rewards.of(page)
            items = [self.summary(r, reward, now) for r, reward in zip(page, rewards, strict=True)]
            total = int(getattr(page, "total", len(items)))
        else:
            items, total = await self._scan(query)
        return {
            "items": items,
            "total": total,
            "limit": query.limit,
            "offset": query.offset,
            "counts": await self.status_counts(),
        }

    async def _scan(self, query: DashboardRolloutsRequest) -> Tuple[List[Dict[str, Any]], int]:
        """Filters the store cannot apply: read the candidates (status-filtered by the store), filter them here."""
        store_sort = query.sort_by if query.sort_by in _STORE_SORTABLE else "start_time"
        # A reward sort or filter reads the whole list the store's own filters leave: a reward lives in the spans of
        # a rollout's latest attempt, and the store can neither order nor filter rollouts by a span's value, nor list
        # reward spans without naming each (rollout, attempt) pair; every candidate's reward decides the total and
        # which rollouts the page shows, and the store's order is the order of ties and of rollouts without one.
        # Beyond being listed, a rollout costs its pair in the one span read of all of them and one parse of its
        # reward span; only the shown page is summarised.
        candidates: Sequence[Rollout] = await self._call(
            "query_rollouts", status_in=query.status, sort_by=store_sort, sort_order=query.sort_order
        )
        modes = None if query.mode is None else {None if m == "none" else m for m in query.mode}
        text = query.text.lower() if query.text else None
        worker = query.worker_id
        wants_reward = query.reward_min is not None or query.reward_max is not None or query.sort_by == "reward"
        matching: List[Rollout] = []
        for rollout in candidates:
            if modes is not None and rollout.mode not in modes:
                continue
            if query.resources_id is not None and rollout.resources_id != query.resources_id:
                continue
            if query.start_after is not None and rollout.start_time < query.start_after:
                continue
            if query.start_before is not None and rollout.start_time > query.start_before:
                continue
            if worker is not None:
                attempt = rollout.attempt if isinstance(rollout, AttemptedRollout) else None
                if attempt is None or attempt.worker_id is None or worker not in attempt.worker_id:
                    continue
            if text is not None and text not in rollout.rollout_id.lower() and text not in _input_text(rollout).lower():
                continue
            matching.append(rollout)
        rewards: List[Optional[float]] = (
            await self.final_rewards.of(matching) if wants_reward else [None] * len(matching)
        )
        # Each kept rollout with its reward as shown, and the value it sorts by (None: missing, NaN included).
        kept: List[Tuple[Rollout, Optional[float], Optional[float]]] = []
        now = time.time()
        for rollout, reward in zip(matching, rewards, strict=True):
            comparable = _orderable(reward)
            if query.reward_min is not None and (comparable is None or comparable < query.reward_min):
                continue
            if query.reward_max is not None and (comparable is None or comparable > query.reward_max):
                continue
            sort_value = _orderable(_duration(rollout, now)) if query.sort_by == "duration" else comparable
            kept.append((rollout, reward, sort_value))
        if query.sort_by in ("duration", "reward"):
            # Missing values go last in both directions; the sort is stable, so ties keep the store's order.
            descending = query.sort_order == "desc"

            def key(item: Tuple[Rollout, Optional[float], Optional[float]]) -> Tuple[bool, float]:
                value = item[2]
                return (value is None, 0.0 if value is None else -value if descending else value)

            kept.sort(key=key)
        page = [(rollout, reward) for rollout, reward, _ in kept[query.offset : query.offset + query.limit]]
        if not wants_reward:
            shown = [rollout for rollout, _ in page]
            page = list(zip(shown, await self.final_rewards.of(shown), strict=True))
        items = [self.summary(rollout, reward, now) for rollout, reward in page]
        return items, len(kept)

    async def resource_scores(self) -> Dict[str, Any]:
        """Per resources version, its finished rollouts and how they scored.

        ``by_purpose`` groups the rollouts by the purpose a prompt optimizer tagged them with (``train``,
        ``val-batch``, ``val-full``...) and their mode (untagged rollouts: by mode alone), and gives each group's
        ``score``: the mean over its rollouts, failed and cancelled ones and those without a finite reward counting
        0, as the optimizers score a candidate. ``rollouts``, ``rewarded`` and ``mean_reward`` pool every purpose:
        the mean of the finite final rewards of the rollouts that have one, whatever their status.
        """
        finished: Sequence[Rollout] = await self._call("query_rollouts", status_in=list(_TERMINAL))
        versioned = [(rollout.resources_id, rollout) for rollout in finished if rollout.resources_id is not None]
        rewards = await self.training_rewards.of([rollout for _, rollout in versioned])
        versions: Dict[str, _VersionScores] = {}
        for (resources_id, rollout), reward in zip(versioned, rewards, strict=True):
            versions.setdefault(resources_id, _VersionScores()).add(rollout, reward)
        return {"items": [version.as_json(resources_id) for resources_id, version in versions.items()]}

    async def workers(self) -> Dict[str, Any]:
        """Workers with the rollouts each finished over the last ten minutes (from the latest attempts of the most
        recently ended rollouts)."""
        workers = await self._call("query_workers")
        now = time.time()
        recent = await self._call(
            "query_rollouts", status_in=list(_TERMINAL), sort_by="end_time", sort_order="desc", limit=_THROUGHPUT_SCAN
        )
        finished: Dict[str, int] = {}
        for rollout in recent:
            if rollout.end_time is None or now - rollout.end_time > _THROUGHPUT_WINDOW_SECONDS:
                continue
            attempt = rollout.attempt if isinstance(rollout, AttemptedRollout) else None
            if attempt is not None and attempt.worker_id:
                finished[attempt.worker_id] = finished.get(attempt.worker_id, 0) + 1
        items = []
        for worker in workers:
            data = worker.model_dump(mode="json")
            count = finished.get(worker.worker_id, 0)
            data["finished_recently"] = count
            data["throughput_per_minute"] = count / (_THROUGHPUT_WINDOW_SECONDS / 60.0)
            items.append(data)
        return {"items": items, "window_seconds": _THROUGHPUT_WINDOW_SECONDS, "now": now}


# ---------------------------------------------------------------------------------------------------------------
# Static app


class _AssetFiles(StaticFiles):
    """Static files whose names carry a hash of their content: cacheable for a year."""

    async def get_response(self, path: str, scope: Any) -> Response:
        response = await super().get_response(path, scope)
        if response.status_code == 200:
            response.headers["cache-control"] = "public, max-age=31536000, immutable"
        return response


def _relative_base(path: str) -> str:
    """``<base href>`` leading from ``path`` (as the browser sent it, still percent-encoded) back to the app's root,
    whatever prefix a proxy serves it under."""
    depth = path.count("/") - 1
    return "./" if depth <= 0 else "../" * depth


def _sent_path(request: Request) -> str:
    """The request's path as the browser wrote it: an encoded ``/`` (``%2F``, as in the address of a resources id
    holding a slash) stays one segment there, so it must not count as a level of the address."""
    raw = request.scope.get("raw_path")
    return raw.decode("latin-1") if raw else request.url.path


_PAGE_POLICY = "; ".join(
    (
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self' data:",
        "connect-src *",  # Settings may point the app at another store
        "object-src 'none'",
        "base-uri 'self'",
        "form-action 'self'",
    )
)
"""Content-Security-Policy of the app's pages: only the app's own files run, so that text an agent wrote which ever
reached the page as markup would run no script and could not lead the page's forms or relative addresses elsewhere."""


def _index_page(index_html: str, path: str) -> Response:
    html = index_html.replace("<head>", f'<head><base href="{_relative_base(path)}">', 1)
    headers = {
        "cache-control": "no-cache",
        "content-security-policy": _PAGE_POLICY,
        "x-content-type-options": "nosniff",
        "referrer-policy": "same-origin",
    }
    return Response(html, media_type="text/html", headers=headers)


def _mount_app(app: FastAPI, directory: Path) -> None:
    index = directory / "index.html"
    assets = directory / "assets"
    if not index.is_file() or not assets.is_dir():
        logger.error("The dashboard is not built (%s is missing); the server runs without it.", index)
        return
    index_html = index.read_text(encoding="utf-8")
    app.mount("/assets", _AssetFiles(directory=str(assets)), name="dashboard-assets")
    favicon = directory / "favicon.svg"

    @app.get("/favicon.svg", include_in_schema=False)
    async def dashboard_favicon() -> Response:
        if not favicon.is_file():
            raise HTTPException(status_code=404, detail="Not Found")
        return FileResponse(favicon, media_type="image/svg+xml", headers={"cache-control": "public, max-age=86400"})

    # Every method, so that an unknown path is a 404 whatever the method, and a known one answered with a method
    # its routes do not serve is a 405 naming all the methods they do serve.
    @app.api_route("/{path:path}", methods=["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"], include_in_schema=False)
    async def dashboard_page(request: Request, path: str) -> Response:
        if request.method in ("GET", "HEAD") and is_public_page(request.url.path):
            return _index_page(index_html, _sent_path(request))
        allowed = _methods_of_other_routes(request)
        if allowed:
            raise HTTPException(status_code=405, detail="Method Not Allowed", headers={"allow": ", ".join(allowed)})
        raise HTTPException(status_code=404, detail="Not Found")


def _methods_of_other_routes(request: Request) -> List[str]:
    """The methods that the app's other routes serve at the request's path (none: the path is unknown)."""
    from starlette.routing import Match

    methods: Set[str] = set()
    for route in request.app.router.routes:
        match, _ = route.matches(request.scope)
        if match is Match.PARTIAL:
            methods |= set(getattr(route, "methods", None) or ())
    return sorted(methods)


# ---------------------------------------------------------------------------------------------------------------
# Routes


async def _json_body(request: Request, model: Any) -> Any:
    from fastapi.exceptions import RequestValidationError
    from pydantic import ValidationError

    body = await request.body()
    try:
        data = decode_json(body)
    except ValueError as exc:
        raise RequestValidationError(
            [{"type": "json_invalid", "loc": ("body",), "msg": f"JSON decode error: {exc}"}]
        ) from exc
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        errors = [{**e, "loc": ("body", *e["loc"])} for e in exc.errors(include_url=False, include_context=False)]
        raise RequestValidationError(errors) from exc


def _add_routes(app: FastAPI, call: StoreCall) -> None:
    summaries = _Summaries(call)

    @app.get("/v1/agl/dashboard/rollouts", tags=["dashboard"])
    async def dashboard_rollouts(query: Annotated[DashboardRolloutsRequest, Query()]) -> Response:
        """One page of rollout summaries with the dashboard's filters."""
        if query.start_after is not None and query.start_before is not None and query.start_after > query.start_before:
            raise HTTPException(status_code=400, detail="start_after must not be later than start_before")
        if query.reward_min is not None and query.reward_max is not None and query.reward_min > query.reward_max:
            raise HTTPException(status_code=400, detail="reward_min must not be greater than reward_max")
        return _json(await summaries.rollouts(query))

    @app.get("/v1/agl/dashboard/resources", tags=["dashboard"])
    async def dashboard_resources() -> Response:
        """Per resources version, the finished rollouts that used it and their scores, per purpose."""
        return _json(await summaries.resource_scores())

    @app.get("/v1/agl/dashboard/workers", tags=["dashboard"])
    async def dashboard_workers() -> Response:
        """Workers with their recent throughput."""
        return _json(await summaries.workers())


def install_dashboard(app: FastAPI, call: StoreCall, directory: Optional[Path] = None) -> None:
    """Add the metrics and dashboard routes and the dashboard app to a store server's FastAPI app.

    Call it after the store's own routes: the app's fallback route answers every remaining path outside ``/v1/``.

    Args:
        app: The server's app.
        call: ``call(method_name, *args, **kwargs)`` running a store method.
        directory: The built dashboard (default: the one in the package).
    """
    _add_routes(app, call)
    _mount_app(app, directory or DASHBOARD_DIR)
