"""Semantic conventions: span names and attribute keys shared by emitters, tracers and adapters.

The ``agentlightning.*`` keys are kept verbatim so traces are interchangeable with Agent Lightning.
"""

from __future__ import annotations

from enum import Enum

from pydantic import BaseModel

AGL_ANNOTATION = "agentlightning.annotation"
AGL_MESSAGE = "agentlightning.message"
AGL_OBJECT = "agentlightning.object"
AGL_EXCEPTION = "agentlightning.exception"
AGL_OPERATION = "agentlightning.operation"
AGL_REWARD = "agentlightning.reward"
AGL_VIRTUAL = "agentlightning.virtual"


class LightningResourceAttributes(Enum):
    """Resource attributes binding spans to a rollout."""

    ROLLOUT_ID = "agentlightning.rollout_id"
    ATTEMPT_ID = "agentlightning.attempt_id"
    SPAN_SEQUENCE_ID = "agentlightning.span_sequence_id"
    TRACER_NAME = "agentlightning.tracer.name"


class LightningSpanAttributes(Enum):
    """Span attribute keys (and prefixes) written by agentbolt emitters."""

    REWARD = "agentlightning.reward"
    LINK = "agentlightning.link"
    TAG = "agentlightning.tag"
    MESSAGE_BODY = "agentlightning.message.body"
    OBJECT_TYPE = "agentlightning.object.type"
    OBJECT_LITERAL = "agentlightning.object.literal"
    OBJECT_JSON = "agentlightning.object.json"
    OPERATION_NAME = "agentlightning.operation.name"
    OPERATION_INPUT = "agentlightning.operation.input"
    OPERATION_OUTPUT = "agentlightning.operation.output"


class RewardAttributes(Enum):
    """Keys of one reward dimension: ``agentlightning.reward.<i>.name`` / ``.value``."""

    REWARD_NAME = "name"
    REWARD_VALUE = "value"


class LinkAttributes(Enum):
    """Keys of one link: ``agentlightning.link.<i>.key_match`` / ``.value_match``."""

    KEY_MATCH = "key_match"
    VALUE_MATCH = "value_match"


class RewardPydanticModel(BaseModel):
    """One reward dimension; index 0 on a span is the primary reward."""

    name: str
    value: float


class LinkPydanticModel(BaseModel):
    """A link condition: spans whose ``key_match`` equals ``value_match``."""

    key_match: str
    value_match: str


# --- LLM call span format ----------------------------------------------------------------------------------------
# Attribute keys of one LLM call, built by ``agentbolt.llm_call_attributes`` for both the OpenAI SDK instrumentation
# (``openai.chat.completion`` spans; ``openai.completion`` for text completions) and the LLM gateway (one
# ``agentbolt.llm_call`` span per proxied call, streaming included). ``agentbolt.adapter`` reads them; the full
# layout is documented in ``agentbolt/adapter/triplet.py``.

AGL_LLM_CALL = "agentbolt.llm_call"
"""Name of the span the gateway records for one LLM call."""

GEN_AI_SYSTEM = "gen_ai.system"
"""Provider of the model (``openai``, ``hosted_vllm``...)."""
GEN_AI_OPERATION_NAME = "gen_ai.operation.name"
"""``chat`` or ``text_completion``."""
GEN_AI_REQUEST_MODEL = "gen_ai.request.model"
"""Model requested by the client."""
GEN_AI_REQUEST_MAX_TOKENS = "gen_ai.request.max_tokens"
"""Token limit of the answer (the request's ``max_tokens`` or ``max_completion_tokens``)."""
GEN_AI_REQUEST_CHOICE_COUNT = "gen_ai.request.choice.count"
"""Number of choices asked for (the request's ``n``)."""
GEN_AI_REQUEST_STOP_SEQUENCES = "gen_ai.request.stop_sequences"
"""Stop sequences (the request's ``stop``), always a list of strings."""
GEN_AI_REQUEST_DISTRIBUTION_CHANGING = "gen_ai.request.distribution_changing"
"""Names of the request's parameters that make the engine sample from another distribution than the model's tempered
softmax (guided decoding, ``top_p`` < 1, penalties...: :mod:`agentbolt.openai_api.sampling`), sorted; absent when none
is set."""
GEN_AI_REQUEST_STREAM = "gen_ai.request.stream"
"""Whether the answer was streamed (bool, always recorded)."""
GEN_AI_REQUEST_FUNCTIONS = "gen_ai.request.functions"
"""Prefix of the tools offered to the model: ``gen_ai.request.functions.<i>.name/description/parameters``."""
GEN_AI_RESPONSE_ID = "gen_ai.response.id"
"""Id of the completion returned by the backend; also the de-duplication key of LLM calls."""
GEN_AI_RESPONSE_MODEL = "gen_ai.response.model"
"""Model that actually answered."""
GEN_AI_RESPONSE_FINISH_REASONS = "gen_ai.response.finish_reasons"
"""Finish reason of each choice (list of str)."""
GEN_AI_PROMPT = "gen_ai.prompt"
"""Prefix of the request messages: ``gen_ai.prompt.<i>.role/content/tool_call_id/tool_calls...``."""
GEN_AI_COMPLETION = "gen_ai.completion"
"""Prefix of the choices: ``gen_ai.completion.<i>.role/content/finish_reason/tool_calls...``."""
GEN_AI_USAGE_INPUT_TOKENS = "gen_ai.usage.input_tokens"
"""Number of prompt tokens."""
GEN_AI_USAGE_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
"""Number of generated tokens."""
PROMPT_TOKEN_IDS = "prompt_token_ids"
"""Token ids of the prompt as the backend tokenized it (list of int)."""
RESPONSE_TOKEN_IDS = "response_token_ids"
"""Token ids of the first choice (list of int)."""
RESPONSE_LOGPROBS = "response_logprobs"
"""Log-probability of each response token (list of float, same length as ``response_token_ids``), when available."""
LOGPROBS_CONTENT = "logprobs.content"
"""The first choice's per-token logprob entries of a chat completion (JSON list of ``{token, logprob, ...}``)."""
LLM_AGENT_NAME = "agentbolt.llm.agent_name"
"""Name of the agent that made the call (optional); used to train selected agents of a multi-agent system."""
LLM_AGENT_NAME_HEADER = "x-agentbolt-agent-name"
"""HTTP request header from which the gateway copies :data:`LLM_AGENT_NAME`."""
LANGGRAPH_NODE_PATH = "langgraph.node_path"
"""On the span of a LangGraph node's run (recorded by the LangChain handler): the names of the graph nodes leading to
it, joined by ``/`` (``"researcher/agent"`` for the ``agent`` node of a subgraph run as node ``researcher``; a node of
the outermost graph is its own name). The adapters name the agent of the calls inside the node by it."""
LLM_CALL_ID = "agentbolt.llm.call_id"
"""Identity of one LLM call across recorders: the ``x-request-id`` of its HTTP response. The gateway issues a unique
one per call and records it on its span; the OpenAI SDK instrumentation records the one its call received, so the
adapters recognise the gateway's and the SDK's records of one call (see ``docs/frameworks.md``)."""
LLM_CALL_ID_HEADER = "x-request-id"
"""HTTP response header carrying :data:`LLM_CALL_ID` (the header the OpenAI SDK exposes as ``_request_id``)."""
