"""Agents used by the runtime tests: ordinary OpenAI SDK code, importable by child processes."""

from __future__ import annotations

import json
import os
import time
from typing import Any, Dict

import openai

import agentbolt as agl

CALCULATOR_TOOL: Dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression.",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
    },
}


def _client(llm: agl.LLM) -> openai.OpenAI:
    return openai.OpenAI(base_url=llm.endpoint, api_key="test", max_retries=0)


@agl.rollout
def echo_agent(task: Dict[str, Any], llm: agl.LLM) -> float:
    """Plain, streaming and tool-call turns; reward 1 when the streamed echo contains the question."""
    client = _client(llm)
    question = task["question"]
    plain = client.chat.completions.create(model=llm.model, messages=[{"role": "user", "content": question}])
    assert plain.choices[0].message.content
    stream = client.chat.completions.create(
        model=llm.model, messages=[{"role": "user", "content": question}], stream=True
    )
    streamed = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    messages: list[Any] = [{"role": "user", "content": question}]
    tool_turn = client.chat.completions.create(model=llm.model, messages=messages, tools=[CALCULATOR_TOOL])
    call = tool_turn.choices[0].message.tool_calls[0]
    messages.append(tool_turn.choices[0].message.model_dump(exclude_none=True))
    messages.append({"role": "tool", "tool_call_id": call.id, "content": json.dumps({"result": 42})})
    client.chat.completions.create(model=llm.model, messages=messages, tools=[CALCULATOR_TOOL])
    return 1.0 if question in streamed else 0.0


@agl.rollout
def two_call_agent(task: Dict[str, Any], llm: agl.LLM) -> float:
    """The benchmark agent: two LLM calls and a reward."""
    client = _client(llm)
    for _ in range(2):
        client.chat.completions.create(model=llm.model, messages=[{"role": "user", "content": task["question"]}])
    return 1.0


@agl.rollout
def failing_agent(task: Dict[str, Any], llm: agl.LLM) -> float:
    """Raises for tasks asking for it."""
    if task.get("fail"):
        raise RuntimeError(f"agent failure for {task['question']}")
    return 0.5


@agl.rollout
def crash_once_agent(task: Dict[str, Any], llm: agl.LLM) -> float:
    """Kills its own process on the first attempt (a marker file remembers), succeeds on the retry."""
    marker = task["marker"]
    client = _client(llm)
    client.chat.completions.create(model=llm.model, messages=[{"role": "user", "content": task["question"]}])
    if not os.path.exists(marker):
        with open(marker, "w") as handle:
            handle.write(str(os.getpid()))
        time.sleep(60)  # the test SIGKILLs this process while it sleeps
    return 1.0


@agl.rollout
def slow_agent(task: Dict[str, Any], llm: agl.LLM) -> float:
    """Sleeps, to keep runner processes busy while the test interrupts them."""
    time.sleep(task.get("sleep", 30))
    return 1.0


class GatewayAgent(agl.LitAgent[Dict[str, Any]]):
    """Calls the ``fixed_llm`` resource bound to its attempt (a gateway), once; reward 1 for a non-empty answer."""

    def training_rollout(self, task: Dict[str, Any], resources: agl.NamedResources, rollout: agl.Rollout) -> float:
        llm = resources["fixed_llm"]
        assert isinstance(llm, agl.ProxyLLM) and isinstance(rollout, agl.AttemptedRollout)
        base_url = llm.get_base_url(rollout.rollout_id, rollout.attempt.attempt_id)
        client = openai.OpenAI(base_url=base_url, api_key="test", max_retries=0)
        answer = client.chat.completions.create(model=llm.model, messages=[{"role": "user", "content": task["q"]}])
        return 1.0 if answer.choices[0].message.content else 0.0
