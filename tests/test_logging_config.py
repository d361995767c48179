"""Logging setup and the lightning_cli configurator."""

from __future__ import annotations

import argparse
import logging
import sys
import warnings
from pathlib import Path
from typing import Any, Iterator, List, Optional

import pytest

from agentbolt import config
from agentbolt import logging as agl_logging
from agentbolt.config import lightning_cli


@pytest.fixture(autouse=True)
def restore_loggers() -> Iterator[None]:
    """Put the loggers touched by these tests back as they were (other tests rely on propagation)."""
    names = ["agentbolt", "agentbolt.sub", "other.lib", "file.only"]
    saved = {}
    for name in names:
        logger = logging.getLogger(name)
        saved[name] = (list(logger.handlers), logger.level, logger.propagate)
    yield
    for name, (handlers, level, propagate) in saved.items():
        logger = logging.getLogger(name)
        for handler in logger.handlers:
            if handler not in handlers:
                handler.close()
        logger.handlers = handlers
        logger.setLevel(level)
        logger.propagate = propagate
    logging.captureWarnings(False)


def test_level_values() -> None:
    assert agl_logging._to_level_value("debug") == logging.DEBUG
    assert agl_logging._to_level_value(15) == 15
    with pytest.raises(ValueError, match="Unknown logging level"):
        agl_logging._to_level_value("loud")


def test_setup_module_plain_and_rich(capsys: pytest.CaptureFixture[str]) -> None:
    logger = agl_logging.setup_module("WARNING", name="agentbolt.sub", color=False)
    assert logger.level == logging.WARNING and not logger.propagate
    (handler,) = logger.handlers
    assert type(handler) is logging.StreamHandler and handler.level == logging.WARNING
    logger.warning("plain message")
    err = capsys.readouterr().err
    assert "[WARNING] (Process-" in err and "agentbolt.sub)   plain message" in err
    rich_logger = agl_logging.setup_module("INFO", name="agentbolt.sub", color={"show_path": False})
    (rich_handler,) = rich_logger.handlers
    assert type(rich_handler).__name__ == "RichHandler"
    silent = agl_logging.setup_module("INFO", name="agentbolt.sub", console=False)
    assert silent.handlers == []


def test_setup_files_submodules_and_apply_to(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    log_file = tmp_path / "logs" / "agentbolt.log"
    other_file = tmp_path / "other.log"
    extra = logging.NullHandler()
    agl_logging.setup(
        "INFO",
        color=False,
        files=str(log_file),
        submodule_levels={"agentbolt.sub": "ERROR"},
        extra_handlers=[extra],
        apply_to=["other.lib"],
        capture_warnings=True,
    )
    base = logging.getLogger("agentbolt")
    assert extra in base.handlers
    logging.getLogger("agentbolt.x").info("to the file")
    logging.getLogger("agentbolt.sub").warning("filtered out")
    assert "to the file" in log_file.read_text(encoding="utf-8")
    assert "filtered out" not in log_file.read_text(encoding="utf-8")
    other = logging.getLogger("other.lib")
    assert other.handlers == base.handlers and not other.propagate and other.level == logging.INFO
    # Setting up twice does not duplicate the file handler.
    agl_logging.setup("INFO", color=False, files=str(log_file), extra_handlers=[extra])
    agl_logging.setup("INFO", color=False, files={"file.only": str(other_file)})
    logging.getLogger("file.only").warning("per-logger file")
    assert "per-logger file" in other_file.read_text(encoding="utf-8")


def test_verbose_submodule_warns(capsys: pytest.CaptureFixture[str]) -> None:
    agl_logging.setup("WARNING", color=False, submodule_levels={"agentbolt.sub": "DEBUG"})
    assert "more verbose" in capsys.readouterr().err


def test_configure_logger_is_deprecated() -> None:
    with pytest.warns(DeprecationWarning):
        logger = agl_logging.configure_logger(logging.DEBUG, name="agentbolt.sub")
    assert logger.level == logging.DEBUG


# ---- lightning_cli ----


class Trainer:
    def __init__(
        self,
        n_workers: int = 1,
        lr: float = 0.1,
        name: Optional[str] = None,
        tags: Optional[List[str]] = None,
        verbose: bool = False,
    ) -> None:
        self.n_workers, self.lr, self.name, self.tags, self.verbose = n_workers, lr, name, tags, verbose


class Agent:
    def __init__(self, model: str, temperature: Optional[float] = 0.7, **extra: Any) -> None:
        self.model, self.temperature = model, temperature


class Broken:
    def __init__(self, size: int = 1) -> None:
        if size < 0:
            raise ValueError("size must be non-negative")


def test_lightning_cli_builds_instances(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        sys,
        "argv",
        [
            "prog",
            "--trainer.n-workers",
            "4",
            "--trainer.tags",
            "a",
            "b",
            "--trainer.verbose",
            "yes",
            "--agent.model",
            "gpt",
            "--agent.temperature",
            "null",
        ],
    )
    trainer, agent = lightning_cli(Trainer, Agent)
    assert (trainer.n_workers, trainer.lr, trainer.name, trainer.tags, trainer.verbose) == (
        4,
        0.1,
        None,
        ["a", "b"],
        True,
    )
    assert (agent.model, agent.temperature) == ("gpt", None)
    monkeypatch.setattr(sys, "argv", ["prog"])
    assert isinstance(lightning_cli(Trainer), Trainer)
    assert lightning_cli() == ()


def test_lightning_cli_errors(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(sys, "argv", ["prog"])
    with pytest.raises(SystemExit) as missing:
        lightning_cli(Agent)
    assert missing.value.code == 2
    assert "--agent.model" in capsys.readouterr().err
    monkeypatch.setattr(sys, "argv", ["prog", "--trainer.n-workers", "many"])
    with pytest.raises(SystemExit):
        lightning_cli(Trainer)
    monkeypatch.setattr(sys, "argv", ["prog", "--broken.size", "-1"])
    with pytest.raises(ValueError, match="non-negative"):
        lightning_cli(Broken)


def test_cli_helpers() -> None:
    assert config.nullable_str("NIL") is None and config.nullable_str("x") == "x"
    assert config.nullable_int("~") is None and config.nullable_int("3") == 3
    assert config.nullable_float("None") is None and config.nullable_float("1.5") == 1.5
    with pytest.raises(argparse.ArgumentTypeError):
        config.nullable_int("x")
    with pytest.raises(argparse.ArgumentTypeError):
        config.nullable_float("x")
    assert config._str_to_bool(True) is True and config._str_to_bool("F") is False
    with pytest.raises(argparse.ArgumentTypeError):
        config._str_to_bool("maybe")
    assert config._get_param_type_details(Optional[List[int]]) == (List[int], True, True)
    assert config._get_param_type_details(int) == (int, False, False)
    assert config._determine_argparse_type(Optional[int]) is config.nullable_int
    assert config._determine_argparse_type(bool) is config._str_to_bool
    assert config._determine_argparse_type(dict) is str
    assert config._determine_argparse_type_and_nargs(List[int], True) == {"nargs": "*", "type": int}
    assert config._build_help_string("Trainer", "tags", List[Optional[int]], True, True) == (
        "For Trainer: 'tags'. Inferred type: Optional[List[Optional[int]]]."
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert config._build_help_string("A", "x", int, False, False) == "For A: 'x'. Inferred type: int."


def test_quiet_model_loading_hides_weight_loading_bars() -> None:
    import warnings

    pytest.importorskip("transformers")
    from transformers.utils import logging as transformers_logging

    from agentbolt.logging import quiet_model_loading

    saved_filters = list(warnings.filters)
    try:
        quiet_model_loading()
        assert not transformers_logging.is_progress_bar_enabled()
    finally:
        transformers_logging.enable_progress_bar()
        warnings.filters[:] = saved_filters
