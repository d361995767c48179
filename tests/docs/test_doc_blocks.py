"""Every fenced block of README.md and docs/ runs as written, or is saved as a file, a display or a fragment.

Each page (the tutorial: all its pages) is followed in order in its own folder (see ``doc_blocks.py``). The default
suite runs every page up to its first ``# slow:`` block; the slow suite runs pages with such blocks to the end.
"""

from __future__ import annotations

from pathlib import Path
from typing import List

import pytest
from doc_figures import doc_pages

from .doc_blocks import FAST_TIMEOUT, SLOW_TIMEOUT, Block, documents, page_run, rule_violations

PAGES = documents(doc_pages())


def _runnable(blocks: List[Block]) -> List[Block]:
    return [block for block in blocks if block.kind in ("run", "slow", "file")]


def _fast_part(blocks: List[Block]) -> List[Block]:
    fast: List[Block] = []
    for block in _runnable(blocks):
        if block.kind == "slow":
            break
        fast.append(block)
    return fast


@pytest.mark.parametrize("page", sorted(PAGES))
def test_every_block_runs_or_is_marked(page: str) -> None:
    assert rule_violations(PAGES[page]) == []


@pytest.mark.parametrize("page", sorted(p for p, blocks in PAGES.items() if _fast_part(blocks)))
def test_page_runs_as_written(page: str, tmp_path: Path) -> None:
    with page_run(tmp_path, FAST_TIMEOUT) as run:
        for block in _fast_part(PAGES[page]):
            run.run_block(block)


@pytest.mark.slow
@pytest.mark.parametrize("page", sorted(p for p, blocks in PAGES.items() if any(b.kind == "slow" for b in blocks)))
def test_page_runs_as_written_with_its_slow_blocks(page: str, tmp_path: Path) -> None:
    with page_run(tmp_path, SLOW_TIMEOUT) as run:
        for block in _runnable(PAGES[page]):
            run.run_block(block)
