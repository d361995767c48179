"""The name formatter: a one-call agent that restores a name's capitalization ("ada king lovelace" -> "Ada King
Lovelace"), graded exactly.

The rule is easy to state and hard for a small model to follow from the statement alone (SmolLM2-135M-Instruct
mostly repeats the instruction or the lowercase name); shown a few solved requests as earlier chat turns, it copies
the procedure. That makes it the task on which few-shot prompt optimization from the agent's own rewarded runs
(:class:`~agentbolt.algorithm.apo.FewShotAPO`) can be measured honestly on a CPU:

* every request of a split has its own answer, so no constant answer scores more than one request in a split, and
  the request copied back (lowercase) scores 0;
* the grader (:func:`grade_name`) is one deterministic rule: the whole reply, once surrounding spaces, one pair of
  quotes or backticks and an ``Answer:``/``Output:``/``Name:`` label are removed, must equal the expected name,
  case included;
* the three splits draw first, middle and last names from disjoint lists (:func:`make_name_tasks`), so no held-out
  request, and no part of a held-out answer, appears in training or validation.

The model and endpoint come from the environment, as with any OpenAI client: ``OPENAI_BASE_URL``,
``OPENAI_API_KEY`` and ``NAME_FORMATTER_MODEL`` (``fewshot_names.py`` sets them for the embedded model).
"""

from __future__ import annotations

import os
import random
import re
from typing import Dict, List, Tuple, TypedDict

import agentbolt as agl
from examples.apo.room_selector import model_settings

__all__ = [
    "NameTask",
    "grade_name",
    "make_name_tasks",
    "name_formatter",
    "name_task_slices",
    "prompt_template_names_baseline",
]


class NameTask(TypedDict):
    """One request: the name as written (lowercase), its shape (``first-last`` or ``first-middle-last``) and the
    answer (the name with standard capitalization)."""

    id: str
    name: str
    shape: str
    expected: str


# Disjoint name lists per split: no first, middle or last name of a held-out request is seen in training.
_FIRST: Dict[str, Tuple[str, ...]] = {
    "train": ("Ada", "Alan", "Grace", "Marie", "Isaac", "Nikola", "Rosalind", "Carl", "Emmy", "Niels", "Barbara"),
    "val": ("Claude", "Edsger", "Donald", "Frances", "Hedy", "Katherine", "Linus", "Tim", "Dorothy", "Werner"),
    "test": ("John", "Lise", "Richard", "Sophie", "Paul", "Vera", "Enrico", "Henrietta", "Max", "Chien", "Ernest"),
}
_MIDDLE: Dict[str, Tuple[str, ...]] = {
    "train": ("King", "Mary", "Louise", "James", "Anne"),
    "val": ("Elwood", "Ervin", "Wyatt", "Jean", "Rose"),
    "test": ("Ray", "Emil", "Swan", "Shiung", "Karl"),
}
_LAST: Dict[str, Tuple[str, ...]] = {
    "train": ("Lovelace", "Turing", "Hopper", "Curie", "Newton", "Tesla", "Franklin", "Gauss", "Noether", "Bohr"),
    "val": ("Shannon", "Dijkstra", "Knuth", "Allen", "Lamarr", "Johnson", "Torvalds", "Hodgkin", "Heisenberg"),
    "test": ("Bardeen", "Meitner", "Feynman", "Germain", "Dirac", "Rubin", "Fermi", "Leavitt", "Planck", "Wu"),
}
SPLIT_SIZES = {"train": 40, "val": 24, "test": 48}
"""Requests per split."""


def make_name_tasks(split: str, *, seed: int = 7) -> List[NameTask]:
    """The requests of one split: ``train``, ``val`` (used by the optimizer to pick prompts) or ``test`` (held
    out). Deterministic for a given ``seed``; a quarter of the names carry a middle name.

    Raises:
        ValueError: An unknown split.
    """
    if split not in SPLIT_SIZES:
        raise ValueError(f"split must be train, val or test, got {split!r}")
    rng = random.Random(f"{seed}-{split}")
    tasks: List[NameTask] = []
    seen = set()
    while len(tasks) < SPLIT_SIZES[split]:
        first, last = rng.choice(_FIRST[split]), rng.choice(_LAST[split])
        middle = rng.choice(_MIDDLE[split]) if rng.random() < 0.25 else None
        name = f"{first} {middle} {last}" if middle else f"{first} {last}"
        if name in seen:
            continue
        seen.add(name)
        shape = "first-middle-last" if middle else "first-last"
        tasks.append(NameTask(id=f"{split}-{len(tasks)}", name=name.lower(), shape=shape, expected=name))
    return tasks


def name_task_slices(task: NameTask) -> List[str]:
    """The slices a test request is reported in: the shape of the name."""
    return [task["shape"]]


_LABEL = re.compile(r"^(?:answer|output|name)\s*:\s*", re.IGNORECASE)


def grade_name(answer: object, expected: str) -> float:
    """1.0 when the whole reply is the expected name, else 0.0.

    Tolerated around the answer: spaces and line breaks, one pair of surrounding quotes or backticks, and a leading
    ``Answer:`` / ``Output:`` / ``Name:`` label. Everything else counts: case, a second line, a second candidate,
    a dropped or added name, the request copied back, an empty reply.
    """
    if not isinstance(answer, str):
        return 0.0
    text = _LABEL.sub("", answer.strip()).strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'`":
        text = text[1:-1].strip()
    return 1.0 if text == expected else 0.0


def prompt_template_names_baseline() -> agl.PromptTemplate:
    """The seed prompt: the rule in words, no example."""
    return agl.PromptTemplate(
        template=(
            "Rewrite the name with standard capitalization: each part starts with a capital letter and the rest of "
            "it is in lowercase. Reply with the rewritten name only.\nName: {name}"
        ),
        engine="f-string",
    )


@agl.rollout
def name_formatter(task: NameTask, prompt_template: agl.PromptTemplate, rollout: agl.Rollout) -> float:
    """One request: the model answers in one line (the reply stops at the first line break); graded exactly."""
    from openai import OpenAI

    client = OpenAI(
        base_url=os.environ.get("OPENAI_BASE_URL"), api_key=os.environ.get("OPENAI_API_KEY") or "no-key-needed"
    )
    model, max_tokens, temperature = model_settings(rollout, "NAME_FORMATTER", 16)
    response = client.chat.completions.create(
        model=model,
        messages=prompt_template.format_messages(name=task["name"]),  # type: ignore[arg-type]
        max_tokens=max_tokens,
        temperature=temperature,
        stop=["\n"],
    )
    return grade_name(response.choices[0].message.content, task["expected"])
