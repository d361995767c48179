"""A local multi-process Ray cluster for tests: a head node and a worker node started with ``ray start``.

Each node is a ``ray start --block`` process in its own process group (its GCS, raylet and workers); teardown stops
exactly those groups, never other Ray processes on the machine. Its worker processes find the test packages
(``tests/``) and agentbolt on their ``PYTHONPATH``. Session files go to a private temporary directory, so
``ray.init(address="auto")`` elsewhere on the machine never finds this cluster.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterator, List

from support.processes import die_with_parent
from support.servers import REPO, free_port

AUTH_MODE = "disabled"
"""Ray's token authentication is off for this loopback-only test cluster; drivers must set ``RAY_AUTH_MODE`` too."""

WORKER_NODE_RESOURCE = "agent_node"
"""Custom resource that only the worker node has (2 units): runners asking for it are placed there."""


@dataclass
class LocalRayCluster:
    """Address and processes of a running cluster."""

    address: str
    processes: List[subprocess.Popen[bytes]] = field(default_factory=list)
    logs: List[Path] = field(default_factory=list)

    def log_tail(self, lines: int = 40) -> str:
        """The end of every node's log, for failure reports."""
        parts = []
        for log in self.logs:
            text = log.read_text(errors="replace").splitlines()[-lines:] if log.exists() else []
            parts.append(f"--- {log.name}\n" + "\n".join(text))
        return "\n".join(parts)


def _ray_start(args: List[str], env: Dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "ray.scripts.scripts", "start", "--block", "--disable-usage-stats", *args]
    with open(log, "wb") as output:
        return subprocess.Popen(
            command,
            env=env,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=die_with_parent,
        )


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)  # `ray start --block` stops its node's processes on SIGTERM
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(5)  # a test cluster: what has not stopped by then is killed
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)  # whatever of that node's group is left
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(5)


def _wait_for_nodes(address: str, count: int, cluster: LocalRayCluster, timeout: float) -> None:
    """Wait until ``count`` nodes are alive, asking from a separate process (keeps Ray out of the test process)."""
    probe = (
        f"import json, ray; ray.init(address={address!r}, logging_level='ERROR'); "
        "print(json.dumps(sum(1 for n in ray.nodes() if n['Alive'])))"
    )
    env = dict(os.environ, RAY_AUTH_MODE=AUTH_MODE)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for process in cluster.processes:
            if process.poll() is not None:
                raise RuntimeError(f"a Ray node exited early:\n{cluster.log_tail()}")
        result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, env=env)
        if result.returncode == 0 and json.loads(result.stdout.strip().splitlines()[-1]) >= count:
            return
        time.sleep(1.0)
    raise RuntimeError(f"the Ray cluster did not have {count} nodes within {timeout:g} s:\n{cluster.log_tail()}")


@contextlib.contextmanager
def local_ray_cluster(head_cpus: int = 4, worker_cpus: int = 2, timeout: float = 180.0) -> Iterator[LocalRayCluster]:
    """A head node (``head_cpus`` logical CPUs) and a worker node (``worker_cpus``, plus ``agent_node``).

    ``RAY_AUTH_MODE`` is set to :data:`AUTH_MODE` in this process while the cluster runs, so drivers here connect.
    """
    temp_dir = Path(tempfile.mkdtemp(prefix="abray-", dir="/tmp"))  # short: Ray's socket paths have a length limit
    port = free_port()
    env = dict(os.environ, RAY_AUTH_MODE=AUTH_MODE)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "tests"), str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    memory = ["--object-store-memory", str(100 * 1024 * 1024)]
    cluster = LocalRayCluster(address=f"127.0.0.1:{port}")
    try:
        cluster.logs.append(temp_dir / "head.log")
        cluster.processes.append(
            _ray_start(
                [
                    "--head",
                    f"--port={port}",
                    "--node-ip-address=127.0.0.1",
                    f"--num-cpus={head_cpus}",
                    "--include-dashboard=false",
                    f"--temp-dir={temp_dir}",
                    *memory,
                ],
                env,
                cluster.logs[-1],
            )
        )
        _wait_for_nodes(cluster.address, 1, cluster, timeout)
        cluster.logs.append(temp_dir / "worker.log")
        cluster.processes.append(
            _ray_start(
                [
                    f"--address={cluster.address}",
                    "--node-ip-address=127.0.0.1",
                    f"--num-cpus={worker_cpus}",
                    f"--resources={json.dumps({WORKER_NODE_RESOURCE: 2})}",
                    *memory,
                ],
                env,
                cluster.logs[-1],
            )
        )
        _wait_for_nodes(cluster.address, 2, cluster, timeout)
        previous = os.environ.get("RAY_AUTH_MODE")
        os.environ["RAY_AUTH_MODE"] = AUTH_MODE
        try:
            yield cluster
        finally:
            if previous is None:
                os.environ.pop("RAY_AUTH_MODE", None)
            else:
                os.environ["RAY_AUTH_MODE"] = previous
    finally:
        for process in reversed(cluster.processes):
            _stop(process)
