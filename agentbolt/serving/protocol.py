"""OpenAI-compatible request bodies accepted by the inference server (pydantic; unknown fields are ignored)."""

from __future__ import annotations

from typing import Any, Dict, List, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field

from agentbolt.serving.params import EngineError, SamplingParams

__all__ = ["ChatCompletionRequest", "CompletionRequest", "LoadLoraRequest", "UnloadLoraRequest", "StreamOptions"]


class StreamOptions(BaseModel):
    """``stream_options`` of OpenAI requests."""

    include_usage: bool = False


class _SamplingFields(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: Optional[str] = None
    temperature: Optional[float] = None
    top_p: Optional[float] = None
    max_tokens: Optional[int] = None
    n: int = 1
    stop: Optional[Union[str, List[str]]] = None
    seed: Optional[int] = None
    stream: bool = False
    stream_options: Optional[StreamOptions] = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: Optional[Dict[str, float]] = None
    # vLLM extensions
    return_token_ids: bool = False
    stop_token_ids: Optional[List[int]] = None
    ignore_eos: bool = False

    def _sampling(self, max_tokens: Optional[int], logprobs: bool, top_logprobs: int) -> SamplingParams:
        if self.presence_penalty or self.frequency_penalty or self.logit_bias:
            raise EngineError("presence_penalty, frequency_penalty and logit_bias are not supported by this server")
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        params = SamplingParams(
            max_tokens=max_tokens,
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            n=self.n,
            stop=stops,
            stop_token_ids=list(self.stop_token_ids or []),
            seed=self.seed,
            logprobs=logprobs,
            top_logprobs=top_logprobs,
            ignore_eos=self.ignore_eos,
        )
        params.validate()
        return params

    @property
    def include_usage(self) -> bool:
        """Whether a streaming response ends with a usage chunk."""
        return bool(self.stream_options and self.stream_options.include_usage)


class ChatCompletionRequest(_SamplingFields):
    """Body of ``POST /v1/chat/completions``."""

    messages: List[Dict[str, Any]] = Field(min_length=1)
    tools: Optional[List[Dict[str, Any]]] = None
    tool_choice: Optional[Union[str, Dict[str, Any]]] = None
    max_completion_tokens: Optional[int] = None
    logprobs: bool = False
    top_logprobs: Optional[int] = None
    chat_template_kwargs: Optional[Dict[str, Any]] = None

    def sampling_params(self) -> SamplingParams:
        """Engine parameters of this request.

        Raises:
            EngineError: Invalid or unsupported values.
        """
        if self.top_logprobs and not self.logprobs:
            raise EngineError("top_logprobs requires logprobs=true")
        max_tokens = self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens
        return self._sampling(max_tokens, self.logprobs, self.top_logprobs or 0)

    def tools_enabled(self) -> bool:
        """Whether tools are passed to the template and tool calls parsed from the output."""
        return bool(self.tools) and self.tool_choice != "none"


class CompletionRequest(_SamplingFields):
    """Body of ``POST /v1/completions``."""

    prompt: Union[str, List[str], List[int], List[List[int]]]
    max_tokens: Optional[int] = 16
    logprobs: Optional[int] = None
    echo: bool = False
    best_of: Optional[int] = None
    suffix: Optional[str] = None

    def sampling_params(self) -> SamplingParams:
        """Engine parameters of this request.

        Raises:
            EngineError: Invalid or unsupported values.
        """
        if self.echo:
            raise EngineError("echo is not supported by this server")
        if self.suffix:
            raise EngineError("suffix is not supported by this server")
        if self.best_of is not None and self.best_of != self.n:
            raise EngineError("best_of different from n is not supported by this server")
        if self.logprobs is not None and not 0 <= self.logprobs <= 20:
            raise EngineError(f"logprobs must be between 0 and 20, got {self.logprobs}")
        return self._sampling(self.max_tokens, self.logprobs is not None, self.logprobs or 0)

    def prompts(self) -> List[Union[str, List[int]]]:
        """The prompt(s) as a list: strings or token id lists.

        Raises:
            EngineError: Empty prompt list.
        """
        prompt = self.prompt
        if isinstance(prompt, str):
            return [prompt]
        if not prompt:
            raise EngineError("prompt must not be empty")
        if all(isinstance(p, int) for p in prompt):
            return [list(prompt)]  # type: ignore[arg-type]
        return list(prompt)  # type: ignore[arg-type]


class LoadLoraRequest(BaseModel):
    """Body of ``POST /v1/load_lora_adapter`` (vLLM-compatible)."""

    lora_name: str = Field(min_length=1)
    lora_path: str = Field(min_length=1)


class UnloadLoraRequest(BaseModel):
    """Body of ``POST /v1/unload_lora_adapter`` (vLLM-compatible)."""

    lora_name: str = Field(min_length=1)
    lora_int_id: Optional[int] = None


FinishReasonOut = Literal["stop", "length", "tool_calls", "abort"]
