"""Reading an example's task file: one JSON object per line, each with the keys of the example's task type.

A file a user edited or replaced (their own tasks in the example's format) is checked as it is read, so a problem is
one :class:`TaskFileError` naming the file, the line and what is wrong, which the command lines turn into one error
line and exit code 2 before anything starts, rather than a ``KeyError`` in a rollout minutes later.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List

from agentbolt.algorithm.sft.data import DataError, iter_jsonl

__all__ = ["TaskFileError", "read_tasks"]


class TaskFileError(ValueError):
    """A task file cannot be used; the message names the file (and the line)."""


def read_tasks(path: Path, task_type: Any) -> List[Dict[str, Any]]:
    """The objects of the JSON-lines file ``path``, each holding every required key of the TypedDict ``task_type``.

    Raises:
        TaskFileError: The file is missing, holds no task, or a line is not JSON, not an object or lacks a key.
    """
    required = sorted(task_type.__required_keys__)
    tasks: List[Dict[str, Any]] = []
    try:
        for number, row in iter_jsonl(path):
            if not isinstance(row, dict):
                raise TaskFileError(f"{path}:{number}: expected a JSON object, got {type(row).__name__}")
            missing = [key for key in required if key not in row]
            if missing:
                raise TaskFileError(f"{path}:{number}: missing key(s) {', '.join(missing)}")
            tasks.append(row)
    except DataError as exc:
        raise TaskFileError(str(exc)) from None
    if not tasks:
        raise TaskFileError(f"{path}: no tasks (expected one JSON object per line)")
    return tasks
