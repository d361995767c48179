"""The prompt-optimization examples refuse counts out of range as usage errors, before any model is served."""

from __future__ import annotations

from typing import Any, List

import pytest

from examples.apo import apo_custom_algorithm_trainer, apo_debug, fewshot_names, room_selector_apo


@pytest.mark.parametrize(
    ("main", "argv", "message"),
    [
        (room_selector_apo.parse_args, ["--limit", "-1"], "argument --limit: must be at least 1, got -1"),
        (room_selector_apo.parse_args, ["--limit", "0"], "argument --limit: must be at least 1, got 0"),
        (room_selector_apo.parse_args, ["--runners", "0"], "argument --runners: must be at least 1"),
        (room_selector_apo.parse_args, ["--val-batch-size", "0"], "argument --val-batch-size: must be at least 1"),
        (room_selector_apo.parse_args, ["--rounds", "-1"], "argument --rounds: must be at least 0"),
        (room_selector_apo.parse_args, ["--limit", "two"], "argument --limit: expected a whole number, got 'two'"),
        (fewshot_names.parse_args, ["--limit", "-3"], "argument --limit: must be at least 1"),
        (fewshot_names.parse_args, ["--finalists", "0"], "argument --finalists: must be at least 1"),
        (apo_debug.main, ["--tasks", "0"], "argument --tasks: must be at least 1"),
        (apo_custom_algorithm_trainer.main, ["--runners", "0"], "argument --runners: must be at least 1"),
    ],
)
def test_a_count_out_of_range_is_a_usage_error(main: Any, argv: List[str], message: str, capsys: Any) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_counts_in_range_are_taken() -> None:
    args = room_selector_apo.parse_args(["--limit", "4", "--rounds", "0", "--runners", "2"])
    assert (args.limit, args.rounds, args.runners) == (4, 0, 2)
