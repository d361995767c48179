"""Resources handed to agents: LLM endpoints and prompt templates, versioned by the store."""

from __future__ import annotations

import contextvars
import copy
import logging
import urllib.parse
from typing import Annotated, Any, Dict, List, Literal, Optional, Union

from pydantic import Field, field_validator

from .core import AttemptedRollout
from .wire import WireModel

__all__ = ["Resource", "LLM", "ProxyLLM", "PromptTemplate", "ResourceUnion", "NamedResources", "ResourcesUpdate"]

logger = logging.getLogger("agentbolt.types.resources")

# Set while agentbolt itself reads ProxyLLM.endpoint, so only user code reading it directly is warned.
_ALLOWED_ENDPOINT_READERS: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "agentbolt_proxy_llm_endpoint_reader", default=False
)


class Resource(WireModel):
    """Base class of everything the algorithm can hand to agents."""

    resource_type: Any


class LLM(Resource):
    """An OpenAI-compatible LLM endpoint."""

    resource_type: Literal["llm"] = "llm"
    endpoint: str
    model: str
    api_key: Optional[str] = None
    sampling_parameters: Dict[str, Any] = Field(default_factory=dict)

    def get_base_url(self, *args: Any, **kwargs: Any) -> str:
        """The base URL to give an OpenAI client."""
        return self.endpoint


class ProxyLLM(LLM):
    """An LLM behind the agentbolt gateway: calls are bound to a rollout and attempt through the URL."""

    resource_type: Literal["proxy_llm"] = "proxy_llm"  # type: ignore[assignment]

    def __getattribute__(self, name: str) -> Any:
        if name == "endpoint" and not _ALLOWED_ENDPOINT_READERS.get():
            logger.warning(
                "ProxyLLM.endpoint was read directly; use get_base_url(rollout_id, attempt_id) so calls are "
                "attributed to the rollout."
            )
        return super().__getattribute__(name)

    def get_base_url(self, rollout_id: Optional[str], attempt_id: Optional[str]) -> str:  # type: ignore[override]
        """Endpoint with ``/rollout/{rollout_id}/attempt/{attempt_id}`` inserted before a trailing ``/v1``.

        The ids are inserted into the endpoint's path (before a query string or fragment, if any), percent-encoded
        (``"r 1"`` becomes ``r%201``), so that the gateway reads them back as given.

        Raises:
            ValueError: Only one id is None, an id is not a string, or an id cannot be one path segment (it is
                empty, ``.`` or ``..``, or holds a ``/``).
        """
        token = _ALLOWED_ENDPOINT_READERS.set(True)
        try:
            endpoint = self.endpoint
        finally:
            _ALLOWED_ENDPOINT_READERS.reset(token)
        if rollout_id is None and attempt_id is None:
            return endpoint
        if not isinstance(rollout_id, str) or not isinstance(attempt_id, str):
            raise ValueError("rollout_id and attempt_id must both be strings (or both None)")
        rollout_part, attempt_part = _path_segment(rollout_id, "rollout_id"), _path_segment(attempt_id, "attempt_id")
        segment = f"/rollout/{rollout_part}/attempt/{attempt_part}"
        cut = min((i for i in (endpoint.find("?"), endpoint.find("#")) if i >= 0), default=len(endpoint))
        base, suffix = endpoint[:cut], endpoint[cut:]
        base = base[:-1] if base.endswith("/") else base
        if base.endswith("/v1"):
            return f"{base[: -len('/v1')]}{segment}/v1{suffix}"
        return f"{base}{segment}{suffix}"

    def with_attempted_rollout(self, rollout: AttemptedRollout) -> LLM:
        """A plain :class:`LLM` whose endpoint is bound to this rollout's current attempt.

        Raises:
            ValueError: ``rollout`` is not an :class:`~agentbolt.types.AttemptedRollout` (it has no attempt).
        """
        if not isinstance(rollout, AttemptedRollout):
            raise ValueError(
                "A ProxyLLM can only be bound to an AttemptedRollout (a rollout with its current attempt); "
                f"got {type(rollout).__name__}."
            )
        return LLM(
            endpoint=self.get_base_url(rollout.rollout_id, rollout.attempt.attempt_id),
            model=self.model,
            api_key=self.api_key,
            sampling_parameters=dict(self.sampling_parameters),
        )

    def model_dump(self, *args: Any, **kwargs: Any) -> Dict[str, Any]:
        """Pydantic's ``model_dump``, reading ``endpoint`` without the direct-read warning."""
        token = _ALLOWED_ENDPOINT_READERS.set(True)
        try:
            return super().model_dump(*args, **kwargs)
        finally:
            _ALLOWED_ENDPOINT_READERS.reset(token)

    def model_dump_json(self, *args: Any, **kwargs: Any) -> str:
        """Pydantic's ``model_dump_json``, reading ``endpoint`` without the direct-read warning."""
        token = _ALLOWED_ENDPOINT_READERS.set(True)
        try:
            return super().model_dump_json(*args, **kwargs)
        finally:
            _ALLOWED_ENDPOINT_READERS.reset(token)


_CHAT_ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})


def _path_segment(value: str, name: str) -> str:
    """``value`` percent-encoded as one URL path segment.

    Raises:
        ValueError: ``value`` cannot be one segment: empty, a dot segment (which clients resolve away) or holding a
            ``/`` (which the server decodes before routing, so it would split the segment).
    """
    if value in ("", ".", "..") or "/" in value:
        raise ValueError(f"{name} {value!r} cannot be a URL path segment: it must be non-empty, not . or .., no '/'")
    return urllib.parse.quote(value, safe="")


class PromptTemplate(Resource):
    """A prompt template filled by :meth:`format` with one of three engines, with optional worked examples.

    ``f-string`` uses :meth:`str.format`; ``jinja`` renders with Jinja2 (the ``jinja2`` package) in its sandbox
    (no access to private attributes; an unsafe access is a ``ValueError``) and fails on an undefined variable;
    ``poml`` renders POML markup with the ``poml`` package (extra ``agentbolt[apo]``), the keyword arguments being
    its context. POML evaluates ``{{ ... }}`` expressions as JavaScript with no sandbox: render only POML templates
    you trust (the prompt optimizers refuse rewrites that add expressions or markup attributes).

    ``examples`` holds worked examples as OpenAI chat messages (user requests, assistant replies with their
    ``tool_calls``, ``tool`` results), sent verbatim before the request by :meth:`format_messages`. Small models
    follow a worked conversation far better than a described one; ``FewShotAPO`` chooses these examples from the
    agent's own rewarded runs.
    """

    resource_type: Literal["prompt_template"] = "prompt_template"
    template: str
    engine: Literal["jinja", "f-string", "poml"]
    examples: List[Dict[str, Any]] = Field(default_factory=list)

    @field_validator("examples")
    @classmethod
    def _examples_are_chat_messages(cls, examples: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
        for position, message in enumerate(examples):
            if message.get("role") not in _CHAT_ROLES:
                raise ValueError(
                    f"examples[{position}].role must be one of {sorted(_CHAT_ROLES)}, got {message.get('role')!r}"
                )
        return examples

    def format(self, **kwargs: Any) -> str:
        """Fill the template with ``kwargs``.

        Raises:
            KeyError: ``f-string``: a placeholder has no value.
            ValueError: ``jinja``: a variable has no value or the template is malformed.
            ImportError: The engine's package is not installed (the message names the extra).
        """
        if self.engine == "f-string":
            return self.template.format(**kwargs)
        if self.engine == "jinja":
            return _render_jinja(self.template, kwargs)
        return _render_poml(self.template, kwargs)

    def format_messages(self, **kwargs: Any) -> List[Dict[str, Any]]:
        """The chat messages of a request: the worked ``examples`` (copied), then the filled template as the user.

        Raises:
            The errors of :meth:`format`.
        """
        return [copy.deepcopy(message) for message in self.examples] + [
            {"role": "user", "content": self.format(**kwargs)}
        ]


def _render_jinja(template: str, context: Dict[str, Any]) -> str:
    try:
        import jinja2
        import jinja2.sandbox
    except ImportError as exc:
        raise ImportError(
            "PromptTemplate(engine='jinja') needs the jinja2 package: pip install 'agentbolt[apo]'"
        ) from exc
    # Sandboxed: a template may be written by a model (prompt optimization), and a plain environment would let
    # `{{ value.__class__ }}` and the like walk from the context values to any Python object.
    environment = jinja2.sandbox.SandboxedEnvironment(
        undefined=jinja2.StrictUndefined, keep_trailing_newline=True, autoescape=False
    )
    try:
        return environment.from_string(template).render(**context)
    except (jinja2.UndefinedError, jinja2.TemplateSyntaxError, jinja2.sandbox.SecurityError) as exc:
        raise ValueError(f"Cannot render the jinja prompt template: {exc}") from exc


def _render_poml(template: str, context: Dict[str, Any]) -> str:
    try:
        import poml
    except ImportError as exc:
        raise ImportError("PromptTemplate(engine='poml') needs the poml package: pip install 'agentbolt[apo]'") from exc
    rendered = poml.poml(template, context=context, chat=False)
    if isinstance(rendered, str):
        return rendered
    return "\n\n".join(_message_text(message) for message in rendered)


def _message_text(message: Any) -> str:
    content = message.get("content", "") if isinstance(message, dict) else message
    if isinstance(content, list):
        return "\n".join(str(part) for part in content)
    return str(content)


ResourceUnion = Annotated[Union[LLM, ProxyLLM, PromptTemplate], Field(discriminator="resource_type")]
NamedResources = Dict[str, ResourceUnion]
"""Resources by name, e.g. ``{"main_llm": LLM(...), "system_prompt": PromptTemplate(...)}``."""


class ResourcesUpdate(WireModel):
    """A versioned snapshot of named resources stored in the LightningStore."""

    resources_id: str
    create_time: float
    update_time: float
    version: int
    resources: NamedResources
