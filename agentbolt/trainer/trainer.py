"""The Trainer: wires the store, the algorithm, the runners, the tracer, the adapter and the LLM gateway."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import functools
import logging
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, AsyncIterator, Dict, Iterator, Mapping, Optional, Sequence, Tuple, Union

from agentbolt.types import Dataset, Hook, Resource
from agentbolt.utils.checks import check_count, check_port

from .init_utils import build_component
from .legacy import TrainerLegacy
from .registry import ExecutionStrategyRegistry

if TYPE_CHECKING:
    from agentbolt.adapter import TraceAdapter
    from agentbolt.algorithm import Algorithm
    from agentbolt.execution import ExecutionEvent, ExecutionStrategy
    from agentbolt.litagent import LitAgent
    from agentbolt.llm_proxy import LLMProxy
    from agentbolt.runner import Runner
    from agentbolt.store.base import LightningStore
    from agentbolt.tracer import Tracer

__all__ = ["Trainer"]

logger = logging.getLogger("agentbolt.trainer")

_SQLITE_SUFFIXES = (".db", ".sqlite", ".sqlite3")


def _sqlite_path_from_spec(spec: Any) -> Optional[str]:
    """A SQLite file named by ``"sqlite:///path"``, a ``Path``, or a string ending in .db/.sqlite/.sqlite3."""
    if isinstance(spec, Path):
        return str(spec)
    if isinstance(spec, str):
        if spec.startswith("sqlite:///"):
            return spec[len("sqlite:///") :]
        if spec.endswith(_SQLITE_SUFFIXES):
            return spec
    return None


@contextlib.contextmanager
def _console_progress(enabled: bool) -> Iterator[None]:
    """Show the progress logger's lines on the console (stderr) while the block runs, unless logging is configured.

    When the progress logger or one of its ancestors already has a handler (``logging.basicConfig``,
    :func:`agentbolt.logging.setup`...), its records go where that configuration sends them and nothing is added.
    """
    from agentbolt.algorithm.progress import PROGRESS_LOGGER_NAME

    progress = logging.getLogger(PROGRESS_LOGGER_NAME)
    if not enabled or progress.hasHandlers():
        yield
        return
    from rich.console import Console
    from rich.logging import RichHandler

    handler = RichHandler(console=Console(stderr=True), show_path=False, markup=False, rich_tracebacks=False)
    handler.setLevel(logging.INFO)
    previous_level = progress.level
    progress.addHandler(handler)
    progress.setLevel(logging.INFO)
    try:
        yield
    finally:
        progress.removeHandler(handler)
        progress.setLevel(previous_level)


@contextlib.asynccontextmanager
async def _following_rollouts(store: LightningStore) -> AsyncIterator[None]:
    """Report the rollouts that finish in ``store`` while the block runs, then a summary."""
    from agentbolt.algorithm.progress import FinishedRolloutFollower, RolloutProgress

    follower = FinishedRolloutFollower(store, RolloutProgress())
    await follower.start()
    stop = asyncio.Event()
    task = asyncio.create_task(follower.follow(stop))
    try:
        yield
    finally:
        stop.set()
        try:
            await asyncio.wait_for(task, 30)
        except (asyncio.TimeoutError, asyncio.CancelledError):
            task.cancel()


@contextlib.asynccontextmanager
async def _resource_gateways(resources: Optional[Mapping[str, Any]], store: LightningStore) -> AsyncIterator[Any]:
    """The initial resources with every :class:`~agentbolt.llm_proxy.LLMProxy` among them started on ``store`` (and
    stopped afterwards, when it was not running already) and replaced by its resource.

    A gateway given as a resource records the calls of the agents that use it into the run's store, like the
    algorithm's own: the fixed roles of a multi-agent system, a judge or a tool model.
    """
    if not resources:
        yield resources
        return
    from agentbolt.llm_proxy import LLMProxy

    started: list[LLMProxy] = []
    published: Dict[str, Any] = {}
    try:
        for name, value in resources.items():
            if isinstance(value, LLMProxy):
                value.set_store(store)
                if not value.is_running():
                    await value.start()
                    started.append(value)
                value = value.as_resource()
            published[name] = value
        yield published
    finally:
        for proxy in reversed(started):
            await proxy.stop()


def _check_initial_resources(resources: Any) -> None:
    """Refuse ``initial_resources`` that are not a mapping of names to resources, before anything starts.

    Raises:
        TypeError: Not a mapping, a name that is not a string, or a value that is not a resource (``LLM``,
            ``ProxyLLM``, ``PromptTemplate``, a dict of one's fields, or an ``LLMProxy``).
    """
    if resources is None:
        return
    if not isinstance(resources, Mapping):
        raise TypeError(
            'initial_resources must map names to resources, e.g. {"main_llm": agl.LLM(...)}, '
            f"got {type(resources).__name__}"
        )
    for name, value in resources.items():
        if not isinstance(name, str):
            raise TypeError(f"initial_resources names must be strings, got {type(name).__name__} {name!r}")
        is_gateway = callable(getattr(value, "as_resource", None))  # an LLMProxy, without importing it here
        if not (isinstance(value, (Resource, Mapping)) or is_gateway):
            raise TypeError(
                f"initial_resources[{name!r}] must be an LLM, ProxyLLM, PromptTemplate or LLMProxy, "
                f"got {type(value).__name__}"
            )


def _check_run_inputs(agent: Any, train_dataset: Any, val_dataset: Any) -> None:
    """Refuse an agent that is not a ``LitAgent`` and datasets without ``len`` and indexing, before anything starts.

    Raises:
        TypeError: The message names the argument and what it should be.
    """
    from agentbolt.litagent import LitAgent

    if not isinstance(agent, LitAgent):
        hint = " (decorate the function with @agl.rollout)" if callable(agent) and not isinstance(agent, type) else ""
        raise TypeError(f"agent must be a LitAgent instance{hint}, got {type(agent).__name__}")
    for name, dataset in (("train_dataset", train_dataset), ("val_dataset", val_dataset)):
        if dataset is None:
            continue
        if (
            isinstance(dataset, (str, bytes, Mapping))
            or not hasattr(dataset, "__len__")
            or not hasattr(dataset, "__getitem__")
        ):
            raise TypeError(
                f"{name} must be a sequence of tasks (a list, or any object with __len__ and __getitem__ by index), "
                f"got {type(dataset).__name__}"
            )


def _hooks_tuple(hooks: Union[Hook, Sequence[Hook], None]) -> Tuple[Hook, ...]:
    """``hooks`` as a tuple of hooks.

    Raises:
        TypeError: ``hooks`` is neither None, a Hook nor a sequence of Hooks; the message names the wrong type.
    """
    if hooks is None:
        return ()
    if isinstance(hooks, Hook):
        return (hooks,)
    if not isinstance(hooks, Sequence) or isinstance(hooks, str):
        raise TypeError(f"hooks must be a Hook or a sequence of Hooks, got {type(hooks)}.")
    for hook in hooks:
        if not isinstance(hook, Hook):
            raise TypeError(f"hooks must contain only Hook instances, got {type(hook)}.")
    return tuple(hooks)


class AgentRunnerBundle:
    """The runner side of a :class:`Trainer` run: the runner, its hooks and the agent, as one runner bundle.

    It references nothing else of the trainer (not its store, algorithm or gateway), so a strategy can pickle it to
    run the runners in other processes or on other machines (the Ray strategy ships it to its actors).
    """

    def __init__(self, runner: Runner[Any], hooks: Sequence[Hook], agent: LitAgent[Any]) -> None:
        self.runner = runner
        self.hooks = tuple(hooks)
        self.agent = agent

    async def __call__(self, store: LightningStore, worker_id: int, event: ExecutionEvent) -> None:
        # Threads of the shared-memory strategy must not share one runner's per-worker state.
        runner = self.runner if worker_id == 0 else copy.copy(self.runner)
        runner_initialized = False
        worker_initialized = False
        try:
            runner.init(agent=self.agent, hooks=list(self.hooks))
            runner_initialized = True
            runner.init_worker(worker_id, store)
            worker_initialized = True
            await runner.iter(event=event)
        finally:
            if worker_initialized:
                try:
                    runner.teardown_worker(worker_id)
                except Exception:
                    logger.exception("Error while tearing down runner worker %d", worker_id)
            if runner_initialized:
                try:
                    runner.teardown()
                except Exception:
                    logger.exception("Error while tearing down the runner")


class Trainer(TrainerLegacy):
    """Runs an algorithm against an agent: ``fit`` for training, ``dev`` for a quick dry run.

    Every component accepts an instance, a class, a zero-argument factory, an import path, a
    ``{"type": ..., **kwargs}`` dict, or ``None`` for the default.

    Args:
        dev: Deprecated; use :meth:`dev`.
        n_runners: Number of runner workers (default 1).
        max_rollouts: Stop each runner after this many rollouts.
        initial_resources: Resources given to the algorithm before it starts (e.g. the LLM and prompt). A value
            may also be an :class:`~agentbolt.llm_proxy.LLMProxy`: it is started on the run's store (its calls
            are recorded with the rollouts) and published as its resource.
        tracer: Default :class:`~agentbolt.tracer.AgentOpsTracer` (OpenAI SDK instrumentation).
        adapter: Default :class:`~agentbolt.adapter.TracerTraceToTriplet`; a dict without ``type`` configures it.
        store: Default :class:`~agentbolt.store.InMemoryLightningStore`. ``"sqlite:///PATH"``, a ``Path`` or a
            string ending in ``.db`` / ``.sqlite`` opens a durable :class:`~agentbolt.store.sqlite.SqliteLightningStore`;
            the trainer closes a SQLite store it opened itself when ``fit`` or ``dev`` ends (so the file alone holds
            the run, with no ``-wal`` beside it) and opens it again for the next run. A store passed in as an
            instance stays open: its owner closes it.
        runner: Default :class:`~agentbolt.runner.LitAgentRunner`.
        strategy: ``"cs"`` (client-server, default), ``"shm"`` (threads), an instance or a dict.
        port: Port of the store server for the client-server strategy; wins over ``AGL_SERVER_PORT`` and over the
            port of a strategy instance given as ``strategy`` (0, any free port, needs the strategy's role ``"both"``).
        algorithm: The algorithm to run (optional for ``fit``; ``dev`` defaults to ``Baseline``).
        llm_proxy: An :class:`~agentbolt.llm_proxy.LLMProxy` (or spec) the algorithm can start and update.
        n_workers: Deprecated alias of ``n_runners``.
        max_tasks: Deprecated alias of ``max_rollouts``.
        daemon: Run worker processes as daemons.
        triplet_exporter: Deprecated alias of ``adapter``.
        hooks: One :class:`~agentbolt.types.Hook` or a sequence of them, called around every rollout.
    """

    def __init__(
        self,
        *,
        dev: bool = False,
        n_runners: Optional[int] = None,
        max_rollouts: Optional[int] = None,
        initial_resources: Optional[Mapping[str, Any]] = None,
        tracer: Any = None,
        adapter: Any = None,
        store: Any = None,
        runner: Any = None,
        strategy: Any = None,
        port: Optional[int] = None,
        algorithm: Any = None,
        llm_proxy: Any = None,
        n_workers: Optional[int] = None,
        max_tasks: Optional[int] = None,
        daemon: bool = True,
        triplet_exporter: Any = None,
        hooks: Union[Hook, Sequence[Hook], None] = None,
    ) -> None:
        super().__init__()
        if dev:
            warnings.warn(
                "Trainer(dev=True) is deprecated; call Trainer.dev(...) instead.", DeprecationWarning, stacklevel=2
            )
        self._dev = dev
        if n_workers is not None:
            warnings.warn("n_workers is deprecated; use n_runners.", DeprecationWarning, stacklevel=2)
            if n_runners is None:
                n_runners = n_workers
        if max_tasks is not None:
            warnings.warn("max_tasks is deprecated; use max_rollouts.", DeprecationWarning, stacklevel=2)
            if max_rollouts is None:
                max_rollouts = max_tasks
        if not daemon:
            warnings.warn("daemon=False: worker processes may outlive the trainer.", stacklevel=2)
        check_count(n_runners, "n_runners", optional=True)
        check_count(max_rollouts, "max_rollouts", optional=True)
        check_port(port)
        _check_initial_resources(initial_resources)
        self.n_runners: int = n_runners if n_runners is not None else 1
        self.n_workers: int = self.n_runners
        self.max_rollouts = max_rollouts
        self.max_tasks = max_rollouts
        self.daemon = daemon
        self.initial_resources = initial_resources
        self.port = port
        self.worker_id: Optional[int] = None

        self.tracer: Tracer = self._make_tracer(tracer)
        if adapter is not None and triplet_exporter is not None:
            warnings.warn("Both adapter and triplet_exporter given; using adapter.", stacklevel=2)
        elif triplet_exporter is not None:
            warnings.warn("triplet_exporter is deprecated; use adapter.", DeprecationWarning, stacklevel=2)
            adapter = triplet_exporter
        self.adapter: TraceAdapter[Any] = self._make_adapter(adapter)
        self.triplet_exporter = self.adapter
        self.algorithm: Optional[Algorithm] = self._make_algorithm(algorithm)
        self.strategy: ExecutionStrategy = self._make_strategy(strategy)
        strategy_runners = getattr(self.strategy, "n_runners", None)
        if isinstance(strategy_runners, int) and not isinstance(strategy_runners, bool) and strategy_runners > 0:
            self.n_runners = self.n_workers = strategy_runners
        self._owned_sqlite_path: Optional[str] = None
        self._owned_store_closed = False
        self.store: LightningStore = self._make_store(store)
        self.runner: Runner[Any] = self._make_runner(runner)
        self.llm_proxy: Optional[LLMProxy] = self._make_llm_proxy(llm_proxy)
        self.hooks: Tuple[Hook, ...] = _hooks_tuple(hooks)

    # ------------------------------------------------------------------ component construction

    def _make_tracer(self, spec: Any) -> Tracer:
        from agentbolt.tracer import AgentOpsTracer, Tracer

        return build_component(  # type: ignore[return-value]
            spec,
            expected_type=Tracer,
            spec_name="tracer",
            default_factory=lambda: AgentOpsTracer(agentops_managed=True, instrument_managed=True, daemon=self.daemon),
        )

    def _make_adapter(self, spec: Any) -> TraceAdapter[Any]:
        from agentbolt.adapter import TraceAdapter, TracerTraceToTriplet

        return build_component(  # type: ignore[return-value]
            spec,
            expected_type=TraceAdapter,
            spec_name="adapter",
            default_factory=TracerTraceToTriplet,
            dict_requires_type=False,
            dict_default_cls=TracerTraceToTriplet,
        )

    def _make_algorithm(self, spec: Any) -> Optional[Algorithm]:
        from agentbolt.algorithm import Algorithm

        return build_component(spec, expected_type=Algorithm, spec_name="algorithm", allow_none=True)

    def _make_strategy(self, spec: Any) -> ExecutionStrategy:
        from agentbolt.execution import ClientServerExecutionStrategy, ExecutionStrategy

        if isinstance(spec, ExecutionStrategy):
            if self.port is not None and isinstance(spec, ClientServerExecutionStrategy):
                spec._set_server_port(self.port, "port")
            return spec
        defaults: Dict[str, Any] = {"n_runners": self.n_runners}
        if self.port is not None:
            defaults["server_port"] = self.port
        return build_component(  # type: ignore[return-value]
            spec,
            expected_type=ExecutionStrategy,
            spec_name="strategy",
            default_factory=lambda: ClientServerExecutionStrategy(**defaults),
            optional_defaults=defaults,
            registry=ExecutionStrategyRegistry,
        )

    def _make_store(self, spec: Any) -> LightningStore:
        from agentbolt.execution import ClientServerExecutionStrategy
        from agentbolt.store.base import LightningStore
        from agentbolt.store.memory import InMemoryLightningStore

        sqlite_path = _sqlite_path_from_spec(spec)
        if sqlite_path is not None:
            from agentbolt.store.sqlite import SqliteLightningStore

            logger.info("Using the durable SQLite store at %s", Path(sqlite_path).resolve())
            self._owned_sqlite_path = sqlite_path
            return SqliteLightningStore(sqlite_path)
        return build_component(  # type: ignore[return-value]
            spec,
            expected_type=LightningStore,
            spec_name="store",
            default_factory=lambda: InMemoryLightningStore(
                thread_safe=isinstance(self.strategy, ClientServerExecutionStrategy)
            ),
        )

    def _make_runner(self, spec: Any) -> Runner[Any]:
        from agentbolt.runner import LitAgentRunner, Runner

        defaults: Dict[str, Any] = {"tracer": self.tracer}
        if self.max_rollouts is not None:
            defaults["max_rollouts"] = self.max_rollouts
        return build_component(  # type: ignore[return-value]
            spec,
            expected_type=Runner,
            spec_name="runner",
            default_factory=lambda: LitAgentRunner(**defaults),
            optional_defaults=defaults,
        )

    def _make_llm_proxy(self, spec: Any) -> Optional[LLMProxy]:
        if spec is None:
            return None
        from agentbolt.llm_proxy import LLMProxy

        if isinstance(spec, dict):
            spec = {"store": self.store, **spec} if "type" in spec else {"type": LLMProxy, "store": self.store, **spec}
        return build_component(
            spec,
            expected_type=LLMProxy,
            spec_name="llm_proxy",
            allow_none=True,
            optional_defaults={"store": self.store},
        )

    # ------------------------------------------------------------------ running

    def fit(
        self,
        agent: LitAgent[Any],
        train_dataset: Optional[Union[Dataset[Any], str]] = None,
        *,
        val_dataset: Optional[Dataset[Any]] = None,
        progress: bool = True,
    ) -> None:
        """Train ``agent`` with the configured algorithm on ``train_dataset`` (validating on ``val_dataset``).

        Args:
            agent: The agent to train.
            train_dataset: Training tasks (a server URL selects the deprecated v0.1 protocol).
            val_dataset: Validation tasks.
            progress: Show one line per finished rollout (status, reward, running mean) and a summary on the
                console (stderr), as :meth:`dev` does; the trainer reads them from the store while the algorithm
                runs (a :class:`~agentbolt.algorithm.FastAlgorithm` reports its own). False shows nothing.
        """
        if isinstance(train_dataset, str):
            warnings.warn(
                "Passing a server URL to fit() uses the deprecated v0.1 protocol (fit_v0).",
                DeprecationWarning,
                stacklevel=2,
            )
            return self.fit_v0(agent, train_dataset, val_data=val_dataset)
        if self.algorithm is None and getattr(self.strategy, "role", "both") == "both":
            # A process of the runner (or algorithm) role alone has no algorithm by design; one running both would wait
            # for rollouts nobody queues, in silence.
            unused = " and ".join(
                name
                for name, dataset in (("train_dataset", train_dataset), ("val_dataset", val_dataset))
                if dataset is not None
            )
            logger.warning(
                "Trainer.fit() without an algorithm: %sthe runners serve the store's queue until the run is stopped "
                "(Ctrl-C). Give the Trainer an algorithm to train, or call Trainer.dev() for a dry run.",
                f"{unused} not used; " if unused else "",
            )
        with _console_progress(progress):
            self._run(agent, train_dataset, val_dataset, self.algorithm, follow_rollouts=progress)
        return None

    def dev(
        self,
        agent: LitAgent[Any],
        train_dataset: Optional[Dataset[Any]] = None,
        *,
        val_dataset: Optional[Dataset[Any]] = None,
        progress: bool = True,
    ) -> None:
        """Dry-run ``agent`` on the datasets with a fast algorithm (``Baseline`` by default), logging what happens.

        Args:
            agent: The agent to run.
            train_dataset: Tasks run in ``train`` mode.
            val_dataset: Tasks run in ``val`` mode.
            progress: Show one line per finished rollout (status, reward, mean reward) and a summary on the
                console (stderr), through the ``agentbolt.progress`` logger. When logging is already configured
                (a handler on that logger or an ancestor, e.g. ``logging.basicConfig`` or
                :func:`agentbolt.logging.setup`), the lines go through that configuration instead. False shows
                nothing on the console.

        Raises:
            TypeError: The configured algorithm is not a :class:`~agentbolt.algorithm.FastAlgorithm`.
        """
        from agentbolt.algorithm import Baseline, FastAlgorithm

        algorithm = self.algorithm if self.algorithm is not None else Baseline()
        if not isinstance(algorithm, FastAlgorithm):
            raise TypeError(
                f"Trainer.dev() needs a FastAlgorithm (such as Baseline); got {type(algorithm).__name__}. "
                "Use Trainer.fit() for training algorithms."
            )
        with _console_progress(progress):
            self._run(agent, train_dataset, val_dataset, algorithm)

    def _run(
        self,
        agent: LitAgent[Any],
        train_dataset: Optional[Dataset[Any]],
        val_dataset: Optional[Dataset[Any]],
        algorithm: Optional[Algorithm],
        follow_rollouts: bool = False,
    ) -> None:
        _check_run_inputs(agent, train_dataset, val_dataset)
        if algorithm is not None and algorithm._run_as_follower():
            return  # a data-parallel follower rank: the leader (rank 0) runs the store, the runners and the rollouts
        self._reopen_owned_store()
        try:
            self._execute(agent, train_dataset, val_dataset, algorithm, follow_rollouts)
        finally:
            self._close_owned_store()

    def _reopen_owned_store(self) -> None:
        if self._owned_sqlite_path is None or not self._owned_store_closed:
            return
        from agentbolt.store.sqlite import SqliteLightningStore

        self.store = SqliteLightningStore(self._owned_sqlite_path)
        self._owned_store_closed = False

    def _close_owned_store(self) -> None:
        """Close the SQLite store this trainer opened: until then its writes may sit in the ``-wal`` file."""
        if self._owned_sqlite_path is None or self._owned_store_closed:
            return
        self._owned_store_closed = True
        asyncio.run(self.store.close())

    def _execute(
        self,
        agent: LitAgent[Any],
        train_dataset: Optional[Dataset[Any]],
        val_dataset: Optional[Dataset[Any]],
        algorithm: Optional[Algorithm],
        follow_rollouts: bool,
    ) -> None:
        agent.set_trainer(self)
        algorithm_bundle = functools.partial(
            self._algorithm_bundle,
            train_dataset=train_dataset,
            val_dataset=val_dataset,
            algorithm=algorithm,
            follow_rollouts=follow_rollouts,
        )
        runner_bundle = self._runner_bundle(agent)
        self.strategy.execute(algorithm_bundle, runner_bundle, self.store)

    async def _algorithm_bundle(
        self,
        store: LightningStore,
        event: ExecutionEvent,
        train_dataset: Optional[Dataset[Any]],
        val_dataset: Optional[Dataset[Any]],
        algorithm: Optional[Algorithm],
        follow_rollouts: bool = False,
    ) -> None:
        if algorithm is None:
            while not event.is_set():
                await asyncio.sleep(0.1)
            return
        following = (
            _following_rollouts(store)
            if follow_rollouts and not algorithm.reports_progress
            else contextlib.nullcontext()
        )
        async with following:
            await self._run_algorithm(store, train_dataset, val_dataset, algorithm)

    async def _run_algorithm(
        self,
        store: LightningStore,
        train_dataset: Optional[Dataset[Any]],
        val_dataset: Optional[Dataset[Any]],
        algorithm: Algorithm,
    ) -> None:
        algorithm.set_trainer(self)
        algorithm.set_store(store)
        algorithm.set_adapter(self.adapter)
        if self.llm_proxy is not None:
            self.llm_proxy.set_store(store)
            algorithm.set_llm_proxy(self.llm_proxy)
        async with _resource_gateways(self.initial_resources, store) as resources:
            if resources is not None:
                algorithm.set_initial_resources(resources)
            result = algorithm._run_with_datasets(train_dataset, val_dataset)
            if algorithm.is_async():
                await result

    def _runner_bundle(self, agent: LitAgent[Any]) -> AgentRunnerBundle:
        return AgentRunnerBundle(self.runner, self.hooks, agent)
