"""A number-guessing agent, written the way it would be deployed: a plain OpenAI-SDK loop with feedback turns.

The model guesses a secret number between 1 and 100; after each wrong guess it is told "Too low" or "Too high".
Reward: 1.0 when a guess hits within ``MAX_TURNS`` turns, else 0.0. Nothing in the agent knows about Tinker: the
Tinker bridge rebuilds its training data from the spans the LLM gateway records for each call.
"""

from __future__ import annotations

import random
import re
from typing import Any, Dict, List, Optional, TypedDict

from openai import AsyncOpenAI

import agentbolt as agl

MAX_TURNS = 5
SYSTEM_PROMPT = "Guess the secret integer between 1 and 100. Answer with one number only."
_NUMBER = re.compile(r"-?\d+")


class GuessTask(TypedDict):
    secret: int


def make_tasks(n: int, seed: int = 0) -> List[GuessTask]:
    """``n`` tasks with seeded secrets."""
    rng = random.Random(seed)
    return [GuessTask(secret=rng.randint(1, 100)) for _ in range(n)]


def extract_guess(text: Optional[str]) -> Optional[int]:
    """The reply's guess: its only integer, else None (no number, or several numbers, is no guess)."""
    numbers = _NUMBER.findall(text or "")
    return int(numbers[0]) if len(numbers) == 1 else None


async def play(client: AsyncOpenAI, model: str, secret: int, max_tokens: int = 8) -> float:
    """One game; returns the reward."""
    messages: List[Dict[str, Any]] = [{"role": "system", "content": SYSTEM_PROMPT},
                                      {"role": "user", "content": "Your guess?"}]  # fmt: skip
    for _ in range(MAX_TURNS):
        reply = await client.chat.completions.create(model=model, messages=messages, max_tokens=max_tokens)  # type: ignore[arg-type]
        text = reply.choices[0].message.content or ""
        messages.append({"role": "assistant", "content": text})
        guess = extract_guess(text)
        if guess == secret:
            return 1.0
        feedback = "Not a number." if guess is None else ("Too low." if guess < secret else "Too high.")
        messages.append({"role": "user", "content": f"{feedback} Your guess?"})
    return 0.0


@agl.rollout
async def guess_number_agent(task: GuessTask, llm: agl.LLM) -> float:
    """The rollout: play one game through ``llm`` (bound to this rollout's gateway route by the decorator)."""
    async with AsyncOpenAI(base_url=llm.endpoint, api_key=llm.api_key or "unused") as client:
        return await play(client, llm.model, task["secret"])
