"""Every fenced block of README.md and docs/ runs as written, or is saved as a file, a display or a fragment.

Each page (the tutorial: all its pages) is followed in order in its own folder (see ``doc_blocks.py``). The default
suite runs every block of a page but its ``# slow:`` ones; the slow suite runs pages with such blocks whole.
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
    """The blocks the default suite runs: all but the ``# slow:`` ones (no later block may need what they made)."""
    return [block for block in _runnable(blocks) if block.kind != "slow"]


@pytest.mark.parametrize("page", sorted(PAGES))
def test_every_block_runs_or_is_marked(page: str) -> None:
    assert rule_violations(PAGES[page]) == []


# A whole page (the tutorial: its four steps, training included) may take longer than one test's default limit;
# each block keeps its own limit (FAST_TIMEOUT).
@pytest.mark.timeout(2 * FAST_TIMEOUT)
@pytest.mark.parametrize("page", sorted(p for p, blocks in PAGES.items() if _fast_part(blocks)))
def test_page_runs_as_written(page: str, tmp_path: Path) -> None:
    with page_run(tmp_path, FAST_TIMEOUT) as run:
        for block in _fast_part(PAGES[page]):
            run.run_block(block)


@pytest.mark.slow
@pytest.mark.timeout(2 * SLOW_TIMEOUT)
@pytest.mark.parametrize("page", sorted(p for p, blocks in PAGES.items() if any(b.kind == "slow" for b in blocks)))
def test_page_runs_as_written_with_its_slow_blocks(page: str, tmp_path: Path) -> None:
    with page_run(tmp_path, SLOW_TIMEOUT) as run:
        for block in _runnable(PAGES[page]):
            run.run_block(block)


def _page(tmp_path: Path, text: str) -> List[Block]:
    from . import doc_blocks

    page = tmp_path / "page.md"
    page.write_text(text)
    original = doc_blocks.REPO
    doc_blocks.REPO = tmp_path
    try:
        return doc_blocks.collect(page)
    finally:
        doc_blocks.REPO = original


def test_directives_languages_and_sections_are_read(tmp_path: Path) -> None:
    blocks = _page(
        tmp_path,
        "# Title\n\n```bash\nagentbolt serve\n```\n\n## A\n\n```python\n# file: agent.py\nx = 1\n```\n\n"
        "### B\n\n```yaml\n# fragment: needs a GPU\nk: v\n```\n\n## C\n\n```text\ndiagram\n```\n\n```\nbare\n```\n",
    )
    assert [(b.language, b.kind, b.note) for b in blocks] == [
        ("bash", "run", ""),
        ("python", "file", "agent.py"),
        ("yaml", "fragment", "needs a GPU"),
        ("text", "display", ""),
        ("", "run", ""),
    ]
    top, a, b, c, _ = (block.section for block in blocks)
    assert top == () and len(a) == 1 and b[:1] == a and len(b) == 2 and len(c) == 1 and c != a
    problems = rule_violations(blocks)
    assert len(problems) == 1 and "needs a language" in problems[0]
    assert "must be saved" in rule_violations([blocks[2].__class__(**{**blocks[2].__dict__, "kind": "run"})])[0]


def test_servers_are_recognised_and_ports_mapped_consistently() -> None:
    from .doc_blocks import PortMap, server_kind

    assert server_kind("agentbolt store --port 4747   # comment") == "store"
    assert server_kind("agl store --port 4747 --tracker prometheus console") == "store"
    assert server_kind("AGENTBOLT_API_KEY=x agentbolt store --host 0.0.0.0") == "store"
    assert server_kind("python -m agentbolt serve ./model") == "serve"
    assert server_kind("agentbolt serve --engine llamacpp --dry-run") is None
    assert server_kind("agentbolt models list") is None
    ports = PortMap()
    text = ports.substitute(
        'curl http://127.0.0.1:4747/x --port 8000; LLMProxy(port=4000) {"port": 4747} 47470 max=8000'
    )
    assert ports.ports.keys() == {4747, 8000, 4000}
    assert text.count(str(ports[4747])) == 2 and "max=8000" in text and "47470" in text


def test_a_benchmark_run_by_a_page_writes_its_result_file_into_the_page_folder(tmp_path: Path) -> None:
    from .doc_blocks import REPO, Block

    code = (
        "import sys\nsys.path.insert(0, 'benchmarks')\nfrom result_files import RunRecord\n"
        "RunRecord.start('benchmarks/doc_test_probe.py', []).finish({'probe': 1})\n"
    )
    block = Block("page.md", 1, "python", code, (), "run")
    with page_run(tmp_path, FAST_TIMEOUT) as run:
        run.run_block(block)
    written = list((tmp_path / "results").glob("doc_test_probe-*.json"))
    assert len(written) == 1 and '"probe": 1' in written[0].read_text()
    assert not list((REPO / "benchmarks" / "results").glob("doc_test_probe-*"))
