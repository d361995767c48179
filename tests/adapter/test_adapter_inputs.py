"""Every adapter takes one rollout's sequence of spans; anything else is a clear TypeError, None is no spans."""

from __future__ import annotations

from typing import Any

import pytest

import agentbolt as agl
from agentbolt.types import Span

ADAPTERS = [agl.TracerTraceToTriplet, agl.TraceToMessages, agl.LlmProxyTraceToTriplet]


@pytest.mark.parametrize("adapter", ADAPTERS)
def test_none_is_no_spans(adapter: Any) -> None:
    assert adapter().adapt(None) == []


@pytest.mark.parametrize("adapter", ADAPTERS)
@pytest.mark.parametrize(
    ("source", "message"),
    [
        (Span.from_attributes(attributes={"a": 1}), "got one Span"),
        (5, "got int"),
        ("spans", "got one str"),
        ([None], "got an item of type NoneType"),
        ([{"attributes": {}}], "got an item of type dict"),
    ],
)
def test_other_sources_are_refused(adapter: Any, source: Any, message: str) -> None:
    with pytest.raises(TypeError, match=message):
        adapter().adapt(source)
