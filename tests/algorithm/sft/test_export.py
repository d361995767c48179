"""Exporting a store: rollouts, spans and samples to JSONL and parquet, filters, round trips, the CLI, bad input.

The store is a real SQLite file filled by a short SFT run of the word model through the full stack (train and
validation rollouts, gateway spans with token ids, rewards), so every record comes from the real span pipeline.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import shutil
import sqlite3
from pathlib import Path
from typing import Any, List

import pytest
from support.word_model import PingAgent, build_word_model, fit

import agentbolt as agl
from agentbolt.algorithm.sft import SFT
from agentbolt.algorithm.sft.export import (
    ExportFilter,
    close_store,
    export_records,
    export_store,
    open_store,
    read_records,
    samples_from_records,
    store_samples,
)
from agentbolt.algorithm.sft.offline import train_from_messages, train_from_store
from agentbolt.cli.export import main as export_main


@pytest.fixture(scope="module")
def store_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from agentbolt.store.sqlite import SqliteLightningStore

    root = tmp_path_factory.mktemp("export")
    path = root / "store.db"
    algorithm = SFT(
        model=str(build_word_model(root / "word")),
        finetune="full",
        batch_size=1,
        rollouts_per_task=6,
        max_steps=1,
        learning_rate=1e-2,
        console=False,
        rollout_timeout=120,
    )
    store = SqliteLightningStore(path)
    fit(
        algorithm,
        PingAgent(agent_name="pinger"),
        train=[{"prompt": "ping", "answer": "yes"}],
        val=[{"prompt": "ping", "answer": "yes"}],
        store=store,
    )
    asyncio.run(store.close())
    return path


def _records(path: Path, kind: str, filters: ExportFilter | None = None) -> List[dict]:
    async def run() -> List[dict]:
        store = open_store(path)
        try:
            return await export_records(store, kind, filters)  # type: ignore[arg-type]
        finally:
            await close_store(store)

    return asyncio.run(run())


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("kind", ["rollouts", "spans", "samples"])
@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_export_round_trips_every_record_exactly(store_file: Path, tmp_path: Path, kind: str, suffix: str) -> None:
    out = tmp_path / f"{kind}{suffix}"
    assert export_main([str(store_file), "--what", kind, "--output", str(out)]) == 0
    expected = _records(store_file, kind)
    assert expected and read_records(out) == json.loads(json.dumps(expected))


@pytest.mark.parametrize("kind", ["rollouts", "spans", "samples"])
def test_the_file_read_in_place_gives_the_records_a_writable_store_reads_from_a_copy_of_it(
    store_file: Path, tmp_path: Path, kind: str
) -> None:
    from agentbolt.store.sqlite import SqliteLightningStore

    out = tmp_path / f"{kind}.jsonl"
    assert export_main([str(store_file), "--what", kind, "--output", str(out)]) == 0

    copy = tmp_path / "copy.db"
    shutil.copyfile(store_file, copy)  # the store is closed: its file holds every commit

    async def from_copy() -> List[dict]:
        store = SqliteLightningStore(copy)
        try:
            return await export_records(store, kind)  # type: ignore[arg-type]
        finally:
            await store.close()

    expected = asyncio.run(from_copy())
    assert expected and read_records(out) == json.loads(json.dumps(expected))


def test_a_store_file_is_opened_read_only(store_file: Path) -> None:
    from agentbolt.store.sqlite import SqliteReadOnlyError

    before = _digest(store_file), sorted(p.name for p in store_file.parent.iterdir())

    async def run() -> None:
        store = open_store(store_file)
        try:
            assert len(await store.query_rollouts()) == 8
            with pytest.raises(SqliteReadOnlyError, match="enqueue_rollout would write"):
                await store.enqueue_rollout(input={"prompt": "ping"})
        finally:
            await close_store(store)

    asyncio.run(run())
    assert (_digest(store_file), sorted(p.name for p in store_file.parent.iterdir())) == before


def test_a_store_of_a_newer_schema_version_is_named_and_left_alone(store_file: Path, tmp_path: Path) -> None:
    newer = tmp_path / "newer.db"
    shutil.copyfile(store_file, newer)
    conn = sqlite3.connect(newer)
    conn.execute("UPDATE schema_version SET version = version + 1")
    conn.commit()
    conn.close()
    before = _digest(newer)
    with pytest.raises(ValueError, match="is not a readable store: The store was written with a newer schema") as info:
        open_store(newer)
    assert str(info.value).startswith(str(newer)) and _digest(newer) == before


def test_samples_carry_token_ids_messages_rewards_and_read_back_as_the_stores_samples(
    store_file: Path, tmp_path: Path
) -> None:
    out = tmp_path / "samples.jsonl"
    assert export_main([str(store_file), "--output", str(out), "--mode", "train"]) == 0
    records = read_records(out)
    assert len(records) == 6  # one per LLM call of the six training rollouts
    for record in records:
        assert record["prompt"] == [{"role": "user", "content": "ping"}]
        assert record["completion"][0]["role"] == "assistant"
        assert record["prompt_token_ids"] and len(record["response_token_ids"]) == 1
        assert record["agent_name"] == "pinger" and record["reward"] == record["final_reward"] in (0.0, 1.0)
        assert record["metadata"] == {"mode": "train", "status": "succeeded"}

    async def from_store() -> List[Any]:
        store = open_store(store_file)
        try:
            return await store_samples(store, ExportFilter(mode=["train"]))
        finally:
            await close_store(store)

    assert samples_from_records(records, str(out)) == asyncio.run(from_store())


def test_filters_select_by_mode_status_reward_and_agent(store_file: Path) -> None:
    everything = _records(store_file, "rollouts")
    assert sorted(r["mode"] for r in everything) == ["train"] * 6 + ["val"] * 2  # validation before and after
    assert {r["mode"] for r in _records(store_file, "rollouts", ExportFilter(mode=["val"]))} == {"val"}
    assert _records(store_file, "rollouts", ExportFilter(status=["failed"])) == []
    winners = _records(store_file, "rollouts", ExportFilter(min_reward=1.0))
    assert all(r["final_reward"] == 1.0 for r in winners)
    losers = _records(store_file, "samples", ExportFilter(max_reward=0.0))
    assert len(winners) + len({r["rollout_id"] for r in losers}) == len(everything)
    assert _records(store_file, "samples", ExportFilter(agent="^other$")) == []
    assert _records(store_file, "spans", ExportFilter(agent="^other$")) == []
    spans = _records(store_file, "spans", ExportFilter(agent="pinger", mode=["val"]))
    assert spans and {s["rollout_id"] for s in spans} == {r["rollout_id"] for r in everything if r["mode"] == "val"}


def test_exporting_leaves_the_store_file_unchanged(store_file: Path, tmp_path: Path) -> None:
    before = _digest(store_file)
    assert export_main([str(store_file), "--what", "spans", "--output", str(tmp_path / "s.jsonl")]) == 0
    assert _digest(store_file) == before


def test_offline_sft_trains_on_the_calls_recorded_in_a_store(store_file: Path, tmp_path: Path) -> None:
    result = train_from_store(
        store_file, model=str(build_word_model(tmp_path / "word")), finetune="full", min_reward=1.0, epochs=2
    )
    assert result.finished and result.data["samples/from_tokens"] == 8  # six training and two validation calls
    assert result.data["select/below_min_reward"] + result.data["select/duplicates"] > 0


async def _two_agent_store() -> agl.InMemoryLightningStore:
    """A store with two training rollouts of one task, one succeeded and one failed. In each, a planner then an
    executor made one LLM call, recorded by the gateway as token ids only (no messages), the same in both rollouts."""
    store = agl.InMemoryLightningStore()
    for status in ("succeeded", "failed"):
        rollout = await store.start_rollout(input={"prompt": "ping"}, mode="train")
        rollout_id, attempt_id = rollout.rollout_id, rollout.attempt.attempt_id
        for sequence, agent in enumerate(("planner", "executor"), start=1):
            attributes = {
                "gen_ai.response.id": f"{rollout_id}-{agent}",
                "prompt_token_ids": [1, 3, 5, 2, 1, 4],
                "response_token_ids": [5 + sequence],
                "agentbolt.llm.agent_name": agent,
            }
            span = agl.Span.from_attributes(
                attributes=attributes,
                name="agentbolt.llm_call",
                rollout_id=rollout_id,
                attempt_id=attempt_id,
                sequence_id=sequence,
                start_time=float(sequence),
                end_time=sequence + 0.5,
            )
            await store.add_span(span)
        await store.update_attempt(rollout_id, attempt_id, status=status)
        await store.update_rollout(rollout_id, status=status)
    return store


def test_given_filters_keep_the_succeeded_status_and_agent_match_defaults(tmp_path: Path) -> None:
    store = asyncio.run(_two_agent_store())
    model = str(build_word_model(tmp_path / "word"))

    def calls_read(**options: Any) -> List[float]:
        result = train_from_store(store, model=model, finetune="full", **options)
        return [result.data["samples/samples"], result.data["select/duplicates"]]

    assert calls_read(agent_match="^planner$") == [1, 0]  # the planner's call of the succeeded rollout
    assert calls_read(agent_match="^planner$", filters=ExportFilter(mode=["train"])) == [1, 0]
    both = ExportFilter(status=["succeeded", "failed"])
    assert calls_read(agent_match="^planner$", filters=both) == [2, 1]  # the same call twice: learned once
    assert calls_read(agent_match="^planner$", filters=ExportFilter(agent="^executor$")) == [1, 0]  # given: it wins


def test_samples_exported_as_token_ids_only_are_read_back_and_trained_on(tmp_path: Path) -> None:
    store = asyncio.run(_two_agent_store())
    out = tmp_path / "samples.jsonl"
    assert asyncio.run(export_store(store, out, filters=ExportFilter(status=["succeeded"]))) == 2
    assert all(r["prompt"] == r["completion"] == [] for r in read_records(out))
    result = train_from_messages(out, model=str(build_word_model(tmp_path / "word")), finetune="full")
    assert result.finished and result.data["samples/from_tokens"] == 2


@pytest.mark.parametrize(
    ("fields", "error", "message"),
    [
        ({"status": "succeeded"}, TypeError, "status must be a list of strings, got one str (wrap it in a list)"),
        ({"mode": "train"}, TypeError, "mode must be a list of strings, got one str (wrap it in a list)"),
        ({"mode": ["train", 1]}, TypeError, "mode must be a list of strings, got an item of type int"),
        ({"mode": ["train", "dev"]}, ValueError, "mode holds 'dev', which is not one of train, val, test"),
        ({"status": ["done"]}, ValueError, "status holds 'done', which is not one of queuing"),
        ({"min_reward": float("nan")}, ValueError, "min_reward must be a finite number"),
        ({"max_reward": "1"}, TypeError, "max_reward must be a number or None"),
    ],
)
def test_an_export_filter_refuses_a_lone_string_or_an_unknown_value(fields: Any, error: Any, message: str) -> None:
    with pytest.raises(error, match=message.replace("(", r"\(").replace(")", r"\)")):
        ExportFilter(**fields)


def test_an_export_filter_of_modes_skips_rollouts_without_one() -> None:
    async def exported() -> List[dict]:
        store = agl.InMemoryLightningStore()
        await store.start_rollout(input={"q": 1}, mode="train")
        await store.start_rollout(input={"q": 2})  # no mode
        return await export_records(store, "rollouts", ExportFilter(mode=("train",)))

    assert [r["input"] for r in asyncio.run(exported())] == [{"q": 1}]


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--what", "traces"], "'traces' is not one of"),
        (["--mode", "dev"], "--mode 'dev' is not one of train, val, test"),
        (["--status", "done"], "--status 'done' is not one of"),
        (["--agent", "(unclosed"], "agent must be a regular expression; '(unclosed' is not"),
        (["--min-reward", "1", "--max-reward", "0"], "min_reward 1.0 is above max_reward 0.0"),
        (["--format", "csv"], "'csv' is not one of"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(store_file: Path, tmp_path: Path, capsys, arguments, message) -> None:
    code = export_main([str(store_file), "--output", str(tmp_path / "out.jsonl"), *arguments])
    err = capsys.readouterr().err
    assert code == 2 and message in err and err.count("\n") == 1


def test_a_missing_store_or_output_directory_exits_2_and_creates_nothing(tmp_path: Path, capsys) -> None:
    missing = tmp_path / "nothing.db"
    assert export_main([str(missing), "--output", str(tmp_path / "out.jsonl")]) == 2
    assert f"{missing} is not a readable store: No such file" in capsys.readouterr().err and not missing.exists()
    assert export_main([str(missing), "--output", str(tmp_path / "no" / "out.jsonl")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_a_file_that_is_not_a_store_exits_2(tmp_path: Path, capsys) -> None:
    bogus = tmp_path / "bogus.db"
    bogus.write_text("not a database")
    assert export_main([str(bogus), "--output", str(tmp_path / "out.jsonl")]) == 2
    assert "is not a readable store" in capsys.readouterr().err
    assert bogus.read_text() == "not a database"


def test_an_unreachable_store_server_is_one_line_and_exit_1(tmp_path: Path, capsys) -> None:
    from support.servers import free_port

    url = f"http://127.0.0.1:{free_port()}"
    assert export_main([url, "--output", str(tmp_path / "out.jsonl")]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"agentbolt: error: cannot read the store at {url}") and err.count("\n") == 1
    assert not (tmp_path / "out.jsonl").exists()


@pytest.mark.parametrize("suffix", ["", "-wal", "-shm"])
def test_the_output_may_not_be_the_store_itself(store_file: Path, capsys, suffix: str) -> None:
    before = _digest(store_file)
    target = store_file.with_name(store_file.name + suffix)
    assert export_main([str(store_file), "--what", "rollouts", "--output", str(target)]) == 2
    assert "is the store being exported" in capsys.readouterr().err
    assert _digest(store_file) == before


def test_an_empty_file_is_not_a_store_and_is_left_empty(tmp_path: Path, capsys) -> None:
    empty = tmp_path / "empty.db"
    empty.touch()
    assert export_main([str(empty), "--output", str(tmp_path / "out.jsonl")]) == 2
    assert "is not a readable store" in capsys.readouterr().err
    assert empty.stat().st_size == 0


def test_a_store_server_url_as_printed_and_its_api_key(store_file: Path, tmp_path: Path, capsys) -> None:
    from support.servers import free_port

    from agentbolt.store.client_server import LightningStoreServer
    from agentbolt.store.sqlite import SqliteLightningStore

    copy = tmp_path / "copy.db"
    copy.write_bytes(store_file.read_bytes())
    server = LightningStoreServer(SqliteLightningStore(copy), "127.0.0.1", free_port(), api_key="secret")
    asyncio.run(server.start())
    try:
        url = server.endpoint + "/v1/agl"  # what `agentbolt store` prints
        assert export_main([url, "--what", "rollouts", "--output", str(tmp_path / "no-key.jsonl")]) == 1
        err = capsys.readouterr().err
        assert "answered 401" in err and "--api-key" in err and err.count("\n") == 1
        out = tmp_path / "rollouts.jsonl"
        assert export_main([url, "--what", "rollouts", "--output", str(out), "--api-key", "secret"]) == 0
        assert len(out.read_text().splitlines()) == len(_records(store_file, "rollouts"))
    finally:
        asyncio.run(server.stop())


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_an_interrupted_export_leaves_the_previous_file_as_it_was(
    store_file: Path, tmp_path: Path, suffix: str
) -> None:
    out = tmp_path / f"rollouts{suffix}"
    out.write_text('{"previous": "export"}\n')

    def interrupt(done: int, total: int, records: int) -> None:
        assert total > 1
        raise KeyboardInterrupt  # Ctrl-C after the first rollout

    async def export() -> int:
        store = open_store(store_file)
        try:
            return await export_store(store, out, "rollouts", progress=interrupt)
        finally:
            await close_store(store)

    with pytest.raises(KeyboardInterrupt):
        asyncio.run(export())
    assert out.read_text() == '{"previous": "export"}\n'
    assert sorted(p.name for p in tmp_path.iterdir()) == [out.name]  # no partial file or spool left beside it


def test_parquet_is_written_in_batches_with_each_columns_type_taken_over_all_of_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agentbolt.algorithm.sft import export

    monkeypatch.setattr(export, "PARQUET_BATCH_RECORDS", 3)  # four row groups for ten records
    records: List[dict] = [
        {
            "step": i if i < 6 else i + 0.5,  # ints in the first batches, floats later: one float column
            "label": "odd" if i % 2 else i,  # strings and ints: no arrow type holds both, kept as JSON text
            "ids": list(range(i % 3)),  # token ids, some lists empty
            "tool": {"name": "calc"} if i == 9 else None,  # nested only in the last batch
            "late": None if i < 8 else True,  # only nulls until the last batches
        }
        for i in range(10)
    ]
    out = tmp_path / "records.parquet"
    export.write_records(records, out)

    import pyarrow.parquet as pq

    file = pq.ParquetFile(str(out))
    assert file.metadata.num_row_groups == 4
    assert str(file.schema_arrow.field("step").type) == "double" and str(file.schema_arrow.field("late").type) == "bool"
    expected = [dict(record, step=float(record["step"])) for record in records]
    assert read_records(out) == expected
    assert sorted(p.name for p in tmp_path.iterdir()) == ["records.parquet"]


def test_progress_is_redrawn_on_a_terminal_and_erased_at_the_end(store_file: Path, tmp_path: Path, monkeypatch) -> None:
    import os
    import pty
    import selectors
    import sys

    master, replica = pty.openpty()
    with open(replica, "w", encoding="utf-8") as terminal:
        monkeypatch.setattr(sys, "stderr", terminal)
        assert export_main([str(store_file), "--what", "rollouts", "--output", str(tmp_path / "r.jsonl")]) == 0
    shown = b""
    # A selector, not select.select, which refuses descriptors above 1,024 (a long test run can hold more).
    with selectors.DefaultSelector() as selector:
        selector.register(master, selectors.EVENT_READ)
        while selector.select(0.5):  # a pty hands out what was written in pieces
            try:
                piece = os.read(master, 65536)
            except OSError:  # the other end is closed and everything was read
                break
            if not piece:
                break
            shown += piece
    os.close(master)
    shown = shown.decode()
    total = len(_records(store_file, "rollouts"))
    assert f"\ragentbolt export: {total}/{total} rollouts read, {total} rollouts" in shown
    # The line is erased once the export is done, and the closing line takes its place.
    assert shown.endswith(f"\r\x1b[Kagentbolt export: {total} rollouts written to {tmp_path / 'r.jsonl'} (jsonl)\r\n")


def test_progress_is_a_periodic_line_when_stderr_is_not_a_terminal(
    store_file: Path, tmp_path: Path, capsys, monkeypatch
) -> None:
    import agentbolt.cli.export as export_cli

    monkeypatch.setattr(export_cli, "PROGRESS_LOG_SECONDS", 0.0)
    assert export_main([str(store_file), "--what", "rollouts", "--output", str(tmp_path / "r.jsonl")]) == 0
    lines = capsys.readouterr().err.splitlines()
    total = len(_records(store_file, "rollouts"))
    assert lines[0] == f"agentbolt export: 1/{total} rollouts read, 1 rollouts"
    assert lines[-2] == f"agentbolt export: {total}/{total} rollouts read, {total} rollouts" and len(lines) == total + 1
    assert lines[-1] == f"agentbolt export: {total} rollouts written to {tmp_path / 'r.jsonl'} (jsonl)"


def test_an_output_suffix_of_no_known_format_exits_2_unless_the_format_is_given(
    store_file: Path, tmp_path: Path, capsys
) -> None:
    out = tmp_path / "x.csv"
    assert export_main([str(store_file), "--output", str(out)]) == 2
    err = capsys.readouterr().err
    assert "--output" in err and "cannot tell the format from '.csv'" in err and err.count("\n") == 1
    assert not out.exists()
    assert export_main([str(store_file), "--output", str(out), "--format", "jsonl"]) == 0
    assert read_records(out) == _records(store_file, "samples")


def test_an_output_that_is_a_directory_exits_2_before_the_store_is_read(tmp_path: Path, capsys) -> None:
    missing = tmp_path / "nothing.db"
    assert export_main([str(missing), "--output", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"--output {tmp_path} is a directory" in err and err.count("\n") == 1


def test_a_store_url_of_another_scheme_is_named(tmp_path: Path, capsys) -> None:
    assert export_main(["ftp://example.org/store", "--output", str(tmp_path / "out.jsonl")]) == 2
    err = capsys.readouterr().err
    assert "ftp://example.org/store: 'ftp' URLs are not supported" in err and err.count("\n") == 1


@pytest.mark.parametrize(
    ("url", "fragment"),
    [
        ("http://127.0.0.1:99999", "not a valid store URL: Port out of range"),
        ("http://127.0.0.1:port", "not a valid store URL"),
        ("http:///store", "not a valid store URL: it names no host"),
    ],
)
def test_a_malformed_store_url_is_refused_before_connecting(tmp_path: Path, capsys, url: str, fragment: str) -> None:
    assert export_main([url, "--output", str(tmp_path / "out.jsonl")]) == 2
    err = capsys.readouterr().err
    assert fragment in err and err.count("\n") == 1


def test_a_store_url_is_read_whatever_the_case_of_its_scheme(tmp_path: Path) -> None:
    store = open_store("HTTP://127.0.0.1:8000")
    try:
        assert store.server_address_root.startswith("http://127.0.0.1:8000")  # type: ignore[attr-defined]
    finally:
        asyncio.run(close_store(store))


def test_a_store_recorded_by_another_model_trains_with_a_warning_naming_it(
    store_file: Path, tiny_model_dir: Path, caplog
) -> None:
    import logging

    with caplog.at_level(logging.WARNING):
        result = train_from_store(store_file, model=str(tiny_model_dir), filters=ExportFilter(mode=["train"]))
    assert result.finished and result.data["samples/from_tokens"] > 0
    assert "recorded by another model" in caplog.text and "word" in caplog.text
