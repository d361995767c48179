"""The sql example's databases and questions: small SQLite databases built by this script, and text-to-SQL tasks.

``python -m examples.sql.databases`` writes the databases into ``data/databases/`` (rebuilt automatically when
missing: they are not shipped) and rewrites the shipped ``data/train.jsonl`` and ``data/test.jsonl`` byte for byte
from the seed.

As in Spider, the held-out questions are asked about **databases never seen in training** (``zoo``, ``airline``):
a model must read the schema, not remember table names, so no held-out question is a reworded training question.
Each question has a gold query; the reward is execution accuracy (:func:`execution_match`): the agent's query must
return the same rows as the gold query (in order only when the gold query orders them). Every question has one
answer: a "which row has the highest ..." question whose highest value is shared by several rows is not asked.

A query runs with the reading rights of a ``SELECT`` only (:func:`execute`): it cannot write, attach or copy a
database, and it is stopped after its timeout in seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sqlite3
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple, TypedDict

from examples.common.tasks import read_tasks

__all__ = [
    "DATA_DIR",
    "DATABASES",
    "SqlTask",
    "database_path",
    "ensure_databases",
    "execute",
    "execution_match",
    "load_split",
    "make_tasks",
    "schema_text",
]

DATA_DIR = Path(__file__).resolve().parent / "data"
SEED = 20251122
TRAIN_DATABASES = ("company", "library", "school", "shop")
TEST_DATABASES = ("zoo", "airline")
MAX_RESULT_ROWS = 10_000
"""Rows :func:`execute` returns at most."""
MAX_VALUE_LENGTH = 1_000_000
"""The longest string or blob a query may build (characters or bytes), on Python 3.11 and later."""
MAX_RESULT_LENGTH = 10_000_000
"""The most text and blob content, summed over every value, a query's rows may hold."""
_READ_ACTIONS = frozenset(
    {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION, sqlite3.SQLITE_RECURSIVE}
)
# printf('%.*c', n, 'x') appends its character n times within one step of the VM, which no deadline interrupts
# (18 s for n = 2**31 - 1 with SQLite 3.40, whatever the length limit).
_UNINTERRUPTIBLE_FUNCTIONS = frozenset({"printf", "format"})


class SqlTask(TypedDict):
    """One question.

    Attributes:
        id: ``train-4`` / ``test-9``.
        db_id: The database (``company``).
        question: The question in English.
        query: The gold SQL query (never shown to the agent).
        kind: The slice: ``count``, ``lookup``, ``max``, ``argmax`` or ``filter``. An ``argmax`` question names the
            one row with the highest (or lowest) value of a column: no other row has that value.
    """

    id: str
    db_id: str
    question: str
    query: str
    kind: str


@dataclass(frozen=True)
class _Table:
    """One table: its name, how to speak of its rows, its columns and how to make a row."""

    name: str
    singular: str
    plural: str
    text_columns: Tuple[Tuple[str, Tuple[str, ...]], ...]  # (column, values)
    number_columns: Tuple[Tuple[str, int, int], ...]  # (column, low, high)


_FIRST = ["Alice", "Bruno", "Chen", "Dana", "Emil", "Farah", "Goran", "Hana", "Ivo", "Jana", "Kofi", "Lena", "Milo",
          "Nadia", "Omar", "Pia", "Quinn", "Rosa", "Sven", "Tara", "Uma", "Viktor", "Wren", "Yusuf"]  # fmt: skip
_LAST = ["Adler", "Brook", "Costa", "Dietz", "Evans", "Fischer", "Gruber", "Horn", "Ibsen", "Jensen", "Kraus", "Lund",
         "Moreau", "Novak", "Olsen", "Petrov", "Quist", "Rossi", "Stein", "Thorne"]  # fmt: skip

DATABASES: Dict[str, _Table] = {
    "company": _Table("employees", "employee", "employees",
                      (("department", ("Sales", "Finance", "Support", "Research")), ("city", ("Oslo", "Lyon", "Porto"))),
                      (("salary", 30000, 90000), ("age", 22, 64))),
    "library": _Table("books", "book", "books",
                      (("genre", ("Mystery", "History", "Poetry", "Science")), ("language", ("English", "French", "German"))),
                      (("pages", 90, 900), ("year", 1950, 2020))),
    "school": _Table("students", "student", "students",
                     (("club", ("Chess", "Drama", "Robotics", "Choir")), ("house", ("Red", "Blue", "Green"))),
                     (("grade", 1, 12), ("score", 40, 100))),
    "shop": _Table("products", "product", "products",
                   (("category", ("Toys", "Garden", "Kitchen", "Books")), ("supplier", ("Acme", "Borka", "Cresto"))),
                   (("price", 2, 400), ("stock", 0, 250))),
    "zoo": _Table("animals", "animal", "animals",
                  (("species", ("Lion", "Zebra", "Otter", "Parrot")), ("enclosure", ("North", "South", "East"))),
                  (("weight", 1, 300), ("age", 1, 30))),
    "airline": _Table("flights", "flight", "flights",
                      (("destination", ("Rome", "Cairo", "Lima", "Seoul")), ("aircraft", ("A320", "B737", "E190"))),
                      (("duration", 45, 720), ("seats", 70, 300))),
}  # fmt: skip
"""Each database has one table; the name column of every table is ``name``."""


def database_path(db_id: str, data_dir: Path = DATA_DIR) -> Path:
    """Where a database lives.

    Raises:
        ValueError: Unknown database.
    """
    if db_id not in DATABASES:
        raise ValueError(f"unknown database {db_id!r}; known: {sorted(DATABASES)}")
    return data_dir / "databases" / f"{db_id}.sqlite"


def _rows(rng: random.Random, db_id: str, table: _Table, count: int = 16) -> List[Tuple[Any, ...]]:
    names: set = set()
    rows: List[Tuple[Any, ...]] = []
    while len(rows) < count:
        name = f"{rng.choice(_FIRST)} {rng.choice(_LAST)}" if db_id in ("company", "school") else None
        if name is None:
            prefix = {"library": "The", "shop": "", "zoo": "", "airline": ""}[db_id]
            stem = f"{rng.choice(_LAST)} {rng.choice(['Garden', 'Star', 'River', 'Stone', 'Crown', 'Harbor'])}"
            name = f"{prefix} {stem}".strip() if db_id != "airline" else f"AB{rng.randint(100, 999)}"
        if name in names:
            continue
        names.add(name)
        texts = [rng.choice(values) for _, values in table.text_columns]
        numbers = [rng.randint(low, high) for _, low, high in table.number_columns]
        rows.append((len(rows) + 1, name, *texts, *numbers))
    return rows


def _create_statement(table: _Table) -> str:
    columns = ["id INTEGER PRIMARY KEY", "name TEXT"]
    columns += [f"{column} TEXT" for column, _ in table.text_columns]
    columns += [f"{column} INTEGER" for column, _, _ in table.number_columns]
    return f"CREATE TABLE {table.name} ({', '.join(columns)})"


def schema_text(db_id: str) -> str:
    """The schema the agent sees: the ``CREATE TABLE`` statement."""
    return _create_statement(DATABASES[db_id]) + ";"


def ensure_databases(data_dir: Path = DATA_DIR, seed: int = SEED) -> None:
    """Build every database that is missing (the same content for the same seed).

    Several processes may build them at once (test workers importing the example): each writes a file of its own
    and moves it into place, so a reader only ever opens a whole database, and the last one in wins with the same
    content.
    """
    for index, (db_id, table) in enumerate(sorted(DATABASES.items())):
        path = database_path(db_id, data_dir)
        if path.exists():
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, name = tempfile.mkstemp(dir=path.parent, prefix=f"{path.name}.", suffix=".partial")
        os.close(handle)
        partial = Path(name)
        try:
            rows = _rows(random.Random(seed + index), db_id, table)
            connection = sqlite3.connect(partial)
            try:
                with connection:
                    connection.execute(_create_statement(table))
                    marks = ", ".join("?" for _ in rows[0])
                    connection.executemany(f"INSERT INTO {table.name} VALUES ({marks})", rows)
            finally:
                connection.close()
            partial.replace(path)
        finally:
            partial.unlink(missing_ok=True)


def _allow_reads_only(action: int, _table: Optional[str], function_name: Optional[str], *_: Optional[str]) -> int:
    # mode=ro only guards the database file itself: ATTACH and VACUUM INTO would write other files.
    if action == sqlite3.SQLITE_FUNCTION and (function_name or "").lower() in _UNINTERRUPTIBLE_FUNCTIONS:
        return sqlite3.SQLITE_DENY
    return sqlite3.SQLITE_OK if action in _READ_ACTIONS else sqlite3.SQLITE_DENY


def execute(db_id: str, query: str, data_dir: Path = DATA_DIR, timeout: float = 2.0) -> List[Tuple[Any, ...]]:
    """Run one query on a database with the rights of a ``SELECT`` and return its rows (at most ``MAX_RESULT_ROWS``).

    The query may read tables and call scalar, aggregate and window functions (but ``printf`` and ``format``),
    recursively or not; anything else is refused before it runs: writes, ``ATTACH``, ``VACUUM INTO``, ``PRAGMA``
    (statements and table-valued functions alike), transactions, temporary tables, other table-valued functions.
    A string or blob the query builds longer than ``MAX_VALUE_LENGTH`` is NULL or an error (Python 3.11 and later).

    Raises:
        sqlite3.Error: The query is not valid text, fails, does anything but read, returns no columns (a comment or
            ``REINDEX`` is not a query), holds more than ``MAX_RESULT_LENGTH`` of text, or runs longer than
            ``timeout`` seconds.
    """
    ensure_databases(data_dir)
    try:
        query.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise sqlite3.ProgrammingError(f"the query is not valid text: {exc}") from None
    uri = f"file:{database_path(db_id, data_dir)}?mode=ro"
    connection = sqlite3.connect(uri, uri=True)
    try:
        connection.set_authorizer(_allow_reads_only)
        # setlimit is Python 3.11+; on 3.10 a value may grow to SQLite's compiled-in limit (1e9 bytes by default).
        if hasattr(connection, "setlimit"):
            connection.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, MAX_VALUE_LENGTH)
        # Checked every 100 VM steps, as one step may take a millisecond (a function over a 1 MB string).
        deadline = time.monotonic() + timeout
        connection.set_progress_handler(lambda: time.monotonic() > deadline, 100)
        cursor = connection.execute(query)
        if cursor.description is None:
            raise sqlite3.ProgrammingError(f"not a query (it returns no columns): {query[:80]!r}")
        rows: List[Tuple[Any, ...]] = []
        length = 0
        for row in cursor:
            length += sum(len(value) for value in row if isinstance(value, (str, bytes)))
            if length > MAX_RESULT_LENGTH:
                raise sqlite3.DataError(f"the result holds more than {MAX_RESULT_LENGTH} characters of text")
            rows.append(row)
            if len(rows) == MAX_RESULT_ROWS:
                break
        return rows
    finally:
        connection.close()


def execution_match(predicted: Optional[str], gold: str, db_id: str, data_dir: Path = DATA_DIR) -> bool:
    """Whether ``predicted`` returns the gold query's rows: as a multiset, or in order when the gold query orders.

    A missing query, a query that is not valid text, an error, or a query that does anything but read never matches.
    """
    if not predicted or not predicted.strip():
        return False
    try:
        mine = execute(db_id, predicted, data_dir)
    except (sqlite3.Error, sqlite3.Warning):
        return False
    expected = execute(db_id, gold, data_dir)
    if "order by" in gold.lower():
        return mine == expected
    return Counter(mine) == Counter(expected)


def _questions(
    rng: random.Random, db_id: str, table: _Table, rows: List[Tuple[Any, ...]]
) -> List[Tuple[SqlTask, bool]]:
    """Every question asked of one table, each with whether it has a single answer.

    An ``argmax`` question has several when several rows share the highest (or lowest) value: its gold query
    (``ORDER BY ... LIMIT 1``) names one of them, and a query naming another would score 0.
    """
    t = table.name
    text_cols = [c for c, _ in table.text_columns]
    num_cols = [c for c, _, _ in table.number_columns]
    values = {c: sorted({row[2 + i] for row in rows}) for i, c in enumerate(text_cols)}
    questions: List[Tuple[SqlTask, bool]] = []

    def add(kind: str, question: str, query: str, single_answer: bool = True) -> None:
        questions.append((SqlTask(id="", db_id=db_id, question=question, query=query, kind=kind), single_answer))

    for column in text_cols:
        for value in values[column]:
            add("count", f"How many {table.plural} have {column} {value}?",
                f"SELECT COUNT(*) FROM {t} WHERE {column} = '{value}'")  # fmt: skip
    for row in rng.sample(rows, 6):
        column = rng.choice(text_cols + num_cols)
        add("lookup", f"What is the {column} of {row[1]}?", f"SELECT {column} FROM {t} WHERE name = '{row[1]}'")
    for index, column in enumerate(num_cols):
        numbers = [row[2 + len(text_cols) + index] for row in rows]
        add("max", f"What is the highest {column} of all {table.plural}?", f"SELECT MAX({column}) FROM {t}")
        add("max", f"What is the lowest {column} of all {table.plural}?", f"SELECT MIN({column}) FROM {t}")
        add("argmax", f"Which {table.singular} has the highest {column}? Give its name.",
            f"SELECT name FROM {t} ORDER BY {column} DESC LIMIT 1", numbers.count(max(numbers)) == 1)  # fmt: skip
        add("argmax", f"Which {table.singular} has the lowest {column}? Give its name.",
            f"SELECT name FROM {t} ORDER BY {column} ASC LIMIT 1", numbers.count(min(numbers)) == 1)  # fmt: skip
        threshold = sorted(numbers)[-4]
        add("filter", f"List the names of the {table.plural} whose {column} is greater than {threshold}.",
            f"SELECT name FROM {t} WHERE {column} > {threshold}")  # fmt: skip
    return questions


def make_tasks(data_dir: Path = DATA_DIR, seed: int = SEED) -> Dict[str, List[SqlTask]]:
    """The training and held-out questions, each with a single answer (the databases are built first when missing)."""
    ensure_databases(data_dir, seed)
    rng = random.Random(seed)
    splits: Dict[str, List[SqlTask]] = {}
    for split, db_ids in (("train", TRAIN_DATABASES), ("test", TEST_DATABASES)):
        questions: List[Tuple[SqlTask, bool]] = []
        for db_id in db_ids:
            connection = sqlite3.connect(database_path(db_id, data_dir))
            rows = connection.execute(f"SELECT * FROM {DATABASES[db_id].name} ORDER BY id").fetchall()
            connection.close()
            questions.extend(_questions(rng, db_id, DATABASES[db_id], rows))
        # Dropped after the shuffle, so that dropping a question neither reorders the others nor changes what the
        # generator draws next (the held-out questions, after the training ones).
        rng.shuffle(questions)
        tasks = [task for task, single_answer in questions if single_answer]
        for i, task in enumerate(tasks):
            task["id"] = f"{split}-{i}"
        splits[split] = tasks
    return splits


def load_split(name: str, data_dir: Path = DATA_DIR) -> List[SqlTask]:
    """The shipped ``train`` or ``test`` questions (the databases are built when missing).

    Raises:
        ValueError: ``name`` is not a split.
        examples.common.tasks.TaskFileError: The file is missing or not a file of sql tasks.
    """
    if name not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {name!r}")
    tasks: List[SqlTask] = read_tasks(data_dir / f"{name}.jsonl", SqlTask)  # type: ignore[assignment]
    ensure_databases(data_dir)
    return tasks


def main(argv: Optional[Sequence[str]] = None) -> None:
    """Build the databases and rewrite the shipped questions."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, default=DATA_DIR)
    args = parser.parse_args(argv)
    for name, tasks in make_tasks(args.data_dir).items():
        text = "".join(json.dumps(task, sort_keys=True) + "\n" for task in tasks)
        (args.data_dir / f"{name}.jsonl").write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
