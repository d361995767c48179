"""Fused C++ kernels for the decoding steps of :class:`~agentbolt.serving.fast_forward.FastForward`.

``csrc/decode_kernels.cpp`` runs every layer of one decoding step (one new token per row) in a single call:
RMSNorm with the residual add, rotary embedding with the key/value cache write, attention of the new token over the
cache, the matrix products through the same oneDNN kernels as the Python path, and a LoRA adapter's low-rank terms
(unmerged, rounded like PEFT's layers); it also samples the next token of every row in one call. Rounding follows the eager PyTorch operators, so results match the Python path except
for float32 summation order.

The source is compiled on first use with the machine's C++ compiler and Python headers
(``torch.utils.cpp_extension``, ninja from the ``ninja`` package, ``-O3 -march=native``, about half a minute) into
``$XDG_CACHE_HOME/agentbolt/kernels/<key>`` (default ``~/.cache/...``), where the key covers the source, the torch
version, the flags and the CPU's instruction sets; later processes load the built library in milliseconds. Without
a compiler or the Python headers, after a failed build, or with ``AGENTBOLT_DECODE_KERNELS=0``,
:func:`load_decode_kernels` returns ``None`` and the engine keeps its Python decoding and sampling.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import shutil
import sys
import sysconfig
import threading
import time
from pathlib import Path
from typing import Any, Iterator, Optional

__all__ = ["kernel_cache_dir", "load_decode_kernels"]

logger = logging.getLogger(__name__)

_SOURCE = Path(__file__).parent / "csrc" / "decode_kernels.cpp"
_CFLAGS = ["-O3", "-ffp-contract=off", "-fopenmp"]
_LOCK = threading.Lock()
_NOT_LOADED = object()
_loaded: Any = _NOT_LOADED  # the outcome of the first load_decode_kernels(): the module or None
_BUILD_LOCK_TIMEOUT = 900.0  # seconds to wait for another process's build before decoding without the kernels


def kernel_cache_dir() -> Path:
    """Directory under which built kernels are kept (one subdirectory per source/torch/CPU combination)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "agentbolt" / "kernels"


def _cpu_flags() -> str:
    """The CPU's instruction-set flags (``-march=native`` builds are only valid on CPUs that have them)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


def _build_key(cflags: list[str]) -> str:
    import torch

    digest = hashlib.sha256()
    # The torch install is part of the key: a build names its torch headers and libraries by path, so two virtual
    # environments sharing one key would rebuild over each other, each waiting on the other's build lock.
    torch_home = os.path.dirname(torch.__file__).encode()
    parts = (
        _SOURCE.read_bytes(),
        torch.__version__.encode(),
        torch_home,
        " ".join(cflags).encode(),
        _cpu_flags().encode(),
    )
    for part in parts:
        digest.update(part)
        digest.update(b"\0")
    return digest.hexdigest()[:16]


@contextlib.contextmanager
def _ninja_on_path() -> Iterator[None]:
    """Put the ``ninja`` package's binary (or the interpreter's bin directory) on ``PATH`` while building."""
    directories = [os.path.dirname(sys.executable)]
    try:
        import ninja

        directories.insert(0, str(ninja.BIN_DIR))
    except ImportError:
        pass
    saved = os.environ.get("PATH", "")
    os.environ["PATH"] = os.pathsep.join([*directories, saved])
    try:
        yield
    finally:
        os.environ["PATH"] = saved


@contextlib.contextmanager
def _build_lock(directory: Path, timeout: float) -> Iterator[bool]:
    """Hold ``directory``'s build lock; yields ``False`` when another process kept it for ``timeout`` seconds.

    The lock is an ``flock`` on ``directory/build.flock``, which the kernel releases when its holder dies. While it is
    held no other agentbolt process is building here, so torch's own lock file (``directory/lock``), which a killed
    build leaves behind and which would make every later build wait for ever, is removed as stale.
    """
    with open(directory / "build.flock", "a+b") as handle:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    yield False
                    return
                time.sleep(0.2)
        try:
            stale = directory / "lock"
            if stale.exists():
                logger.info("Removing the lock file a stopped kernel build left in %s", directory)
                stale.unlink(missing_ok=True)
            yield True
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def load_decode_kernels() -> Optional[Any]:
    """Build (once per machine) and load the decoding kernels; ``None`` when they cannot be used here.

    The outcome is kept for the life of the process. The reason for ``None`` is logged once: kernels disabled by
    ``AGENTBOLT_DECODE_KERNELS=0``, no C++ compiler or Python headers, or a failed build (compiler output at DEBUG
    level).
    """
    global _loaded
    with _LOCK:
        if _loaded is _NOT_LOADED:
            _loaded = _build_and_load()
        return _loaded


def _missing_build_tools() -> Optional[str]:
    """What this machine lacks to compile the kernels (a C++ compiler, the Python headers), or ``None``."""
    compiler = os.environ.get("CXX", "c++")
    if shutil.which(compiler) is None:
        return f"No C++ compiler ({compiler}) found"
    headers = Path(sysconfig.get_paths()["include"]) / "Python.h"
    if not headers.exists():
        return f"No Python headers ({headers}; install the python3-dev package or equivalent)"
    return None


def _build_and_load(march: str = "native") -> Optional[Any]:
    """Compile the kernels if this machine has no build of the current source yet, then import them.

    Args:
        march: The compiler's ``-march`` target; ``native`` (the CPU this runs on) except in tests that build the
            AVX2 and baseline x86-64 variants.
    """
    if os.environ.get("AGENTBOLT_DECODE_KERNELS", "1").strip().lower() in {"0", "false", "no", "off"}:
        logger.info("Decoding kernels disabled by AGENTBOLT_DECODE_KERNELS")
        return None
    missing = _missing_build_tools()
    if missing is not None:
        logger.warning("%s: decoding runs on the slower Python path", missing)
        return None
    from torch.utils import cpp_extension

    cflags = [*_CFLAGS, f"-march={march}"]
    key = _build_key(cflags)
    directory = kernel_cache_dir() / key
    started = time.monotonic()
    try:
        directory.mkdir(parents=True, exist_ok=True)
        built = any(directory.glob("*.so"))
        if not built:
            logger.info("Compiling the decoding kernels into %s (once per machine, about 30 s)", directory)
        with _build_lock(directory, _BUILD_LOCK_TIMEOUT) as locked, _ninja_on_path():
            if not locked:
                logger.warning(
                    "Another process has been building the decoding kernels in %s for %.0f s: decoding runs on the "
                    "slower Python path",
                    directory,
                    _BUILD_LOCK_TIMEOUT,
                )
                return None
            module = cpp_extension.load(
                name=f"agentbolt_decode_kernels_{key}",
                sources=[str(_SOURCE)],
                extra_cflags=cflags,
                extra_ldflags=["-fopenmp"],
                build_directory=str(directory),
                verbose=False,
            )
    except Exception as exc:  # compiler errors, missing ninja, an unwritable cache directory
        logger.warning("Building the decoding kernels failed (%s): decoding runs on the slower Python path", exc)
        logger.debug("Kernel build failure", exc_info=True)
        return None
    if not built:
        logger.info("Decoding kernels built in %.1f s", time.monotonic() - started)
    return module
