"""What an example's command needs from outside before it starts anything: variables that must be set and services
that must answer.

Each check returns when all is well; otherwise it stops the command with one line naming what is missing or
unreachable and how to configure it, and exit code 2 (:data:`CONFIGURATION_ERROR`), the code every example's command
line uses for a configuration problem. Checking up front keeps a missing key or an unreachable service from surfacing
minutes later as an SDK traceback, a run of failed rollouts or a client retrying without end.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import threading
from typing import Dict, Iterator, List, Mapping, Optional, Sequence

__all__ = [
    "CONFIGURATION_ERROR",
    "OPENAI_DEFAULT_BASE_URL",
    "PROBE_TIMEOUT",
    "missing_variables",
    "reporting_refusals",
    "require_openai_service",
    "require_reachable",
    "require_variables",
    "unreachable_reason",
]

CONFIGURATION_ERROR = 2
"""Exit code of a command stopped by a configuration problem."""

PROBE_TIMEOUT = 10.0
"""Seconds a service gets to answer the start-up check."""

OPENAI_DEFAULT_BASE_URL = "https://api.openai.com/v1"
"""Where the OpenAI SDK goes when ``OPENAI_BASE_URL`` is unset."""


def missing_variables(names: Sequence[str], environ: Optional[Mapping[str, str]] = None) -> List[str]:
    """The variables of ``names`` that are unset or empty in ``environ`` (default: the process's), in order."""
    environ = os.environ if environ is None else environ
    return [name for name in names if not environ.get(name)]


def require_variables(
    parser: argparse.ArgumentParser,
    names: Sequence[str],
    *,
    needed_by: str,
    hint: str = "",
    environ: Optional[Mapping[str, str]] = None,
) -> None:
    """Return when every variable of ``names`` is set; else exit 2 with ``error: NEEDED_BY needs A, B; HINT``."""
    missing = missing_variables(names, environ)
    if missing:
        message = f"error: {needed_by} needs {', '.join(missing)}"
        parser.exit(CONFIGURATION_ERROR, f"{message}; {hint}\n" if hint else f"{message}\n")


def unreachable_reason(url: str, timeout: float = PROBE_TIMEOUT) -> Optional[str]:
    """None when ``url`` answers an HTTP GET within ``timeout`` seconds, whatever the status (a 401 or 404 still
    shows the service is there; keys are the SDK's to check); else why not, e.g. ``ConnectError: [Errno 111]
    Connection refused`` or ``no answer within 10 s``.

    The whole check, name resolution included (which httpx's timeouts do not bound), ends within ``timeout``
    seconds: the request runs in a daemon thread that is left behind if it has not finished by then.
    """
    import httpx  # proxies come from the environment (HTTPS_PROXY...), as in the SDKs, which use httpx too

    outcome: Dict[str, Optional[str]] = {}

    def probe() -> None:
        try:
            httpx.get(url, timeout=timeout)
        except Exception as exc:  # any failure to get an answer is the reason, invalid URLs included
            outcome["reason"] = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        else:
            outcome["reason"] = None

    thread = threading.Thread(target=probe, name=f"probe {url}", daemon=True)
    thread.start()
    thread.join(timeout)
    if "reason" not in outcome:
        return f"no answer within {timeout:g} s"
    return outcome["reason"]


def require_reachable(
    parser: argparse.ArgumentParser, url: str, *, service: str, configure: str, timeout: float = PROBE_TIMEOUT
) -> None:
    """Return when ``url`` answers within ``timeout`` seconds; else exit 2 with
    ``error: cannot reach SERVICE at URL (REASON); CONFIGURE``."""
    reason = unreachable_reason(url, timeout)
    if reason is not None:
        parser.exit(CONFIGURATION_ERROR, f"error: cannot reach {service} at {url} ({reason}); {configure}\n")


def require_openai_service(
    parser: argparse.ArgumentParser,
    *,
    needed_by: str,
    alternative: str,
    timeout: float = PROBE_TIMEOUT,
    environ: Optional[Mapping[str, str]] = None,
) -> None:
    """Check the OpenAI-compatible service an example calls through the OpenAI SDK's environment: ``OPENAI_API_KEY``
    must be set and ``OPENAI_BASE_URL`` (default :data:`OPENAI_DEFAULT_BASE_URL`) must answer. Otherwise exit 2,
    naming the missing variable or the address tried, and ``alternative`` (what to do instead, e.g. the example's
    local mode)."""
    environ = os.environ if environ is None else environ
    base_url = (environ.get("OPENAI_BASE_URL") or OPENAI_DEFAULT_BASE_URL).rstrip("/")
    require_variables(
        parser,
        ["OPENAI_API_KEY"],
        needed_by=needed_by,
        hint=f"set it to the key of the service at OPENAI_BASE_URL (now {base_url}; any value for a server that "
        f"checks none), or {alternative}",
        environ=environ,
    )
    require_reachable(
        parser,
        f"{base_url}/models",
        service="the OpenAI-compatible service",
        configure=f"set OPENAI_BASE_URL to a service that answers (and check the network or HTTPS_PROXY), "
        f"or {alternative}",
        timeout=timeout,
    )


@contextlib.contextmanager
def reporting_refusals(parser: argparse.ArgumentParser, *, service: str, configure: str) -> Iterator[None]:
    """Run the block; when the OpenAI-compatible service answers a call with an HTTP error (``openai.APIStatusError``:
    a wrong key, a model it does not serve...), exit with one line instead of the SDK's traceback:
    ``error: SERVICE refused the request (HTTP STATUS: MESSAGE); CONFIGURE``, code 2 for a 4xx answer (the
    configuration is wrong), 1 for a 5xx one (the service failed)."""
    import openai

    try:
        yield
    except openai.APIStatusError as exc:
        message = " ".join(str(exc.message).split())
        code = CONFIGURATION_ERROR if 400 <= exc.status_code < 500 else 1
        parser.exit(code, f"error: {service} refused the request (HTTP {exc.status_code}: {message}); {configure}\n")
