"""Logging setup for agentbolt's loggers (``agentbolt`` and its children).

Libraries should not configure logging on import; applications call :func:`setup` once (the CLI does).
"""

from __future__ import annotations

import logging
import logging.config
import os
import platform
import sys
import warnings
from typing import Any, Dict, List, Optional, Union

__all__ = [
    "setup",
    "configure_logger",
    "setup_module",
    "quiet_model_loading",
    "setup_logging",
    "setup_module_logging",
]

DEFAULT_FORMAT = "%(asctime)s [%(levelname)s] (Process-%(process)d %(name)s)   %(message)s"
DATE_FORMAT = "%H:%M:%S"
BASE_LOGGER = "agentbolt"

_RICH_DEFAULTS: Dict[str, Any] = {"rich_tracebacks": False, "markup": False, "show_time": True, "show_path": True}


def _to_level_value(level: Union[int, str]) -> int:
    """Numeric logging level from an int or a (case-insensitive) level name.

    Raises:
        ValueError: Unknown level name.
    """
    if isinstance(level, int):
        return level
    value = logging.getLevelName(str(level).strip().upper())
    if not isinstance(value, int):
        raise ValueError(f"Unknown logging level {level!r}; use DEBUG, INFO, WARNING, ERROR or CRITICAL.")
    return value


def _rich_console() -> Any:
    from rich.console import Console

    if sys.stdout.isatty():
        return Console()
    return Console(width=200)


def setup_module(
    level: Union[int, str] = "INFO",
    *,
    name: str = BASE_LOGGER,
    console: bool = True,
    color: Union[bool, Dict[str, Any]] = True,
    propagate: bool = False,
    disable_existing_loggers: bool = False,
) -> logging.Logger:
    """Configure one logger (its handlers are replaced).

    Args:
        level: Level of the logger and its handler.
        name: Logger name.
        console: Attach a console handler.
        color: Use a ``rich`` handler (a dict gives its keyword arguments); False for plain text.
        propagate: Let records reach ancestor loggers too.
        disable_existing_loggers: Passed to ``logging.config.dictConfig``.

    Returns:
        The configured logger.
    """
    level_value = _to_level_value(level)
    handlers: Dict[str, Dict[str, Any]] = {}
    formatters: Dict[str, Dict[str, Any]] = {}
    if console and color is not False:
        options = dict(_RICH_DEFAULTS)
        if isinstance(color, dict):
            options.update(color)
        handlers["console"] = {"()": "rich.logging.RichHandler", "level": level_value, "console": _rich_console()}
        handlers["console"].update(options)
    elif console:
        formatters["plain"] = {"format": DEFAULT_FORMAT, "datefmt": DATE_FORMAT}
        handlers["console"] = {"class": "logging.StreamHandler", "level": level_value, "formatter": "plain"}
    logging.config.dictConfig(
        {
            "version": 1,
            "disable_existing_loggers": disable_existing_loggers,
            "formatters": formatters,
            "handlers": handlers,
            "loggers": {
                name: {"level": level_value, "handlers": list(handlers), "propagate": propagate},
            },
        }
    )
    return logging.getLogger(name)


def _add_file_handler(target: logging.Logger, path: str, level: int, formatter: Optional[logging.Formatter]) -> None:
    absolute = os.path.abspath(path)
    for handler in target.handlers:
        if isinstance(handler, logging.FileHandler) and os.path.abspath(handler.baseFilename) == absolute:
            return
    directory = os.path.dirname(absolute)
    if directory:
        os.makedirs(directory, exist_ok=True)
    handler = logging.FileHandler(absolute, encoding="utf-8")
    handler.setLevel(level)
    handler.setFormatter(formatter or logging.Formatter(DEFAULT_FORMAT, DATE_FORMAT))
    target.addHandler(handler)


def setup(
    level: Union[int, str] = "INFO",
    *,
    console: bool = True,
    color: Union[bool, Dict[str, Any]] = True,
    propagate: bool = False,
    disable_existing_loggers: bool = False,
    capture_warnings: bool = False,
    submodule_levels: Optional[Dict[str, Union[int, str]]] = None,
    extra_handlers: Optional[List[logging.Handler]] = None,
    formatter: Optional[logging.Formatter] = None,
    apply_to: Optional[List[str]] = None,
    files: Optional[Union[str, Dict[str, str]]] = None,
) -> None:
    """Configure agentbolt's logging.

    Args:
        level: Level of the ``agentbolt`` logger.
        console: Log to the console.
        color: Use a ``rich`` console handler (a dict gives its keyword arguments).
        propagate: Let ``agentbolt`` records reach the root logger.
        disable_existing_loggers: Passed to ``logging.config.dictConfig``.
        capture_warnings: Route ``warnings.warn`` messages through logging.
        submodule_levels: Levels for child loggers, e.g. ``{"agentbolt.store": "DEBUG"}``.
        extra_handlers: Handlers added to the ``agentbolt`` logger (once).
        formatter: Formatter for the base handlers that have none.
        apply_to: Other loggers (e.g. ``"uvicorn"``) that should use agentbolt's handlers and level.
        files: A log file for the ``agentbolt`` logger, or ``{logger_name: file}``.
    """
    if platform.system() == "Windows":
        os.environ.setdefault("PYTHONUTF8", "1")
    base = setup_module(
        level,
        name=BASE_LOGGER,
        console=console,
        color=color,
        propagate=propagate,
        disable_existing_loggers=disable_existing_loggers,
    )
    base_level = base.level
    if formatter is not None:
        for handler in base.handlers:
            if handler.formatter is None or handler.formatter is logging._defaultFormatter:  # type: ignore[attr-defined]
                handler.setFormatter(formatter)
    for handler in extra_handlers or []:
        if handler not in base.handlers:
            base.addHandler(handler)
    for logger_name, sub_level in (submodule_levels or {}).items():
        value = _to_level_value(sub_level)
        logging.getLogger(logger_name).setLevel(value)
        if value < base_level:
            base.warning(
                "Logger %s is set to %s, more verbose than %s: its records below %s are dropped by the base handlers.",
                logger_name,
                logging.getLevelName(value),
                logging.getLevelName(base_level),
                logging.getLevelName(base_level),
            )
    if isinstance(files, str):
        _add_file_handler(base, files, base_level, formatter)
    elif isinstance(files, dict):
        for logger_name, path in files.items():
            target = logging.getLogger(logger_name)
            _add_file_handler(target, path, target.getEffectiveLevel(), formatter)
    for logger_name in apply_to or []:
        target = logging.getLogger(logger_name)
        target.handlers = list(base.handlers)
        target.setLevel(base_level)
        target.propagate = False
    if capture_warnings:
        logging.captureWarnings(True)


def configure_logger(level: int = logging.INFO, name: str = BASE_LOGGER) -> logging.Logger:
    """Deprecated: use :func:`setup` (or :func:`setup_module`)."""
    warnings.warn(
        "configure_logger is deprecated; use agentbolt.setup_logging instead.", DeprecationWarning, stacklevel=2
    )
    return setup_module(level, name=name, console=True, color=True, propagate=False)


# The names the package exports these two under (``agentbolt.setup_logging``, ``agentbolt.setup_module_logging``).
setup_logging = setup
setup_module_logging = setup_module


def quiet_model_loading() -> None:
    """Keep console output to an application's own progress: no transformers weight-loading bars and no
    transformers deprecation notes (``FutureWarning``). Does nothing when transformers is not installed."""
    warnings.filterwarnings("ignore", category=FutureWarning, module="transformers")
    try:
        from transformers.utils import logging as transformers_logging
    except ImportError:
        return
    transformers_logging.disable_progress_bar()
