"""Model routing: LiteLLM-style ``model_list`` entries resolved to upstream deployments.

An entry looks like ``{"model_name": "qwen", "litellm_params": {"model": "hosted_vllm/Qwen/Qwen2.5-0.5B",
"api_base": "http://127.0.0.1:8000/v1", "api_key": "..."}}``. The provider prefix of ``litellm_params.model``
decides how the gateway talks to the backend:

* ``hosted_vllm/<model>`` and ``agentbolt/<model>`` (our own ``agentbolt serve``): OpenAI-compatible servers that
  return token ids; the gateway asks them for ``return_token_ids`` and logprobs.
* ``openai/<model>`` (or no prefix): forwarded without those extensions.
* ``anthropic/<model>``: a backend that speaks Anthropic's Messages API (``POST {api_base}/v1/messages``, default
  ``api_base`` ``https://api.anthropic.com``, key from ``ANTHROPIC_API_KEY``). Only the gateway's ``/v1/messages``
  route serves these models; it passes requests through unchanged.

Several entries may share a ``model_name``; calls are spread over them round-robin and retries move on to the next.
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple
from urllib.parse import urlsplit, urlunsplit

__all__ = [
    "ANTHROPIC_PROVIDER",
    "Deployment",
    "ModelRouter",
    "PLAIN_PROVIDERS",
    "TOKEN_ID_PROVIDERS",
    "UnknownModelError",
]

TOKEN_ID_PROVIDERS = ("hosted_vllm", "agentbolt")
"""Providers whose servers understand ``return_token_ids`` (vLLM and ``agentbolt serve``)."""

PLAIN_PROVIDERS = ("openai",)
"""Providers forwarded without the token-id and logprob extensions."""

ANTHROPIC_PROVIDER = "anthropic"
"""Provider of backends that speak Anthropic's Messages API (served by the gateway's ``/v1/messages`` only)."""

_DEFAULT_OPENAI_BASE = "https://api.openai.com/v1"
_DEFAULT_ANTHROPIC_BASE = "https://api.anthropic.com"


class UnknownModelError(LookupError):
    """Raised when a request names a model that no ``model_list`` entry serves."""

    def __init__(self, model: str, available: Sequence[str]) -> None:
        self.model = model
        self.available = list(available)
        listed = ", ".join(self.available) if self.available else "(none configured)"
        super().__init__(f"Model {model!r} is not served by this gateway. Available models: {listed}")


@dataclass(frozen=True)
class Deployment:
    """One upstream backend serving a public model name.

    Attributes:
        model_name: Name clients use in the ``model`` field.
        provider: Provider prefix (``hosted_vllm``, ``agentbolt``, ``openai`` or ``anthropic``).
        upstream_model: Model name sent to the backend (the part after the provider prefix).
        api_base: Base URL of the backend, ending in ``/v1`` for OpenAI-compatible servers; for Anthropic-compatible
            ones, the URL ``/v1/messages`` is appended to (as the Anthropic SDK's ``base_url``).
        api_key: Bearer token sent to the backend, if any.
        token_ids: Whether the backend is asked for ``return_token_ids`` and logprobs.
        timeout: Per-deployment timeout in seconds (``None`` uses the gateway default).
    """

    model_name: str
    provider: str
    upstream_model: str
    api_base: str
    api_key: Optional[str]
    token_ids: bool
    timeout: Optional[float]

    def url(self, endpoint: str) -> str:
        """Absolute URL of ``endpoint`` (e.g. ``chat/completions``) on this backend."""
        return f"{self.api_base}/{endpoint}"

    @property
    def shown_base(self) -> str:
        """``api_base`` as error answers, logs and spans show it: credentials a URL can carry (user info, query
        string) are masked, since clients and the store must not see them."""
        return _without_url_credentials(self.api_base)

    @property
    def speaks_messages(self) -> bool:
        """Whether the backend speaks Anthropic's Messages API rather than OpenAI's."""
        return self.provider == ANTHROPIC_PROVIDER


def _without_url_credentials(url: str) -> str:
    """``url`` with its user info and query string, where credentials can hide, replaced by ``***``."""
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    netloc = f"***@{host}" if "@" in parts.netloc else host
    return urlunsplit(parts._replace(netloc=netloc, query="***" if parts.query else ""))


def _resolve_secret(value: Any, where: str) -> Optional[str]:
    """Read ``os.environ/NAME`` references (LiteLLM syntax) and check the type."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise ValueError(f"{where} must be a string, got {type(value).__name__}")
    if value.startswith("os.environ/"):
        name = value[len("os.environ/") :]
        resolved = os.environ.get(name)
        if resolved is None:
            raise ValueError(f"{where} refers to environment variable {name!r}, which is not set")
        return resolved
    return value


def parse_deployment(entry: Mapping[str, Any], index: int) -> Deployment:
    """Validate one ``model_list`` entry and turn it into a :class:`Deployment`.

    Raises:
        ValueError: When the entry is malformed; the message names the entry and the field.
    """
    where = f"model_list[{index}]"
    if not isinstance(entry, Mapping):
        raise ValueError(f"{where} must be a mapping with 'model_name' and 'litellm_params'")
    model_name = entry.get("model_name")
    if not isinstance(model_name, str) or not model_name:
        raise ValueError(f"{where}.model_name must be a non-empty string")
    params = entry.get("litellm_params")
    if not isinstance(params, Mapping):
        raise ValueError(f"{where}.litellm_params must be a mapping")
    model = params.get("model")
    if not isinstance(model, str) or not model:
        raise ValueError(f"{where}.litellm_params.model must be a non-empty string such as 'hosted_vllm/<model>'")
    provider, sep, upstream_model = model.partition("/")
    if not sep or provider not in (*TOKEN_ID_PROVIDERS, *PLAIN_PROVIDERS, ANTHROPIC_PROVIDER):
        # No known prefix: the whole string is the model name of an OpenAI-compatible backend.
        provider, upstream_model = "openai", model
    if not upstream_model:
        raise ValueError(f"{where}.litellm_params.model has an empty model name after the provider prefix")
    api_base = _resolve_secret(params.get("api_base", params.get("base_url")), f"{where}.litellm_params.api_base")
    if api_base is None and provider == ANTHROPIC_PROVIDER:
        api_base = _DEFAULT_ANTHROPIC_BASE  # never ANTHROPIC_BASE_URL: clients set it to point at this gateway
    if api_base is None:
        if provider != "openai":
            raise ValueError(f"{where}.litellm_params.api_base is required for {provider}/ models")
        api_base = os.environ.get("OPENAI_BASE_URL", _DEFAULT_OPENAI_BASE)
    if not api_base.startswith(("http://", "https://")):
        raise ValueError(f"{where}.litellm_params.api_base must be an http(s) URL, got {api_base!r}")
    api_key = _resolve_secret(params.get("api_key"), f"{where}.litellm_params.api_key")
    if api_key is None and provider in ("openai", ANTHROPIC_PROVIDER):
        api_key = os.environ.get("OPENAI_API_KEY" if provider == "openai" else "ANTHROPIC_API_KEY")
    token_ids = params.get("return_token_ids", provider in TOKEN_ID_PROVIDERS)
    if not isinstance(token_ids, bool):
        raise ValueError(f"{where}.litellm_params.return_token_ids must be a boolean")
    if token_ids and provider == ANTHROPIC_PROVIDER:
        raise ValueError(f"{where}.litellm_params.return_token_ids is not available for anthropic/ models")
    api_base = api_base.rstrip("/")
    if provider == ANTHROPIC_PROVIDER and api_base.endswith("/v1"):
        api_base = api_base[: -len("/v1")]  # the Messages URL is {api_base}/v1/messages
    timeout = params.get("timeout", params.get("request_timeout"))
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0):
        raise ValueError(f"{where}.litellm_params.timeout must be a positive number of seconds")
    return Deployment(
        model_name=model_name,
        provider=provider,
        upstream_model=upstream_model,
        api_base=api_base,
        api_key=api_key,
        token_ids=token_ids,
        timeout=float(timeout) if timeout is not None else None,
    )


class ModelRouter:
    """Maps public model names to deployments and spreads calls over them.

    Args:
        model_list: LiteLLM-style entries (see the module docstring).

    Raises:
        ValueError: When an entry is malformed.
    """

    def __init__(self, model_list: Sequence[Mapping[str, Any]]) -> None:
        if isinstance(model_list, (str, bytes)) or not isinstance(model_list, Sequence):
            raise ValueError("model_list must be a list of {'model_name': ..., 'litellm_params': {...}} entries")
        grouped: Dict[str, List[Deployment]] = {}
        for index, entry in enumerate(model_list):
            deployment = parse_deployment(entry, index)
            group = grouped.setdefault(deployment.model_name, [])
            if group and group[0].speaks_messages != deployment.speaks_messages:
                raise ValueError(
                    f"model_list[{index}]: model {deployment.model_name!r} mixes anthropic/ and OpenAI-compatible "
                    "deployments; give each kind its own model_name"
                )
            group.append(deployment)
        self._groups: Dict[str, Tuple[Deployment, ...]] = {name: tuple(items) for name, items in grouped.items()}
        self._cycles: Dict[str, Iterator[int]] = {
            name: itertools.cycle(range(len(items))) for name, items in grouped.items()
        }

    @property
    def model_names(self) -> List[str]:
        """Public model names, in configuration order."""
        return list(self._groups)

    def deployments(self) -> List[Deployment]:
        """Every configured deployment."""
        return [d for group in self._groups.values() for d in group]

    def candidates(self, model: str) -> Tuple[Deployment, ...]:
        """Deployments to try for ``model``, starting with the next one in round-robin order.

        Raises:
            UnknownModelError: When no entry serves ``model``.
        """
        group = self._groups.get(model)
        if group is None:
            raise UnknownModelError(model, self.model_names)
        if len(group) == 1:
            return group
        start = next(self._cycles[model])
        return group[start:] + group[:start]
