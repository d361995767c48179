"""Peak memory of ``agentbolt demo`` (or any command): PSS summed over its whole process tree, sampled every second.

Each sample lists the command's process and all its descendants (from ``/proc/*/stat``) and reads ``Pss`` and ``Rss``
from ``/proc/PID/smaps_rollup``. PSS (proportional set size) divides every page among the processes that map it, so
the pages forked runners share with the main process count once in the sum; RSS counts them once per process and is
reported next to it for comparison. Processes that exit between the listing and the reading are skipped.

Prints one JSON document: peak summed PSS (and when it happened), summed RSS at that moment and at its own peak, the
peak of every process kind (the main process, forked children with the main process's command line, other commands),
wall time, the command's exit status and, for the demo, its ``--summary-json`` result. Exits with the command's
status when it failed. Ctrl-C or SIGTERM is passed on to the command as SIGINT (the demo then stops its runners)
and the report of what was sampled so far is still printed.

Reading ``smaps_rollup`` walks the page tables of the process, so sampling costs CPU in proportion to the memory it
measures; the report gives the sampler's own CPU time (``sampler_cpu_s``).

Usage:
    .venv/bin/python benchmarks/demo_memory.py                            # agentbolt demo with its defaults
    .venv/bin/python benchmarks/demo_memory.py --timeline /tmp/mem.jsonl  # also every sample, per process
    .venv/bin/python benchmarks/demo_memory.py -- .venv/bin/agentbolt demo --quick --summary-json /tmp/s.json
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from result_files import RunRecord, add_result_options

MIB = 1024 * 1024
MAIN_KIND = "main"
FORKED_KIND = "forked from main"


@dataclass(frozen=True)
class ProcessMemory:
    """One process in one sample (sizes in bytes)."""

    pid: int
    ppid: int
    pss: int
    rss: int
    uss: int
    cmdline: str


def _parent_pids() -> Dict[int, int]:
    """``{pid: parent pid}`` of every process visible in ``/proc`` right now."""
    parents: Dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:  # exited since the listing
            continue
        # The command name (field 2) is in parentheses and may contain spaces; the parent pid follows the state.
        fields = stat[stat.rfind(")") + 2 :].split()
        parents[int(entry)] = int(fields[1])
    return parents


def process_tree(root: int) -> List[int]:
    """``root`` and all its living descendants, ``root`` first."""
    children: Dict[int, List[int]] = {}
    for pid, ppid in _parent_pids().items():
        children.setdefault(ppid, []).append(pid)
    tree, pending = [], [root]
    while pending:
        pid = pending.pop()
        tree.append(pid)
        pending.extend(sorted(children.get(pid, [])))
    return tree


def read_process(pid: int, ppid: int = 0) -> Optional[ProcessMemory]:
    """PSS and RSS of ``pid`` from ``/proc/PID/smaps_rollup``; ``None`` when it has exited (or is a zombie)."""
    try:
        rollup = Path(f"/proc/{pid}/smaps_rollup").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    sizes: Dict[str, int] = {}
    for line in rollup.splitlines()[1:]:
        key, _, value = line.partition(":")
        parts = value.split()
        if len(parts) == 2 and parts[1] == "kB":
            sizes[key] = int(parts[0]) * 1024
    if "Pss" not in sizes:  # a zombie has an empty rollup
        return None
    command = " ".join(part.decode(errors="replace") for part in cmdline.split(b"\0") if part)
    private = sizes.get("Private_Clean", 0) + sizes.get("Private_Dirty", 0)
    return ProcessMemory(pid, ppid, sizes["Pss"], sizes.get("Rss", 0), private, command)


def sample_tree(root: int) -> List[ProcessMemory]:
    """Memory of every living process of ``root``'s tree (``root`` first, when it is still alive)."""
    parents = _parent_pids()
    out = []
    for pid in process_tree(root):
        memory = read_process(pid, parents.get(pid, 0))
        if memory is not None:
            out.append(memory)
    return out


def process_kind(process: ProcessMemory, root: int, root_cmdline: str) -> str:
    """``main`` for the root, ``forked from main`` for forks running the root's command line, else the command."""
    if process.pid == root:
        return MAIN_KIND
    if process.cmdline == root_cmdline:
        return FORKED_KIND
    return process.cmdline[:160] or f"pid {process.pid}"


class PeakTracker:
    """Running peaks over samples of one process tree."""

    def __init__(self, root: int) -> None:
        self.root = root
        self.root_cmdline = ""
        self.samples = 0
        self.peak_pss = 0
        self.peak_pss_time = 0.0
        self.rss_at_peak_pss = 0
        self.processes_at_peak_pss: List[Dict[str, Any]] = []
        self.peak_rss = 0
        self.kinds: Dict[str, Dict[str, Any]] = {}

    def add(self, elapsed: float, processes: Sequence[ProcessMemory]) -> None:
        """Fold one sample taken ``elapsed`` seconds after the start."""
        if not processes:
            return
        if processes[0].pid == self.root and not self.root_cmdline:
            self.root_cmdline = processes[0].cmdline
        self.samples += 1
        pss, rss = sum(p.pss for p in processes), sum(p.rss for p in processes)
        self.peak_rss = max(self.peak_rss, rss)
        by_kind: Dict[str, List[ProcessMemory]] = {}
        for process in processes:
            by_kind.setdefault(process_kind(process, self.root, self.root_cmdline), []).append(process)
        if pss > self.peak_pss:
            self.peak_pss, self.peak_pss_time, self.rss_at_peak_pss = pss, elapsed, rss
            self.processes_at_peak_pss = [
                {"kind": kind, "processes": len(group), "pss_mib": _mib(sum(p.pss for p in group))}
                for kind, group in by_kind.items()
            ]
        for kind, group in by_kind.items():
            entry = self.kinds.setdefault(
                kind, {"peak_pss_mib": 0.0, "peak_time_s": 0.0, "max_processes": 0, "peak_process_pss_mib": 0.0}
            )
            total = _mib(sum(p.pss for p in group))
            if total > entry["peak_pss_mib"]:
                entry["peak_pss_mib"], entry["peak_time_s"] = total, round(elapsed, 1)
                entry["peak_rss_mib"] = _mib(sum(p.rss for p in group))
            entry["max_processes"] = max(entry["max_processes"], len(group))
            entry["peak_process_pss_mib"] = max(entry["peak_process_pss_mib"], _mib(max(p.pss for p in group)))

    def report(self) -> Dict[str, Any]:
        """The peaks as a JSON-able dict (sizes in MiB)."""
        return {
            "samples": self.samples,
            "peak_pss_mib": _mib(self.peak_pss),
            "peak_pss_gib": round(self.peak_pss / 1024**3, 3),
            "peak_pss_time_s": round(self.peak_pss_time, 1),
            "rss_at_peak_pss_mib": _mib(self.rss_at_peak_pss),
            "peak_rss_mib": _mib(self.peak_rss),
            "at_peak": self.processes_at_peak_pss,
            "kinds": self.kinds,
        }


def _mib(size: int) -> float:
    return round(size / MIB, 1)


def _timeline_row(elapsed: float, processes: Sequence[ProcessMemory], root: int, root_cmdline: str) -> Dict[str, Any]:
    return {
        "t": round(elapsed, 2),
        "pss_mib": _mib(sum(p.pss for p in processes)),
        "rss_mib": _mib(sum(p.rss for p in processes)),
        "processes": [
            {
                "pid": p.pid,
                "kind": process_kind(p, root, root_cmdline),
                "pss_mib": _mib(p.pss),
                "rss_mib": _mib(p.rss),
                "uss_mib": _mib(p.uss),
            }
            for p in processes
        ],
    }


def _summary_path(command: Sequence[str]) -> Optional[Path]:
    """The ``--summary-json`` file an ``agentbolt demo`` command line writes, if any."""
    for index, part in enumerate(command):
        if part == "--summary-json" and index + 1 < len(command):
            return Path(command[index + 1])
        if part.startswith("--summary-json="):
            return Path(part.split("=", 1)[1])
    return None


def _default_command(output_dir: Path) -> List[str]:
    script = Path(sys.executable).with_name("agentbolt")
    launcher = [str(script)] if script.exists() else [sys.executable, "-c", "from agentbolt.cli import main; main()"]
    return [*launcher, "demo", "--output-dir", str(output_dir), "--summary-json", str(output_dir / "summary.json")]


def measure(command: Sequence[str], *, interval: float = 1.0, timeline: Optional[Path] = None) -> Dict[str, Any]:
    """Run ``command`` to completion, sampling its process tree every ``interval`` seconds.

    Returns:
        The report (see the module docstring); ``exit_status`` is the command's return code.
    """
    started = time.monotonic()
    cpu_started = time.process_time()
    # The command gets the default SIGINT action even when this script runs in the background (where SIGINT is
    # ignored), so that forwarding Ctrl-C / SIGTERM below lets it stop its own children and exit cleanly.
    process = subprocess.Popen(list(command), preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    previous = {
        signum: signal.signal(signum, lambda *_: process.send_signal(signal.SIGINT))
        for signum in (signal.SIGINT, signal.SIGTERM)
    }
    tracker = PeakTracker(process.pid)
    log = timeline.open("w", encoding="utf-8") if timeline is not None else None
    try:
        while True:
            elapsed = time.monotonic() - started
            processes = sample_tree(process.pid)
            tracker.add(elapsed, processes)
            if log is not None:
                log.write(json.dumps(_timeline_row(elapsed, processes, process.pid, tracker.root_cmdline)) + "\n")
                log.flush()
            try:
                status = process.wait(timeout=max(0.0, interval - (time.monotonic() - started - elapsed)))
                break
            except subprocess.TimeoutExpired:
                continue
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if log is not None:
            log.close()
    wall = time.monotonic() - started
    report: Dict[str, Any] = {
        "command": list(command),
        "interval_s": interval,
        "wall_s": round(wall, 1),
        "exit_status": status,
        "sampler_cpu_s": round(time.process_time() - cpu_started, 1),
        **tracker.report(),
    }
    summary = _summary_path(command)
    if summary is not None and summary.is_file():
        result = json.loads(summary.read_text(encoding="utf-8"))
        report["result"] = result
        if "baseline_val_accuracy" in result and "final_val_accuracy" in result:
            gain = 100.0 * (result["final_val_accuracy"] - result["baseline_val_accuracy"])
            report["held_out_gain_points"] = round(gain, 1)
    return report


def main(argv: Optional[Sequence[str]] = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    command: List[str] = []
    if "--" in arguments:
        split = arguments.index("--")
        arguments, command = arguments[:split], arguments[split + 1 :]
    record = RunRecord.start(__file__, arguments + (["--", *command] if command else []))
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--interval", type=float, default=1.0, help="Seconds between samples (default 1).")
    parser.add_argument("--timeline", type=Path, help="Write every sample (per process) to this JSON-lines file.")
    parser.add_argument(
        "--output-dir", type=Path, help="Demo output directory when no command is given (default: a new temp dir)."
    )
    add_result_options(parser)
    args = parser.parse_args(arguments)
    if args.interval <= 0:
        parser.error("--interval must be positive")
    if not command:
        output_dir = args.output_dir or Path(tempfile.mkdtemp(prefix="demo-memory-"))
        output_dir.mkdir(parents=True, exist_ok=True)
        command = _default_command(output_dir)
    report = measure(command, interval=args.interval, timeline=args.timeline)
    record.finish(report, args)
    return 0 if report["exit_status"] == 0 else (report["exit_status"] if report["exit_status"] > 0 else 1)


if __name__ == "__main__":
    sys.exit(main())
