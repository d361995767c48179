"""``agentbolt export`` opens the source SQLite store read-only: the file, its folder and its bytes stay as they were.

A real store file is written through the store's API, then exported by the real command. Whether the source was
opened for writing is observed with inotify (Linux): a file opened for writing reports ``IN_CLOSE_WRITE`` when it is
closed, and SQLite's journal files report ``IN_CREATE``. This holds for every user, root included; the file-mode
test (a 0444 file in a 0555 folder) only means something for users whose writes the modes stop.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import hashlib
import json
import os
import struct
import sys
import tempfile
from pathlib import Path
from typing import Iterator, List, Set, Tuple

import pytest
from store.conftest import numbered_span as _span
from support.servers import StoreServerProcess

from agentbolt.cli.export import main as export_main
from agentbolt.store.base import LightningStore
from agentbolt.store.client_server import LightningStoreClient
from agentbolt.store.sqlite import SqliteLightningStore

ROLLOUTS = 3

_IN_MODIFY = 0x002
_IN_ATTRIB = 0x004
_IN_CLOSE_WRITE = 0x008
_IN_MOVED_TO = 0x080
_IN_CREATE = 0x100
_IN_DELETE = 0x200
_IN_NONBLOCK = 0o4000
_WRITE_EVENTS = _IN_MODIFY | _IN_ATTRIB | _IN_CLOSE_WRITE | _IN_MOVED_TO | _IN_CREATE | _IN_DELETE
_EVENT = struct.Struct("iIII")


async def _fill(store: LightningStore, count: int) -> None:
    for index in range(count):
        rollout = await store.enqueue_rollout(input={"question": index}, mode="train")
        attempted = await store.start_attempt(rollout.rollout_id, worker_id="worker-0")
        attempt_id = attempted.attempt.attempt_id
        sequence_id = await store.get_next_span_sequence_id(rollout.rollout_id, attempt_id)
        await store.add_span(_span(rollout.rollout_id, attempt_id, sequence_id))
        await store.update_attempt(rollout.rollout_id, attempt_id, status="succeeded")


@pytest.fixture
def store_file(tmp_path: Path) -> Path:
    """A closed store file holding ``ROLLOUTS`` finished rollouts, alone in its folder."""
    folder = tmp_path / "source"
    folder.mkdir()
    path = folder / "store.db"

    async def write() -> None:
        store = SqliteLightningStore(path)
        try:
            await _fill(store, ROLLOUTS)
        finally:
            await store.close()

    asyncio.run(write())
    assert sorted(p.name for p in folder.iterdir()) == ["store.db"]
    return path


def _state(path: Path) -> Tuple[str, int, List[str]]:
    """The file's checksum and modification time, and what its folder holds."""
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    return digest, path.stat().st_mtime_ns, sorted(p.name for p in path.parent.iterdir())


def _lines(path: Path) -> List[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


class _Watch:
    """inotify events of one folder: the names of its files that were created, written or opened for writing."""

    def __init__(self, folder: Path) -> None:
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        self._fd = libc.inotify_init1(_IN_NONBLOCK)
        if self._fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1 failed")
        if libc.inotify_add_watch(self._fd, os.fsencode(folder), _WRITE_EVENTS) < 0:
            os.close(self._fd)
            raise OSError(ctypes.get_errno(), "inotify_add_watch failed")

    def written(self) -> Set[str]:
        """Names of the files with a write event since the watch started (or since the last call)."""
        names: Set[str] = set()
        while True:
            try:
                data = os.read(self._fd, 65536)
            except BlockingIOError:
                return names
            offset = 0
            while offset < len(data):
                _, _, _, length = _EVENT.unpack_from(data, offset)
                offset += _EVENT.size
                names.add(data[offset : offset + length].rstrip(b"\0").decode())
                offset += length

    def close(self) -> None:
        os.close(self._fd)


@pytest.fixture
def watch(store_file: Path) -> Iterator[_Watch]:
    if not sys.platform.startswith("linux"):
        pytest.skip("inotify is Linux only")
    watcher = _Watch(store_file.parent)
    try:
        yield watcher
    finally:
        watcher.close()


def test_export_opens_nothing_next_to_the_source_for_writing(store_file: Path, watch: _Watch, tmp_path: Path) -> None:
    before = _state(store_file)
    for what in ("rollouts", "spans", "samples"):
        out = tmp_path / f"{what}.jsonl"
        assert export_main([str(store_file), "--what", what, "--output", str(out)]) == 0
    assert watch.written() == set()  # no -wal / -shm created, the file never opened for writing
    assert _state(store_file) == before
    assert len(_lines(tmp_path / "rollouts.jsonl")) == ROLLOUTS
    assert len(_lines(tmp_path / "spans.jsonl")) == ROLLOUTS


def test_export_reads_the_file_in_place_without_writing_to_tmpdir(
    store_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not sys.platform.startswith("linux"):
        pytest.skip("inotify is Linux only")
    scratch = tmp_path / "tmpdir"
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    watcher = _Watch(scratch)  # also sees a file or folder created there and removed before the export returns
    try:
        for what in ("rollouts", "spans", "samples"):
            assert export_main([str(store_file), "--what", what, "--output", str(tmp_path / f"{what}.jsonl")]) == 0
        assert watcher.written() == set() and list(scratch.iterdir()) == []
    finally:
        watcher.close()
    assert len(_lines(tmp_path / "spans.jsonl")) == ROLLOUTS


def test_export_of_a_read_only_file_in_a_read_only_folder(store_file: Path, tmp_path: Path) -> None:
    if os.geteuid() == 0:
        pytest.skip(
            "root ignores file modes, so 0444/0555 cannot stop its writes; "
            "test_export_opens_nothing_next_to_the_source_for_writing proves the read-only opening for root"
        )
    folder = store_file.parent
    store_file.chmod(0o444)
    folder.chmod(0o555)
    try:
        before = _state(store_file)
        out = tmp_path / "rollouts.jsonl"
        assert export_main([str(store_file), "--what", "rollouts", "--output", str(out)]) == 0
        assert len(_lines(out)) == ROLLOUTS
        assert _state(store_file) == before
    finally:
        folder.chmod(0o755)
        store_file.chmod(0o644)


def test_export_of_a_store_in_use_sees_its_latest_writes_and_changes_nothing(store_file: Path, tmp_path: Path) -> None:
    """A store another process writes to: the export reads what was committed, its write-ahead log included."""

    async def run() -> None:
        live = SqliteLightningStore(store_file)
        try:
            await _fill(live, 2)  # committed to the -wal file, not yet copied into the database file
            wal = store_file.with_name(store_file.name + "-wal")
            assert wal.exists()
            before = _state(store_file), wal.read_bytes()
            out = tmp_path / "rollouts.jsonl"
            code = await asyncio.to_thread(export_main, [str(store_file), "--what", "rollouts", "--output", str(out)])
            assert code == 0
            assert len(_lines(out)) == ROLLOUTS + 2
            assert (_state(store_file), wal.read_bytes()) == before
            await _fill(live, 1)  # the live store still writes after the export
        finally:
            await live.close()

    asyncio.run(run())


def test_export_of_a_store_a_server_process_is_writing_to(store_file: Path, tmp_path: Path) -> None:
    """``agentbolt store`` serves the file; the export reads every acknowledged write and the server keeps serving."""
    server = StoreServerProcess(store_file)
    server.start()
    try:

        async def write(count: int) -> None:
            client = LightningStoreClient(server.endpoint)
            try:
                await _fill(client, count)
            finally:
                await client.close()

        asyncio.run(write(2))
        out = tmp_path / "spans.jsonl"
        assert export_main([str(store_file), "--what", "spans", "--output", str(out)]) == 0
        assert len(_lines(out)) == ROLLOUTS + 2
        asyncio.run(write(1))
        assert export_main([str(store_file), "--what", "rollouts", "--output", str(out)]) == 0
        assert len(_lines(out)) == ROLLOUTS + 3
    finally:
        server.stop()


def test_a_file_that_is_not_a_store_is_still_refused_and_left_alone(tmp_path: Path, capsys) -> None:
    for name, content in (("bogus.db", b"not a database"), ("empty.db", b"")):
        path = tmp_path / name
        path.write_bytes(content)
        assert export_main([str(path), "--output", str(tmp_path / "out.jsonl")]) == 2
        err = capsys.readouterr().err
        assert f"{path} is not a readable store" in err and err.count("\n") == 1
        assert path.read_bytes() == content
        assert not (tmp_path / "out.jsonl").exists()
