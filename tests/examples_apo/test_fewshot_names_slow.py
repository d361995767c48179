"""FewShotAPO on the name formatter with the embedded model (slow: minutes on 2 cores)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow


def test_fewshot_on_the_name_formatter_with_the_embedded_model() -> None:
    pytest.importorskip("torch")
    from examples.apo.fewshot_names import main

    report = main(["--limit", "8", "--val-batch-size", "4", "--runners", "2"])
    search = report["search"]
    assert report["agent_model"] == "smollm2-135m-instruct"
    assert search["rollouts"] >= 8 + 16 and search["rollouts_failed"] == 0
    assert report["test_seed"]["all"]["total"] == report["test_best"]["all"]["total"] == 8
    assert report["test_constant_answer"]["score"] == 1 / 8  # eight requests, eight answers
    # a best prompt other than the seed passed the repetition guard on the full validation split
    best = search["best_version"]
    assert best == "v0" or not search["echo_checks"][best]["refused"]
