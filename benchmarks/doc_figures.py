"""Figures in the docs, read from result files: check them, or write them.

A measured figure in README.md or docs/*.md is written as

    <!--fig NAME:KEY-->1.40<!--/fig-->

where NAME is a result file ``benchmarks/results/NAME.json`` (see ``result_files.py``) and KEY a path into its
``results``: dotted names, ``[3]`` for a list position, ``[op=add_span,concurrency=16]`` for the list item whose
fields have those values; a key starting with ``@`` reads the file's other fields (``@machine.cpu_model``,
``@load_average.start[0]``, ``@started_at``). ``KEY*100`` or ``KEY/1000`` scales the value (a fraction as a percentage, seconds as
milliseconds). The text between the markers is what readers see; it must equal the value rounded to as many
decimals as the text shows (thousands separators allowed).

    python benchmarks/doc_figures.py check     # every figure against its result file (the doc test does this)
    python benchmarks/doc_figures.py write     # rewrite each figure's text from its result file

Two pages must not quote different runs for the same thing: outside docs/benchmarks.md (the record of every
run), all quotes of one command's KEY come from one result file.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

REPO_ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = REPO_ROOT / "benchmarks" / "results"
RUN_RECORD_PAGE = "docs/benchmarks.md"

FIGURE = re.compile(r"<!--fig (?P<name>[\w.-]+):(?P<key>[^>]*?)\s*-->(?P<text>.*?)<!--/fig-->")
_SCALE = re.compile(r"^(?P<path>.*?)(?:(?P<op>[*/])(?P<factor>[0-9.]+))?$")
_STEP = re.compile(r"\.?(?P<name>[\w-]+)|\[(?P<selector>[^\]]*)\]")
_NUMBER = re.compile(r"^-?[0-9][0-9,]*(?:\.[0-9]+)?$")


class FigureError(ValueError):
    """A figure whose key, result file or text is wrong."""


@dataclass(frozen=True)
class Figure:
    """One ``<!--fig NAME:KEY-->text<!--/fig-->`` marker in a page."""

    page: str
    line: int
    name: str
    key: str
    text: str

    def where(self) -> str:
        return f"{self.page}:{self.line}: {self.name}:{self.key}"


def doc_pages(root: Path = REPO_ROOT) -> List[Path]:
    """The pages whose figures are checked: README.md, CHANGELOG.md, docs/ (tutorial pages included) and the examples'
    READMEs (the site shows each as a page)."""
    return [
        root / "README.md",
        root / "CHANGELOG.md",
        *sorted((root / "docs").rglob("*.md")),
        *sorted(root.glob("examples/*/README.md")),
    ]


_FENCE = re.compile(r"^\s*(```|~~~)")


def _prose_lines(text: str) -> Iterator[Tuple[int, str, bool]]:
    """``(line number, line, is prose)`` for each line; lines of code blocks, where a marker is an example, are
    not prose."""
    in_code = False
    for number, line in enumerate(text.split("\n"), start=1):
        fence = bool(_FENCE.match(line))
        if fence:
            in_code = not in_code
        yield number, line, not (fence or in_code)


def find_figures(path: Path, root: Path = REPO_ROOT) -> List[Figure]:
    """The markers of a page, outside code blocks."""
    page = str(path.relative_to(root))
    return [
        Figure(page, number, match["name"], match["key"].strip(), match["text"])
        for number, line, prose in _prose_lines(path.read_text())
        if prose
        for match in FIGURE.finditer(line)
    ]


def _literal(raw: str) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def resolve(results: Any, key: str) -> Any:
    """The value at ``key`` (``a.b[0].c``, ``rows[op=x,concurrency=16].p50``, optionally ``*100`` / ``/1000``)."""
    scaled = _SCALE.match(key)
    assert scaled is not None  # the pattern matches any string
    path, op, factor = scaled["path"], scaled["op"], scaled["factor"]
    value: Any = results
    position = 0
    while position < len(path):
        step = _STEP.match(path, position)
        if step is None:
            raise FigureError(f"cannot parse key {key!r} at {path[position:]!r}")
        position = step.end()
        if step["name"] is not None:
            if not isinstance(value, dict) or step["name"] not in value:
                raise FigureError(f"no {step['name']!r} in the result at {path[: step.start()] or 'the top'}")
            value = value[step["name"]]
        elif step["selector"].isdigit():
            index = int(step["selector"])
            if not isinstance(value, list) or index >= len(value):
                raise FigureError(f"no item {index} in the result at {path[: step.start()]}")
            value = value[index]
        else:
            wanted = dict(part.split("=", 1) for part in step["selector"].split(","))
            items = [
                item
                for item in (value if isinstance(value, list) else [])
                if isinstance(item, dict) and all(item.get(k) == _literal(v) for k, v in wanted.items())
            ]
            if len(items) != 1:
                raise FigureError(f"{len(items)} items match [{step['selector']}] (need exactly 1)")
            value = items[0]
    if op is not None:
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise FigureError(f"cannot scale the non-number {value!r}")
        value = value * float(factor) if op == "*" else value / float(factor)
    return value


def _decimals(text: str) -> int:
    return len(text.split(".", 1)[1]) if "." in text else 0


def format_like(value: Any, text: str) -> str:
    """``value`` written the way ``text`` writes numbers (same decimals, thousands separators if it has them)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if not _NUMBER.match(text.strip()):
        return f"{value:.2f}" if isinstance(value, float) else str(value)
    separator = "," if "," in text else ""
    return f"{value:{separator}.{_decimals(text.strip())}f}"


def check_text(value: Any, text: str) -> Optional[str]:
    """None when ``text`` shows ``value`` (rounded as written), else what is wrong."""
    shown = text.strip()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None if shown == str(value) else f"the text {shown!r} is not the result's value {value!r}"
    if not _NUMBER.match(shown):
        return f"the text {shown!r} is not a number (expected {format_like(value, '0.00')})"
    expected = format_like(value, shown)
    if expected.replace(",", "") != shown.replace(",", ""):
        return f"the text {shown!r} does not match the result's value {value!r} (written {expected!r})"
    return None


class ResultFiles:
    """The result files, read once each."""

    def __init__(self, directory: Path = RESULTS_DIR) -> None:
        self.directory = directory
        self._loaded: Dict[str, Dict[str, Any]] = {}

    def get(self, name: str) -> Dict[str, Any]:
        if name not in self._loaded:
            path = self.directory / f"{name}.json"
            if not path.is_file():
                raise FigureError(f"no result file {name}.json in {self.directory}")
            self._loaded[name] = json.loads(path.read_text())
        return self._loaded[name]

    def value(self, figure: Figure) -> Any:
        return value_of(self.get(figure.name), figure.key)


def value_of(document: Dict[str, Any], key: str) -> Any:
    """The value of ``key`` in a result file: in its ``results``, or in the file itself for ``@key``."""
    if key.startswith("@"):
        return resolve(document, key[1:])
    return resolve(document.get("results", {}), key)


def check_figures(figures: Iterable[Figure], results: ResultFiles) -> List[str]:
    """Every problem with ``figures``: unknown files or keys, texts that differ from the results, and two runs
    quoted for the same command and key outside the run record."""
    problems: List[str] = []
    runs_by_subject: Dict[Tuple[str, str], Dict[str, List[str]]] = defaultdict(lambda: defaultdict(list))
    for figure in figures:
        try:
            value = results.value(figure)
        except FigureError as error:
            problems.append(f"{figure.where()}: {error}")
            continue
        wrong = check_text(value, figure.text)
        if wrong:
            problems.append(f"{figure.where()}: {wrong}")
        if figure.page != RUN_RECORD_PAGE:
            subject = (results.get(figure.name).get("command", figure.name), figure.key)
            runs_by_subject[subject][figure.name].append(f"{figure.page}:{figure.line}")
    for (command, key), runs in runs_by_subject.items():
        if len(runs) > 1:
            quoted = "; ".join(f"{name} at {', '.join(places)}" for name, places in sorted(runs.items()))
            problems.append(f"{key} of `{command}` is quoted from different runs: {quoted}")
    return problems


def write_figures(path: Path, results: ResultFiles) -> int:
    """Rewrite the text of every figure of ``path`` from its result file; return how many changed."""
    changed = 0

    def replace(match: re.Match[str]) -> str:
        nonlocal changed
        try:
            value = value_of(results.get(match["name"]), match["key"].strip())
        except FigureError:
            return match.group(0)  # left as it is; the check reports it
        text = format_like(value, match["text"] or "0.00")
        changed += text != match["text"]
        return match.group(0).replace(f"-->{match['text']}<!--/fig-->", f"-->{text}<!--/fig-->")

    original = path.read_text()
    lines = [FIGURE.sub(replace, line) if prose else line for _, line, prose in _prose_lines(original)]
    updated = "\n".join(lines)
    if updated != original:
        path.write_text(updated)
    return changed


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=["check", "write"])
    args = parser.parse_args(argv)
    results = ResultFiles()
    pages = doc_pages()
    if args.action == "write":
        for page in pages:
            count = write_figures(page, results)
            if count:
                print(f"{page.relative_to(REPO_ROOT)}: {count} figures rewritten")
    problems = check_figures((figure for page in pages for figure in find_figures(page)), results)
    for problem in problems:
        print(problem, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
