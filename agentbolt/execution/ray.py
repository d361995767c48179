"""Run the runners as Ray actors on a Ray cluster; the store and the algorithm stay in this (the driver) process.

The driver serves the store over HTTP (as the client-server strategy does) and starts ``n_runners`` actors, each
asking the cluster for ``num_cpus_per_runner`` CPUs, ``num_gpus_per_runner`` GPUs and any custom resources, so Ray
places them on whichever nodes have room. Each actor connects a store client to the driver and runs the runner
bundle there. An actor whose process dies (killed, out of memory, node lost) is restarted by Ray up to
``max_restarts`` times and put back to work under the same worker id; the rollout it was running is judged by the
store's watchdog (``RolloutConfig.unresponsive_seconds`` / ``timeout_seconds``) and requeued for another attempt
when its ``RolloutConfig`` allows one.

Ray is imported only when :meth:`RayExecutionStrategy.execute` runs (extra ``agentbolt[ray]``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import secrets
import socket
import threading
import time
import uuid
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Union

from agentbolt.env_var import (
    API_KEY_ENV_VAR,
    LightningEnvVar,
    resolve_int_env_var,
)
from agentbolt.utils.checks import check_count, check_finite, check_port, check_positive
from agentbolt.utils.imports import import_extra
from agentbolt.utils.server_launcher import LOOPBACK_HOSTS, pick_free_port

from .base import (
    AlgorithmBundle,
    ExecutionStrategy,
    RunnerBundle,
    check_store_port_free,
    check_unmanaged_store_shareable,
    resolve_managed_store_setting,
    resolve_server_host,
)
from .events import ExecutionEvent, ThreadingEvent

if TYPE_CHECKING:
    from agentbolt.store.base import LightningStore

__all__ = ["RayExecutionStrategy", "RunnerActorFailure"]

logger = logging.getLogger("agentbolt.execution.ray")


def _ship_function_agents_by_value(ray: Any) -> None:
    """Have Ray pickle ``@rollout`` agents with their function, not by name.

    A ``@rollout`` agent pickles by name (so multiprocessing's spawn start method re-imports it), but a Ray worker
    does not import the driver's main script: Ray's pickler must carry the function itself, as it does for any
    function of the main script.
    """
    from agentbolt.litagent.decorator import FunctionalLitAgent

    ray.util.register_serializer(FunctionalLitAgent, serializer=_agent_state, deserializer=_agent_from_state)


def _agent_state(agent: Any) -> Any:
    """What Ray ships of a ``@rollout`` agent: its class and its state (the function included)."""
    return type(agent), agent.__getstate__()


def _agent_from_state(shipped: Any) -> Any:
    """The ``@rollout`` agent rebuilt from :func:`_agent_state`."""
    cls, state = shipped
    agent = cls.__new__(cls)
    agent.__dict__.update(state)
    return agent


def _import_ray() -> Any:
    return import_extra("ray", feature="The Ray execution strategy", extra="ray")


class RunnerActorFailure(RuntimeError):
    """Runner actors died more often than ``max_restarts`` allows (or could not be placed on the cluster)."""


@dataclasses.dataclass(frozen=True)
class _StoreConnection:
    """How an actor reaches the driver's store server."""

    address: str
    server_id: str
    api_key: Optional[str]
    startup_timeout: float


class RunnerActor:
    """The body of one runner actor (wrapped with ``ray.remote`` at run time).

    ``run`` blocks one of the actor's two threads until the runner bundle returns; ``stop`` (on the other thread)
    raises the bundle's stop event.
    """

    def __init__(self, worker_id: int) -> None:
        self.worker_id = worker_id
        self._stop = ThreadingEvent()
        self._running = threading.Lock()

    def info(self) -> Dict[str, Any]:
        """Where this actor runs: process id, node address and node id."""
        import ray

        context = ray.get_runtime_context()
        return {
            "worker_id": self.worker_id,
            "pid": os.getpid(),
            "node_ip": ray.util.get_node_ip_address(),
            "node_id": context.get_node_id(),
        }

    def stop(self) -> None:
        """Ask the running bundle to finish (it returns after its current rollout)."""
        self._stop.set()

    def run(self, runner: RunnerBundle, store: Union[_StoreConnection, LightningStore]) -> None:
        """Run the runner bundle against the driver's store until stopped (one run at a time: a second call waits)."""
        with self._running:
            asyncio.run(_run_runner_bundle(runner, self.worker_id, store, self._stop))


async def _run_runner_bundle(
    runner: RunnerBundle,
    worker_id: int,
    store: Union[_StoreConnection, LightningStore],
    stop_evt: ExecutionEvent,
) -> None:
    if not isinstance(store, _StoreConnection):  # an unmanaged store is used as it was given
        await runner(store, worker_id, stop_evt)
        return
    from agentbolt.store.client_server import LightningStoreClient

    from .client_server import run_runner_with_client

    client = LightningStoreClient(store.address, api_key=store.api_key, expected_server_id=store.server_id)
    await run_runner_with_client(runner, worker_id, client, stop_evt, store.startup_timeout)


class RayExecutionStrategy(ExecutionStrategy):
    """Runners as Ray actors on a Ray cluster; the store and the algorithm in this process (alias ``"ray"``).

    Ray is started here when it is not running yet: ``address=None`` starts a local instance (or joins the one
    named by ``RAY_ADDRESS``); ``"auto"`` joins the cluster started on this machine with ``ray start --head``;
    ``"HOST:PORT"`` joins that cluster's head; ``"ray://HOST:10001"`` connects through Ray Client. When Ray is
    already initialised in this process, that session is used as it is and left running afterwards.

    The store server listens on ``server_host``. When every node of the cluster is this machine it defaults to
    127.0.0.1; otherwise to 0.0.0.0, announced to the actors as this node's address, and protected by a bearer
    token (``api_key``, else ``$AGENTBOLT_API_KEY``, else a random one made for the run and handed to the actors
    through Ray). Other servers the agents call (the LLM gateway, inference engines) must be reachable from the
    nodes too: that is the algorithm's configuration, not this strategy's.

    Args:
        n_runners: Number of runner actors.
        address: Ray cluster to join (see above).
        num_cpus_per_runner: CPUs Ray reserves for each actor (fractions allowed; actors beyond what the cluster
            has wait, and fail the run after ``startup_timeout``).
        num_gpus_per_runner: GPUs reserved for each actor (Ray sets ``CUDA_VISIBLE_DEVICES`` for it).
        resources_per_runner: Custom Ray resources each actor needs (e.g. ``{"agent_node": 1}``), to pin runners
            to nodes started with ``ray start --resources``.
        max_restarts: How often Ray restarts an actor whose process died (-1: without limit). An actor that dies
            once more is given up; the run goes on with the others and fails with :class:`RunnerActorFailure`
            when none is left (or at the end, if any was given up).
        scheduling_strategy: Passed to Ray (``"DEFAULT"``, ``"SPREAD"`` or a Ray scheduling strategy object).
        runtime_env: Ray runtime environment of the actors (``env_vars``, ``pip``, ``working_dir``...), also used
            when this strategy starts Ray.
        init_kwargs: Further arguments of ``ray.init`` when this strategy starts Ray (``num_cpus``, ...).
        server_host: Interface of the store server (default: see above; ``AGL_SERVER_HOST`` also works).
        server_port: Port of the store server (default ``AGL_SERVER_PORT``, else a free port).
        advertised_host: Address the actors use to reach the store server (default: 127.0.0.1 when it listens
            there, else this node's IP address as Ray sees it).
        api_key: Bearer token of the store server (see above).
        managed_store: Serve the given store and give the actors clients (default ``AGL_MANAGED_STORE``, else
            True). When False, the store is pickled to every actor as it is: it must be reachable from them
            (a :class:`~agentbolt.store.client_server.LightningStoreClient` of an ``agentbolt store`` server).
        graceful_timeout: Seconds the actors get to finish their current rollout once the algorithm is done.
        startup_timeout: Seconds an actor may take to be placed and started, and to reach the store server.
        poll_interval: Seconds between two checks of the actors' health.

    Raises:
        TypeError: A setting of the wrong type (a count that is not an integer, an amount that is not a number...).
        ValueError: A count, amount, timeout or port out of range, or an ``address`` of none of the forms above.
    """

    alias = "ray"

    def __init__(
        self,
        n_runners: int = 1,
        address: Optional[str] = None,
        num_cpus_per_runner: float = 1.0,
        num_gpus_per_runner: float = 0.0,
        resources_per_runner: Optional[Dict[str, float]] = None,
        max_restarts: int = 3,
        scheduling_strategy: Any = None,
        runtime_env: Optional[Dict[str, Any]] = None,
        init_kwargs: Optional[Dict[str, Any]] = None,
        server_host: Optional[str] = None,
        server_port: Optional[int] = None,
        advertised_host: Optional[str] = None,
        api_key: Optional[str] = None,
        managed_store: Optional[bool] = None,
        graceful_timeout: float = 10.0,
        startup_timeout: float = 120.0,
        poll_interval: float = 0.5,
    ) -> None:
        check_count(n_runners, "n_runners")
        check_finite(num_cpus_per_runner, "num_cpus_per_runner", minimum=0)
        check_finite(num_gpus_per_runner, "num_gpus_per_runner", minimum=0)
        for name, mapping in (
            ("resources_per_runner", resources_per_runner),
            ("runtime_env", runtime_env),
            ("init_kwargs", init_kwargs),
        ):
            if mapping is not None and not isinstance(mapping, Mapping):
                raise TypeError(f"{name} must be a dict, got {type(mapping).__name__} {mapping!r}")
        if init_kwargs and "address" in init_kwargs:
            raise ValueError("init_kwargs must not hold 'address': pass it as address=")
        for name, amount in (resources_per_runner or {}).items():
            if not isinstance(amount, (int, float)) or isinstance(amount, bool) or not amount >= 0:
                raise ValueError(f"resources_per_runner[{name!r}] must be a number >= 0, got {amount!r}")
        if check_count(max_restarts, "max_restarts", minimum=-2) == -2:
            raise ValueError(f"max_restarts must be -1 (no limit) or >= 0, got {max_restarts}")
        for name, value in (
            ("graceful_timeout", graceful_timeout),
            ("startup_timeout", startup_timeout),
            ("poll_interval", poll_interval),
        ):
            check_positive(value, name)
        if address is not None:
            if not isinstance(address, str):
                raise TypeError(f"address must be a string ('auto', 'HOST:PORT', 'ray://HOST:PORT'), got {address!r}")
            if not address.strip():
                raise ValueError("address must not be empty (None starts a local Ray instance)")
            _cluster_endpoint(address)
        self.n_runners = n_runners
        self.address = address
        self.num_cpus_per_runner = float(num_cpus_per_runner)
        self.num_gpus_per_runner = float(num_gpus_per_runner)
        self.resources_per_runner = dict(resources_per_runner or {})
        self.max_restarts = max_restarts
        self.scheduling_strategy = scheduling_strategy
        self.runtime_env = runtime_env
        self.init_kwargs = dict(init_kwargs or {})
        self.server_host = resolve_server_host(server_host, None)
        self.server_port = resolve_int_env_var(LightningEnvVar.AGL_SERVER_PORT, override=server_port)
        check_port(self.server_port, "server_port")
        self.advertised_host = advertised_host
        self.api_key = api_key
        self.managed_store, self._managed_store_source = resolve_managed_store_setting(managed_store)
        self.graceful_timeout = graceful_timeout
        self.startup_timeout = startup_timeout
        self.poll_interval = poll_interval
        self.restarts: Dict[int, int] = {}
        """How often each runner's actor died and was put back to work during the last :meth:`execute`."""
        self.actor_info: Dict[int, Dict[str, Any]] = {}
        """Where each runner's actor last reported running (pid, node ip, node id)."""
        self.given_up: List[int] = []
        """Runners whose actor died more often than ``max_restarts`` during the last :meth:`execute`."""
        self.interrupted = False
        """Whether the last :meth:`execute` was stopped by Ctrl-C (it then returns normally, having stopped the
        actors, as the client-server strategy does)."""

    # ------------------------------------------------------------------ placement

    def _actor_options(self) -> Dict[str, Any]:
        options: Dict[str, Any] = {
            "num_cpus": self.num_cpus_per_runner,
            "num_gpus": self.num_gpus_per_runner,
            "max_restarts": self.max_restarts,
            "max_task_retries": 0,  # a dead actor's run is resubmitted here, after Ray restarted it
            "max_concurrency": 2,  # ``run`` on one thread, ``stop`` / ``info`` on the other
        }
        if self.resources_per_runner:
            options["resources"] = self.resources_per_runner
        if self.scheduling_strategy is not None:
            options["scheduling_strategy"] = self.scheduling_strategy
        if self.runtime_env is not None:
            options["runtime_env"] = self.runtime_env
        return options

    def _describe_request(self) -> str:
        parts = [f"{self.num_cpus_per_runner:g} CPU"]
        if self.num_gpus_per_runner:
            parts.append(f"{self.num_gpus_per_runner:g} GPU")
        parts += [f"{amount:g} {name}" for name, amount in self.resources_per_runner.items()]
        return ", ".join(parts)

    @staticmethod
    def _cluster_is_this_machine(ray: Any) -> bool:
        own = ray.util.get_node_ip_address()
        addresses = {node.get("NodeManagerAddress") for node in ray.nodes() if node.get("Alive")}
        return addresses <= {own, *LOOPBACK_HOSTS}

    def _store_endpoint(self, ray: Any) -> tuple[str, str, Optional[str]]:
        """(bind host, advertised host, api key) of the store server for this cluster."""
        local = self._cluster_is_this_machine(ray)
        bind = self.server_host or ("127.0.0.1" if local else "0.0.0.0")
        if self.advertised_host is not None:
            advertised = self.advertised_host
        elif bind in LOOPBACK_HOSTS:
            advertised = "127.0.0.1"
        else:
            advertised = ray.util.get_node_ip_address() if bind in ("0.0.0.0", "::") else bind
        api_key = self.api_key or os.environ.get(API_KEY_ENV_VAR) or None
        if api_key is None and bind not in LOOPBACK_HOSTS:
            api_key = secrets.token_urlsafe(24)
            logger.info("The store server listens on %s: requests need the bearer token made for this run", bind)
        return bind, advertised, api_key

    # ------------------------------------------------------------------ orchestration

    def execute(self, algorithm: AlgorithmBundle, runner: RunnerBundle, store: Any) -> None:
        """Start Ray if needed, serve the store, run the actors and the algorithm; always stop the actors.

        Ctrl-C stops the run and returns normally with :attr:`interrupted` set.

        Raises:
            ImportError: Ray is not installed.
            RuntimeError: A fixed ``server_port`` is taken (checked before Ray starts).
            ConnectionError: Nothing answers at ``address`` (checked before Ray starts).
            ValueError: ``managed_store`` is False and the store cannot be shared with other processes.
            RunnerActorFailure: Every runner actor died beyond ``max_restarts``, or actors could not be placed.
            Exception: What the algorithm or a runner bundle raised.
        """
        ray = _import_ray()
        check_unmanaged_store_shareable(store, self.managed_store, self._managed_store_source)
        if self.managed_store and self.server_port:
            # Taken on any interface counts: the store server's bind host is not known before Ray starts.
            check_store_port_free(
                self.server_host or "0.0.0.0",
                self.server_port,
                failure=f"server_port {self.server_port}",
                option="server_port=",
            )
        if not ray.is_initialized():
            _check_cluster_answers(self.address)
        started_ray = False
        if not ray.is_initialized():
            kwargs = dict(self.init_kwargs)
            if self.runtime_env is not None:
                kwargs.setdefault("runtime_env", self.runtime_env)
            ray.init(address=self.address, **kwargs)
            started_ray = True
        self.restarts = {}
        self.actor_info = {}
        self.given_up = []
        self.interrupted = False
        try:
            asyncio.run(self._execute(ray, algorithm, runner, store))
        except KeyboardInterrupt:
            self.interrupted = True
            logger.warning("Interrupted; the runner actors were stopped")
        finally:
            if started_ray:
                ray.shutdown()

    async def _execute(self, ray: Any, algorithm: AlgorithmBundle, runner: RunnerBundle, store: Any) -> None:
        from agentbolt.store.client_server import LightningStoreServer

        stop_evt = ThreadingEvent()
        server: Optional[LightningStoreServer] = None
        actors: Dict[int, Any] = {}
        runs: Dict[int, Any] = {}
        supervisor: Optional[asyncio.Task[None]] = None
        try:
            if self.managed_store:
                bind, advertised, api_key = self._store_endpoint(ray)
                port = self.server_port if self.server_port is not None else pick_free_port(bind)
                server_id = uuid.uuid4().hex
                server = LightningStoreServer(store, host=bind, port=port, api_key=api_key, server_id=server_id)
                server.launcher_args.log_level = logging.WARNING
                await server.start()
                logger.info("Store served at %s for the runner actors (%s:%d)", server.endpoint, advertised, port)
                runner_store: Any = _StoreConnection(
                    f"http://{advertised}:{port}", server_id, api_key, self.startup_timeout
                )
                store = server
            else:
                runner_store = store
            actor_class = ray.remote(RunnerActor).options(**self._actor_options())
            _ship_function_agents_by_value(ray)
            bundle_ref = ray.put(runner)
            for worker_id in range(self.n_runners):
                actors[worker_id] = actor_class.remote(worker_id)
                runs[worker_id] = actors[worker_id].run.remote(bundle_ref, runner_store)
            supervisor = asyncio.create_task(self._supervise(ray, actors, runs, bundle_ref, runner_store, stop_evt))
            algorithm_task = asyncio.create_task(algorithm(store, stop_evt))
            await asyncio.wait({supervisor, algorithm_task}, return_when=asyncio.FIRST_COMPLETED)
            if not algorithm_task.done():
                failure = supervisor.exception()
                if failure is None:
                    await algorithm_task  # every runner returned by itself (max_rollouts): the algorithm ends the run
                else:
                    stop_evt.set()
                    await self._finish_task(algorithm_task)
                    raise failure
            stop_evt.set()
            algorithm_task.result()
            if self.given_up:
                raise RunnerActorFailure(
                    f"Runner actors died more often than max_restarts={self.max_restarts} allows: runners "
                    f"{', '.join(map(str, self.given_up))}."
                )
        except (Exception, asyncio.CancelledError, KeyboardInterrupt):
            stop_evt.set()
            raise
        finally:
            stop_evt.set()
            if supervisor is not None:
                supervisor.cancel()
            await asyncio.to_thread(self._stop_actors, ray, actors, runs)
            if server is not None:
                await server.stop()

    async def _finish_task(self, task: asyncio.Task[Any]) -> None:
        """Give ``task`` ``graceful_timeout`` seconds to return after the stop event, then cancel it."""
        done, _ = await asyncio.wait({task}, timeout=self.graceful_timeout)
        if not done:
            task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
        except Exception:
            logger.exception("The algorithm failed while the run was stopping")

    async def _supervise(
        self,
        ray: Any,
        actors: Dict[int, Any],
        runs: Dict[int, Any],
        bundle_ref: Any,
        runner_store: Any,
        stop_evt: ExecutionEvent,
    ) -> None:
        """Watch the actors until they are all done; put restarted ones back to work.

        Raises:
            RunnerActorFailure: Actors could not be placed within ``startup_timeout``, or none is left alive.
            Exception: A runner bundle raised (re-raised as its own type).
        """
        await self._wait_until_placed(ray, actors, stop_evt)
        while runs and not stop_evt.is_set():
            refs = list(runs.values())
            ready, _ = await asyncio.to_thread(ray.wait, refs, num_returns=1, timeout=self.poll_interval)
            for ref in ready:
                worker_id = next(i for i, r in runs.items() if r == ref)
                del runs[worker_id]
                try:
                    await asyncio.to_thread(ray.get, ref)
                    logger.info("Runner %d finished", worker_id)
                except ray.exceptions.RayActorError as exc:
                    if stop_evt.is_set():
                        break
                    logger.warning(
                        "Runner %d's actor died (%s). The rollout it was running is retried by the store's watchdog "
                        "when its RolloutConfig allows it.",
                        worker_id,
                        _first_line(exc),
                    )
                    if await self._revive(ray, worker_id, actors[worker_id], stop_evt):
                        runs[worker_id] = actors[worker_id].run.remote(bundle_ref, runner_store)
                    elif not stop_evt.is_set():
                        self.given_up.append(worker_id)
                        logger.error(
                            "Runner %d's actor is gone for good (max_restarts=%d); the others go on.",
                            worker_id,
                            self.max_restarts,
                        )
                except ray.exceptions.RayTaskError as exc:
                    raise exc.as_instanceof_cause() from None
            if self.given_up and not runs:
                raise RunnerActorFailure(
                    f"Every runner actor died more often than max_restarts={self.max_restarts} allows (runners "
                    f"{', '.join(map(str, sorted(self.given_up)))})."
                )

    async def _revive(self, ray: Any, worker_id: int, actor: Any, stop_evt: ExecutionEvent) -> bool:
        """Wait until Ray restarted a dead actor; True once it answers, False when Ray gave it up (or time ran out).

        Calls made while Ray restarts an actor fail as "unavailable"; only an answer from the new process counts.
        """
        deadline = time.monotonic() + self.startup_timeout
        while not stop_evt.is_set() and time.monotonic() < deadline:
            try:
                info = await asyncio.to_thread(ray.get, actor.info.remote(), timeout=self.poll_interval * 4)
            except ray.exceptions.ActorDiedError:
                return False
            except (ray.exceptions.ActorUnavailableError, ray.exceptions.GetTimeoutError):
                await asyncio.sleep(self.poll_interval)
                continue
            previous = self.actor_info.get(worker_id, {}).get("pid")
            if info["pid"] != previous:  # a new process; the same one means only the connection was lost
                self.restarts[worker_id] = self.restarts.get(worker_id, 0) + 1
            self.actor_info[worker_id] = info
            logger.info("Runner %d's actor answers again (pid %s on %s)", worker_id, info["pid"], info["node_ip"])
            return True
        return False

    async def _wait_until_placed(self, ray: Any, actors: Dict[int, Any], stop_evt: ExecutionEvent) -> None:
        """Wait for every actor to start (recording where it runs).

        Raises:
            RunnerActorFailure: Some actor was not placed within ``startup_timeout`` (naming what it asks for and
                what the cluster has).
        """
        pending = {actor.info.remote(): worker_id for worker_id, actor in actors.items()}
        deadline = time.monotonic() + self.startup_timeout
        while pending and not stop_evt.is_set():
            timeout = min(self.poll_interval, max(0.0, deadline - time.monotonic()))
            ready, _ = await asyncio.to_thread(ray.wait, list(pending), num_returns=len(pending), timeout=timeout)
            for ref in ready:
                worker_id = pending.pop(ref)
                with contextlib.suppress(ray.exceptions.RayActorError):  # died while starting: handled as a death
                    self.actor_info[worker_id] = await asyncio.to_thread(ray.get, ref)
            if pending and time.monotonic() >= deadline:
                raise RunnerActorFailure(
                    f"{len(pending)} of {len(actors)} runner actors did not start within {self.startup_timeout:g} "
                    f"seconds. Each asks for {self._describe_request()}; the cluster has "
                    f"{_format_resources(ray.cluster_resources())}. Lower num_cpus_per_runner / "
                    "num_gpus_per_runner or n_runners, or add nodes."
                )
        if self.actor_info:
            nodes = sorted({info["node_ip"] for info in self.actor_info.values()})
            logger.info("%d runner actors started on %s", len(self.actor_info), ", ".join(nodes))

    def _stop_actors(self, ray: Any, actors: Dict[int, Any], runs: Dict[int, Any]) -> None:
        """Ask every actor to stop, wait ``graceful_timeout`` for their runs, then kill them all."""
        for actor in actors.values():
            try:
                actor.stop.remote()
            except Exception as exc:  # the actor may already be gone
                logger.debug("Could not ask an actor to stop: %s", exc)
        if runs:
            ray.wait(list(runs.values()), num_returns=len(runs), timeout=self.graceful_timeout)
        for worker_id, actor in actors.items():
            try:
                ray.kill(actor, no_restart=True)
            except Exception as exc:
                logger.debug("Could not kill runner %d's actor: %s", worker_id, exc)


def _cluster_endpoint(address: str) -> Optional[tuple[str, int]]:
    """``(host, port)`` of a cluster address (``HOST:PORT`` or ``ray://HOST[:PORT]``); None for ``auto`` / ``local``.

    Raises:
        ValueError: ``address`` is none of those forms, naming it.
    """
    if address in ("auto", "local"):
        return None
    text, default_port = (address[len("ray://") :], "10001") if address.startswith("ray://") else (address, "")
    host, _, port = text.rpartition(":") if ":" in text else (text, "", default_port)
    host = host.strip("[]")
    if not host or not port.isdigit() or not 0 < int(port) < 65536 or any(c.isspace() or c in "/@" for c in host):
        raise ValueError(
            f"address {address!r} is not a Ray cluster address: use 'auto', 'HOST:PORT' (the head's GCS port, "
            "6379 by default) or 'ray://HOST:PORT' (Ray Client, 10001 by default)"
        )
    return host, int(port)


def _check_cluster_answers(address: Optional[str], timeout: float = 5.0) -> None:
    """Fail at once when nothing listens at a cluster address (``ray.init`` would retry for minutes).

    Raises:
        ConnectionError: Nothing accepts a connection at the address's host and port.
    """
    endpoint = _cluster_endpoint(address) if address else None
    if endpoint is None:
        return
    try:
        socket.create_connection(endpoint, timeout=timeout).close()
    except OSError as exc:
        raise ConnectionError(
            f"address {address!r}: nothing answers at {endpoint[0]}:{endpoint[1]} ({exc.strerror or exc}). Start the "
            "cluster's head (`ray start --head`) or correct the address."
        ) from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _format_resources(resources: Dict[str, float]) -> str:
    shown = {k: v for k, v in resources.items() if not k.startswith("node:") and "memory" not in k}
    return ", ".join(f"{amount:g} {name}" for name, amount in sorted(shown.items())) or "no resources"
