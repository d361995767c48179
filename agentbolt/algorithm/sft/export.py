"""Export what a store holds for training elsewhere: rollouts, spans or samples, as JSONL or parquet.

* ``rollouts``: one record per rollout (its input, status, mode, times, metadata, attempts and final reward);
* ``spans``: one record per span of the selected rollouts' latest attempts (the stored span, attributes as they are);
* ``samples``: one record per LLM call of the selected rollouts, in the layout TRL reads
  (``{"prompt": [...], "completion": [...], "tools": [...]}``) plus the exact token ids when the gateway recorded
  them, the call's reward (propagated as SFT propagates it), the rollout's final reward and the agent name. The SFT
  offline trainer reads these files back (:func:`agentbolt.algorithm.sft.read_samples`).

Filters: rollout ``mode`` and ``status``, a reward range (the rollout's final reward for rollouts and spans; the
call's reward for samples) and an agent-name regex (samples: the call's agent; rollouts and spans: rollouts with at
least one call of a matching agent). Reading never changes the store: a SQLite file is opened read-only (see
:func:`open_store`), and the health watchdog that a store runs before its calls is suppressed while exporting.

Parquet needs pyarrow (``pip install 'agentbolt[parquet]'``). Scalar columns and lists of scalars (token ids) are
native columns; nested values (messages, tools, span attributes, rollout inputs...) are written as JSON text, named
in the file's ``agentbolt.json_columns`` metadata, so :func:`read_records` gives back exactly what was written.

Writing is atomic: records go to a temporary file in the output's directory, which replaces the output only once it
is complete, so an interrupted export leaves the previous file as it was. Neither format holds the whole export in
memory: JSONL is written one rollout at a time (the records of a rollout are held, not those of the whole store);
parquet, a table with one schema, is written in two passes over a JSONL spool beside the output, the first finding
each column's type, the second writing row groups of :data:`PARQUET_BATCH_RECORDS` records.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import secrets
import stat
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import (
    TYPE_CHECKING,
    Any,
    AsyncGenerator,
    AsyncIterator,
    Callable,
    Dict,
    Iterable,
    Iterator,
    List,
    Literal,
    Optional,
    Sequence,
    Tuple,
    Union,
)

from agentbolt.adapter.agent_match import compile_agent_match
from agentbolt.algorithm.sft.data import (
    ChatSample,
    RewardPropagation,
    StudentPrompt,
    finite_reward,
    samples_from_triplets,
    task_key,
)
from agentbolt.types import RolloutMode, RolloutStatus
from agentbolt.utils.checks import check_choices, check_finite
from agentbolt.utils.imports import import_extra

if TYPE_CHECKING:
    from agentbolt.store.base import LightningStore
    from agentbolt.types import Rollout, Span

__all__ = [
    "STANDARD_OUTPUT",
    "ExportFilter",
    "ExportKind",
    "ExportProgress",
    "ExportWriteError",
    "atomic_output",
    "export_store",
    "iter_located_records",
    "iter_records",
    "open_store",
    "read_records",
    "resolve_format",
    "store_samples",
    "write_records",
]

logger = logging.getLogger(__name__)

ExportKind = Literal["rollouts", "spans", "samples"]
ExportFormat = Literal["jsonl", "parquet"]
ExportProgress = Callable[[int, int, int], None]
"""Called after each rollout an export reads: ``(rollouts read, rollouts to read, records so far)``."""
STORE_URL_SCHEMES = ("http", "https")
_JSON_COLUMNS_KEY = b"agentbolt.json_columns"


@dataclass
class ExportFilter:
    """Which rollouts (and calls) to export.

    Attributes:
        mode: Rollout modes to keep (a list of ``train``, ``val``, ``test``); None keeps all.
        status: Rollout statuses to keep (a list of them); None keeps all.
        min_reward: Lowest reward kept (inclusive, a finite number).
        max_reward: Highest reward kept (inclusive, a finite number).
        agent: Regex over agent names (see the module docstring).

    Raises:
        TypeError: ``mode`` or ``status`` is a lone string (wrap it in a list) or holds something other than strings,
            or a reward bound is not a number.
        ValueError: An unknown mode or status, a bound that is NaN or infinite or a minimum above the maximum, or an
            invalid agent regex.
    """

    mode: Optional[Sequence[str]] = None
    status: Optional[Sequence[str]] = None
    min_reward: Optional[float] = None
    max_reward: Optional[float] = None
    agent: Optional[str] = None

    def __post_init__(self) -> None:
        self.mode = check_choices(self.mode, "mode", RolloutMode)
        self.status = check_choices(self.status, "status", RolloutStatus)
        check_finite(self.min_reward, "min_reward", optional=True)
        check_finite(self.max_reward, "max_reward", optional=True)
        compile_agent_match(self.agent, "agent")
        if self.min_reward is not None and self.max_reward is not None and self.min_reward > self.max_reward:
            raise ValueError(f"min_reward {self.min_reward} is above max_reward {self.max_reward}")

    def reward_ok(self, reward: Optional[float]) -> bool:
        """Whether ``reward`` lies in the range (a missing or non-finite reward passes only when no bound is set)."""
        if self.min_reward is None and self.max_reward is None:
            return True
        reward = finite_reward(reward)
        if reward is None:
            return False
        return (self.min_reward is None or reward >= self.min_reward) and (
            self.max_reward is None or reward <= self.max_reward
        )


def open_store(location: Union[str, os.PathLike[str]], *, api_key: Optional[str] = None) -> LightningStore:
    """The store at ``location``: an ``http(s)://`` URL of a store server, or an existing SQLite file.

    A SQLite file is opened with ``SqliteLightningStore(path, read_only=True)``: read in place, never written to
    (nothing is created next to it either), also while a server writes to it; its writing methods raise
    :class:`~agentbolt.store.sqlite.SqliteReadOnlyError`.

    Args:
        location: The URL or the file.
        api_key: The server's bearer token, if it requires one.

    Raises:
        ValueError: A URL of another scheme than http(s), or a file that cannot be read as a store: it does not
            exist (it is never created here), cannot be read, is not a store, or has another schema version. The
            message names the file and the reason.
    """
    text = os.fspath(location)
    scheme = re.match(r"^([A-Za-z][A-Za-z0-9+.-]*)://", text)
    if scheme and scheme.group(1).lower() not in STORE_URL_SCHEMES:
        raise ValueError(
            f"{text}: {scheme.group(1)!r} URLs are not supported; give a SQLite store file or the http(s):// URL of "
            "a store server"
        )
    if scheme:  # http(s), in any case
        from urllib.parse import urlsplit, urlunsplit

        from agentbolt.store.client_server import LightningStoreClient

        parts = urlsplit(text)
        try:
            parts.port  # noqa: B018 (raises for a port that is not a number, or out of range)
        except ValueError as exc:
            raise ValueError(f"{text} is not a valid store URL: {exc}") from None
        if not parts.hostname:
            raise ValueError(f"{text} is not a valid store URL: it names no host")
        url = urlunsplit(parts._replace(scheme=parts.scheme.lower()))
        return LightningStoreClient(url, api_key=api_key, retry_delays=(1.0,), request_timeout=10.0)
    from agentbolt.store.sqlite import SqliteLightningStore, SqliteStoreError

    path = Path(text).expanduser()
    try:
        return SqliteLightningStore(path, read_only=True)
    except SqliteStoreError as exc:
        raise ValueError(f"{path} is not a readable store: {exc.reason}") from exc


async def close_store(store: Any) -> None:
    """Close a store opened by :func:`open_store`."""
    close = getattr(store, "close", None)
    if close is not None:
        await close()


def _default_adapter() -> Any:
    from agentbolt.algorithm.sft.algorithm import LLM_CALL_SPANS
    from agentbolt.algorithm.sft.data import CallTraceToTriplet

    return CallTraceToTriplet(llm_call_match=LLM_CALL_SPANS)


async def _selected_rollouts(store: LightningStore, filters: ExportFilter) -> List[Rollout]:
    statuses: Optional[List[Any]] = list(filters.status) if filters.status else None
    rollouts = await store.query_rollouts(status_in=statuses)
    if filters.mode:
        rollouts = [r for r in rollouts if r.mode in filters.mode]
    return sorted(rollouts, key=lambda r: (r.start_time or 0.0, r.rollout_id))


async def _latest_spans(store: LightningStore, rollout_id: str) -> List[Span]:
    latest = await store.get_latest_attempt(rollout_id)
    if latest is None:
        return []
    return list(await store.query_spans(rollout_id, latest.attempt_id))


async def _walk(
    store: LightningStore,
    filters: ExportFilter,
    propagation: RewardPropagation,
    adapter: Any,
    student_prompt: Optional[StudentPrompt] = None,
    counted: Optional[Callable[[int], None]] = None,
) -> Any:
    """Yield ``(rollout, spans, final_reward, samples)`` of each rollout that passes the rollout-level filters.

    ``counted`` receives the number of rollouts to read once they are listed.
    """
    from agentbolt.store.collection_based import healthcheck_suppressed
    from agentbolt.utils.reward_spans import training_reward

    with healthcheck_suppressed():
        rollouts = await _selected_rollouts(store, filters)
        if counted is not None:
            counted(len(rollouts))
        for rollout in rollouts:
            spans = await _latest_spans(store, rollout.rollout_id)
            final = training_reward(spans, rollout.rollout_id) if spans else None
            triplets = list(adapter.adapt(spans)) if spans else []
            samples, _ = samples_from_triplets(
                triplets,
                final_reward=final,
                propagation=propagation,
                agent_match=filters.agent,
                rollout_id=rollout.rollout_id,
                task_id=task_key(rollout.input),
                metadata={"mode": rollout.mode, "status": rollout.status},
                student_prompt=student_prompt,
            )
            yield rollout, spans, final, samples


async def store_samples(
    store: LightningStore,
    filters: Optional[ExportFilter] = None,
    *,
    propagation: RewardPropagation = "backward",
    adapter: Any = None,
    student_prompt: Optional[StudentPrompt] = None,
) -> List[ChatSample]:
    """The chat samples (one per LLM call) of the store's rollouts that pass ``filters``.

    Args:
        store: The store.
        filters: Rollout and call filters (the reward range applies to each call's propagated reward).
        propagation: How a rollout's rewards reach its calls (see :func:`~agentbolt.algorithm.sft.data.propagate_rewards`).
        adapter: Spans-to-triplets adapter (default: the gateway's and the OpenAI SDK's call spans).
        student_prompt: Replace each call's prompt with the one this returns (context distillation, see
            :func:`~agentbolt.algorithm.sft.data.with_student_prompt`).
    """
    filters = filters or ExportFilter()
    adapter = adapter or _default_adapter()
    found: List[ChatSample] = []
    async with contextlib.aclosing(_walk(store, filters, propagation, adapter, student_prompt)) as walk:
        async for _, _, _, samples in walk:
            found.extend(s for s in samples if filters.reward_ok(s.reward))
    return found


def _rollout_record(rollout: Rollout, final_reward: Optional[float]) -> Dict[str, Any]:
    record = rollout.model_dump(mode="json")
    record["final_reward"] = final_reward
    return record


async def iter_records(
    store: LightningStore,
    kind: ExportKind,
    filters: Optional[ExportFilter] = None,
    *,
    propagation: RewardPropagation = "backward",
    progress: Optional[ExportProgress] = None,
) -> AsyncGenerator[Dict[str, Any], None]:
    """The records :func:`export_store` writes, in rollout order, read one rollout at a time.

    Args:
        store: The store to read.
        kind: ``"rollouts"``, ``"spans"`` or ``"samples"``.
        filters: Which rollouts and calls to export.
        propagation: How rewards reach the calls of a rollout (samples).
        progress: Called after each rollout is read (see :data:`ExportProgress`).
    """
    filters = filters or ExportFilter()
    adapter = _default_adapter()
    total, done, count = 0, 0, 0

    def counted(rollouts: int) -> None:
        nonlocal total
        total = rollouts

    # Closed here, in this context, when the caller stops early (the reader's context must be left where it was set).
    async with contextlib.aclosing(_walk(store, filters, propagation, adapter, counted=counted)) as walk:
        async for rollout, spans, final, samples in walk:
            records: List[Dict[str, Any]] = []
            if kind == "samples":
                records = [s.to_record() for s in samples if filters.reward_ok(s.reward)]
            elif filters.reward_ok(final) and (filters.agent is None or samples):
                if kind == "rollouts":
                    records = [_rollout_record(rollout, final)]
                else:
                    records = [span.model_dump(mode="json") for span in spans]
            for record in records:
                yield record
            done, count = done + 1, count + len(records)
            if progress is not None:
                progress(done, total, count)


async def export_records(
    store: LightningStore,
    kind: ExportKind,
    filters: Optional[ExportFilter] = None,
    *,
    propagation: RewardPropagation = "backward",
) -> List[Dict[str, Any]]:
    """The records :func:`export_store` writes, in rollout order, as one list (see :func:`iter_records`)."""
    return [record async for record in iter_records(store, kind, filters, propagation=propagation)]


async def export_store(
    store: LightningStore,
    path: Union[str, os.PathLike[str]],
    kind: ExportKind = "samples",
    *,
    format: Optional[ExportFormat] = None,
    filters: Optional[ExportFilter] = None,
    propagation: RewardPropagation = "backward",
    progress: Optional[ExportProgress] = None,
) -> int:
    """Write the store's rollouts, spans or samples to ``path``; returns the number of records.

    The file is replaced only once it is complete (:func:`atomic_output`): an export that fails or is interrupted
    leaves the previous file as it was. JSONL is written as the rollouts are read.

    Args:
        store: The store to read.
        path: Output file (its parent directory must exist); ``"-"`` writes JSON lines to the standard output as
            they are read.
        kind: ``"rollouts"``, ``"spans"`` or ``"samples"``.
        format: ``"jsonl"`` or ``"parquet"`` (default: from the file suffix, ``.parquet`` or else JSONL).
        filters: Which rollouts and calls to export.
        propagation: How rewards reach the calls of a rollout (samples).
        progress: Called after each rollout is read (see :data:`ExportProgress`).

    Raises:
        ValueError: An unknown kind or format, or parquet to the standard output.
        ImportError: Parquet without pyarrow.
        ExportWriteError: The file cannot be written (an ``OSError``).
    """
    if kind not in ("rollouts", "spans", "samples"):
        raise ValueError(f"unknown export kind {kind!r}; expected rollouts, spans or samples")
    chosen = resolve_format(path, format)
    if str(path) == STANDARD_OUTPUT and chosen == "parquet":
        raise ValueError("parquet cannot be written to the standard output (it is not seekable): name a file")
    reading = iter_records(store, kind, filters, propagation=propagation, progress=progress)
    async with contextlib.aclosing(reading) as records:
        return await _write_async(records, path, chosen)


async def _write_async(records: AsyncIterator[Dict[str, Any]], path: Union[str, os.PathLike[str]], chosen: str) -> int:
    """Write ``records`` to ``path`` atomically in the ``chosen`` format; how many were written.

    Raises:
        ExportWriteError: Writing failed (errors of reading ``records`` pass as they are).
    """
    count = 0
    if str(path) == STANDARD_OUTPUT:
        name = "the standard output"
        # A handle of its own on file descriptor 1: the records go where it points (a pipe, a terminal, a file the
        # shell opened, appending if it did), and closing it leaves sys.stdout open.
        handle = _written(name, os.fdopen, os.dup(sys.stdout.fileno()), "w", encoding="utf-8")
        try:
            async for record in records:
                _written(name, handle.write, json.dumps(record, ensure_ascii=False) + "\n")
                count += 1
            _written(name, handle.flush)
        finally:
            with contextlib.suppress(OSError):  # after a failed write (a closed pipe), closing fails the same way
                handle.close()
        return count
    with _writing(path) as temporary, _jsonl_destination(temporary, chosen) as lines:
        with _written(path, open, lines, "w", encoding="utf-8") as handle:
            async for record in records:
                _written(path, handle.write, json.dumps(record, ensure_ascii=False) + "\n")
                count += 1
            _written(path, _flush_to_disk, handle)
        if chosen == "parquet":
            _written(path, _write_parquet, lines, temporary)
    return count


@contextlib.contextmanager
def _jsonl_destination(temporary: Path, chosen: str) -> Iterator[Path]:
    """Where the JSON lines of an export go: the output itself for JSONL; for parquet, a spool beside it that is
    removed at the end (see :func:`_write_parquet`)."""
    if chosen != "parquet":
        yield temporary
        return
    spool = temporary.with_name(f"{temporary.name}.jsonl")
    try:
        yield spool
    finally:
        with contextlib.suppress(OSError):
            spool.unlink()


STANDARD_OUTPUT = "-"
"""The output name of the standard output (never a file called ``-``)."""


class ExportWriteError(OSError):
    """The output file of an export cannot be written (the store was read fine); the message names the file."""


def _written(path: Union[str, os.PathLike[str]], write: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    try:
        return write(*args, **kwargs)
    except OSError as exc:
        raise ExportWriteError(exc.errno, f"cannot write {path}: {exc.strerror or exc}") from exc


@contextlib.contextmanager
def _writing(path: Union[str, os.PathLike[str]]) -> Iterator[Path]:
    """:func:`atomic_output`, with its own failures (creating, replacing the file) raised as :class:`ExportWriteError`."""
    manager = atomic_output(path)
    temporary = _written(path, manager.__enter__)
    try:
        yield temporary
    except BaseException:
        manager.__exit__(*sys.exc_info())
        raise
    _written(path, manager.__exit__, None, None, None)


@contextlib.contextmanager
def atomic_output(path: Union[str, os.PathLike[str]]) -> Iterator[Path]:
    """Yield a temporary path in ``path``'s directory that replaces ``path`` when the block ends without error.

    On an error or an interruption the temporary file is removed and ``path`` stays as it was. The new file gets
    the permissions of the file it replaces (of a new file, otherwise). A ``path`` that exists and is not a regular
    file (a pipe, a terminal, ``/dev/null``) is yielded as it is: it cannot be replaced. A symbolic link is written
    through: the file it names is replaced, never the link (``/dev/stdout`` redirected to a file replaces that file).
    """
    target = Path(path)
    if target.exists() and not target.is_file():
        yield target
        return
    if target.is_symlink():
        target = Path(os.path.realpath(target))
    temporary = target.with_name(f".{target.name}.{secrets.token_hex(4)}.tmp")
    os.close(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
    try:
        if target.exists():
            os.chmod(temporary, stat.S_IMODE(target.stat().st_mode))
        yield temporary
        os.replace(temporary, target)
    except BaseException:
        with contextlib.suppress(OSError):
            temporary.unlink()
        raise


def _flush_to_disk(handle: Any) -> None:
    """Flush ``handle`` to the disk before its file replaces another (a pipe or a terminal has nothing to sync)."""
    handle.flush()
    if stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
        os.fsync(handle.fileno())


def resolve_format(path: Union[str, os.PathLike[str]], format: Optional[str] = None) -> str:
    """``format``, else ``parquet`` for a ``.parquet`` file (in any case: ``.PARQUET``) and ``jsonl`` otherwise.

    Raises:
        ValueError: An unknown format.
        ImportError: Parquet without pyarrow.
    """
    chosen = format or ("parquet" if Path(path).suffix.lower() == ".parquet" else "jsonl")
    if chosen not in ("jsonl", "parquet"):
        raise ValueError(f"unknown format {chosen!r}; expected jsonl or parquet")
    if chosen == "parquet":
        _pyarrow()
    return chosen


def _pyarrow() -> Any:
    import_extra(
        "pyarrow.parquet", feature="Reading or writing Parquet files", extra="parquet"
    )  # used through the package below
    return import_extra("pyarrow", feature="Reading or writing Parquet files", extra="parquet")


def write_records(
    records: Iterable[Dict[str, Any]], path: Union[str, os.PathLike[str]], *, format: Optional[str] = None
) -> None:
    """Write dict records as JSONL or parquet (see the module docstring for parquet's JSON columns); ``path`` is
    replaced only once the file is complete (:func:`atomic_output`)."""
    chosen = resolve_format(path, format)
    with atomic_output(path) as temporary, _jsonl_destination(temporary, chosen) as lines:
        with open(lines, "w", encoding="utf-8") as handle:
            for record in records:
                handle.write(json.dumps(record, ensure_ascii=False) + "\n")
            _flush_to_disk(handle)
        if chosen == "parquet":
            _write_parquet(lines, temporary)


PARQUET_BATCH_RECORDS = 1000
"""Records per parquet row group: what a parquet export holds in memory at a time."""

_JSON_TEXT: Any = object()
"""The kind of a column written as JSON text (nested values, or scalars of types no one arrow type holds)."""


def _write_parquet(lines: Path, path: Path) -> None:
    """Write the JSON records of the file ``lines`` to ``path`` as one parquet table, a batch at a time: a first pass
    finds every column's type across all records, a second writes the row groups."""
    pa = _pyarrow()
    kinds = _column_kinds(pa, _record_batches(lines))
    schema = pa.schema([(name, pa.string() if kind is _JSON_TEXT else kind) for name, kind in kinds.items()])
    schema = schema.with_metadata({_JSON_COLUMNS_KEY: json.dumps([n for n, k in kinds.items() if k is _JSON_TEXT])})
    with pa.parquet.ParquetWriter(str(path), schema) as writer:
        for batch in _record_batches(lines):
            if kinds:
                columns = [_column(pa, [record.get(name) for record in batch], kind) for name, kind in kinds.items()]
                writer.write_table(pa.Table.from_arrays(columns, schema=schema))


def _record_batches(lines: Path) -> Iterator[List[Dict[str, Any]]]:
    with open(lines, encoding="utf-8") as handle:
        batch: List[Dict[str, Any]] = []
        for line in handle:
            batch.append(json.loads(line))
            if len(batch) == PARQUET_BATCH_RECORDS:
                yield batch
                batch = []
        if batch:
            yield batch


def _column_kinds(pa: Any, batches: Iterable[List[Dict[str, Any]]]) -> Dict[str, Any]:
    """Each column's arrow type over all ``batches`` (in order of first appearance), or :data:`_JSON_TEXT`: nested
    values, and scalars that no one arrow type holds (``1`` and ``"a"``), are kept exactly as JSON text."""
    kinds: Dict[str, Any] = {}
    for batch in batches:
        for name in dict.fromkeys(name for record in batch for name in record):
            if kinds.get(name) is _JSON_TEXT:
                continue
            kind = _batch_kind(pa, [record.get(name) for record in batch])
            kinds[name] = kind if name not in kinds else _merged_kind(pa, kinds[name], kind)
    return kinds


def _batch_kind(pa: Any, values: List[Any]) -> Any:
    if any(_nested(value) for value in values):
        return _JSON_TEXT
    try:
        return pa.array(values).type
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, OverflowError):
        return _JSON_TEXT


def _merged_kind(pa: Any, first: Any, second: Any) -> Any:
    """The type holding both: the same, the other where one is null, ints widened to floats; else JSON text."""
    if first is _JSON_TEXT or second is _JSON_TEXT:
        return _JSON_TEXT
    try:
        merged = pa.unify_schemas([pa.schema([("c", first)]), pa.schema([("c", second)])], promote_options="permissive")
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        return _JSON_TEXT
    return merged.field("c").type


def _column(pa: Any, values: List[Any], kind: Any) -> Any:
    if kind is _JSON_TEXT:
        return pa.array([None if v is None else json.dumps(v, ensure_ascii=False) for v in values], type=pa.string())
    return pa.array(values, type=kind)


def _nested(value: Any) -> bool:
    """Dicts, and lists holding dicts or lists: written as JSON text so they read back exactly."""
    return isinstance(value, dict) or (isinstance(value, list) and any(isinstance(v, (dict, list)) for v in value))


def read_records(path: Union[str, os.PathLike[str]]) -> List[Dict[str, Any]]:
    """Read records written by :func:`write_records` (JSONL or parquet, by suffix).

    Raises:
        agentbolt.algorithm.sft.data.DataError: The file is missing, a JSONL line is not JSON, or a parquet file
            cannot be read as one; the message names the file.
    """
    return [record for _, record in iter_located_records(path)]


def iter_located_records(path: Union[str, os.PathLike[str]]) -> Iterator[Tuple[str, Dict[str, Any]]]:
    """``(where, record)`` of each record of a JSONL or parquet file (by suffix, in any case): ``where`` names the
    record for errors, ``"chat.jsonl:7"`` (its line; blank lines are skipped) or ``"chat.parquet row 7"``.

    Raises:
        agentbolt.algorithm.sft.data.DataError: As :func:`read_records`.
    """
    from agentbolt.algorithm.sft.data import iter_jsonl

    path = Path(path)
    if resolve_format(path) == "jsonl":
        for number, record in iter_jsonl(path):
            yield f"{path}:{number}", record
        return
    for number, record in enumerate(_parquet_rows(path), start=1):
        yield f"{path} row {number}", record


def _parquet_rows(path: Path) -> List[Dict[str, Any]]:
    """The rows of a parquet file, its JSON-text columns decoded (see the module docstring).

    Raises:
        agentbolt.algorithm.sft.data.DataError: The file is missing, not parquet, or a JSON column holds other text.
    """
    from agentbolt.algorithm.sft.data import DataError

    if not path.is_file():
        raise DataError(f"{path}: no such file" if not path.exists() else f"{path}: not a file")
    pa = _pyarrow()
    try:
        table = pa.parquet.read_table(str(path))
    except (pa.ArrowException, OSError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise DataError(f"{path}: not a readable parquet file ({reason})") from None
    metadata = table.schema.metadata or {}
    try:
        json_columns = set(json.loads(metadata.get(_JSON_COLUMNS_KEY, b"[]")))
    except (ValueError, TypeError):
        raise DataError(f"{path}: its {_JSON_COLUMNS_KEY.decode()} metadata is not a JSON list") from None
    records = []
    for number, row in enumerate(table.to_pylist(), start=1):
        record = {}
        for name, value in row.items():
            if name in json_columns and isinstance(value, str):
                try:
                    value = json.loads(value)
                except ValueError:
                    raise DataError(f"{path} row {number}: column {name!r} does not hold JSON text") from None
            record[name] = value
        records.append(record)
    return records


def samples_from_records(records: Iterable[Dict[str, Any]], where: str) -> List[ChatSample]:
    """Chat samples of exported (or hand-written) records; ``where`` names the source in errors."""
    return [ChatSample.from_record(record, f"{where} record {i + 1}") for i, record in enumerate(records)]
