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
import difflib
import importlib.util
import inspect
import json
import logging
import sys
from pathlib import Path
from typing import Any, Dict, List, Literal, Optional, Sequence, Tuple, Type

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


def _read_config(path: Path) -> Dict[str, Any]:
    """The mapping a config file holds.

    Raises:
        CliError: The file is missing, not UTF-8 YAML, or does not hold a mapping.
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
    return raw


def _validated_run_config(raw: Dict[str, Any]) -> Tuple[Optional[TrainRunConfig], List[str]]:
    """The run config ``raw`` describes, or None with one message for each field at fault, an algorithm name that
    is not registered among them."""
    mistakes = _algorithm_name_mistakes(raw)
    try:
        run = TrainRunConfig(**raw)
    except ValidationError as exc:
        return None, [*mistakes, *_field_errors(exc, TrainRunConfig)]
    return (None, mistakes) if mistakes else (run, [])


def _algorithm_name_mistakes(raw: Dict[str, Any]) -> List[str]:
    """The mistake of an ``algorithm`` that names no registered algorithm (one that is not a name at all is the
    run config's own mistake); its options, if any, cannot be checked without it."""
    from agentbolt.algorithm.registry import UnknownAlgorithmError, check_algorithm_name

    name = raw.get("algorithm")
    if not isinstance(name, str):
        return []
    try:
        check_algorithm_name(name)
    except UnknownAlgorithmError as exc:
        unchecked = " (its options are checked once it names one of these)" if raw.get("options") else ""
        return [f"algorithm: {exc}{unchecked}"]
    return []


def _config_error(path: Path, file_mistakes: List[str], option_mistakes: Sequence[str] = ()) -> CliError:
    """One line for all the mistakes found in a config file.

    ``file_mistakes`` concern the file's own keys (the message names the file), ``option_mistakes`` the algorithm's
    options; a single option mistake is reported alone, as ``options.<key>: ...``.
    """
    mistakes = [*file_mistakes, *option_mistakes]
    if len(mistakes) == 1:
        return CliError(f"{path}: {mistakes[0]}" if file_mistakes else mistakes[0])
    listed = "; ".join(f"({number}) {mistake}" for number, mistake in enumerate(mistakes, start=1))
    return CliError(f"{path}: {len(mistakes)} mistakes: {listed}")


def load_run_config(path: Path) -> TrainRunConfig:
    """Read and validate a run config file.

    Raises:
        CliError: The file is missing, not YAML, or not a valid run config (the message names every field at fault,
            an algorithm name that is not registered among them).
    """
    run, mistakes = _validated_run_config(_read_config(path))
    if run is None:
        raise _config_error(path, mistakes)
    return run


def _field_path(loc: Tuple[Any, ...]) -> Tuple[Any, ...]:
    """``loc`` without the union-member tags pydantic adds (``'list[str]'``, ``"literal['all-linear']"``)."""
    return tuple(part for part in loc if isinstance(part, int) or str(part).isidentifier())


def _names_at(model: Optional[Type[BaseModel]], loc: Tuple[Any, ...]) -> List[str]:
    """The field names valid where ``loc``'s last part was given (``loc`` walks nested models of ``model``)."""
    for part in loc[:-1]:
        field = model.model_fields.get(str(part)) if model is not None else None
        annotation = field.annotation if field is not None else None
        model = annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None
    return list(model.model_fields) if model is not None else []


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:77]}..."


def _field_errors(
    exc: ValidationError, model: Optional[Type[BaseModel]] = None, prefix: str = "", owner: str = ""
) -> List[str]:
    """One message for each field ``exc`` refuses, in the order pydantic reports them:
    ``where: what is expected, got the value given``.

    ``model`` is the validated class, whose field names are suggested for an unknown key (a misspelt one);
    ``prefix`` is prepended to the field's path (``options``); ``owner`` names whose option an unknown key is not.
    The messages of the config's own validators name the value themselves.
    """
    by_field: Dict[Tuple[Any, ...], List[Any]] = {}
    for error in exc.errors():
        by_field.setdefault(_field_path(tuple(error["loc"])), []).append(error)
    return [_field_error(loc, same, model, prefix, owner) for loc, same in by_field.items()]


def _field_error(
    loc: Tuple[Any, ...], same: List[Any], model: Optional[Type[BaseModel]], prefix: str, owner: str
) -> str:
    """The message for the field at ``loc``, which the errors ``same`` refuse."""
    where = ".".join(str(part) for part in (prefix, *loc) if part != "")
    head = f"{where}: " if where else ""
    first = same[0]
    if first["type"] == "extra_forbidden":
        key = str(loc[-1]) if loc else ""
        close = difflib.get_close_matches(key, _names_at(model, loc), n=1, cutoff=0.75)
        what = f"not an option of {owner}" if owner else "unknown key"
        hint = f"; did you mean {close[0]}?" if close else ""
        return f"{head}{first['msg']} ({what}{hint})"
    message = " or ".join(dict.fromkeys(str(e["msg"]).removeprefix("Value error, ") for e in same))
    if first["type"] in ("missing", "value_error", "assertion_error") or not loc:
        return f"{head}{message}"
    shown = _shown(first.get("input"))
    got = f": {shown}" if ", got " in message else f", got {shown}"
    return f"{head}{message}{got}"


def _import(reference: str, what: str) -> Any:
    try:
        return import_reference(reference, what)
    except ImportReferenceError as exc:
        raise CliError(str(exc)) from None
    except Exception as exc:  # the module itself fails: a SyntaxError, an exception at import time
        module = reference.partition(":")[0]
        raise CliError(f"{what} {reference!r}: importing {module} raised {_raised(exc)}") from None


def _raised(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".replace("\n", " ")


def _called(function: Any, reference: str, what: str) -> Any:
    """``function()``, whose failure is the config's error (a factory of the agent or of the tasks)."""
    try:
        return function()
    except Exception as exc:
        raise CliError(f"{what} {reference!r}: calling it raised {_raised(exc)}") from None


def _required_parameters(function: Any) -> List[str]:
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):  # a callable without a signature (a builtin): called without arguments
        return []
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return [p.name for p in parameters if p.default is p.empty and p.kind in kinds]


def _agent(reference: str) -> Any:
    from agentbolt.litagent import LitAgent

    agent = _import(reference, "agent")
    if isinstance(agent, LitAgent):
        return agent
    expected = "a LitAgent, an @agl.rollout function or a factory of one"
    if callable(agent) and not inspect.iscoroutinefunction(agent):
        needed = _required_parameters(agent)
        if needed:
            raise CliError(
                f"agent {reference!r} needs arguments ({', '.join(needed)}); give {expected} that takes none"
            )
        agent = _called(agent, reference, "agent")
    if not isinstance(agent, LitAgent):
        raise CliError(f"agent {reference!r} is not {expected}, got {type(agent).__name__}")
    return agent


def _dataset(reference: Optional[str], base: Path, what: str) -> Optional[List[Any]]:
    if reference is None:
        return None
    candidate = (base / reference).expanduser()
    if candidate.is_dir():
        raise CliError(f"data.{what}: {candidate} is a directory; give a .jsonl or .json file, or 'module:attribute'")
    if ":" not in reference and not candidate.exists():
        raise CliError(f"data.{what}: {candidate}: no such file (or write 'module:attribute' for tasks made in Python)")
    source: Any = candidate
    if candidate.suffix in (".jsonl", ".json") or candidate.is_file():
        if not candidate.is_file():
            raise CliError(f"data.{what}: {candidate}: no such file")
        try:
            text = candidate.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            raise CliError(f"data.{what}: {candidate} is not UTF-8 text") from None
        items = _json_tasks(text, candidate, what)
    else:
        source = reference
        items = _import(reference, f"data.{what}")
        if callable(items):
            if _required_parameters(items):
                raise CliError(f"data.{what}: {reference} is a function that needs arguments; give one that takes none")
            items = _called(items, reference, f"data.{what}")
    if not isinstance(items, (list, tuple)):
        raise CliError(f"data.{what}: expected a list of tasks, got {type(items).__name__}")
    if not items:
        raise CliError(f"data.{what}: {source} holds no tasks")
    return list(items)


def _json_tasks(text: str, path: Path, what: str) -> Any:
    """The tasks of a ``.json`` file (one JSON value) or of a JSON-lines file (one task a line, blank lines skipped).

    Raises:
        CliError: Not valid JSON; the message gives the line of the file at fault.
    """
    if path.suffix == ".json":
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise CliError(f"data.{what}: {path} is not valid JSON ({exc.msg}, line {exc.lineno})") from None
    items = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            items.append(json.loads(line))
        except json.JSONDecodeError as exc:
            raise CliError(f"data.{what}: {path} is not valid JSON lines ({exc.msg}, line {number})") from None
    return items


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
        help="Continue from the latest checkpoint in options.checkpoint_dir, or start a new run (default: the "
        "config's options.resume, else the algorithm's default: resume for GRPO and SFT).",
    ),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Show library logs (INFO)."),
) -> int:
    """Build the algorithm, agent, data and runners that CONFIG describes and train."""
    from agentbolt.algorithm.registry import build_algorithm

    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )
    raw = _read_config(config)
    run, mistakes = _validated_run_config(raw)
    base = config.resolve().parent
    # The options are checked even when other sections are at fault, so that one run reports every mistake.
    options = dict(raw["options"]) if isinstance(raw.get("options"), dict) else {}
    if resume is not None:
        options["resume"] = resume
    for key in ("checkpoint_dir", "log_dir", "adapter_dir", "init_adapter"):
        if isinstance(options.get(key), str):
            options[key] = str((base / options[key]).expanduser())
    model = options.get("model")
    if isinstance(model, str) and model and (base / model).expanduser().is_dir():  # a model directory near the file
        options["model"] = str((base / model).expanduser())
    algorithm_class = _algorithm_class(raw["algorithm"]) if isinstance(raw.get("algorithm"), str) else None
    options_given = isinstance(raw.get("options", {}), dict)  # else the file's own check names the section
    option_mistakes = (
        _option_mistakes(algorithm_class, options) if algorithm_class is not None and options_given else []
    )
    if run is None or option_mistakes:
        raise _config_error(config, mistakes, option_mistakes)
    if resume and not options.get("checkpoint_dir"):
        raise CliError("--resume needs options.checkpoint_dir in the config")
    _check_address(run.trainer)
    try:
        algorithm = build_algorithm(run.algorithm, options)  # its name is registered: the run config checked it
    except ValidationError as exc:
        raise CliError("; ".join(_field_errors(exc, prefix="options"))) from None
    except (TypeError, ValueError, ImportError) as exc:
        raise CliError(f"algorithm {run.algorithm!r}: {exc}") from None
    agent = _agent(run.agent)
    train = _dataset(run.data.train, base, "train")
    val = _dataset(run.data.val, base, "val")
    _check_before_start(algorithm, train)
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


def _algorithm_class(name: str) -> Optional[Type[Any]]:
    """The class registered as ``name`` when it trains a model's weights (GRPO, SFT), else None.

    None too when the name is unknown (the run config reports it) or its module does not import (building the
    algorithm reports that).
    """
    from agentbolt.algorithm.finetuning.algorithm import FinetuningAlgorithm
    from agentbolt.algorithm.registry import ALGORITHMS

    factory = ALGORITHMS.get(name)
    if isinstance(factory, str):
        try:
            factory = import_reference(factory, f"algorithm {name!r}")
        except Exception:
            return None
    if isinstance(factory, type) and issubclass(factory, FinetuningAlgorithm):
        return factory
    return None


def _option_mistakes(algorithm_class: Type[Any], options: Dict[str, Any]) -> List[str]:
    """Validate ``options`` as the fields of the algorithm's config, as a config file can only give those.

    The constructor's other arguments (a model object and its ``tokenizer``, an ``adapter``, a whole ``config``)
    are Python objects: a config file that names them is refused rather than half used.

    Returns:
        One message for each option at fault, its value and what is valid (a close name for a misspelt key).
    """
    config_class = algorithm_class.config_class
    try:
        config_class.model_validate(options)
    except ValidationError as exc:
        return _field_errors(exc, config_class, "options", algorithm_class.__name__)
    return []


def _check_metrics_sinks(config: Any) -> None:
    """Refuse a metrics sink whose package is not installed (it would fail after the model loads).

    Raises:
        CliError: ``tensorboard`` without the ``tensorboard`` package, ``wandb_project`` without ``wandb``.
    """
    if config.tensorboard and importlib.util.find_spec("tensorboard") is None:
        raise CliError("options.tensorboard: TensorBoard logging needs: pip install 'agentbolt[tensorboard]'")
    if config.wandb_project is not None and importlib.util.find_spec("wandb") is None:
        raise CliError(
            f"options.wandb_project: {config.wandb_project!r} needs Weights & Biases: pip install 'agentbolt[wandb]'"
        )


def _check_before_start(algorithm: Any, train: Optional[List[Any]]) -> None:
    """Refuse what would otherwise fail only once the runners run: a model that cannot be found, no training tasks,
    a device this machine does not have, a ``log_dir`` holding another run's metrics or that cannot be written, a
    ``checkpoint_dir`` that cannot hold checkpoints, an ``init_adapter`` that is not one, a metrics sink that is not
    installed, options the algorithm refuses at its start.

    Only an algorithm that trains a model's weights (GRPO, SFT) has these options; others pass unchecked.

    Raises:
        CliError: The option at fault and why (exit code 2).
    """
    from agentbolt.algorithm.finetuning.algorithm import (
        FinetuningAlgorithm,
        check_run_directories,
        check_writable_dir,
    )
    from agentbolt.algorithm.finetuning.trainer import CheckpointError, check_init_adapter, resolve_device
    from agentbolt.models import DEFAULT_MODEL, ModelNotAvailableError, resolve_model

    if not isinstance(algorithm, FinetuningAlgorithm):
        return
    config = algorithm.config
    if train is None and config.max_steps > 0:
        raise CliError(f"data.train: {algorithm.title} needs training tasks (or options.max_steps: 0 to only validate)")
    try:
        algorithm._check_run()  # the hook every run calls first: options that cannot run
    except ValueError as exc:  # an ImportReferenceError too (a student_prompt that does not import)
        raise CliError(f"options: {exc}") from None
    try:
        resolve_device(config.device)
    except ValueError as exc:
        raise CliError(f"options.device: {exc}") from None
    try:
        check_init_adapter(config)
    except (OSError, ValueError) as exc:
        raise CliError(f"options.{exc}") from None
    _check_metrics_sinks(config)
    try:
        check_writable_dir(config.adapter_dir, "adapter_dir")
    except ValueError as exc:
        raise CliError(f"options.{exc}") from None
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
        message = str(exc) if str(exc).startswith("log_dir:") else f"log_dir: {exc}"
        raise CliError(f"options.{message}".replace("(resume=True)", "(--resume)")) from None


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


def _check_address(config: RunnerConfig) -> None:
    """Refuse a store-server address nothing can listen on, before anything is built or written.

    Raises:
        CliError: ``trainer.port`` is taken, or ``trainer.host`` is not an address of this machine nor a name.
    """
    from agentbolt.utils.server_launcher import bind_socket

    if config.strategy != "cs":
        return
    if config.port is not None:
        check_port_free(config.host, config.port, "trainer.port")
        return
    try:
        bind_socket(config.host, 0).close()
    except OSError as exc:
        raise CliError(f"trainer.host: cannot listen on {config.host!r}: {exc.strerror or exc}") from None


def _fit(algorithm: Any, agent: Any, train: Any, val: Any, config: RunnerConfig, base: Path) -> bool:
    """Run ``algorithm`` on ``agent`` with the runners ``config`` describes; True when Ctrl-C stopped it.

    The store (``trainer.store``) is closed when the run ends, however it ends.
    """
    from agentbolt.serving.transformers_engine import configure_openmp

    configure_openmp()
    import agentbolt as agl
    from agentbolt.runner.agent import TRAINING_POLL_INTERVAL
    from agentbolt.serving.server import find_free_port

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
