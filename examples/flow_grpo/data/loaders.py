"""Task records and loaders.

Every task has the schema ``{"id", "question", "chain", "result", "source", "extra_info": {"ground_truth", "idx"}}``
where ``ground_truth`` is the **list** of accepted answers and ``result`` the first of them (the reward accepts
any). ``source`` routes the reward: math sources are scored by equivalence, the others by exact match.

DeepMath-103K and Natural Questions are read from parquet or JSONL files a user already has (nothing is
downloaded); the offline dataset shipped with the example lives next to this module.
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

__all__ = [
    "DATA_DIR",
    "TaskRecord",
    "combine",
    "load_deepmath",
    "load_nq",
    "load_offline_dataset",
    "load_tasks",
    "make_record",
    "read_table",
    "split_holdout",
    "write_jsonl",
]

DATA_DIR = Path(__file__).resolve().parent
TaskRecord = Dict[str, Any]
PathLike = Union[str, Path]


def make_record(idx: int, question: str, answers: Sequence[Any], source: str) -> TaskRecord:
    """A task in the dataset schema.

    Raises:
        ValueError: Empty question or no non-empty answer.
    """
    question = question.strip()
    golds = _clean_answers(answers)
    if not question:
        raise ValueError(f"task {idx}: empty question")
    if not golds:
        raise ValueError(f"task {idx}: no gold answer")
    return {
        "id": idx,
        "question": question,
        "chain": "",
        "result": golds[0],
        "source": source,
        "extra_info": {"ground_truth": golds, "idx": idx},
    }


def _clean_answers(value: Any) -> List[str]:
    """Gold answers as a list of non-empty strings (lists, tuples, numpy arrays, scalars; NaN/None dropped)."""
    if value is None:
        return []
    if isinstance(value, str):
        return [value.strip()] if value.strip() else []
    if hasattr(value, "tolist") and not isinstance(value, (int, float)):
        value = value.tolist()
    if isinstance(value, (list, tuple)):
        return [item for entry in value for item in _clean_answers(entry)]
    if isinstance(value, float) and math.isnan(value):
        return []
    text = str(value).strip()
    return [text] if text and text.lower() != "nan" else []


def read_table(path: PathLike) -> List[Dict[str, Any]]:
    """Rows of a ``.parquet`` (needs pyarrow), ``.jsonl`` or ``.json`` (a list of objects) file.

    Raises:
        ValueError: Unknown extension, or a line/element that is not a JSON object (named in the message).
        ImportError: Parquet without pyarrow (install ``agentbolt[examples]``).
    """
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise ImportError("reading parquet files needs pyarrow: pip install 'agentbolt[examples]'") from None
        return list(pq.read_table(path).to_pylist())
    if suffix == ".jsonl":
        rows = []
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{number}: invalid JSON ({exc.msg})") from None
            if not isinstance(row, dict):
                raise ValueError(f"{path}:{number}: expected a JSON object")
            rows.append(row)
        return rows
    if suffix == ".json":
        data = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(data, list) or not all(isinstance(row, dict) for row in data):
            raise ValueError(f"{path}: expected a JSON list of objects")
        return data
    raise ValueError(f"{path}: unsupported file type {suffix!r} (use .parquet, .jsonl or .json)")


def _field(row: Mapping[str, Any], names: Sequence[str], path: PathLike, index: int) -> Any:
    for name in names:
        if row.get(name) is not None:  # parquet rows carry every column, null where absent
            return row[name]
    raise ValueError(f"{path}: row {index} has none of the fields {list(names)}")


def load_deepmath(path: PathLike, limit: Optional[int] = None) -> List[TaskRecord]:
    """DeepMath-103K rows (``question``/``Problem``, ``final_answer``/``Answer``) as math tasks (source ``mathhard``)."""
    records = []
    for index, row in enumerate(read_table(path)[:limit]):
        question = _field(row, ("question", "Problem"), path, index)
        answer = _field(row, ("final_answer", "Answer"), path, index)
        records.append(make_record(index, str(question), [answer], "mathhard"))
    return records


def load_nq(path: PathLike, limit: Optional[int] = None) -> List[TaskRecord]:
    """Natural Questions rows (``question``, ``golden_answers``) as QA tasks (source ``nq``), every answer kept.

    Rows without a usable answer are skipped (they cannot be scored).
    """
    records = []
    for index, row in enumerate(read_table(path)[:limit]):
        question = str(_field(row, ("question",), path, index)).strip()
        if question and not question.endswith("?"):
            question += "?"
        answers = _clean_answers(_field(row, ("golden_answers", "answers", "answer"), path, index))
        if question and answers:
            records.append(make_record(index, question, answers, "nq"))
    return records


def combine(datasets: Iterable[Sequence[TaskRecord]], seed: int = 42) -> List[TaskRecord]:
    """Concatenate, shuffle with ``seed`` and renumber ``id`` / ``extra_info.idx`` from 0."""
    merged = [dict(record, extra_info=dict(record["extra_info"])) for dataset in datasets for record in dataset]
    random.Random(seed).shuffle(merged)
    for index, record in enumerate(merged):
        record["id"] = index
        record["extra_info"]["idx"] = index
    return merged


def split_holdout(
    records: Sequence[TaskRecord], fraction: float = 0.2, seed: int = 0
) -> Tuple[List[TaskRecord], List[TaskRecord]]:
    """``(train, held_out)``: a fixed-seed random ``fraction`` of the records is held out.

    Raises:
        ValueError: ``fraction`` not in (0, 1).
    """
    if not 0 < fraction < 1:
        raise ValueError(f"fraction must be in (0, 1), got {fraction}")
    order = list(range(len(records)))
    random.Random(seed).shuffle(order)
    held = set(order[: round(len(records) * fraction)])
    train = [r for i, r in enumerate(records) if i not in held]
    held_out = [r for i, r in enumerate(records) if i in held]
    return train, held_out


def write_jsonl(records: Iterable[Mapping[str, Any]], path: PathLike) -> None:
    """Write one JSON object per line (stable key order, UTF-8)."""
    lines = [json.dumps(record, ensure_ascii=False) for record in records]
    Path(path).write_text("\n".join(lines) + "\n", encoding="utf-8")


def load_tasks(path: PathLike) -> List[TaskRecord]:
    """Tasks in the dataset schema from a file (see :func:`read_table`), checked.

    Raises:
        ValueError: A record lacks ``question`` or gold answers (the message names the row).
    """
    tasks = []
    for index, row in enumerate(read_table(path)):
        extra = row.get("extra_info") or {}
        answers = extra.get("ground_truth") if isinstance(extra, Mapping) else None
        if answers is None:
            answers = row.get("result")
        if not isinstance(row.get("question"), str) or not _clean_answers(answers):
            raise ValueError(f"{path}: row {index} needs a 'question' and gold answers")
        record = make_record(
            int(row.get("id", index)), row["question"], _clean_answers(answers), str(row.get("source", "qa"))
        )
        # The chain and any other extra_info entries (a reference plan, for instance) travel with the task.
        record["chain"] = str(row.get("chain") or "")
        if isinstance(extra, Mapping):
            record["extra_info"].update({k: v for k, v in extra.items() if k not in ("ground_truth", "idx")})
        tasks.append(record)
    return tasks


def load_offline_dataset(split: str = "train") -> List[TaskRecord]:
    """The generated dataset shipped with the example: ``split`` is ``"train"`` or ``"val"`` (held out).

    Raises:
        ValueError: Unknown split.
    """
    if split not in ("train", "val"):
        raise ValueError(f"split must be 'train' or 'val', got {split!r}")
    return load_tasks(DATA_DIR / f"{split}.jsonl")
