"""Datasets of the Flow-GRPO example: the task schema, loaders, and the shipped offline dataset and corpus."""

from examples.flow_grpo.data.loaders import (
    DATA_DIR,
    TaskRecord,
    combine,
    load_deepmath,
    load_nq,
    load_offline_dataset,
    load_tasks,
    make_record,
    read_table,
    split_holdout,
    write_jsonl,
)

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
