"""A scripted stand-in for the hosted models prompt optimization talks to (none can be reached here).

One real HTTP server (FastAPI + uvicorn on 127.0.0.1) answers OpenAI chat completions for three model names:

* ``agent``: the model of the test agent. It answers the last capital-city question of its prompt ("Capital of X?")
  with the bare city when its prompt says ``ONLY THE CITY`` or holds worked examples (``Examples of solved
  tasks`` in its text, or earlier assistant turns); otherwise with a sentence (which the exact-match reward scores 0). For countries in :data:`EASY` it
  always answers with the bare city, so a seed prompt earns some reward (and few-shot bootstrapping has examples).
* ``parrot``: a model that learns nothing from worked examples and repeats the last one's answer (see
  :func:`parrot_agent`).
* ``critic`` / ``editor`` / ``reflector``: the optimizer. Each call pops the next scripted step of its queue: a reply
  text, a reply without content (None), an HTTP error status, or a delay (seconds) longer than the client's timeout.
  With an empty queue the critic
  says the answer format is unclear and the editor / reflector return :data:`GOOD_TEMPLATE`.

Every request is recorded in ``requests`` (model, messages). :func:`capital_agent` is the test agent and :func:`fit`
runs an optimizer on it under a Trainer.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import defaultdict, deque
from dataclasses import dataclass, field
from typing import Any, Deque, Dict, List, Optional, Union

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

import agentbolt as agl

CAPITALS = {
    "France": "Paris",
    "Japan": "Tokyo",
    "Kenya": "Nairobi",
    "Peru": "Lima",
    "Chile": "Santiago",
    "Egypt": "Cairo",
    "Spain": "Madrid",
    "Italy": "Rome",
    "Canada": "Ottawa",
    "Norway": "Oslo",
}
EASY = {"France", "Japan", "Kenya"}

SEED_TEMPLATE = "Answer the question. Capital of {country}?"
GOOD_TEMPLATE = "Answer with ONLY THE CITY name. Capital of {country}?"

BASE_URL: Dict[str, str] = {}
"""Where the running stand-in listens (set by the ``standin`` fixture)."""

Step = Union[str, int, float, None]
"""A scripted optimizer step: reply text (str), a reply with ``content: null`` (None), HTTP error status (int) or a
delay in seconds (float)."""


@dataclass
class Script:
    """What the optimizer models answer, in order, per model name."""

    queues: Dict[str, Deque[Step]] = field(default_factory=lambda: defaultdict(deque))
    requests: List[Dict[str, Any]] = field(default_factory=list)

    def push(self, model: str, *steps: Step) -> None:
        self.queues[model].extend(steps)

    def calls(self, model: str) -> List[Dict[str, Any]]:
        return [r for r in self.requests if r["model"] == model]


def _agent_reply(messages: List[Dict[str, Any]]) -> str:
    prompt = "\n".join(str(m.get("content") or "") for m in messages)
    question = prompt.rsplit("Capital of ", 1)[1] if "Capital of " in prompt else ""
    country = next((c for c in CAPITALS if question.startswith(c)), None)
    if country is None:
        return "I do not know."
    city = CAPITALS[country]
    worked_turns = any(m.get("role") == "assistant" for m in messages)
    if "ONLY THE CITY" in prompt or "Examples of solved tasks" in prompt or worked_turns or country in EASY:
        return city
    return f"The capital of {country} is {city}."


def _parrot_reply(messages: List[Dict[str, Any]]) -> str:
    """A model that learns nothing from examples: it repeats the last worked example's answer."""
    prompt = "\n".join(str(m.get("content") or "") for m in messages)
    question = prompt.rsplit("Capital of ", 1)[1] if "Capital of " in prompt else ""
    country = next((c for c in CAPITALS if question.startswith(c)), None)
    if country is not None and question.startswith(f"{country} (easy)"):
        return CAPITALS[country]
    shown = [str(m.get("content")) for m in messages[:-1] if m.get("role") == "assistant"]
    shown += [line.split(": ", 1)[1] for line in prompt.splitlines() if line.startswith("Assistant: ")]
    return shown[-1] if shown else f"The capital of {country} is {CAPITALS.get(country or '', '?')}."


def _completion(model: str, text: Optional[str], prompt_chars: int) -> Dict[str, Any]:
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex[:12]}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": {
            "prompt_tokens": prompt_chars // 4,
            "completion_tokens": len(text or "") // 4 + 1,
            "total_tokens": prompt_chars // 4 + len(text or "") // 4 + 1,
        },
    }


def _default_reply(model: str) -> str:
    if model == "critic":
        return "The prompt does not say that the answer must be the city name alone."
    return f"```\n{GOOD_TEMPLATE}\n```" if model == "reflector" else GOOD_TEMPLATE


def create_app(script: Script) -> FastAPI:
    """The stand-in server's app, driven by ``script``."""
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Any:
        body = await request.json()
        model, messages = body["model"], body["messages"]
        script.requests.append({"model": model, "messages": messages})
        prompt = "\n".join(str(m.get("content") or "") for m in messages)
        if model == "agent":
            return _completion(model, _agent_reply(messages), len(prompt))
        if model == "parrot":
            return _completion(model, _parrot_reply(messages), len(prompt))
        queue = script.queues[model]
        step: Step = queue.popleft() if queue else _default_reply(model)
        if isinstance(step, int):
            return JSONResponse(
                {"error": {"message": f"scripted failure for model {model}", "type": "server_error"}}, status_code=step
            )
        if isinstance(step, float):
            await asyncio.sleep(step)
            step = _default_reply(model)
        return _completion(model, step, len(prompt))

    return app


async def _ask_capital(task: Dict[str, Any], messages: List[Dict[str, Any]], model: str = "agent") -> float:
    from openai import AsyncOpenAI

    if task.get("crash"):
        raise RuntimeError("the agent crashed on purpose")
    client = AsyncOpenAI(base_url=BASE_URL["url"], api_key="stand-in", max_retries=0)
    response = await client.chat.completions.create(model=model, messages=messages)  # type: ignore[arg-type]
    await client.close()
    answer = response.choices[0].message.content
    agl.emit_message(f"expected {CAPITALS[task['country']]}, got {answer}")
    return 1.0 if answer == CAPITALS[task["country"]] else 0.0


@agl.rollout
async def capital_agent(task: Dict[str, Any], prompt_template: agl.PromptTemplate) -> float:
    """Ask the stand-in's agent model (the template's worked examples first); reward 1 for the bare city name."""
    return await _ask_capital(task, prompt_template.format_messages(country=task["country"]))


@agl.rollout
async def capital_agent_without_examples(task: Dict[str, Any], prompt_template: agl.PromptTemplate) -> float:
    """The same agent sending only the filled template (it ignores the template's worked examples)."""
    return await _ask_capital(task, [{"role": "user", "content": prompt_template.format(country=task["country"])}])


@agl.rollout
async def parrot_agent(task: Dict[str, Any], prompt_template: agl.PromptTemplate) -> float:
    """The capital agent on the ``parrot`` model: bare city only for tasks marked ``easy`` (the prompt says so),
    otherwise the last worked example's answer, or a sentence when there is none."""
    country = task["country"] + (" (easy)" if task.get("easy") else "")
    return await _ask_capital(task, prompt_template.format_messages(country=country), model="parrot")


def capital_tasks(countries: List[str]) -> List[Dict[str, Any]]:
    return [{"country": c} for c in countries]


TRAIN = capital_tasks(["France", "Chile", "Egypt", "Spain", "Japan", "Italy"])
VAL = capital_tasks(["Kenya", "Peru", "Canada", "Norway"])


def fit(
    algorithm: agl.Algorithm,
    *,
    train: Optional[List[Dict[str, Any]]] = None,
    val: Optional[List[Dict[str, Any]]] = None,
    store: Any = None,
    initial_resources: Any = "seed",
    adapter: Any = None,
    agent: Any = None,
) -> Any:
    """Run ``algorithm`` on the capital agent in one process (shared-memory strategy); returns the store."""
    store = store if store is not None else agl.InMemoryLightningStore()
    resources = (
        {"prompt_template": agl.PromptTemplate(template=SEED_TEMPLATE, engine="f-string")}
        if initial_resources == "seed"
        else initial_resources
    )
    trainer = agl.Trainer(
        algorithm=algorithm,
        store=store,
        strategy=agl.SharedMemoryExecutionStrategy(n_runners=1),
        initial_resources=resources,
        adapter=adapter if adapter is not None else agl.TraceToMessages(),
        runner=agl.LitAgentRunner(tracer=agl.AgentOpsTracer(), poll_interval=0.02),
    )
    trainer.fit(
        agent or capital_agent, train_dataset=TRAIN if train is None else train, val_dataset=VAL if val is None else val
    )
    return store


def make_apo(client: Any, **overrides: Any) -> agl.APO:
    """An APO of one small beam round on the stand-in's critic and editor models, ``overrides`` applied."""
    options: Dict[str, Any] = {
        "gradient_model": "critic",
        "apply_edit_model": "editor",
        "gradient_batch_size": 2,
        "val_batch_size": 2,
        "beam_width": 1,
        "branch_factor": 1,
        "beam_rounds": 1,
        "optimizer_backoff": 0.01,
        "seed": 0,
        "use_poml": False,  # POML itself is covered by test_apo_prompts.py
    }
    options.update(overrides)
    return agl.APO(client, **options)
