"""Tracing through W&B Weave.

agentbolt's tracers are built on OpenTelemetry (:class:`~agentbolt.tracer.agentops.AgentOpsTracer` is the
default). A Weave-based tracer is not provided by this version: importing this module fails with an
``ImportError`` that says what to use instead, and names the ``weave`` package when it is not installed.
"""

from __future__ import annotations

import importlib.util

if importlib.util.find_spec("weave") is None:
    raise ImportError(
        "WeaveTracer needs the 'weave' package (pip install weave), and is not provided by this version of "
        "agentbolt: use agentbolt.AgentOpsTracer (the default) or agentbolt.OtelTracer."
    )
raise ImportError(
    "WeaveTracer is not provided by this version of agentbolt: use agentbolt.AgentOpsTracer (the default) or "
    "agentbolt.OtelTracer."
)
