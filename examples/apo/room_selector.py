"""The room selector: an OpenAI-SDK agent that books a meeting room with a tool call, graded deterministically.

The agent fills the prompt template with the meeting's requirements, offers the model the
``get_rooms_and_availability`` tool, runs the call the model makes against the local room database, and returns the
reward of the model's final answer. The model and endpoint come from the environment, as with any OpenAI client:
``OPENAI_BASE_URL``, ``OPENAI_API_KEY`` and ``ROOM_SELECTOR_MODEL`` (``room_selector_apo.py`` sets them for the
embedded model).

The right room is decided by one rule (:func:`best_room`): among the rooms free for the whole meeting, large enough,
with every needed piece of equipment and, if asked, step-free access, the smallest; ties go to the first name in
alphabetical order.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple, TypedDict

import agentbolt as agl
from examples.common.rewards import HEDGE, NEGATION

__all__ = [
    "ROOMS",
    "ROOM_TOOL",
    "RoomSelectionTask",
    "best_room",
    "get_rooms_and_availability",
    "load_room_tasks",
    "prompt_template_baseline",
    "room_selection_grader",
    "room_selector",
    "room_selector_lookup",
    "prompt_template_lookup_baseline",
    "format_rooms",
]

TASKS_FILE = Path(__file__).with_name("room_tasks.jsonl")


class RoomSelectionTask(TypedDict):
    """One booking request and the room the grader expects."""

    id: str
    date: str
    time: str
    duration_min: int
    attendees: int
    needs: List[str]
    accessible_required: bool
    expected_choice: str


# name -> (capacity, equipment, step-free access)
ROOMS: Dict[str, Tuple[int, Tuple[str, ...], bool]] = {
    "Atlas": (4, ("whiteboard",), True),
    "Birch": (6, ("screen",), False),
    "Cedar": (8, ("whiteboard", "screen"), True),
    "Delta": (10, ("projector",), False),
    "Ember": (12, ("projector", "confphone"), True),
    "Fjord": (16, ("screen", "confphone"), True),
    "Gale": (20, ("projector", "whiteboard", "confphone"), False),
    "Harbor": (30, ("projector", "screen", "confphone"), True),
}
"""The room database: capacity, equipment and step-free access of each room."""

EQUIPMENT = ("whiteboard", "screen", "projector", "confphone")


def _minutes(clock: str) -> int:
    hours, minutes = clock.split(":")
    return int(hours) * 60 + int(minutes)


def bookings(date: str) -> Dict[str, List[Tuple[int, int]]]:
    """Booked intervals (start, end, in minutes after midnight) of each room on ``date``: two meetings a day each,
    placed by a fixed rule on the day of the month."""
    day = int(date[-2:])
    schedule: Dict[str, List[Tuple[int, int]]] = {}
    for index, name in enumerate(sorted(ROOMS)):
        first = 8 * 60 + ((day * 7 + index * 5) % 9) * 60
        second = 8 * 60 + ((day * 3 + index * 4 + 5) % 9) * 60 + 30
        schedule[name] = [(first, first + 90), (second, second + 60)]
    return schedule


def get_rooms_and_availability(date: str, time_str: str, duration_min: int) -> List[Dict[str, Any]]:
    """The tool: every room with its capacity, equipment, access, and whether it is free for the whole slot."""
    start = _minutes(time_str)
    end = start + int(duration_min)
    schedule = bookings(date)
    rooms = []
    for name, (capacity, equipment, accessible) in ROOMS.items():
        free = all(end <= b_start or start >= b_end for b_start, b_end in schedule[name])
        rooms.append(
            {"room": name, "capacity": capacity, "equipment": list(equipment), "accessible": accessible, "free": free}
        )
    return rooms


def best_room(
    date: str, time: str, duration_min: int, attendees: int, needs: List[str], accessible_required: bool
) -> Optional[str]:
    """The room the grader expects, or None when no room fits."""
    fitting = [
        room
        for room in get_rooms_and_availability(date, time, duration_min)
        if room["free"]
        and room["capacity"] >= attendees
        and all(need in room["equipment"] for need in needs)
        and (room["accessible"] or not accessible_required)
    ]
    if not fitting:
        return None
    return min(fitting, key=lambda room: (room["capacity"], room["room"]))["room"]


_ROOM_NAME = re.compile(r"\b(" + "|".join(name for room in ROOMS for name in (room, room.upper())) + r")\b")
"""A room named as the tool and the lookup list write it (``Harbor``) or in capitals: ``delta`` in "the time delta"
is a word, not the room."""
_BARE_ANSWER = re.compile(r"[\s\"'`*.!]*(\w+)[\s\"'`*.!]*")


def room_selection_grader(final_message: Optional[str], expected_choice: str) -> float:
    """1.0 when the answer commits to exactly one room and it is the expected one, else 0.0.

    A room counts when it is written as the room list writes it (``Harbor``, or ``HARBOR``); a reply that is only a
    room's name counts in any letter case (``harbor``). Naming several rooms (hedging), none, or another room scores
    0, and so does an answer with a negation ("not", "n't", "no", "none", "unavailable"...) or a hedge ("maybe",
    "perhaps"...) anywhere, since it may name the room to rule it out: "Do not book Harbor." scores 0.
    """
    if not final_message:
        return 0.0
    bare = _BARE_ANSWER.fullmatch(final_message)
    if bare is not None and bare.group(1).capitalize() in ROOMS:
        return 1.0 if bare.group(1).capitalize() == expected_choice else 0.0
    if NEGATION.search(final_message) or HEDGE.search(final_message):
        return 0.0
    named = {match.capitalize() for match in _ROOM_NAME.findall(final_message)}
    return 1.0 if named == {expected_choice} else 0.0


ROOM_TOOL: Dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_rooms_and_availability",
        "description": "List every meeting room with its capacity, equipment, step-free access and whether it is "
        "free for the whole requested slot.",
        "parameters": {
            "type": "object",
            "properties": {
                "date": {"type": "string", "description": "YYYY-MM-DD"},
                "time": {"type": "string", "description": "Start time, HH:MM (24 h)"},
                "duration_min": {"type": "integer", "description": "Length of the meeting in minutes"},
            },
            "required": ["date", "time", "duration_min"],
        },
    },
}


def prompt_template_baseline() -> agl.PromptTemplate:
    """The seed prompt the optimizers start from."""
    return agl.PromptTemplate(
        template="Find a room for this meeting.\n"
        "Date: {date}\nTime: {time}\nDuration: {duration_min} minutes\nAttendees: {attendees}\n"
        "Needs: {needs}\nStep-free access required: {accessible_required}",
        engine="f-string",
    )


def _prompt_fields(task: RoomSelectionTask) -> Dict[str, Any]:
    fields: Dict[str, Any] = {key: value for key, value in task.items() if key not in ("id", "expected_choice")}
    fields["needs"] = ", ".join(task["needs"]) or "nothing special"
    fields["accessible_required"] = "yes" if task["accessible_required"] else "no"
    return fields


def _client() -> Any:
    from openai import OpenAI

    return OpenAI(
        base_url=os.environ.get("OPENAI_BASE_URL"), api_key=os.environ.get("OPENAI_API_KEY") or "no-key-needed"
    )


def _run_tool_call(call: Any) -> str:
    if call.function.name != "get_rooms_and_availability":
        return json.dumps({"error": f"unknown tool {call.function.name}"})
    try:
        arguments = json.loads(call.function.arguments or "{}")
        rooms = get_rooms_and_availability(
            str(arguments["date"]), str(arguments["time"]), int(arguments["duration_min"])
        )
    except (KeyError, TypeError, ValueError) as exc:
        return json.dumps({"error": f"bad arguments: {exc}"})
    return json.dumps(rooms)


def model_settings(rollout: agl.Rollout, env_prefix: str, default_max_tokens: int) -> Tuple[str, int, float]:
    """Model, completion budget and temperature of an example agent's call, read from ``{env_prefix}_MODEL``,
    ``{env_prefix}_MAX_TOKENS`` and ``{env_prefix}_TRAIN_TEMPERATURE``."""
    model = os.environ.get(f"{env_prefix}_MODEL", "gpt-4.1-nano")
    max_tokens = int(os.environ.get(f"{env_prefix}_MAX_TOKENS", str(default_max_tokens)))
    # training runs sample (so a few-shot bootstrap gets varied attempts); validation and test runs are greedy
    temperature = float(os.environ.get(f"{env_prefix}_TRAIN_TEMPERATURE", "0.7")) if rollout.mode == "train" else 0.0
    return model, max_tokens, temperature


@agl.rollout
def room_selector(task: RoomSelectionTask, prompt_template: agl.PromptTemplate, rollout: agl.Rollout) -> float:
    """One booking: the model may call the lookup tool, then names a room; the grader scores the answer."""
    client = _client()
    model, max_tokens, temperature = model_settings(rollout, "ROOM_SELECTOR", 120)
    messages: List[Dict[str, Any]] = prompt_template.format_messages(**_prompt_fields(task))
    first = client.chat.completions.create(
        model=model,
        messages=messages,
        tools=[ROOM_TOOL],
        tool_choice="auto",
        max_tokens=max_tokens,
        temperature=temperature,
    )
    reply = first.choices[0].message
    final_message = reply.content
    if reply.tool_calls:
        messages.append(reply.model_dump(exclude_none=True))
        for call in reply.tool_calls:
            messages.append({"role": "tool", "tool_call_id": call.id, "content": _run_tool_call(call)})
        second = client.chat.completions.create(
            model=model, messages=messages, max_tokens=max_tokens, temperature=temperature
        )
        final_message = second.choices[0].message.content
    return _grade(task, final_message)


def _grade(task: RoomSelectionTask, final_message: Optional[str]) -> float:
    reward = room_selection_grader(final_message, task["expected_choice"])
    agl.emit_message(f"expected {task['expected_choice']}; answered {final_message!r}; reward {reward}")
    return reward


def format_rooms(task: RoomSelectionTask) -> str:
    """The lookup's result as the lookup variant shows it: one line per room."""
    lines = []
    for room in get_rooms_and_availability(task["date"], task["time"], task["duration_min"]):
        equipment = ", ".join(room["equipment"])
        lines.append(
            f"{room['room']}: {room['capacity']} seats; {equipment}; "
            f"{'step-free' if room['accessible'] else 'stairs'}; {'free' if room['free'] else 'booked'}"
        )
    return "\n".join(lines)


def prompt_template_lookup_baseline() -> agl.PromptTemplate:
    """The seed prompt of the lookup variant (the room list is filled in as ``{rooms}``)."""
    return agl.PromptTemplate(template=prompt_template_baseline().template + "\nRooms:\n{rooms}", engine="f-string")


@agl.rollout
def room_selector_lookup(task: RoomSelectionTask, prompt_template: agl.PromptTemplate, rollout: agl.Rollout) -> float:
    """The lookup variant: the agent's code runs the room lookup and puts the result in the prompt; one model call.

    Small local models do not emit tool calls for this task (see docs/apo.md); this variant keeps the task and the
    grader and leaves the model only the choice.
    """
    client = _client()
    model, max_tokens, temperature = model_settings(rollout, "ROOM_SELECTOR", 120)
    fields = {**_prompt_fields(task), "rooms": format_rooms(task)}
    response = client.chat.completions.create(
        model=model,
        messages=prompt_template.format_messages(**fields),
        max_tokens=max_tokens,
        temperature=temperature,
    )
    return _grade(task, response.choices[0].message.content)


def load_room_tasks(split: str, path: Path = TASKS_FILE) -> List[RoomSelectionTask]:
    """The shipped tasks of one split: ``train``, ``val`` (used by the optimizers to pick prompts) or ``test``
    (held out: only for the final figures)."""
    if split not in ("train", "val", "test"):
        raise ValueError(f"split must be train, val or test, got {split!r}")
    tasks: List[RoomSelectionTask] = []
    for line in path.read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        if record["split"] == split:
            tasks.append(
                RoomSelectionTask(id=record["id"], **record["task_input"], expected_choice=record["expected_choice"])
            )
    return tasks
