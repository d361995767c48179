"""A throwaway PostgreSQL server for tests and benchmarks, started from the machine's own server binaries.

The binaries come from the system (Debian's ``postgresql`` package: ``scripts/install-postgres.sh`` installs it when
missing and ``make test`` runs that script). PostgreSQL refuses to run as root, so when the tests run as root the
server runs as the unprivileged ``postgres`` user the package creates (override with ``AGENTBOLT_PG_USER``). The
cluster lives in a temporary directory, listens on 127.0.0.1 at a free port with a Unix socket beside its data, trusts
local connections, and is deleted when stopped.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional

from agentbolt.utils.server_launcher import pick_free_port

__all__ = ["LocalPostgres", "find_postgres_bindir", "postgres_unavailable_reason"]

SUPERUSER = "agentbolt"
DATABASE = "agentbolt"


def find_postgres_bindir() -> Optional[Path]:
    """Directory holding ``initdb``, ``pg_ctl`` and ``postgres``: ``$PG_BINDIR``, the newest Debian install, or PATH."""
    candidates: List[str] = []
    if os.environ.get("PG_BINDIR"):
        candidates.append(os.environ["PG_BINDIR"])
    versions = glob.glob("/usr/lib/postgresql/*/bin")
    candidates += sorted(
        versions, key=lambda path: int(Path(path).parent.name) if Path(path).parent.name.isdigit() else 0, reverse=True
    )
    initdb = shutil.which("initdb")
    if initdb:
        candidates.append(str(Path(initdb).resolve().parent))
    for candidate in candidates:
        if all((Path(candidate) / tool).exists() for tool in ("initdb", "pg_ctl", "postgres")):
            return Path(candidate)
    return None


def _server_user() -> Optional[str]:
    """The user to run the server as: None for the current (non-root) user, else an unprivileged account."""
    if os.geteuid() != 0:
        return None
    name = os.environ.get("AGENTBOLT_PG_USER", "postgres")
    try:
        pwd.getpwnam(name)
    except KeyError:
        return ""
    return name


def postgres_unavailable_reason() -> Optional[str]:
    """Why no PostgreSQL server can be started here, or None when one can."""
    try:
        import psycopg  # noqa: F401
        import psycopg_pool  # noqa: F401
    except ImportError:
        return "psycopg 3 with its pool is not installed (pip install 'agentbolt[postgres]')"
    if find_postgres_bindir() is None:
        return "no PostgreSQL server binaries (initdb, pg_ctl) found: run scripts/install-postgres.sh"
    if _server_user() == "":
        return "running as root without an unprivileged 'postgres' user to run PostgreSQL (see scripts/install-postgres.sh)"
    return None


class LocalPostgres:
    """One PostgreSQL cluster in a temporary directory.

    Args:
        settings: Extra server settings (``-c name=value``).
    """

    def __init__(self, settings: Optional[Dict[str, str]] = None) -> None:
        reason = postgres_unavailable_reason()
        if reason is not None:
            raise RuntimeError(reason)
        self.bindir = find_postgres_bindir()
        assert self.bindir is not None
        self.user = _server_user()
        self.root = Path(tempfile.mkdtemp(prefix="agentbolt-pg-"))
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self.port = pick_free_port("127.0.0.1")
        self.settings = {
            "listen_addresses": "127.0.0.1",
            "port": str(self.port),
            "unix_socket_directories": str(self.root),
            "max_connections": "200",
            "shared_buffers": "64MB",
            # Tests never pull the power: skip fsync, keep synchronous commit so that a crashed server keeps every
            # acknowledged transaction (its WAL reached the operating system before the commit returned).
            "fsync": "off",
            "full_page_writes": "off",
            **(settings or {}),
        }
        if self.user:
            os.chmod(self.root, 0o755)
            shutil.chown(self.root, user=self.user)
        self._run(
            [
                str(self.bindir / "initdb"),
                "-D",
                str(self.data),
                "-U",
                SUPERUSER,
                "--auth=trust",
                "-E",
                "UTF8",
                "--locale=C",
                "--no-sync",
            ]
        )
        self.start()
        self.psql(f"CREATE DATABASE {DATABASE}", database="postgres")

    def _run(self, command: List[str], timeout: float = 120.0) -> subprocess.CompletedProcess[bytes]:
        result = subprocess.run(command, capture_output=True, timeout=timeout, user=self.user or None, cwd=self.root)
        if result.returncode != 0:
            raise RuntimeError(
                f"{' '.join(command)} failed ({result.returncode}): {result.stderr.decode(errors='replace')}"
                f"\n{self.log.read_text() if self.log.exists() else ''}"
            )
        return result

    def dsn(self, database: str = DATABASE, **params: str) -> str:
        """Connection string of ``database`` over TCP."""
        extra = "".join(f" {key}={value}" for key, value in params.items())
        return f"host=127.0.0.1 port={self.port} user={SUPERUSER} dbname={database}{extra}"

    def _options(self) -> str:
        return " ".join(f"-c {key}={value}" for key, value in self.settings.items())

    def start(self) -> None:
        """Start the server and wait until it accepts connections."""
        self._run(
            [
                str(self.bindir / "pg_ctl"),
                "-D",
                str(self.data),
                "-l",
                str(self.log),
                "-o",
                self._options(),
                "-w",
                "-t",
                "60",
                "start",
            ]
        )

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (``fast``: clean; ``immediate``: like a crash, recovered at the next start)."""
        self._run([str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop"])

    def restart(self, mode: str = "fast", down_seconds: float = 0.0) -> None:
        """Stop, stay down ``down_seconds``, start again on the same port and data."""
        self.stop(mode)
        time.sleep(down_seconds)
        self.start()

    def psql(self, sql: str, database: str = DATABASE) -> str:
        """Run ``sql`` with psql as the superuser; returns its output (unaligned, tuples only)."""
        psql = str(self.bindir / "psql") if (self.bindir / "psql").exists() else "psql"
        result = self._run(
            [
                psql,
                "-h",
                str(self.root),
                "-p",
                str(self.port),
                "-U",
                SUPERUSER,
                "-d",
                database,
                "-At",
                "-v",
                "ON_ERROR_STOP=1",
                "-c",
                sql,
            ]
        )
        return result.stdout.decode()

    def close(self) -> None:
        """Stop the server (if running) and delete the cluster."""
        with contextlib.suppress(Exception):
            self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)
