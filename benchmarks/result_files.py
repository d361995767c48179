"""Result files: every benchmark and training run writes one, and the docs quote their figures from them.

A result file is ``benchmarks/results/<name>.json``::

    {
      "name": "gateway_bench-20261126-0130",
      "benchmark": "gateway_bench",
      "command": "python benchmarks/gateway_bench.py --requests 1000",
      "git": {"commit": "3f2c...", "dirty": false},      # dirty: the code differed from the commit
      "machine": {"cpu_model": "AMD EPYC", "cores": 2, "memory_gib": 23.5, "cpu_flags": ["avx2"], ...},
      "started_at": "2026-11-26T01:30:02Z", "finished_at": "2026-11-26T01:32:40Z",
      "load_average": {"start": [1.2, 0.9, 0.8], "end": [2.1, 1.3, 0.9]}, "nice": 0,
      "results": {...what the benchmark measured...}
    }

A benchmark script calls :meth:`RunRecord.start` first (start time and load), adds the result options to its
parser with :func:`add_result_options`, and hands its JSON report to :meth:`RunRecord.finish`, which prints it
and writes the file. Docs quote figures with ``<!--fig NAME:KEY-->value<!--/fig-->`` markers, checked by
``benchmarks/doc_figures.py`` (see docs/contributing.md).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import platform
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence

REPO_ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = REPO_ROOT / "benchmarks" / "results"
RESULTS_DIR_ENV_VAR = "AGENTBOLT_RESULTS_DIR"

# Instruction sets that change the speed of CPU inference and training (bfloat16 and the decoding kernels).
_CPU_FLAGS_OF_INTEREST = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")


def _utc_now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc).replace(microsecond=0)


def _iso(moment: dt.datetime) -> str:
    return moment.isoformat().replace("+00:00", "Z")


def _load_average() -> List[float]:
    return [round(x, 2) for x in os.getloadavg()]


def _cpuinfo_field(name: str) -> Optional[str]:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(name):
                return line.split(":", 1)[1].strip()
    return None


def machine_info() -> Dict[str, Any]:
    """The machine a figure was measured on: CPU model, cores, memory, relevant instruction sets, software."""
    flags = (_cpuinfo_field("flags") or "").split()
    memory_gib: Optional[float] = None
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                memory_gib = round(int(line.split()[1]) / 2**20, 1)
                break
    info: Dict[str, Any] = {
        "cpu_model": _cpuinfo_field("model name") or platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "memory_gib": memory_gib,
        "cpu_flags": [flag for flag in _CPU_FLAGS_OF_INTEREST if flag in flags],
        "platform": platform.platform(),
        "python": platform.python_version(),
    }
    torch = sys.modules.get("torch")
    if torch is not None:
        info["torch"] = getattr(torch, "__version__", None)
    return info


CODE_PATHS = ("agentbolt", "benchmarks", "examples", "pyproject.toml")


def git_state() -> Dict[str, Any]:
    """The commit the code was run from, and whether the code (``CODE_PATHS``; not the docs) differed from it."""

    def git(*args: str) -> Optional[str]:
        try:
            done = subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10, check=True)
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip()

    commit = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no", "--", *CODE_PATHS)
    return {"commit": commit, "dirty": bool(status) if status is not None else None}


def command_line(argv: Sequence[str]) -> str:
    """``argv`` as a shell command, with the script path relative to the repository when it lies inside it."""
    words = list(argv)
    if words:
        script = Path(words[0]).resolve()
        with contextlib.suppress(ValueError):
            words[0] = str(script.relative_to(REPO_ROOT))
    return shlex.join(["python", *words])


def add_result_options(parser: argparse.ArgumentParser) -> None:
    """The options every benchmark has: where its result file goes, or none."""
    group = parser.add_argument_group("result file")
    group.add_argument(
        "--result-name",
        help="name of the result file, benchmarks/results/NAME.json (default: the script's name and the UTC time)",
    )
    group.add_argument(
        "--results-dir",
        type=Path,
        help=f"folder of the result file (default: ${RESULTS_DIR_ENV_VAR} or benchmarks/results)",
    )
    group.add_argument("--no-result", action="store_true", help="only print the JSON report, write no file")


@dataclass
class RunRecord:
    """One run of a benchmark: what was run, from which commit, on which machine, and under what load."""

    benchmark: str
    command: str
    started: dt.datetime
    load_start: List[float]
    extra_machine: Dict[str, Any] = field(default_factory=dict)

    @classmethod
    def start(cls, script: str, argv: Optional[Sequence[str]] = None) -> RunRecord:
        """Start recording; call it first thing in ``main``. ``script`` is the script's ``__file__``."""
        return cls(
            benchmark=Path(script).stem,
            command=command_line([script, *(sys.argv[1:] if argv is None else argv)]),
            started=_utc_now(),
            load_start=_load_average(),
        )

    def document(self, results: Mapping[str, Any], name: str) -> Dict[str, Any]:
        """The result file's content for ``results``, measured from :meth:`start` until now."""
        return {
            "name": name,
            "benchmark": self.benchmark,
            "command": self.command,
            "git": git_state(),
            "machine": {**machine_info(), **self.extra_machine},
            "started_at": _iso(self.started),
            "finished_at": _iso(_utc_now()),
            "load_average": {"start": self.load_start, "end": _load_average()},
            "nice": os.nice(0),  # the run's scheduling priority: 0 is normal, 19 the lowest
            "results": dict(results),
        }

    def finish(self, results: Mapping[str, Any], options: Optional[argparse.Namespace] = None) -> Optional[Path]:
        """Print ``results`` as JSON and write the result file (unless ``--no-result``); return its path."""
        name = getattr(options, "result_name", None) or f"{self.benchmark}-{self.started:%Y%m%d-%H%M%S}"
        document = self.document(results, name)
        print(json.dumps(document, indent=2))
        if getattr(options, "no_result", False):
            return None
        directory = getattr(options, "results_dir", None) or Path(os.environ.get(RESULTS_DIR_ENV_VAR) or RESULTS_DIR)
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"{name}.json"
        path.write_text(json.dumps(document, indent=2) + "\n")
        print(f"result file: {path}", file=sys.stderr)
        return path


def load_result(name: str, directory: Optional[Path] = None) -> Dict[str, Any]:
    """The result file ``NAME.json``.

    Raises:
        FileNotFoundError: No result file has that name; the message names the folder searched.
    """
    folder = directory or RESULTS_DIR
    path = folder / f"{name}.json"
    if not path.is_file():
        raise FileNotFoundError(f"no result file {name!r} in {folder}")
    return json.loads(path.read_text())
