"""A vLLM server as a child process: started with the right options, awaited until it serves, stopped cleanly.

:class:`VllmServer` runs ``agentbolt vllm serve MODEL ...`` (vLLM's own CLI, instrumented so that responses carry
token ids, see :mod:`agentbolt.instrumentation.vllm`) with runtime LoRA loading enabled, so a trainer can publish
each new adapter with ``POST /v1/load_lora_adapter`` (GRPO's ``policy_server_url``) and the gateway records exact
token ids and logprobs. It is ready when ``GET /health`` answers 200 and ``GET /v1/models`` lists the served name;
it is stopped with SIGTERM to its process group (vLLM's engine processes included), then SIGKILL after a grace
period.

Typical use on a GPU machine (a fragment: it needs vLLM and a GPU)::

    with VllmServer("Qwen/Qwen2.5-0.5B-Instruct", served_name="policy") as server:
        algorithm = GRPO(model="Qwen/Qwen2.5-0.5B-Instruct", policy_server_url=server.base_url, ...)
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

from agentbolt.serving.launchers import LaunchCommand, vllm_command

__all__ = ["INSTRUMENTED_VLLM", "VllmServer", "VllmServerError"]

logger = logging.getLogger(__name__)

INSTRUMENTED_VLLM: List[str] = [sys.executable, "-m", "agentbolt", "vllm"]
"""The program that replaces ``vllm`` in the command line: vLLM's CLI run by ``agentbolt vllm``."""


class VllmServerError(RuntimeError):
    """The vLLM server could not start, did not become ready in time, or exited."""


class VllmServer:
    """vLLM's OpenAI-compatible server, run as a child process.

    Args:
        model: Model directory or hub id.
        host: Interface to bind.
        port: Port (None: a free one).
        dtype: Weights dtype (``bfloat16``, ``float16``, ``float32``, ``auto``).
        max_batch_size: ``--max-num-seqs``.
        served_name: Name clients request (default: ``model``).
        max_model_len: Context length (default: the model's).
        max_lora_rank: Largest LoRA rank the server accepts.
        api_key: Bearer token the server requires (``--api-key``); used by the readiness checks.
        extra_args: Further vLLM arguments (``--tensor-parallel-size 2``, ``--gpu-memory-utilization 0.8``...).
        program: Command that takes vLLM's arguments (default :data:`INSTRUMENTED_VLLM`; ``["vllm"]`` runs the
            plain CLI, without token ids by default).
        env: Variables added to the server's environment.
        log_path: File receiving the server's output (default: a temporary file, kept for inspection).
        startup_timeout: Seconds allowed for loading the model and becoming ready.
        stop_timeout: Seconds the server gets to exit after SIGTERM before SIGKILL.

    Raises:
        EngineError: An unknown dtype.
    """

    def __init__(
        self,
        model: str,
        *,
        host: str = "127.0.0.1",
        port: Optional[int] = None,
        dtype: str = "bfloat16",
        max_batch_size: int = 256,
        served_name: Optional[str] = None,
        max_model_len: Optional[int] = None,
        max_lora_rank: int = 64,
        api_key: Optional[str] = None,
        extra_args: Sequence[str] = (),
        program: Optional[Sequence[str]] = None,
        env: Optional[Dict[str, str]] = None,
        log_path: Optional[os.PathLike[str] | str] = None,
        startup_timeout: float = 900.0,
        stop_timeout: float = 30.0,
    ) -> None:
        from agentbolt.utils.server_launcher import pick_free_port

        self.host = host
        self.port = port if port is not None else pick_free_port(host)
        self.served_name = served_name or model
        self.api_key = api_key
        self.startup_timeout = startup_timeout
        self.stop_timeout = stop_timeout
        args = list(extra_args) + (["--api-key", api_key] if api_key else [])
        self.command: LaunchCommand = vllm_command(
            model,
            host=host,
            port=self.port,
            dtype=dtype,
            max_batch_size=max_batch_size,
            served_name=self.served_name,
            max_model_len=max_model_len,
            max_lora_rank=max_lora_rank,
            extra_args=args,
        )
        prefix = list(program) if program is not None else list(INSTRUMENTED_VLLM)
        self.command.argv = prefix + self.command.argv[1:]  # replaces the bare ``vllm``
        self.command.env.update(env or {})
        self.log_path = Path(log_path) if log_path is not None else None
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
        params: Dict[str, Any] = {"model": f"hosted_vllm/{self.served_name}", "api_base": self.base_url}
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
            VllmServerError: Already started, the port is taken, the process exited, or it was not ready within
                ``startup_timeout`` seconds (it is stopped then); the message ends with the server's last lines.
        """
        from agentbolt.utils.server_launcher import bind_socket

        if self._process is not None:
            raise VllmServerError("this vLLM server was already started")
        try:
            bind_socket(self.host, self.port).close()
        except OSError as exc:
            raise VllmServerError(f"cannot listen on {self.host}:{self.port}: {exc.strerror or exc}") from None
        if self.log_path is None:
            handle, name = tempfile.mkstemp(prefix="agentbolt-vllm-", suffix=".log")
            os.close(handle)
            self.log_path = Path(name)
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        logger.info("Starting vLLM: %s (output in %s)", self.command.shell(), self.log_path)
        self._process = subprocess.Popen(
            self.command.argv,
            env={**os.environ, **self.command.env},
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: stop() reaches vLLM's engine processes too
        )
        try:
            self._wait_until_ready()
        except BaseException:
            self.stop()
            raise
        logger.info("vLLM serves %r at %s", self.served_name, self.base_url)

    def _wait_until_ready(self) -> None:
        import httpx

        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        deadline = time.monotonic() + self.startup_timeout
        with httpx.Client(timeout=5.0, headers=headers) as client:
            while True:
                assert self._process is not None
                code = self._process.poll()
                if code is not None:
                    raise VllmServerError(f"vLLM exited with code {code} before it was ready.{self._log_tail()}")
                if self._serves_model(client):
                    return
                if time.monotonic() > deadline:
                    raise VllmServerError(
                        f"vLLM did not serve {self.served_name!r} at {self.base_url} within "
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
        return f" Last lines of {self.log_path}:\n" + "\n".join(text) if text else ""

    def stop(self) -> Optional[int]:
        """Stop the server (SIGTERM to its process group, SIGKILL after ``stop_timeout``); returns its exit code.

        Safe to call more than once and when the process already exited.
        """
        process = self._process
        if process is not None and process.poll() is None:
            self._signal_group(process, signal.SIGTERM)
            try:
                process.wait(self.stop_timeout)
            except subprocess.TimeoutExpired:
                logger.warning("vLLM did not exit %g s after SIGTERM; killing it", self.stop_timeout)
                self._signal_group(process, signal.SIGKILL)
                process.wait()
        elif process is not None:
            self._signal_group(process, signal.SIGKILL)  # leftover engine processes of a server that died
        if self._log is not None:
            self._log.close()
            self._log = None
        return None if process is None else process.returncode

    @staticmethod
    def _signal_group(process: subprocess.Popen[bytes], sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, sig)

    def __enter__(self) -> VllmServer:
        self.start()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.stop()
