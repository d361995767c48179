"""``benchmarks/demo_memory.py``: process-tree sampling on small real process trees."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import ModuleType
from typing import Iterator

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "demo_memory.py"
MIB = 1024 * 1024


@pytest.fixture(scope="module")
def demo_memory() -> ModuleType:
    spec = importlib.util.spec_from_file_location("demo_memory", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["demo_memory"] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


# A parent that fills 64 MiB, forks a child sharing those pages, and starts a `sleep` with another command line.
_TREE = textwrap.dedent(
    """
    import os, subprocess, sys, time
    block = bytearray(b"x") * (64 * 1024 * 1024)
    child = os.fork()
    if child == 0:
        time.sleep(60)
        os._exit(0)
    other = subprocess.Popen(["sleep", "60"])
    print(child, other.pid, flush=True)
    sys.stdin.read()
    for pid in (child, other.pid):
        os.kill(pid, 9)
    """
)


@pytest.fixture
def tree() -> Iterator[tuple[subprocess.Popen[str], int, int]]:
    parent = subprocess.Popen([sys.executable, "-c", _TREE], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None and parent.stdin is not None
    forked, other = (int(x) for x in parent.stdout.readline().split())
    try:
        yield parent, forked, other
    finally:
        parent.stdin.close()
        parent.wait(timeout=30)


def test_sample_lists_every_process_of_the_tree(demo_memory: ModuleType, tree) -> None:
    parent, forked, other = tree
    pids = [p.pid for p in demo_memory.sample_tree(parent.pid)]
    assert pids[0] == parent.pid
    assert sorted(pids) == sorted([parent.pid, forked, other])


def test_shared_pages_of_a_fork_count_once_in_pss(demo_memory: ModuleType, tree) -> None:
    parent, forked, _ = tree
    by_pid = {p.pid: p for p in demo_memory.sample_tree(parent.pid)}
    main, child = by_pid[parent.pid], by_pid[forked]
    assert main.rss > 64 * MIB and child.rss > 64 * MIB  # each maps the whole block
    # PSS splits the shared block between the two: their sum holds it once, not twice.
    assert main.pss + child.pss < main.rss + child.rss - 48 * MIB
    assert main.pss + child.pss > 64 * MIB


def test_kinds_tell_the_main_process_forks_and_other_commands_apart(demo_memory: ModuleType, tree) -> None:
    parent = tree[0]
    tracker = demo_memory.PeakTracker(parent.pid)
    tracker.add(0.5, demo_memory.sample_tree(parent.pid))
    report = tracker.report()
    assert set(report["kinds"]) == {demo_memory.MAIN_KIND, demo_memory.FORKED_KIND, "sleep 60"}
    assert report["kinds"][demo_memory.FORKED_KIND]["max_processes"] == 1
    assert report["peak_pss_time_s"] == 0.5
    assert report["rss_at_peak_pss_mib"] > report["peak_pss_mib"]


def test_a_process_that_exited_is_skipped(demo_memory: ModuleType) -> None:
    done = subprocess.Popen(["true"])
    done.wait()
    assert demo_memory.read_process(done.pid) is None


def test_a_zombie_is_skipped(demo_memory: ModuleType) -> None:
    zombie = subprocess.Popen(["true"])  # exits, and stays a zombie until waited for
    try:
        stat = Path(f"/proc/{zombie.pid}/stat")
        deadline = time.monotonic() + 10
        while stat.read_text().rsplit(")", 1)[1].split()[0] != "Z":
            assert time.monotonic() < deadline, "the child never exited"
            time.sleep(0.01)
        assert demo_memory.read_process(zombie.pid) is None
    finally:
        zombie.wait()


def test_main_reports_the_result_and_the_exit_status(demo_memory: ModuleType, tmp_path: Path, capsys) -> None:
    summary = tmp_path / "summary.json"
    write = "import json, sys; json.dump({'baseline_val_accuracy': 0.25, 'final_val_accuracy': 0.75}, open(sys.argv[2], 'w'))"
    assert (
        demo_memory.main(["--interval", "0.1", "--", sys.executable, "-c", write, "--summary-json", str(summary)]) == 0
    )
    report = json.loads(capsys.readouterr().out)["results"]
    assert report["exit_status"] == 0 and report["held_out_gain_points"] == 50.0
    assert report["samples"] >= 1 and report["peak_pss_mib"] > 0

    assert demo_memory.main(["--interval", "0.1", "--", sys.executable, "-c", "import sys; sys.exit(3)"]) == 3
    assert json.loads(capsys.readouterr().out)["results"]["exit_status"] == 3


def test_sigterm_stops_the_command_and_still_reports(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    child = f"import pathlib, time; pathlib.Path({str(ready)!r}).touch(); time.sleep(60)"
    script = subprocess.Popen(
        [sys.executable, str(SCRIPT), "--interval", "0.1", "--", sys.executable, "-c", child],
        stdout=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 30
    while not ready.exists():
        assert time.monotonic() < deadline, "the command never started"
        time.sleep(0.05)
    script.terminate()
    out, _ = script.communicate(timeout=30)
    report = json.loads(out)["results"]
    assert report["exit_status"] != 0 and script.returncode != 0
    assert report["wall_s"] < 30 and report["samples"] >= 1
