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

import asyncio
import inspect
import json
import logging
import sys
from pathlib import Path
from typing import Any, Dict, List, Literal, Optional, Tuple

import typer
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agentbolt.cli.errors import CliError, check_port_free
from agentbolt.cli.invocation import run_command
from agentbolt.utils.imports import ImportReferenceError, import_reference

__all__ = ["HELP", "TrainRunConfig", "load_run_config", "main", "train_command"]

logger = logging.getLogger(__name__)

HELP = "Train an agent with GRPO, SFT or another registered algorithm, as one YAML config file describes."

INTERRUPTED_EXIT_CODE = 130
"""Exit code of a run stopped by Ctrl-C (SIGINT) or SIGTERM, as shells report a command killed by SIGINT."""


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
    _check_before_start(algorithm)
    interrupted = _fit(algorithm, agent, train, val, run.trainer, base)
    if interrupted:
        print(f"agentbolt train: {_interruption(algorithm, config)}", file=sys.stderr)
        return INTERRUPTED_EXIT_CODE
    history = getattr(algorithm, "history", None)
    if history:
        last = {k: v for k, v in history[-1].items() if k.startswith(("val/", "train/"))}
        print(f"agentbolt train: {run.algorithm} finished: {json.dumps(last)}")
    else:
        print(f"agentbolt train: {run.algorithm} finished")
    return 0


def _check_before_start(algorithm: Any) -> None:
    """Refuse what would otherwise fail only once the runners run: a model that cannot be found, a ``log_dir``
    holding another run's metrics, a ``checkpoint_dir`` that cannot hold checkpoints, options the algorithm
    refuses at its start.

    Only an algorithm that trains a model's weights (GRPO, SFT) has these options; others pass unchecked.

    Raises:
        CliError: The option at fault and why (exit code 2).
    """
    from agentbolt.algorithm.finetuning.algorithm import FinetuningAlgorithm, check_run_directories
    from agentbolt.algorithm.finetuning.trainer import CheckpointError
    from agentbolt.models import DEFAULT_MODEL, ModelNotAvailableError, resolve_model

    if not isinstance(algorithm, FinetuningAlgorithm):
        return
    config = algorithm.config
    try:
        algorithm._check_run()  # the hook every run calls first: options that cannot run
    except ValueError as exc:  # an ImportReferenceError too (a student_prompt that does not import)
        raise CliError(f"options: {exc}") from None
    name = config.model or DEFAULT_MODEL
    try:
        resolved = resolve_model(name)
    except ModelNotAvailableError as exc:
        raise CliError(f"options.model: {exc}") from None
    if resolved.source == "gguf":
        raise CliError(
            f"options.model: {name!r} is a GGUF file; {algorithm.title} trains a Hugging Face model directory"
        )
    try:
        check_run_directories(config.checkpoint_dir, config.log_dir, resume=config.resume)
    except CheckpointError as exc:
        raise CliError(f"options.checkpoint_dir: {exc}".replace("(resume=True)", "(--resume)")) from None
    except ValueError as exc:
        raise CliError(f"options.log_dir: {exc}".replace("(resume=True)", "(--resume)")) from None


def _progress(algorithm: Any) -> Optional[Tuple[int, int, Optional[Path]]]:
    """``(steps completed, max_steps, latest checkpoint)`` of a training algorithm's run; None for other algorithms.

    A step is completed once its metrics are recorded (``algorithm.history``) or a checkpoint holds it (a resumed
    run's earlier steps, a run already complete).
    """
    from agentbolt.algorithm.finetuning.trainer import checkpoint_state, latest_checkpoint

    options = getattr(algorithm, "config", None)
    total = getattr(options, "max_steps", None)
    if not isinstance(total, int):
        return None
    recorded = [
        int(r["step"]) for r in getattr(algorithm, "history", None) or [] if isinstance(r.get("step"), (int, float))
    ]
    checkpoint_dir = getattr(options, "checkpoint_dir", None)
    checkpoint = latest_checkpoint(checkpoint_dir) if checkpoint_dir else None
    saved = int(checkpoint_state(checkpoint)["global_step"]) if checkpoint is not None else 0
    return max([0, saved, *recorded]), total, checkpoint


def _interruption(algorithm: Any, config_path: Path) -> str:
    """Where Ctrl-C stopped the run and how to continue it, for the one line ``train`` prints."""
    from agentbolt.algorithm.finetuning.trainer import interrupted_run
    from agentbolt.algorithm.grpo.metrics import check_log_dir_unused

    progress = _progress(algorithm)
    if progress is None:
        return "interrupted"
    done, total, checkpoint = progress
    where = f"interrupted at step {done}/{total}"
    if checkpoint is not None:
        return f"{where}; resume with: agentbolt train {config_path} --resume (from {checkpoint})"
    options = algorithm.config
    if interrupted_run(options.checkpoint_dir, options.log_dir):
        return (
            f"{where}; no checkpoint was written to {options.checkpoint_dir} yet: agentbolt train {config_path} "
            "--resume starts this run again from step 0"
        )
    restart = ""
    try:
        check_log_dir_unused(options.log_dir)
    except ValueError:  # a new run would refuse the log this one started
        restart = f"; to start over, use a new options.log_dir or delete {Path(options.log_dir) / 'metrics.jsonl'}"
    if not options.checkpoint_dir:
        return f"{where}; nothing to resume from: options.checkpoint_dir is not set{restart}"
    return f"{where}; nothing to resume from: no checkpoint was written to {options.checkpoint_dir} yet{restart}"


def _interrupted(strategy: Any, algorithm: Any) -> bool:
    """Whether Ctrl-C stopped the run: execution strategies swallow it (the contract's behaviour) and return.

    The client-server strategy records it; for the others, a training algorithm whose run ended before its last
    step without raising was stopped by it.
    """
    recorded = getattr(strategy, "interrupted", None)
    if isinstance(recorded, bool):
        return recorded
    progress = _progress(algorithm)
    return progress is not None and progress[0] < progress[1]


def _close(store: Any) -> None:
    """Close the run's store: a SQLite store moves its ``-wal`` journal into the database file and removes it."""
    close = getattr(store, "close", None)
    if close is None:
        return
    try:
        asyncio.run(close())
    except Exception as exc:  # the run's outcome matters more than a failing close
        logger.warning("Could not close the store %s: %s", getattr(store, "path", store), exc)


def _fit(algorithm: Any, agent: Any, train: Any, val: Any, config: RunnerConfig, base: Path) -> bool:
    """Run ``algorithm`` on ``agent`` with the runners ``config`` describes; True when Ctrl-C stopped it.

    The store (``trainer.store``) is closed when the run ends, however it ends.
    """
    from agentbolt.serving.transformers_engine import configure_openmp

    configure_openmp()
    import agentbolt as agl
    from agentbolt.runner.agent import TRAINING_POLL_INTERVAL
    from agentbolt.serving.server import find_free_port

    if config.strategy == "cs" and config.port is not None:
        check_port_free(config.host, config.port, "trainer.port")
    store = _store(config, base)
    try:
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
    finally:
        _close(store)
    return _interrupted(strategy, algorithm)


def main(argv: Optional[List[str]] = None) -> int:
    """``agentbolt train`` with ``argv`` (default ``sys.argv[1:]``) as its arguments; returns the exit code."""
    return run_command(train_command, "train", HELP, argv)
