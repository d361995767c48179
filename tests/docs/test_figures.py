"""Figures in the docs come from result files: the markers, the checks, and the result files benchmarks write."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from doc_figures import (
    REPO_ROOT,
    Figure,
    FigureError,
    ResultFiles,
    check_figures,
    check_text,
    doc_pages,
    find_figures,
    resolve,
    write_figures,
)
from result_files import RunRecord, add_result_options, load_result

RESULTS = {
    "in_gateway": {"added_p50_ms": 1.4012, "calls": 4320},
    "rows": [
        {"op": "add_span", "concurrency": 1, "ops_per_s": 892.4},
        {"op": "add_span", "concurrency": 16, "ops_per_s": 1960.2},
    ],
    "accuracy": 0.7833,
}


def _result_dir(tmp_path: Path, **runs: str) -> ResultFiles:
    """Result files NAME.json holding ``RESULTS``, each recorded with the given command."""
    for name, command in runs.items():
        document = {"name": name, "benchmark": "bench", "command": command, "results": RESULTS}
        (tmp_path / f"{name}.json").write_text(json.dumps(document))
    return ResultFiles(tmp_path)


def _figure(key: str, text: str, name: str = "run-a", page: str = "docs/a.md") -> Figure:
    return Figure(page=page, line=1, name=name, key=key, text=text)


def test_every_figure_in_the_docs_is_held_by_a_result_file() -> None:
    figures = [figure for page in doc_pages() for figure in find_figures(page)]
    assert check_figures(figures, ResultFiles()) == []


def test_every_result_file_records_command_commit_and_machine() -> None:
    for path in sorted((REPO_ROOT / "benchmarks" / "results").glob("*.json")):
        document = json.loads(path.read_text())
        assert document["name"] == path.stem, path
        assert document["command"].startswith("python "), path
        assert document["git"]["commit"], path
        assert {"cpu_model", "cores"} <= document["machine"].keys(), path
        assert {"start", "end"} <= document["load_average"].keys(), path
        assert document["nice"] == 0, f"{path}: timed at a lowered priority"
        assert document["started_at"] and document["results"], path


def test_keys_reach_nested_values_list_items_and_scale() -> None:
    assert resolve(RESULTS, "in_gateway.added_p50_ms") == 1.4012
    assert resolve(RESULTS, "rows[1].ops_per_s") == 1960.2
    assert resolve({"per_runner": {"8": 30.2}}, "per_runner.8") == 30.2
    assert resolve(RESULTS, "rows[op=add_span,concurrency=16].ops_per_s") == 1960.2
    assert resolve(RESULTS, "accuracy*100") == pytest.approx(78.33)
    assert resolve(RESULTS, "in_gateway.added_p50_ms/1000") == pytest.approx(0.0014012)


@pytest.mark.parametrize(
    ("key", "message"),
    [
        ("in_gateway.missing", "no 'missing'"),
        ("rows[5].ops_per_s", "no item 5"),
        ("rows[op=add_span].ops_per_s", "2 items match"),
        ("rows[op=query_spans].ops_per_s", "0 items match"),
        ("in_gateway*100", "non-number"),
    ],
)
def test_a_key_the_result_does_not_hold_is_an_error_naming_it(key: str, message: str) -> None:
    with pytest.raises(FigureError, match=message.replace("[", r"\[")):
        resolve(RESULTS, key)


@pytest.mark.parametrize(
    ("value", "text", "ok"),
    [
        (1.4012, "1.40", True),
        (1.4012, "1.4", True),
        (1.4012, "1", True),
        (1.4012, "1.41", False),
        (1960.2, "1,960", True),
        (1960.2, "1960", True),
        (1960.2, "1,961", False),
        (4320, "4,320", True),
        (4320, "4321", False),
        (0.7833, "about 0.78", False),
        ("sqlite", "sqlite", True),
    ],
)
def test_the_text_must_show_the_value_rounded_as_written(value: object, text: str, ok: bool) -> None:
    assert (check_text(value, text) is None) is ok


def test_a_figure_without_its_result_file_fails(tmp_path: Path) -> None:
    results = _result_dir(tmp_path, **{"run-a": "python benchmarks/bench.py"})
    problems = check_figures([_figure("accuracy", "0.78", name="run-gone")], results)
    assert len(problems) == 1 and "no result file run-gone.json" in problems[0]


def test_a_figure_that_differs_from_its_result_fails(tmp_path: Path) -> None:
    results = _result_dir(tmp_path, **{"run-a": "python benchmarks/bench.py"})
    assert check_figures([_figure("accuracy", "0.78")], results) == []
    problems = check_figures([_figure("accuracy", "0.80")], results)
    assert len(problems) == 1 and "does not match" in problems[0] and "docs/a.md:1" in problems[0]


def test_two_pages_quoting_different_runs_of_one_command_fail(tmp_path: Path) -> None:
    results = _result_dir(tmp_path, **{"run-a": "python benchmarks/bench.py", "run-b": "python benchmarks/bench.py"})
    figures = [_figure("accuracy", "0.78", "run-a", "README.md"), _figure("accuracy", "0.78", "run-b", "docs/x.md")]
    problems = check_figures(figures, results)
    assert len(problems) == 1 and "quoted from different runs" in problems[0]


def test_the_run_record_page_may_list_several_runs_and_other_commands_are_other_things(tmp_path: Path) -> None:
    results = _result_dir(
        tmp_path,
        **{
            "run-a": "python benchmarks/bench.py",
            "run-b": "python benchmarks/bench.py",
            "run-c": "python benchmarks/bench.py --stream",
        },
    )
    figures = [
        _figure("accuracy", "0.78", "run-a", "README.md"),
        _figure("accuracy", "0.78", "run-b", "docs/benchmarks.md"),
        _figure("accuracy", "0.78", "run-c", "docs/x.md"),
    ]
    assert check_figures(figures, results) == []


def test_markers_are_found_with_their_line_and_written_from_the_result(tmp_path: Path) -> None:
    (tmp_path / "results").mkdir()
    results = _result_dir(tmp_path / "results", **{"run-a": "python benchmarks/bench.py"})
    page = tmp_path / "docs" / "page.md"
    page.parent.mkdir()
    page.write_text(
        "Intro.\n\n| op | ops/s |\n|---|---|\n"
        "| add_span | <!--fig run-a:rows[op=add_span,concurrency=16].ops_per_s-->1,000<!--/fig--> |\n"
        "Accuracy <!--fig run-a:accuracy*100-->0.0<!--/fig--> %.\n"
    )
    figures = find_figures(page, root=tmp_path)
    assert [(f.line, f.key, f.text) for f in figures] == [
        (5, "rows[op=add_span,concurrency=16].ops_per_s", "1,000"),
        (6, "accuracy*100", "0.0"),
    ]
    assert write_figures(page, results) == 2
    assert "-->1,960<!--/fig-->" in page.read_text() and "-->78.3<!--/fig-->" in page.read_text()
    assert check_figures(find_figures(page, root=tmp_path), results) == []


def test_a_run_record_writes_command_commit_machine_and_load(tmp_path: Path) -> None:
    import argparse

    parser = argparse.ArgumentParser()
    add_result_options(parser)
    options = parser.parse_args(["--result-name", "bench-test", "--results-dir", str(tmp_path)])
    record = RunRecord.start(str(REPO_ROOT / "benchmarks" / "bench.py"), ["--requests", "10"])
    path = record.finish({"p50_ms": 1.2}, options)
    assert path == tmp_path / "bench-test.json"
    document = load_result("bench-test", tmp_path)
    assert document["command"] == "python benchmarks/bench.py --requests 10"
    assert document["benchmark"] == "bench"
    assert len(document["git"]["commit"]) == 40
    assert document["machine"]["cores"] >= 1 and document["machine"]["cpu_model"]
    assert len(document["load_average"]["start"]) == 3 and len(document["load_average"]["end"]) == 3
    assert document["results"] == {"p50_ms": 1.2}


def test_no_result_prints_and_writes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import argparse

    parser = argparse.ArgumentParser()
    add_result_options(parser)
    options = parser.parse_args(["--no-result", "--results-dir", str(tmp_path)])
    assert RunRecord.start("bench.py", []).finish({"x": 1}, options) is None
    assert list(tmp_path.iterdir()) == []
    assert json.loads(capsys.readouterr().out)["results"] == {"x": 1}


def test_the_check_command_passes_on_the_docs() -> None:
    done = subprocess.run(
        [sys.executable, str(REPO_ROOT / "benchmarks" / "doc_figures.py"), "check"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr


def test_markers_inside_code_blocks_are_examples_not_figures(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "```text\n<!--fig run-gone:x-->1<!--/fig-->\n```\n\nProse <!--fig run-a:accuracy-->0.78<!--/fig-->.\n"
    )
    assert [(f.line, f.name) for f in find_figures(page, root=tmp_path)] == [(5, "run-a")]
