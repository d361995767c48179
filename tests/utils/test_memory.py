"""glibc malloc returns freed tensor-sized blocks to the system once ``return_large_blocks_to_os`` ran."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from agentbolt.utils.memory import return_large_blocks_to_os

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc and glibc's malloc")

# Allocate 64 blocks of 2 MiB, touch them, free every other one: without an mmap threshold fixed at or below 2 MiB,
# glibc serves all but the first from its heap after the first free, and the freed blocks between live ones stay
# resident. Prints the resident-memory drop caused by the frees, in MiB.
_PROBE = textwrap.dedent(
    """
    import ctypes, ctypes.util, json, sys
    from agentbolt.utils.memory import return_large_blocks_to_os

    applied = return_large_blocks_to_os() if sys.argv[1] == "on" else False
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]

    def resident():
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * 4096 / 2**20

    size = 2 << 20
    warm = libc.malloc(size)
    libc.free(warm)  # the first freed mmapped block raises glibc's own threshold past 2 MiB
    blocks = [libc.malloc(size) for _ in range(64)]
    for block in blocks:
        ctypes.memset(block, 1, size)
    before = resident()
    for block in blocks[::2]:
        libc.free(block)
    print(json.dumps({"applied": applied, "released_mib": before - resident()}))
    """
)


def _probe(mode: str, **env: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, mode], env={**os.environ, **env}, capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout)


def test_freed_large_blocks_leave_the_process() -> None:
    on = _probe("on")
    assert on["applied"] is True
    assert on["released_mib"] >= 60  # the 32 freed blocks of 2 MiB
    assert _probe("off")["released_mib"] < 8  # glibc's default keeps them


def test_an_explicit_environment_setting_wins() -> None:
    assert _probe("on", MALLOC_MMAP_THRESHOLD_="4194304")["applied"] is False


def test_the_threshold_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        return_large_blocks_to_os(0)
