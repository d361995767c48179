"""Task lists as VERL's dataloaders read them.

VERL's trainer iterates a ``torch`` dataset through a dataloader whose ``collate_fn`` stacks tensors and gathers
everything else into object arrays. In agent mode nothing is tokenized up front: an item is the task itself (any
JSON-like value the agent understands), which the daemon enqueues as a rollout.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, Iterable, List, Sequence, Union

from torch.utils.data import Dataset

__all__ = ["AgentDataset", "LoadedDataset"]


class AgentDataset(Dataset):  # type: ignore[type-arg]
    """Tasks for VERL's dataloader: item ``i`` is ``{"task": tasks[i], "index": i}``.

    Args:
        tasks: The tasks (a list, a Hugging Face dataset, any sequence).

    Raises:
        ValueError: No task.
        TypeError: ``tasks`` is not a sequence.
    """

    def __init__(self, tasks: Sequence[Any]) -> None:
        if isinstance(tasks, (str, bytes, dict)) or not hasattr(tasks, "__len__") or not hasattr(tasks, "__getitem__"):
            raise TypeError(f"tasks must be a sequence of tasks, got {type(tasks).__name__}")
        if len(tasks) == 0:
            raise ValueError("the dataset has no task")
        self.tasks = tasks

    def __len__(self) -> int:
        return len(self.tasks)

    def __getitem__(self, index: int) -> Dict[str, Any]:
        return {"task": self.tasks[index], "index": index}


class LoadedDataset(AgentDataset):
    """Tasks read from files: Parquet (one task per row), JSON (a list) or JSON Lines (one task per line).

    Args:
        files: One path or several (their tasks are concatenated in order).

    Raises:
        ValueError: An unknown file type, a JSON file that is not a list, or no task at all.
    """

    def __init__(self, files: Union[str, Path, Iterable[Union[str, Path]]]) -> None:
        paths = [Path(files)] if isinstance(files, (str, Path)) else [Path(f) for f in files]
        tasks: List[Any] = []
        for path in paths:
            tasks.extend(_read_tasks(path.expanduser()))
        super().__init__(tasks)
        self.files = paths


def _read_tasks(path: Path) -> List[Any]:
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        import pandas

        return pandas.read_parquet(path).to_dict("records")
    if suffix == ".jsonl":
        with path.open(encoding="utf-8") as handle:
            return [json.loads(line) for line in handle if line.strip()]
    if suffix == ".json":
        data = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(data, list):
            raise ValueError(f"{path} must hold a JSON list of tasks, got {type(data).__name__}")
        return data
    raise ValueError(f"cannot read tasks from {path}: use .parquet, .json or .jsonl")
