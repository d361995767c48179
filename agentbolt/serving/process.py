"""An OpenAI-compatible model server as a child process: started, awaited until it serves its model, stopped cleanly.

:class:`ModelServerProcess` owns the lifecycle every local server shares: it refuses a taken port before starting,
runs the command in its own process group with its output in a log file, is ready when ``GET /health`` answers 200
and ``GET /v1/models`` lists the served name, and stops with SIGTERM to the whole group (engine processes included),
then SIGKILL after a grace period. A failed start ends with the server's last log lines in the error.

Two servers build on it:

* :class:`LocalModelServer`: ``agentbolt serve`` (the transformers engine) on a model of the registry or a local
  directory; what a trainer uses on a CPU machine for the models it does not train (the fixed roles of a
  multi-agent system, a judge, a teacher);
* :class:`~agentbolt.serving.vllm.VllmServer`: vLLM's server, for GPU machines.

Either one is a context manager, and :meth:`ModelServerProcess.model_config` gives the ``model_list`` entry that puts
it behind the LLM gateway with token ids recorded::

    with LocalModelServer("smollm2-135m-instruct", served_name="fixed") as server:
        proxy = agl.LLMProxy(model_list=[server.model_config()])
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO, Any, Dict, List, Optional, Sequence

from agentbolt.serving.launchers import LaunchCommand

__all__ = ["LocalModelServer", "ModelServerProcess", "ServerProcessError"]

logger = logging.getLogger(__name__)


class ServerProcessError(RuntimeError):
    """The server could not start, did not become ready in time, or exited."""


class ModelServerProcess:
    """An OpenAI-compatible server run as a child process (see the module docstring).

    Args:
        command: The program and its arguments (and environment additions).
        served_name: The model name the server lists in ``/v1/models`` and clients request.
        host: Interface the server binds (given to the command by the caller).
        port: Its port.
        api_key: Bearer token the server requires; used by the readiness checks.
        label: Name of the server in logs and errors (``"vLLM"``, ``"agentbolt serve"``).
        provider: Prefix of :meth:`model_config`'s model (``hosted_vllm``: the gateway asks for token ids).
        log_path: File receiving the server's output (default: a temporary file, kept for inspection).
        startup_timeout: Seconds allowed for loading the model and becoming ready.
        stop_timeout: Seconds the server gets to exit after SIGTERM before SIGKILL.
    """

    error_type: type[ServerProcessError] = ServerProcessError
    """Exception raised by :meth:`start` (subclasses name their own)."""

    def __init__(
        self,
        command: LaunchCommand,
        *,
        served_name: str,
        host: str,
        port: int,
        api_key: Optional[str] = None,
        label: str = "server",
        provider: str = "hosted_vllm",
        log_path: Optional[os.PathLike[str] | str] = None,
        startup_timeout: float = 900.0,
        stop_timeout: float = 30.0,
    ) -> None:
        self.command = command
        self.served_name = served_name
        self.host = host
        self.port = port
        self.api_key = api_key
        self.label = label
        self.provider = provider
        self.log_path = Path(log_path) if log_path is not None else None
        self.startup_timeout = startup_timeout
        self.stop_timeout = stop_timeout
        self._process: Optional[subprocess.Popen[bytes]] = None
        self._log: Optional[IO[bytes]] = None

    # ------------------------------------------------------------------ addresses

    @property
    def root_url(self) -> str:
        """``http://HOST:PORT`` (a wildcard bind is reached through 127.0.0.1)."""
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else ("[::1]" if self.host == "::" else self.host)
        return f"http://{host}:{self.port}"

    @property
    def base_url(self) -> str:
        """OpenAI base URL, ending in ``/v1``."""
        return f"{self.root_url}/v1"

    def model_config(self) -> Dict[str, Any]:
        """A ``model_list`` entry routing the served name through the gateway to this server (token ids on)."""
        params: Dict[str, Any] = {"model": f"{self.provider}/{self.served_name}", "api_base": self.base_url}
        if self.api_key:
            params["api_key"] = self.api_key
        return {"model_name": self.served_name, "litellm_params": params}

    @property
    def pid(self) -> Optional[int]:
        """Process id of the server (None before :meth:`start`)."""
        return None if self._process is None else self._process.pid

    def is_running(self) -> bool:
        """Whether the server process is alive."""
        return self._process is not None and self._process.poll() is None

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Start the server and wait until it serves the model.

        Raises:
            ServerProcessError: Already started, the port is taken, the program cannot be run, the process exited,
                or it was not ready within ``startup_timeout`` seconds (it is stopped then); the message ends with
                the server's last lines, or says its log is empty.
                Subclasses raise their own subclass (:attr:`error_type`).
        """
        from agentbolt.utils.server_launcher import bind_socket

        if self._process is not None:
            raise self.error_type(f"this {self.label} server was already started")
        try:
            bind_socket(self.host, self.port).close()
        except OSError as exc:
            raise self.error_type(f"cannot listen on {self.host}:{self.port}: {exc.strerror or exc}") from None
        if self.log_path is None:
            handle, name = tempfile.mkstemp(prefix="agentbolt-server-", suffix=".log")
            os.close(handle)
            self.log_path = Path(name)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        logger.info("Starting %s: %s (output in %s)", self.label, self.command.shell(), self.log_path)
        try:
            self._process = subprocess.Popen(
                self.command.argv,
                env={**os.environ, **self.command.env},
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: stop() reaches the engine's processes too
            )
        except OSError as exc:  # no such program, not executable
            self.stop()
            raise self.error_type(f"cannot run {self.label} ({self.command.argv[0]}): {exc.strerror or exc}") from None
        try:
            self._wait_until_ready()
        except BaseException:
            self.stop()
            raise
        logger.info("%s serves %r at %s (pid %d)", self.label, self.served_name, self.base_url, self._process.pid)

    def _wait_until_ready(self) -> None:
        import httpx

        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        deadline = time.monotonic() + self.startup_timeout
        with httpx.Client(timeout=5.0, headers=headers) as client:
            while True:
                assert self._process is not None
                code = self._process.poll()
                if code is not None:
                    raise self.error_type(
                        f"{self.label} exited with code {code} before it was ready.{self._log_tail()}"
                    )
                if self._serves_model(client):
                    return
                if time.monotonic() > deadline:
                    raise self.error_type(
                        f"{self.label} did not serve {self.served_name!r} at {self.base_url} within "
                        f"{self.startup_timeout:g} seconds.{self._log_tail()}"
                    )
                time.sleep(0.5)

    def _serves_model(self, client: Any) -> bool:
        import httpx

        try:
            if client.get(f"{self.root_url}/health").status_code != 200:
                return False
            models = client.get(f"{self.base_url}/models")
        except httpx.HTTPError:
            return False
        if models.status_code != 200:
            return False
        try:
            ids = {entry.get("id") for entry in models.json().get("data", [])}
        except (ValueError, AttributeError):
            return False
        return self.served_name in ids

    def _log_tail(self, lines: int = 20) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        text = self.log_path.read_text(encoding="utf-8", errors="replace").strip().splitlines()[-lines:]
        return f" Last lines of {self.log_path}:\n" + "\n".join(text) if text else f" {self.log_path} is empty."

    def stop(self) -> Optional[int]:
        """Stop the server (SIGTERM to its process group, SIGKILL after ``stop_timeout``); returns its exit code.

        Returns once every process of the group (the server's engine processes too) has ended. Safe to call more
        than once and when the process already exited.
        """
        process = self._process
        if process is not None and process.poll() is None:
            deadline = time.monotonic() + self.stop_timeout
            self._signal_group(process, signal.SIGTERM)
            try:
                process.wait(self.stop_timeout)
            except subprocess.TimeoutExpired:
                logger.warning("%s did not exit %g s after SIGTERM; killing it", self.label, self.stop_timeout)
                self._signal_group(process, signal.SIGKILL)
                process.wait()
            if not _wait_for_group(process.pid, deadline):  # engine processes still ending after the server
                logger.warning("Processes of %s outlived it by the grace period; killing them", self.label)
                self._signal_group(process, signal.SIGKILL)
                _wait_for_group(process.pid, time.monotonic() + _KILLED_GROUP_WAIT_SECONDS)
        elif process is not None:
            self._signal_group(process, signal.SIGKILL)  # leftover engine processes of a server that died
            _wait_for_group(process.pid, time.monotonic() + _KILLED_GROUP_WAIT_SECONDS)
        if self._log is not None:
            self._log.close()
            self._log = None
        return None if process is None else process.returncode

    @staticmethod
    def _signal_group(process: subprocess.Popen[bytes], sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, sig)

    def __enter__(self) -> ModelServerProcess:
        self.start()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.stop()


_KILLED_GROUP_WAIT_SECONDS = 5.0


def _wait_for_group(group_id: int, deadline: float) -> bool:
    """Wait until process group ``group_id`` has no running process left; False if some still run at ``deadline``."""
    while _group_runs(group_id):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


def _group_runs(group_id: int) -> bool:
    """Whether a process of the group still runs (zombies waiting for their new parent to reap them do not count)."""
    try:
        os.killpg(group_id, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    import psutil  # type: ignore[import-untyped]

    for member in psutil.process_iter():
        try:
            if os.getpgid(member.pid) == group_id and member.status() != psutil.STATUS_ZOMBIE:
                return True
        except (OSError, psutil.Error):  # ended meanwhile
            continue
    return False


class LocalModelServer(ModelServerProcess):
    """``agentbolt serve MODEL`` (the transformers engine) as a child process.

    Args:
        model: Registry name (the embedded ``smollm2-135m-instruct``), local model directory or hub id.
        served_name: Name clients request (default: ``model``).
        host: Interface to bind.
        port: Port (None: a free one).
        dtype: Weights dtype (``bfloat16``, ``float32``...).
        threads: CPU threads of the engine (None: torch's choice).
        max_batch_size: Sequences decoded together.
        api_key: Bearer token the server requires (``--api-key``), when the server supports one.
        extra_args: Further ``agentbolt serve`` arguments.
        log_path: File receiving the server's output.
        startup_timeout: Seconds allowed for loading the model (a first conversion of the embedded model takes
            tens of seconds).
        stop_timeout: Seconds the server gets to exit after SIGTERM before SIGKILL.
    """

    def __init__(
        self,
        model: str,
        *,
        served_name: Optional[str] = None,
        host: str = "127.0.0.1",
        port: Optional[int] = None,
        dtype: str = "bfloat16",
        threads: Optional[int] = None,
        max_batch_size: int = 8,
        api_key: Optional[str] = None,
        extra_args: Sequence[str] = (),
        log_path: Optional[os.PathLike[str] | str] = None,
        startup_timeout: float = 600.0,
        stop_timeout: float = 30.0,
    ) -> None:
        from agentbolt.utils.server_launcher import pick_free_port

        port = port if port is not None else pick_free_port(host)
        name = served_name or model
        argv: List[str] = [sys.executable, "-m", "agentbolt", "serve", model, "--host", host, "--port", str(port)]
        argv += ["--served-name", name, "--dtype", dtype, "--max-batch-size", str(max_batch_size)]
        if threads is not None:
            argv += ["--threads", str(threads)]
        if api_key:
            argv += ["--api-key", api_key]
        argv += list(extra_args)
        super().__init__(
            LaunchCommand(argv),
            served_name=name,
            host=host,
            port=port,
            api_key=api_key,
            label="agentbolt serve",
            log_path=log_path,
            startup_timeout=startup_timeout,
            stop_timeout=stop_timeout,
        )
