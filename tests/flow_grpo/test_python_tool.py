"""The Python runner: real child processes, killed at the wall-clock timeout or stopped at the memory limit."""

from __future__ import annotations

import psutil
import pytest

from examples.flow_grpo.tools import PythonTool, run_python


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_infinite_loop_is_killed_at_the_timeout() -> None:
    result = run_python("import os\nprint(os.getpid(), flush=True)\nwhile True:\n    pass\n", timeout=1.0)
    assert result.timed_out and result.returncode is None
    assert _gone(int(result.stdout.split()[0]))
    assert "time limit" in result.observation()


def test_children_of_the_code_are_killed_with_it() -> None:
    code = "import os, time\npid = os.fork()\nif pid == 0:\n    time.sleep(600)\nelse:\n    print(pid, flush=True)\n    time.sleep(600)\n"
    result = run_python(code, timeout=1.0)
    assert result.timed_out
    assert _gone(int(result.stdout.split()[0]))


def test_memory_bomb_stops_at_the_memory_limit() -> None:
    result = run_python(
        "blocks = []\nwhile True:\n    blocks.append(bytearray(16 * 1024 * 1024))\n", memory_mb=200, timeout=60
    )
    assert result.memory_exceeded and not result.timed_out
    assert "memory limit" in result.observation()


def test_syntax_errors_and_exceptions_are_observations() -> None:
    syntax = run_python("x = (1 +")
    assert syntax.returncode == 1 and "SyntaxError" in syntax.observation()
    raised = run_python("print('before')\nraise ValueError('bad value')")
    observation = raised.observation()
    assert "before" in observation and "ValueError: bad value" in observation
    assert "exec(" not in observation  # the bootstrap frame is hidden


def test_one_namespace_so_functions_see_top_level_imports() -> None:
    result = run_python("import math\ndef hyp(a, b):\n    return math.sqrt(a * a + b * b)\nprint(hyp(3, 4))")
    assert result.ok and result.stdout.strip() == "5.0"


def test_stdout_and_stderr_are_captured_separately_and_truncated() -> None:
    result = run_python("import sys\nprint('x' * 10000)\nsys.stderr.write('warn')", max_output_chars=100)
    assert result.ok and len(result.stdout) <= 100 and result.stderr == "warn"


def test_network_is_refused() -> None:
    result = run_python("import socket\nsocket.socket()")
    assert not result.ok and "PermissionError: network access is disabled" in result.stderr
    result = run_python("import urllib.request\nurllib.request.urlopen('http://127.0.0.1:9/')")
    assert not result.ok and "network access is disabled" in result.stderr


def test_cpu_limit_stops_busy_code_that_outlives_its_cpu_budget() -> None:
    result = run_python("while True:\n    pass\n", timeout=30, cpu_seconds=1)
    assert result.cpu_exceeded and not result.timed_out


def test_tool_strips_code_fences_and_reports_empty_output() -> None:
    tool = PythonTool(timeout=5)
    assert tool.execute("```python\nprint(12 ** 2)\n```").output == "144"
    assert "printed nothing" in tool.execute("x = 1").output
    assert not tool.execute("   ").ok


def test_invalid_limits_are_rejected() -> None:
    with pytest.raises(ValueError, match="positive"):
        run_python("print(1)", timeout=0)
