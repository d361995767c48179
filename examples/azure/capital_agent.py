"""A tool-calling agent for the Azure OpenAI fine-tuning loop: it must look capitals up with a tool.

The agent offers one function tool, ``country_capital_lookup(country)``, answers from a fixed table, and is rewarded
1.0 when its brief final answer commits to the expected capital (0.0 otherwise: a list of cities, a hedge, a
negation, a question, an answer of over 30 words; see :func:`capital_reward`). It is written with the OpenAI SDK against any OpenAI-compatible endpoint:
Azure OpenAI's v1 API (``https://RESOURCE.openai.azure.com/openai/v1``, the deployment name as the model) in the
fine-tuning loop.

Run it once against an endpoint of your own::

    OPENAI_BASE_URL=https://RESOURCE.openai.azure.com/openai/v1 OPENAI_API_KEY=... \\
        python -m examples.azure.capital_agent --model gpt-4.1-mini

Without ``OPENAI_API_KEY``, or when ``OPENAI_BASE_URL`` does not answer, the command stops at once with exit code 2;
a call the service refuses (a wrong key, a model it does not serve) stops it with one line and exit code 2 too.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import os
import re
from pathlib import Path
from typing import Any, Dict, List, Optional, TypedDict

from openai import AsyncOpenAI

import agentbolt as agl
from examples.common.arguments import count
from examples.common.environment import reporting_refusals, require_openai_service
from examples.common.rewards import HEDGE, NEGATION, fold_accents

SAMPLES = Path(__file__).with_name("capital_samples.csv")
SYSTEM_PROMPT = "You answer questions about capital cities. Always call country_capital_lookup, then answer briefly."
LOOKUP_TOOL: Dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "country_capital_lookup",
        "description": "The capital city of a country.",
        "parameters": {
            "type": "object",
            "properties": {"country": {"type": "string", "description": "The country's name in English."}},
            "required": ["country"],
        },
    },
}
MAX_TURNS = 3


class CapitalTask(TypedDict):
    question: str
    country: str
    capital: str


def load_tasks(path: Path = SAMPLES) -> List[CapitalTask]:
    """The prompt/answer pairs of ``capital_samples.csv``."""
    with path.open(newline="", encoding="utf-8") as handle:
        return [
            CapitalTask(question=r["question"], country=r["country"], capital=r["capital"])
            for r in csv.DictReader(handle)
        ]


CAPITALS: Dict[str, str] = {task["country"].lower(): task["capital"] for task in load_tasks()}


def country_capital_lookup(country: str) -> str:
    """The tool: the capital of ``country`` from the table, or a message saying it is unknown."""
    return CAPITALS.get(country.strip().lower(), f"unknown country: {country}")


MAX_ANSWER_WORDS = 30
"""Longer answers score 0: a brief answer names one city, and length is how a reply lists them all."""
_SEVERAL = re.compile(r"[,;/&+?]|\b(?:and|or|vs|versus)\b", re.IGNORECASE)
"""A separator between candidates, or a question mark: the answer lists cities or asks rather than commits."""
_WORD = re.compile(r"[^\W\d_]+(?:'[^\W\d_]+)*")
_PLAIN_CAPITALISED = frozenset(
    {"the", "it", "it's", "its", "i", "i'm", "this", "that", "that's", "here", "here's", "so", "yes", "sure",
     "certainly", "answer", "final", "capital", "city", "country", "according", "based", "lookup", "tool", "result"}
)  # fmt: skip
"""Capitalised words an answer may hold beside the capital and the words of the question (sentence openers)."""


def _names(answer: str, city: str) -> bool:
    """Whether ``answer`` holds ``city`` as whole words (case-insensitive), not inside a longer word."""
    return re.search(rf"(?<!\w){re.escape(city)}(?!\w)", answer, re.IGNORECASE) is not None


def _names_another_place(answer: str, task: CapitalTask) -> bool:
    """Whether ``answer`` (accent-folded) names a city other than the expected capital.

    Any other capital of the table counts, in any letter case. So does any other capitalised word that is neither
    part of the capital, the country or the question, nor a plain sentence opener ("The", "It"): in a brief answer
    it is a place or a person, a second candidate either way. An answer written all in capitals is only checked
    against the table.
    """
    capital = fold_accents(task["capital"])
    others = {fold_accents(c) for c in CAPITALS.values()} - {capital}
    if any(_names(answer, other) for other in others if other.lower() != capital.lower()):
        return True
    if answer.isupper():
        return False
    known = {word.lower() for word in _WORD.findall(fold_accents(f"{task['capital']} {task['question']}"))}
    known |= {word.lower() for word in _WORD.findall(fold_accents(task["country"]))} | _PLAIN_CAPITALISED
    for word in _WORD.findall(answer):
        word = re.sub(r"'s$", "", word)
        if word[0].isupper() and word.lower() not in known:
            return True
    return False


def capital_reward(answer: str, task: CapitalTask) -> float:
    """1.0 when a brief answer commits to the expected capital, else 0.0.

    The capital must appear as whole words, compared case-insensitively on accent-folded text (``Brasilia`` is
    ``Brasília``). The answer scores 0 when it is longer than :data:`MAX_ANSWER_WORDS` words, lists candidates
    (commas, semicolons, slashes, ``&``, ``+``, "and", "or", "vs"), asks (a question mark), negates or hedges ("not",
    "n't", "no", "maybe", "perhaps"... :data:`examples.common.rewards.NEGATION` and ``HEDGE``), or names a second
    city (see :func:`_names_another_place`).
    """
    folded = fold_accents(answer)
    if len(folded.split()) > MAX_ANSWER_WORDS or not _names(folded, fold_accents(task["capital"])):
        return 0.0
    if _SEVERAL.search(folded) or NEGATION.search(folded) or HEDGE.search(folded):
        return 0.0
    return 0.0 if _names_another_place(folded, task) else 1.0


async def answer_question(client: AsyncOpenAI, model: str, question: str) -> str:
    """The chat loop: the model may call the lookup tool (up to ``MAX_TURNS`` turns); returns its final text."""
    messages: List[Dict[str, Any]] = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": question},
    ]
    for _ in range(MAX_TURNS):
        response = await client.chat.completions.create(model=model, messages=messages, tools=[LOOKUP_TOOL])  # type: ignore[arg-type]
        message = response.choices[0].message
        if not message.tool_calls:
            return message.content or ""
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls:
            try:
                country = json.loads(call.function.arguments).get("country", "")
                result = country_capital_lookup(str(country))
            except (json.JSONDecodeError, AttributeError):
                result = "error: the arguments are not a JSON object with a country"
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return ""


@agl.rollout
async def capital_agent(task: CapitalTask, llm: agl.LLM) -> float:
    """One rollout: answer the task's question through ``llm`` and score the answer."""
    async with AsyncOpenAI(base_url=llm.endpoint, api_key=llm.api_key or "unused") as client:
        answer = await answer_question(client, llm.model, task["question"])
    return capital_reward(answer, task)


async def _debug(model: str, limit: int) -> None:
    async with AsyncOpenAI(
        base_url=os.environ.get("OPENAI_BASE_URL"), api_key=os.environ.get("OPENAI_API_KEY")
    ) as client:
        for task in load_tasks()[:limit]:
            answer = await answer_question(client, model, task["question"])
            print(f"{task['question']} -> {answer!r} (reward {capital_reward(answer, task)})")


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m examples.azure.capital_agent", description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, help="the model (on Azure: the deployment name)")
    parser.add_argument("--limit", type=count(1), default=5, help="questions to ask (default: 5)")
    args = parser.parse_args(argv)
    require_openai_service(
        parser,
        needed_by="the capital agent",
        alternative="point OPENAI_BASE_URL at an Azure OpenAI resource (https://RESOURCE.openai.azure.com/openai/v1) "
        "and set OPENAI_API_KEY to its key",
    )
    with reporting_refusals(
        parser,
        service="the OpenAI-compatible service",
        configure="check OPENAI_API_KEY (the key of the service at OPENAI_BASE_URL) and --model (a model it serves)",
    ):
        asyncio.run(_debug(args.model, args.limit))


if __name__ == "__main__":
    main()
