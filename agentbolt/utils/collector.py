"""Pausing Python's cyclic garbage collector while a large answer is turned into objects.

Decoding one store answer (say a rollout's 200 spans) creates thousands of container objects that all stay alive
until the caller is done with them. While they are created, every few hundred allocations start a collection that
finds nothing to free, and the survivors are promoted towards the oldest generation, whose growth sets off full
collections that walk every object of the process. Creating them with the collector paused skips the collections
during their creation; objects that form cycles are still collected at the next collection after it resumes.
"""

from __future__ import annotations

import contextlib
import gc
from typing import Iterator

__all__ = ["collection_paused"]


@contextlib.contextmanager
def collection_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector inside the block (if it was running), for code that only builds objects
    and does not wait: other threads' allocations in the meantime are collected once it resumes."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
