"""``agentbolt train CONFIG.yaml``: run a training algorithm (GRPO, SFT, ...) on an agent from one config file.

The file names the algorithm (a name of :mod:`agentbolt.algorithm.registry`) and its options, the agent, the
data and how the runners run::

    algorithm: sft                          # grpo, sft, or any registered name
    options:                                # keyword arguments of the algorithm
      model: smollm2-135m-instruct
      max_steps: 4
      checkpoint_dir: runs/sft/checkpoints  # --resume continues from the latest checkpoint here
    agent: examples.sft.agent:math_agent    # module:attribute: a LitAgent, a @rollout function, or a factory
    data:
      train: data/train.jsonl               # JSONL of tasks (relative to this file), or module:attribute
      val: data/val.jsonl
    trainer:
      n_runners: 4                          # runner processes
      store: runs/sft/store.db              # SQLite store file (null: in memory)

Module paths are imported with the current directory on ``sys.path``; file paths are relative to the config file.
"""

from __future__ import annotations

import inspect
import json
import logging
from pathlib import Path
from typing import Any, Dict, List, Literal, Optional

import typer
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agentbolt.cli.errors import CliError, check_port_free
from agentbolt.cli.invocation import run_command
from agentbolt.utils.imports import ImportReferenceError, import_reference

__all__ = ["HELP", "TrainRunConfig", "load_run_config", "main", "train_command"]

logger = logging.getLogger(__name__)

HELP = "Train an agent with GRPO, SFT or another registered algorithm, as one YAML config file describes."


class DataConfig(BaseModel):
    """Where the tasks come from."""

    model_config = ConfigDict(extra="forbid")

    train: Optional[str] = Field(default=None, description="JSONL file of tasks, or module:attribute.")
    val: Optional[str] = Field(default=None, description="JSONL file of held-out tasks, or module:attribute.")


class RunnerConfig(BaseModel):
    """How rollouts run."""

    model_config = ConfigDict(extra="forbid")

    n_runners: int = Field(default=1, ge=1, description="Runners executing rollouts concurrently.")
    strategy: Literal["cs", "shm"] = Field(
        default="cs", description="'cs': runner processes around a store server; 'shm': runner threads."
    )
    store: Optional[str] = Field(default=None, description="SQLite store file (None: in memory).")
    host: str = Field(default="127.0.0.1", description="Interface of the store server (cs).")
    port: Optional[int] = Field(default=None, ge=1, le=65535, description="Port of the store server (None: free).")
    poll_interval: Optional[float] = Field(
        default=None,
        gt=0,
        description="Seconds between an idle runner's polls for work (None: agentbolt.runner.agent.TRAINING_POLL_INTERVAL).",
    )


class TrainRunConfig(BaseModel):
    """One training run: algorithm, options, agent, data and runners."""

    model_config = ConfigDict(extra="forbid")

    algorithm: str = Field(description="Registered algorithm name (grpo, sft, ...).")
    options: Dict[str, Any] = Field(default_factory=dict, description="Keyword arguments of the algorithm.")
    agent: str = Field(description="module:attribute of the agent (LitAgent, @rollout function or factory).")
    data: DataConfig = Field(default_factory=DataConfig)
    trainer: RunnerConfig = Field(default_factory=RunnerConfig)


def load_run_config(path: Path) -> TrainRunConfig:
    """Read and validate a run config file.

    Raises:
        CliError: The file is missing, not YAML, or not a valid run config (the message names the field).
    """
    import yaml  # type: ignore[import-untyped]

    if path.is_dir():
        raise CliError(f"{path} is a directory, not a config file")
    if not path.is_file():
        raise CliError(f"{path}: no such config file")
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise CliError(f"{path} is not valid YAML: {exc}".replace("\n", " ")) from None
    except UnicodeDecodeError:
        raise CliError(f"{path} is not UTF-8 text") from None
    if not isinstance(raw, dict):
        raise CliError(f"{path}: expected a mapping with 'algorithm', 'agent', ... at the top")
    try:
        return TrainRunConfig(**raw)
    except ValidationError as exc:
        raise CliError(f"{path}: {_first_error(exc)}") from None


def _first_error(exc: ValidationError) -> str:
    error = exc.errors()[0]
    where = ".".join(str(part) for part in error["loc"]) or "config"
    more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    return f"{where}: {error['msg']}{more}"


def _import(reference: str, what: str) -> Any:
    try:
        return import_reference(reference, what)
    except ImportReferenceError as exc:
        raise CliError(str(exc)) from None


def _agent(reference: str) -> Any:
    from agentbolt.litagent import LitAgent

    agent = _import(reference, "agent")
    if isinstance(agent, LitAgent):
        return agent
    if callable(agent) and not inspect.iscoroutinefunction(agent) and not inspect.signature(agent).parameters:
        agent = agent()
    if not isinstance(agent, LitAgent):
        raise CliError(f"agent {reference!r} is not a LitAgent, an @agl.rollout function or a factory of one")
    return agent


def _dataset(reference: Optional[str], base: Path, what: str) -> Optional[List[Any]]:
    if reference is None:
        return None
    candidate = (base / reference).expanduser()
    if candidate.is_dir():
        raise CliError(f"data.{what}: {candidate} is a directory; give a .jsonl or .json file, or 'module:attribute'")
    if ":" not in reference and not candidate.exists():
        raise CliError(f"data.{what}: {candidate}: no such file (or write 'module:attribute' for tasks made in Python)")
    if candidate.suffix in (".jsonl", ".json") or candidate.is_file():
        if not candidate.is_file():
            raise CliError(f"data.{what}: {candidate}: no such file")
        try:
            if candidate.suffix == ".json":
                items = json.loads(candidate.read_text(encoding="utf-8"))
            else:
                lines = candidate.read_text(encoding="utf-8").splitlines()
                items = [json.loads(line) for line in lines if line.strip()]
        except json.JSONDecodeError as exc:
            raise CliError(f"data.{what}: {candidate} is not valid JSON ({exc.msg}, line {exc.lineno})") from None
        except UnicodeDecodeError:
            raise CliError(f"data.{what}: {candidate} is not UTF-8 text") from None
    else:
        items = _import(reference, f"data.{what}")
        if callable(items):
            if any(
                p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
                for p in inspect.signature(items).parameters.values()
            ):
                raise CliError(f"data.{what}: {reference} is a function that needs arguments; give one that takes none")
            items = items()
    if not isinstance(items, (list, tuple)):
        raise CliError(f"data.{what}: expected a list of tasks, got {type(items).__name__}")
    return list(items)


def _store(config: RunnerConfig, base: Path) -> Any:
    if config.store is None:
        from agentbolt.store.memory import InMemoryLightningStore

        return InMemoryLightningStore(thread_safe=True)
    from agentbolt.store.sqlite import SqliteLightningStore

    path = (base / config.store).expanduser()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        return SqliteLightningStore(path)
    except Exception as exc:
        raise CliError(f"trainer.store: cannot open {path}: {exc}") from None


def train_command(
    config: Path = typer.Argument(..., help="The run's YAML config file."),
    resume: Optional[bool] = typer.Option(
        None,
        "--resume/--no-resume",
        help="Continue from the latest checkpoint in options.checkpoint_dir (default: the algorithm's own default).",
    ),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Show library logs (INFO)."),
) -> int:
    """Build the algorithm, agent, data and runners that CONFIG describes and train."""
    from agentbolt.algorithm.registry import UnknownAlgorithmError, build_algorithm

    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )
    run = load_run_config(config)
    base = config.resolve().parent
    options = dict(run.options)
    if resume is not None:
        if resume and not options.get("checkpoint_dir"):
            raise CliError("--resume needs options.checkpoint_dir in the config")
        options["resume"] = resume
    for key in ("checkpoint_dir", "log_dir", "adapter_dir"):
        if isinstance(options.get(key), str):
            options[key] = str((base / options[key]).expanduser())
    try:
        algorithm = build_algorithm(run.algorithm, options)
    except UnknownAlgorithmError as exc:
        raise CliError(f"algorithm: {exc}") from None
    except ValidationError as exc:
        raise CliError(f"options.{_first_error(exc)}") from None
    except (TypeError, ValueError, ImportError) as exc:
        raise CliError(f"algorithm {run.algorithm!r}: {exc}") from None
    agent = _agent(run.agent)
    train = _dataset(run.data.train, base, "train")
    val = _dataset(run.data.val, base, "val")
    _fit(algorithm, agent, train, val, run.trainer, base)
    history = getattr(algorithm, "history", None)
    if history:
        last = {k: v for k, v in history[-1].items() if k.startswith(("val/", "train/"))}
        print(f"agentbolt train: {run.algorithm} finished: {json.dumps(last)}")
    else:
        print(f"agentbolt train: {run.algorithm} finished")
    return 0


def _fit(algorithm: Any, agent: Any, train: Any, val: Any, config: RunnerConfig, base: Path) -> None:
    from agentbolt.serving.transformers_engine import configure_openmp

    configure_openmp()
    import agentbolt as agl
    from agentbolt.runner.agent import TRAINING_POLL_INTERVAL
    from agentbolt.serving.server import find_free_port

    if config.strategy == "cs" and config.port is not None:
        check_port_free(config.host, config.port, "trainer.port")
    store = _store(config, base)
    tracer = agl.OtelTracer()
    if config.strategy == "cs":
        strategy: Any = agl.ClientServerExecutionStrategy(
            n_runners=config.n_runners,
            server_host=config.host,
            server_port=config.port or find_free_port(config.host),
        )
    else:
        strategy = agl.SharedMemoryExecutionStrategy(n_runners=config.n_runners, main_thread="algorithm")
    trainer = agl.Trainer(
        algorithm=algorithm,
        store=store,
        tracer=tracer,
        strategy=strategy,
        runner=agl.LitAgentRunner(tracer=tracer, poll_interval=config.poll_interval or TRAINING_POLL_INTERVAL),
    )
    trainer.fit(agent, train_dataset=train, val_dataset=val)


def main(argv: Optional[List[str]] = None) -> int:
    """``agentbolt train`` with ``argv`` (default ``sys.argv[1:]``) as its arguments; returns the exit code."""
    return run_command(train_command, "train", HELP, argv)
