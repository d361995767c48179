"""Runs the fenced code blocks of README.md and docs/ as a reader would, in order, page by page.

The rules (written for contributors in docs/contributing.md):

* ``python`` blocks are scripts: each is saved to a file in the page's working folder and run with ``python``.
* ``bash`` blocks are shell commands, run with ``bash -e``. ``agentbolt store``, ``agentbolt serve`` and
  ``agentbolt proxy`` are servers: they are started in the background, and the next command runs once the server
  answers its health check. A server runs until the section (heading) it was started in ends; one started before
  the page's first section runs to the end of the page.
* The first line of a block may be a directive comment: ``# file: NAME`` saves the block as NAME (a module or a
  config file that a later block uses) instead of running it; ``# slow: WHY`` runs it only in the slow suite;
  ``# fragment: WHY`` never runs it (an excerpt, or a command for hardware the tests do not have).
* ``text`` and ``json`` blocks are displays (diagrams, output) and are not run; any other block must run, be saved
  with ``# file:``, or be marked a fragment. A block without a language is an error.

The pages of docs/tutorial/ run as one document, in order (index.md first), since each step builds on the files of
the previous ones. Each document runs in its own empty folder, with ``HOME`` pointing into it (so ``~/runs`` stays inside), the model
cache of the machine, and a free port in place of each port the page names (4747, 8000, ...), so pages never
collide with other servers; the repository's ``examples``, ``benchmarks``, ``tests`` and ``.venv`` are linked
into the folder, which therefore works as the repository root the docs' commands assume. A benchmark a page runs
writes its result file into the folder (``AGENTBOLT_RESULTS_DIR``), not into the repository's
``benchmarks/results``, so a doc test never changes a figure the docs quote.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple

from markdown_it import MarkdownIt
from support.processes import die_with_parent
from support.servers import wait_healthy

from agentbolt.utils.server_launcher import pick_free_port

REPO = Path(__file__).resolve().parents[2]
RUN_LANGUAGES = {"python": "python", "py": "python", "bash": "bash", "sh": "bash", "shell": "bash"}
DISPLAY_LANGUAGES = {"text", "json"}
DIRECTIVE = re.compile(r"^#\s*(?P<kind>fragment|slow|file):\s*(?P<note>\S.*?)\s*$")
# Ports the docs name, in the places a port is written: URLs, --port, port=, "port": ...
PORT_CONTEXT = re.compile(
    r"(?P<before>(?:127\.0\.0\.1|localhost|0\.0\.0\.0):|--port[= ]|\bport=|\"port\":\s*)(?P<port>[1-9]\d{3,4})\b"
)
SERVER_DEFAULT_PORTS = {"store": 4747, "serve": 8000, "proxy": 4000}
SERVER_HEALTH = {"store": "/v1/agl/health", "serve": "/health", "proxy": "/health"}
LINKED_INTO_THE_FOLDER = ("examples", "benchmarks", "tests")
FAST_TIMEOUT = 600.0
SLOW_TIMEOUT = 1800.0


@dataclass
class Block:
    """One fenced block of a page."""

    page: str
    line: int
    language: str
    code: str
    section: Tuple[str, ...]
    """The headings (below the page title) the block sits under, outermost first, as ``page#number``."""
    kind: str
    """``run``, ``slow``, ``file``, ``fragment`` or ``display``."""
    note: str = ""

    def where(self) -> str:
        return f"{self.page}:{self.line}"


class DocBlockError(AssertionError):
    """A block that failed, or that breaks the rules; the message names the page and line."""


def collect(path: Path) -> List[Block]:
    """The fenced blocks of a Markdown page, with their directive and the section they sit in."""
    page = str(path.relative_to(REPO))
    tokens = MarkdownIt("commonmark").parse(path.read_text())
    blocks: List[Block] = []
    open_headings: List[Tuple[int, str]] = []  # (level, heading id)
    heading_count = 0
    for token in tokens:
        if token.type == "heading_open":
            level = int(token.tag[1])
            if level == 1:  # the page title: its section is the whole page
                continue
            while open_headings and open_headings[-1][0] >= level:
                open_headings.pop()
            heading_count += 1
            open_headings.append((level, f"{page}#{heading_count}"))
            continue
        if token.type != "fence":
            continue
        line = (token.map[0] + 1) if token.map else 0
        language = token.info.split()[0].lower() if token.info.strip() else ""
        first = token.content.split("\n", 1)[0].strip()
        directive = DIRECTIVE.match(first)
        if directive:
            kind, note = directive["kind"], directive["note"]
        elif language in DISPLAY_LANGUAGES:
            kind, note = "display", ""
        else:
            kind, note = "run", ""
        section = tuple(heading for _, heading in open_headings)
        blocks.append(Block(page, line, language, token.content, section, kind, note))
    return blocks


def documents(pages: List[Path]) -> Dict[str, List[Block]]:
    """The blocks of each document: a page, or the whole tutorial (its pages in order, index.md first)."""
    found: Dict[str, List[Block]] = {}
    for page in sorted(pages, key=lambda p: (p.parent, p.name != "index.md", p.name)):
        name = str(page.relative_to(REPO))
        if page.parent == REPO / "docs" / "tutorial":
            name = "docs/tutorial/"
        found.setdefault(name, []).extend(collect(page))
    return found


def rule_violations(blocks: List[Block]) -> List[str]:
    """Blocks that are neither runnable, saved, displays nor marked fragments."""
    problems = []
    for block in blocks:
        if not block.language:
            problems.append(f"{block.where()}: a block needs a language (python, bash, text, ...)")
        elif block.kind in ("run", "slow") and block.language not in RUN_LANGUAGES:
            problems.append(
                f"{block.where()}: a {block.language} block must be saved (# file: NAME) or marked (# fragment: WHY)"
            )
        elif block.kind == "file" and "/" in block.note:
            problems.append(f"{block.where()}: # file: takes a file name in the page's folder, got {block.note!r}")
    return problems


class PortMap:
    """A free port for each port a page names, the same one wherever the page names it."""

    def __init__(self) -> None:
        self.ports: Dict[int, int] = {}

    def __getitem__(self, documented: int) -> int:
        if documented not in self.ports:
            self.ports[documented] = pick_free_port("127.0.0.1")
        return self.ports[documented]

    def substitute(self, text: str) -> str:
        return PORT_CONTEXT.sub(lambda m: f"{m['before']}{self[int(m['port'])]}", text)


def _logical_lines(code: str) -> List[str]:
    """Shell lines with backslash continuations joined; blank and comment-only lines dropped."""
    lines: List[str] = []
    pending = ""
    for raw in code.splitlines():
        if raw.rstrip().endswith("\\"):
            pending += raw.rstrip()[:-1] + " "
            continue
        line = (pending + raw).strip()
        pending = ""
        if line and not line.startswith("#"):
            lines.append(line)
    return lines


def server_kind(command: str) -> Optional[str]:
    """``store``, ``serve`` or ``proxy`` when ``command`` starts an agentbolt server (``agentbolt`` or ``agl``), else
    None."""
    try:
        words = shlex.split(command, comments=True)
    except ValueError:
        return None
    while words and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]):
        words = words[1:]
    if words[:3] in (["python", "-m", "agentbolt"], ["python3", "-m", "agentbolt"]):
        words = ["agentbolt", *words[3:]]
    if len(words) < 2 or words[0] not in ("agentbolt", "agl") or words[1] not in SERVER_DEFAULT_PORTS:
        return None
    if any(flag in words for flag in ("--help", "--dry-run")):
        return None
    return words[1]


def _option(command: str, name: str) -> Optional[str]:
    words = shlex.split(command, comments=True)
    for index, word in enumerate(words):
        if word == name and index + 1 < len(words):
            return words[index + 1]
        if word.startswith(name + "="):
            return word.split("=", 1)[1]
    return None


def _tail(path: Path, size: int = 4000) -> str:
    with contextlib.suppress(OSError):
        return path.read_text(errors="replace")[-size:]
    return ""


@dataclass
class Server:
    process: subprocess.Popen[bytes]
    port: int
    section: Tuple[str, ...]
    log: Path
    command: str


@dataclass
class PageRun:
    """The state of one page being followed: its folder, environment, ports and running servers."""

    folder: Path
    ports: PortMap = field(default_factory=PortMap)
    servers: List[Server] = field(default_factory=list)
    timeout: float = FAST_TIMEOUT

    def __post_init__(self) -> None:
        home = self.folder / "home"
        home.mkdir(parents=True, exist_ok=True)
        for name in LINKED_INTO_THE_FOLDER:
            link = self.folder / name
            if not link.exists():
                link.symlink_to(REPO / name, target_is_directory=True)
        venv = self.folder / ".venv"
        if not venv.exists():
            venv.symlink_to(Path(sys.prefix), target_is_directory=True)
        cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        self.env = {
            **os.environ,
            "HOME": str(home),
            "XDG_CACHE_HOME": cache,
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
            "PYTHONUNBUFFERED": "1",
            "AGL_SERVER_PORT": str(self.ports[4747]),
            # Benchmarks a page runs write their result files here, never into the repository's benchmarks/results
            "AGENTBOLT_RESULTS_DIR": str(self.folder / "results"),
            "COLUMNS": "200",
        }
        self.env.pop("PYTHONPATH", None)

    # ---------------------------------------------------------------------------------------------- running blocks

    def run_block(self, block: Block) -> None:
        self.stop_servers(outside=block.section)
        if block.kind == "file":
            (self.folder / block.note).write_text(self.ports.substitute(block.code))
        elif block.language == "python":
            script = self.folder / f"doc_block_{Path(block.page).stem}_{block.line}.py"
            script.write_text(self.ports.substitute(block.code))
            self._run([sys.executable, script.name], block, block.code)
        elif block.language == "bash":
            self._run_shell(block)

    def _run_shell(self, block: Block) -> None:
        script: List[str] = []
        for line in _logical_lines(block.code):
            kind = server_kind(line)
            if kind is None:
                script.append(line)
                continue
            self._run_script(script, block)
            script = []
            self._start_server(kind, line, block)
        self._run_script(script, block)

    def _run_script(self, lines: List[str], block: Block) -> None:
        if lines:
            text = self.ports.substitute("\n".join(lines))
            self._run(["bash", "-e", "-o", "pipefail", "-c", text], block, text)

    def _run(self, command: List[str], block: Block, shown: str) -> None:
        started = time.monotonic()
        # A session of its own: on a timeout, the processes the block started (runners, servers) go too.
        process = subprocess.Popen(
            command,
            cwd=self.folder,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
            preexec_fn=die_with_parent,
        )
        try:
            stdout, stderr = process.communicate(timeout=self.timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            stdout, stderr = process.communicate()
            raise DocBlockError(
                f"{block.where()}: still running after {self.timeout:g} s\n{shown}\n"
                f"--- stdout ---\n{stdout[-3000:]}\n--- stderr ---\n{stderr[-3000:]}{self._server_logs()}"
            ) from None
        except BaseException:  # pytest-timeout's or Ctrl-C's exception: the block's processes must not outlive it
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            raise
        if process.returncode != 0:
            raise DocBlockError(
                f"{block.where()}: exit code {process.returncode} after {time.monotonic() - started:.1f} s\n{shown}\n"
                f"--- stdout ---\n{stdout[-3000:]}\n--- stderr ---\n{stderr[-5000:]}{self._server_logs()}"
            )

    # ---------------------------------------------------------------------------------------------------- servers

    def _start_server(self, kind: str, line: str, block: Block) -> None:
        command = self.ports.substitute(re.sub(r"\s+#.*$", "", line))  # without its comment
        if _option(command, "--port") is None:
            command += f" --port {self.ports[SERVER_DEFAULT_PORTS[kind]]}"
        port = int(_option(command, "--port") or 0)
        for server in [s for s in self.servers if s.port == port]:
            self._stop(server)
        log = self.folder / f"server-{kind}-{port}.log"
        process = subprocess.Popen(
            ["bash", "-c", command],
            cwd=self.folder,
            env=self.env,
            stdout=log.open("wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=die_with_parent,
        )
        server = Server(process, port, block.section, log, command)
        self.servers.append(server)
        try:
            wait_healthy(f"http://127.0.0.1:{port}{SERVER_HEALTH[kind]}", process, timeout=self.timeout)
        except AssertionError as exc:
            raise DocBlockError(f"{block.where()}: `{command}`: {exc}\n{_tail(log)}") from None

    def _stop(self, server: Server) -> None:
        self.servers.remove(server)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.process.pid, signal.SIGINT)
        try:
            server.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(server.process.pid, signal.SIGKILL)
            server.process.wait(timeout=10)

    def stop_servers(self, outside: Optional[Tuple[str, ...]] = None) -> None:
        """Stop every server, or those started in a section that does not contain ``outside``."""
        for server in list(self.servers):
            if outside is None or outside[: len(server.section)] != server.section:
                self._stop(server)

    def _server_logs(self) -> str:
        return "".join(f"\n--- server `{s.command}` ---\n{_tail(s.log, 2000)}" for s in self.servers)


@contextlib.contextmanager
def page_run(folder: Path, timeout: float) -> Iterator[PageRun]:
    run = PageRun(folder, timeout=timeout)
    try:
        yield run
    finally:
        run.stop_servers()
