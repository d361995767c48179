"""The sql example: generated databases and questions, execution accuracy, the LangGraph agent and its rollouts."""

from __future__ import annotations

import json
import re
import sqlite3
import time
from pathlib import Path

import pytest
from support.split_overlap import describe, find_overlaps

import agentbolt as agl

from .rollouts import run_rollouts
from .scripted_chat import ScriptedChat

pytest.importorskip("langgraph")
pytest.importorskip("langchain_openai")

from examples.sql.agent import CORRECT, SqlAgent, extract_query
from examples.sql.databases import (
    DATA_DIR,
    DATABASES,
    MAX_VALUE_LENGTH,
    TEST_DATABASES,
    TRAIN_DATABASES,
    database_path,
    ensure_databases,
    execute,
    execution_match,
    load_split,
    make_tasks,
)

TASK = next(t for t in load_split("test") if t["db_id"] == "zoo" and t["kind"] == "argmax")


def test_databases_and_questions_are_regenerated_identically(tmp_path: Path) -> None:
    tasks = make_tasks(tmp_path)
    for name in ("train", "test"):
        expected = "".join(json.dumps(task, sort_keys=True) + "\n" for task in tasks[name])
        assert (DATA_DIR / f"{name}.jsonl").read_text(encoding="utf-8") == expected
    for db_id in TRAIN_DATABASES + TEST_DATABASES:
        assert execute(db_id, "SELECT * FROM sqlite_master", tmp_path) == execute(db_id, "SELECT * FROM sqlite_master")


def test_processes_building_the_databases_at_once_each_leave_them_whole(tmp_path: Path) -> None:
    # Test workers import the example at the same moment, and each builds the databases that are missing.
    import multiprocessing

    workers = [multiprocessing.get_context("fork").Process(target=ensure_databases, args=(tmp_path,)) for _ in range(4)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=60)
    assert [worker.exitcode for worker in workers] == [0] * 4
    databases = TRAIN_DATABASES + TEST_DATABASES
    assert sorted(p for p in tmp_path.rglob("*") if p.is_file()) == sorted(
        database_path(d, tmp_path) for d in databases
    )
    for db_id in databases:
        assert execute(db_id, "SELECT * FROM sqlite_master", tmp_path) == execute(db_id, "SELECT * FROM sqlite_master")


def test_held_out_questions_are_about_databases_never_trained_on() -> None:
    train, test = load_split("train"), load_split("test")
    assert {t["db_id"] for t in train} == set(TRAIN_DATABASES)
    assert {t["db_id"] for t in test} == set(TEST_DATABASES)
    assert not {t["question"] for t in train} & {t["question"] for t in test}
    overlaps = find_overlaps([t["question"] for t in train], [t["question"] for t in test])
    assert not overlaps, describe(overlaps)
    for task in train + test:  # every gold query runs and returns something
        assert execute(task["db_id"], task["query"]), task


@pytest.mark.parametrize(
    ("predicted", "expected"),
    [
        (TASK["query"], True),
        (TASK["query"].replace("SELECT name", "SELECT  name"), True),
        (None, False),
        ("", False),
        ("SELECT name FROM nowhere", False),  # an error
        (TASK["question"], False),  # the question copied back
        ("DELETE FROM animals", False),  # writes are refused (read-only connection)
        ("SELECT name FROM animals", False),  # every name: the gold among distractors
        ("SELECT name FROM animals ORDER BY name LIMIT 1", False),  # ordered, but other rows
        ("SELECT * FROM animals", False),  # a query that returns everything
        ("SELECT name FROM animals ORDER BY weight DESC", False),  # the gold first, then every distractor
        (f"{TASK['query']} UNION ALL SELECT name FROM animals WHERE id = 1", False),  # the gold plus a candidate
        (f"-- {TASK['question']}", False),  # a comment only: no statement to run
        ("word " * 5000, False),  # very long, no query
        ("SELECT name FROM animals WHERE name = 'x'; " + TASK["query"], False),  # only one statement runs
        ("SELECT name FROM animals WHERE name = '\ud800'", False),  # a lone surrogate: not text SQLite can read
    ],
)
def test_execution_match(predicted: str, expected: bool) -> None:
    assert execution_match(predicted, TASK["query"], TASK["db_id"]) is expected


def test_unordered_gold_accepts_any_row_order() -> None:
    task = next(t for t in load_split("test") if t["kind"] == "filter")
    reordered = task["query"] + " ORDER BY name DESC"
    assert execution_match(reordered, task["query"], task["db_id"])


def test_writes_leave_the_database_intact() -> None:
    before = execute("zoo", "SELECT COUNT(*) FROM animals")
    with pytest.raises(sqlite3.Error):
        execute("zoo", "DROP TABLE animals")
    assert execute("zoo", "SELECT COUNT(*) FROM animals") == before


@pytest.mark.parametrize(
    "statement",
    [
        "VACUUM INTO '{out}/copy.sqlite'",
        "ATTACH DATABASE '{out}/attached.sqlite' AS attached",
        "PRAGMA user_version = 7",
        "CREATE TEMP TABLE notes (note TEXT)",
        "BEGIN",
    ],
)
def test_a_query_can_only_read(statement: str, tmp_path: Path) -> None:
    with pytest.raises(sqlite3.Error):
        execute("zoo", statement.format(out=tmp_path))
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("statement", ["-- only a comment", "REINDEX"])
def test_a_statement_that_returns_no_columns_is_not_a_query(statement: str) -> None:
    with pytest.raises(sqlite3.Error):
        execute("zoo", statement)


def test_a_query_of_few_slow_steps_is_stopped_at_its_timeout_in_seconds() -> None:
    # 2000 rows each building a string of 0.8 MB: some 10 s unbounded on the 2-core test machine, in few VM steps.
    slow = (
        "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 2000) "
        "SELECT sum(length(replace(hex(zeroblob(200000 + x)), '0', 'ab'))) FROM c"
    )
    started = time.monotonic()
    with pytest.raises(sqlite3.OperationalError, match="interrupted"):
        execute("zoo", slow, timeout=0.5)
    assert time.monotonic() - started < 5.0


@pytest.mark.parametrize("function", ["printf", "FORMAT"])
def test_printf_is_refused_since_one_call_can_outlast_any_timeout(function: str) -> None:
    # Unrefused, this one call repeats its character 2**31 - 1 times in one step: some 18 s.
    with pytest.raises(sqlite3.Error, match="not authorized"):
        execute("zoo", f"SELECT {function}('%.*c', 2147483647, 'x')", timeout=0.5)


@pytest.mark.skipif(not hasattr(sqlite3.Connection, "setlimit"), reason="Connection.setlimit is Python 3.11+")
def test_a_value_longer_than_the_cap_is_refused() -> None:
    with pytest.raises(sqlite3.Error, match="too big"):
        execute("zoo", f"SELECT zeroblob({MAX_VALUE_LENGTH + 1})")


def test_a_result_too_large_to_hold_is_refused() -> None:
    # 50 rows of 0.8 MB of text each: 40 MB, a few milliseconds of work.
    huge = (
        "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 50) "
        "SELECT replace(hex(zeroblob(200000)), '0', 'ab') FROM c"
    )
    with pytest.raises(sqlite3.Error, match="more than"):
        execute("zoo", huge)


def test_every_argmax_question_has_a_single_answer() -> None:
    """Naming every row at the highest (or lowest) value matches the gold: no gold picks one of several tied rows."""
    asked = re.compile(r"Which \w+ has the (highest|lowest) (\w+)\? Give its name\.")
    argmax = [t for t in load_split("train") + load_split("test") if t["kind"] == "argmax"]
    assert argmax
    for task in argmax:
        found = asked.fullmatch(task["question"])
        assert found, task
        extreme, column = "MAX" if found.group(1) == "highest" else "MIN", found.group(2)
        table = DATABASES[task["db_id"]].name
        every_row_at_extreme = f"SELECT name FROM {table} WHERE {column} = (SELECT {extreme}({column}) FROM {table})"
        assert execution_match(every_row_at_extreme, task["query"], task["db_id"]), task


@pytest.mark.parametrize(
    ("reply", "query"),
    [
        ("```sql\nSELECT 1;\n```", "SELECT 1"),
        ("Here it is: SELECT name FROM t; DROP TABLE t", "SELECT name FROM t"),
        ("```\nWITH x AS (SELECT 1) SELECT * FROM x\n```", "WITH x AS (SELECT 1) SELECT * FROM x"),
        ("no query at all", "no query at all"),
    ],
)
def test_extract_query(reply: str, query: str) -> None:
    assert extract_query(reply) == query


def test_the_graph_writes_checks_and_rewrites_through_the_trainer(tmp_path: Path) -> None:
    """Writer wrong, checker objects, rewriter right: the held-out reward is 1 and each node named its calls."""
    wrong = "```sql\nSELECT name FROM animals\n```"
    script = [wrong, "The query returns every row.", f"```sql\n{TASK['query']}\n```"]
    with ScriptedChat(script) as chat:
        rollouts = run_rollouts(SqlAgent(), agl.LLM(endpoint=chat.base_url, model="scripted"),
                                tmp_path / "store.sqlite", val=[TASK])  # fmt: skip
    assert [r.status for r in rollouts] == ["succeeded"]
    assert rollouts[0].rewards["primary"] == 1.0
    assert chat.agents == ["write_query", "check_query", "rewrite_query"]


@pytest.mark.parametrize(
    "query",
    ["VACUUM INTO '{out}/copy.sqlite'", "SELECT name FROM animals WHERE name = '\ud800'"],
    ids=["writes-a-file", "lone-surrogate"],
)
def test_a_query_that_cannot_run_earns_no_training_credit(query: str, tmp_path: Path) -> None:
    """Neither a statement that would write a file nor a query that is not valid text is worth the 0.1 for running."""
    out = tmp_path / "out"
    out.mkdir()
    reply = f"```sql\n{query.format(out=out)}\n```"
    with ScriptedChat([reply, "The query does not answer the question.", reply]) as chat:
        rollouts = run_rollouts(SqlAgent(), agl.LLM(endpoint=chat.base_url, model="scripted"),
                                tmp_path / "store.sqlite", train=[TASK])  # fmt: skip
    assert [r.status for r in rollouts] == ["succeeded"]
    assert rollouts[0].rewards["primary"] == 0.0
    assert list(out.iterdir()) == []


def test_a_checked_query_ends_the_graph(tmp_path: Path) -> None:
    with ScriptedChat([f"```sql\n{TASK['query']}\n```", CORRECT]) as chat:
        rollouts = run_rollouts(SqlAgent(), agl.LLM(endpoint=chat.base_url, model="scripted"),
                                tmp_path / "store.sqlite", train=[TASK])  # fmt: skip
    assert rollouts[0].rewards["primary"] == 1.0
    assert chat.agents == ["write_query", "check_query"]
