"""Ctrl-C as a terminal sends it: SIGINT to the whole process group of a command, once it reached a given point."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

from support.processes import die_with_parent


def _default_sigint_dying_with_parent() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    die_with_parent()


def ctrl_c_when(
    command: List[str],
    ready: Callable[[], bool],
    *,
    cwd: Optional[Path] = None,
    env: Optional[Dict[str, str]] = None,
    wait_seconds: float = 600.0,
    exit_seconds: float = 600.0,
) -> Tuple[subprocess.Popen[bytes], str, str]:
    """Run ``command`` in its own process group until ``ready()`` holds, then Ctrl-C the group.

    The command gets SIGINT's default action, as in a terminal, whatever the test runner set. Returns the process
    (ended; its group id is its pid) with its stdout and stderr. The group is killed if the command outlives
    ``exit_seconds`` after the signal or the test fails.
    """
    process = subprocess.Popen(
        command,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,  # its own process group, which Ctrl-C in a terminal signals as a whole
        preexec_fn=_default_sigint_dying_with_parent,
    )
    try:
        deadline = time.monotonic() + wait_seconds
        while not ready():
            assert process.poll() is None, process.communicate()[1].decode()
            assert time.monotonic() < deadline, f"{command} never reached the point to interrupt it at"
            time.sleep(0.2)
        os.killpg(process.pid, signal.SIGINT)
        out, err = (stream.decode() for stream in process.communicate(timeout=exit_seconds))
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    return process, out, err
