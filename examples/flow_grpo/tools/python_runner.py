"""Python code runner: model-written code in a separate, resource-limited process.

Each call starts a fresh ``python -I`` child in its own process group and temporary directory, with:

* a wall-clock timeout: on expiry the whole process group is killed (SIGKILL), so ``while True: pass`` and
  forked children cannot outlive the call;
* rlimits set in the child before the interpreter starts (``preexec_fn``): CPU seconds, address space (memory),
  size of written files, no core dumps (the hook only calls ``setrlimit``, which takes no locks, so it is safe in
  the runner's multi-threaded process);
* no network for ordinary code: the child's bootstrap replaces ``socket.socket`` and the name-resolution functions
  with ones that raise ``PermissionError`` before running the code;
* one namespace: the code runs with a single dict as globals and locals, so functions see top-level imports and
  definitions (a plain ``exec(code, {}, locals)`` breaks them);
* stdout and stderr captured separately and truncated.

**This is not a security sandbox.** Without root or namespaces nothing stops code from importing ``_socket``
directly, reading any file the user can read, writing into the temporary directory's parent, or using ``ctypes``.
Run untrusted model code inside a container or VM (no network, read-only filesystem) when that matters. The limits
here protect the solver from runaway or careless code, which is what small models produce.
"""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from typing import Callable, Optional

from examples.flow_grpo.memory import truncate
from examples.flow_grpo.tools.base import Tool, ToolMetadata, ToolResult

__all__ = ["PythonRunResult", "PythonTool", "run_python"]

_BOOTSTRAP = r"""
import socket, sys, traceback

def _no_network(*args, **kwargs):
    raise PermissionError("network access is disabled in the Python tool")

class _NoSocket(socket.socket):
    def __init__(self, *args, **kwargs):
        _no_network()

socket.socket = _NoSocket
for _name in ("create_connection", "getaddrinfo", "gethostbyname", "gethostbyname_ex", "socketpair", "fromfd"):
    setattr(socket, _name, _no_network)
del _name

_code = sys.stdin.read()
_namespace = {"__name__": "__main__", "__builtins__": __builtins__}
try:
    exec(compile(_code, "<tool>", "exec"), _namespace)
except MemoryError:
    sys.stderr.write("MemoryError: the code exceeded the memory limit\n")
    sys.exit(3)
except SystemExit:
    raise
except BaseException:
    _type, _value, _tb = sys.exc_info()
    # Drop the bootstrap's own frame: show only the user's code.
    traceback.print_exception(_type, _value, _tb.tb_next if _tb is not None else None)
    sys.exit(1)
"""

_MEMORY_EXIT = 3


@dataclass
class PythonRunResult:
    """Outcome of :func:`run_python`.

    Attributes:
        stdout: Captured standard output (truncated).
        stderr: Captured standard error (truncated); tracebacks of the user's code land here.
        returncode: Exit status (negative: killed by that signal); None when the run timed out.
        timed_out: The wall-clock timeout expired and the process group was killed.
        memory_exceeded: The code ran out of memory under the address-space limit.
        cpu_exceeded: The CPU-time limit killed the process.
    """

    stdout: str
    stderr: str
    returncode: Optional[int]
    timed_out: bool = False
    memory_exceeded: bool = False
    cpu_exceeded: bool = False

    @property
    def ok(self) -> bool:
        """Whether the code ran to completion without an error."""
        return self.returncode == 0

    def observation(self) -> str:
        """The result as the text the agent sees."""
        if self.timed_out:
            problem = "Error: the code was stopped at the time limit."
        elif self.memory_exceeded:
            problem = "Error: the code exceeded the memory limit."
        elif self.cpu_exceeded:
            problem = "Error: the code exceeded the CPU time limit."
        elif self.returncode not in (0, None):
            problem = f"Error (exit status {self.returncode}):"
        else:
            problem = ""
        parts = [problem] if problem else []
        if self.stdout.strip():
            parts.append(f"Output: {self.stdout.strip()}" if problem else self.stdout.strip())
        if self.stderr.strip() and not self.ok:
            parts.append(self.stderr.strip())
        if not parts:
            return "(the code printed nothing; use print() to show results)"
        return "\n".join(parts)


def _limits(cpu_seconds: int, memory_bytes: int, file_bytes: int) -> Callable[[], None]:
    def apply() -> None:
        # Runs in the child between fork and exec: only async-signal-safe work here (no imports, no locks).
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds + 1))
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
        resource.setrlimit(resource.RLIMIT_FSIZE, (file_bytes, file_bytes))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    return apply


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)


def run_python(
    code: str,
    *,
    timeout: float = 10.0,
    memory_mb: int = 512,
    cpu_seconds: Optional[int] = None,
    max_file_mb: int = 16,
    max_output_chars: int = 4000,
) -> PythonRunResult:
    """Run ``code`` in a limited child process and capture what it prints.

    Args:
        code: Python source.
        timeout: Wall-clock limit in seconds; the child's process group is killed when it expires.
        memory_mb: Address-space limit of the child (MiB).
        cpu_seconds: CPU-time limit; defaults to the wall-clock timeout rounded up, plus one second.
        max_file_mb: Largest file the child may write (MiB).
        max_output_chars: Budget of each of stdout and stderr.

    Returns:
        The captured output and how the run ended.

    Raises:
        ValueError: A limit is not positive.
    """
    if timeout <= 0 or memory_mb <= 0 or max_file_mb <= 0:
        raise ValueError("timeout, memory_mb and max_file_mb must be positive")
    cpu = cpu_seconds if cpu_seconds is not None else int(timeout) + 1
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "PYTHONIOENCODING": "utf-8",
        "PYTHONDONTWRITEBYTECODE": "1",
        # Thread pools of numeric libraries reserve address space per thread; one thread keeps them under the limit.
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }
    with tempfile.TemporaryDirectory(prefix="flow-grpo-python-") as workdir:
        process = subprocess.Popen(
            [sys.executable, "-I", "-c", _BOOTSTRAP],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=workdir,
            env=env,
            start_new_session=True,
            preexec_fn=_limits(cpu, memory_mb * 1024 * 1024, max_file_mb * 1024 * 1024),
        )
        timed_out = False
        try:
            out, err = process.communicate(code.encode("utf-8", "replace"), timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(process)
            out, err = process.communicate()
        finally:
            # Children the code may have started in the same group go too.
            _kill_group(process)
    returncode = None if timed_out else process.returncode
    stderr = err.decode("utf-8", "replace")
    return PythonRunResult(
        stdout=truncate(out.decode("utf-8", "replace"), max_output_chars) if out else "",
        stderr=truncate(stderr, max_output_chars) if stderr else "",
        returncode=returncode,
        timed_out=timed_out,
        memory_exceeded=returncode == _MEMORY_EXIT and "MemoryError" in stderr,
        cpu_exceeded=returncode == -signal.SIGXCPU or (returncode == -signal.SIGKILL and not timed_out),
    )


def _strip_fences(code: str) -> str:
    text = code.strip()
    if text.startswith("```"):
        text = text.split("\n", 1)[1] if "\n" in text else ""
        text = text.rsplit("```", 1)[0]
    return text


class PythonTool(Tool):
    """Runs a Python snippet and returns what it printed (see :func:`run_python` for the limits).

    Args:
        timeout: Wall-clock limit per call (seconds).
        memory_mb: Memory limit per call (MiB).
    """

    metadata = ToolMetadata(
        name="python",
        description="Runs Python code and returns what it prints; for tasks on letters and words (counting, "
        "reversing, sorting).",
        input_description="Python code that prints the result.",
        examples=(
            ("none", "How many times does 'o' occur in 'goose'?", "print('goose'.count('o'))"),
            ("none", "What is the word 'stone' written backwards?", "print('stone'[::-1])"),
            ("none", "How many vowels are in the word 'house'?", "print(sum(c in 'aeiou' for c in 'house'))"),
            (
                "none",
                "Which of the words cat, dog, ant and bee comes last in alphabetical order?",
                "print(sorted(['cat', 'dog', 'ant', 'bee'])[-1])",
            ),
        ),
        aliases=("python_code", "code", "python_coder"),
    )

    def __init__(self, timeout: float = 10.0, memory_mb: int = 512) -> None:
        self.timeout = timeout
        self.memory_mb = memory_mb

    def run(self, tool_input: str) -> ToolResult:
        """Execute the code (a surrounding code fence is removed)."""
        result = run_python(_strip_fences(tool_input), timeout=self.timeout, memory_mb=self.memory_mb)
        return ToolResult(result.observation(), ok=result.ok)
