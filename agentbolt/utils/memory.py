"""Process memory settings for training on CPUs.

PyTorch allocates CPU tensors with the C library's ``malloc``. glibc serves a block from an ``mmap`` of its own
(returned to the system by ``free``) only above a threshold that starts at 128 KiB and rises to the size of every
such block freed, up to 32 MiB. A training step allocates and frees thousands of activation buffers of a few MiB:
after the first step nearly all of them come from the heaps, where freed memory stays with the process and, as
sizes vary, is not reused well: the resident memory of a training step grows to several times what its live tensors
need (measured on the GRPO demo in docs/benchmarks.md, "Demo memory").

:func:`return_large_blocks_to_os` fixes the threshold, so buffers at least that large always get their own mapping
and are handed back as soon as torch frees them.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import platform

__all__ = ["LARGE_BLOCK_BYTES", "return_large_blocks_to_os"]

logger = logging.getLogger(__name__)

LARGE_BLOCK_BYTES = 1 << 20
"""Default threshold: blocks of 1 MiB and more are mapped on their own and unmapped when freed."""

_M_MMAP_THRESHOLD = -3  # mallopt parameter number in glibc's malloc.h
_applied: int | None = None


def return_large_blocks_to_os(threshold: int = LARGE_BLOCK_BYTES) -> bool:
    """Make glibc's ``malloc`` give every block of at least ``threshold`` bytes back to the system when it is freed.

    Sets ``M_MMAP_THRESHOLD`` with ``mallopt``, which also stops glibc from raising the threshold by itself. The
    setting is process-wide and idempotent; an explicit ``MALLOC_MMAP_THRESHOLD_`` in the environment is left alone.
    Elsewhere than on glibc (macOS, musl) nothing is changed.

    Args:
        threshold: Size in bytes from which blocks get their own mapping.

    Returns:
        True when the threshold is in effect.

    Raises:
        ValueError: ``threshold`` is not positive.
    """
    global _applied
    if threshold <= 0:
        raise ValueError(f"threshold must be a positive number of bytes, got {threshold}")
    if _applied == threshold:
        return True
    if "MALLOC_MMAP_THRESHOLD_" in os.environ or platform.libc_ver()[0] != "glibc":
        return False
    name = ctypes.util.find_library("c")
    if name is None:  # pragma: no cover - glibc systems always have one
        return False
    libc = ctypes.CDLL(name)
    if libc.mallopt(_M_MMAP_THRESHOLD, ctypes.c_int(threshold)) != 1:
        logger.warning("mallopt(M_MMAP_THRESHOLD, %d) was refused; freed tensors may stay with the process", threshold)
        return False
    _applied = threshold
    logger.debug("glibc malloc: blocks of %d bytes and more are returned to the system when freed", threshold)
    return True
