"""The room selector's grader against adversarial answers, its tasks and splits, and a whole run on the embedded model."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from examples.apo.room_selector import (
    ROOMS,
    TASKS_FILE,
    best_room,
    format_rooms,
    get_rooms_and_availability,
    load_room_tasks,
    room_selection_grader,
)

TASK = load_room_tasks("val")[0]
GOLD = TASK["expected_choice"]
OTHER = next(name for name in ROOMS if name != GOLD)


@pytest.mark.parametrize(
    ("answer", "reward"),
    [
        (GOLD, 1.0),
        (f"The best room is {GOLD}.", 1.0),
        (GOLD.lower(), 1.0),
        (None, 0.0),
        ("", 0.0),
        (OTHER, 0.0),
        (f"{GOLD} or {OTHER}", 0.0),  # several candidates
        (", ".join(ROOMS), 0.0),  # every room: the gold among distractors
        (json.dumps(get_rooms_and_availability(TASK["date"], TASK["time"], TASK["duration_min"])), 0.0),  # tool output
        (f"Find a room for {TASK['attendees']} people on {TASK['date']} at {TASK['time']}", 0.0),  # question copied
        ("x" * 100_000 + GOLD, 0.0),  # very long: no word boundary before the name
        ("word " * 20_000 + GOLD, 1.0),  # very long but naming only the gold room
        (f"{GOLD}ville", 0.0),  # not a room name
    ],
)
def test_grader_against_adversarial_answers(answer: str, reward: float) -> None:
    assert room_selection_grader(answer, GOLD) == reward


@pytest.mark.parametrize(
    "answer",
    [
        "Do not book Harbor.",
        "Harbor is unavailable, none fits",
        "Harbor isn't free.",
        "No room fits; Harbor is booked.",
        "Never Harbor.",
        "Maybe Harbor.",
        "Perhaps Harbor would do.",
        "Any room except Harbor.",
    ],
)
def test_grader_refuses_negated_and_hedged_answers(answer: str) -> None:
    assert room_selection_grader(answer, "Harbor") == 0.0


@pytest.mark.parametrize(
    "answer",
    [
        "Book Harbor; the time delta is fine",  # "delta" is a word here, not the room Delta
        "Harbor fits: it has a cedar desk and gale-proof windows.",  # lowercase room words are words
        "HARBOR",
        "**Harbor**",
        "harbor.",
        "I booked Harbor for you: it has a projector, a screen and a conference phone.",
        "The best room is Harbor.",
    ],
)
def test_grader_pays_the_room_named_as_the_room_list_writes_it(answer: str) -> None:
    assert room_selection_grader(answer, "Harbor") == 1.0


def test_grader_reads_lowercase_room_words_in_a_sentence_as_words() -> None:
    assert room_selection_grader("I would book harbor.", "Harbor") == 0.0  # no room named as the list writes it
    assert room_selection_grader("Book Harbor, then Delta.", "Harbor") == 0.0  # two rooms


def test_every_shipped_task_has_the_answer_of_the_rule() -> None:
    for split in ("train", "val", "test"):
        for task in load_room_tasks(split):
            fields = {k: task[k] for k in ("date", "time", "duration_min", "attendees", "needs", "accessible_required")}
            assert best_room(**fields) == task["expected_choice"], task["id"]


def test_splits_share_no_request_and_no_date() -> None:
    splits = {name: load_room_tasks(name) for name in ("train", "val", "test")}
    assert [len(tasks) for tasks in splits.values()] == [40, 24, 48]
    dates = {name: {task["date"] for task in tasks} for name, tasks in splits.items()}
    assert (
        not (dates["train"] & dates["val"])
        and not (dates["train"] & dates["test"])
        and not (dates["val"] & dates["test"])
    )
    for tasks in splits.values():
        most_common = Counter(task["expected_choice"] for task in tasks).most_common(1)[0][1]
        assert most_common <= len(tasks) // 4  # naming one room always scores at most 25%


def test_the_generator_reproduces_the_shipped_file(tmp_path: pytest.TempPathFactory) -> None:
    from examples.apo.make_room_tasks import main

    output = tmp_path / "tasks.jsonl"  # type: ignore[operator]
    main(["--output", str(output)])
    assert output.read_text(encoding="utf-8") == TASKS_FILE.read_text(encoding="utf-8")


def test_the_lookup_variant_lists_every_room() -> None:
    lines = format_rooms(TASK).splitlines()
    assert [line.split(":")[0] for line in lines] == list(ROOMS)
    assert all(line.endswith(("free", "booked")) for line in lines)


def test_the_report_slices_by_needs_and_by_expected_room() -> None:
    from examples.apo.room_selector_apo import constant_answer_score, slice_report

    tasks = load_room_tasks("test")
    counts = Counter(task["expected_choice"] for task in tasks)
    room, frequency = counts.most_common(1)[0]
    # an answer that ignores the request: right exactly when the expected room is the most frequent one
    rewards = [1.0 if task["expected_choice"] == room else 0.0 for task in tasks]
    report = slice_report(tasks, rewards)
    assert report["all"]["solved"] == frequency and report["all"]["total"] == len(tasks)
    assert report[f"expected-{room}"]["score"] == 1.0
    assert all(report[f"expected-{other}"]["score"] == 0.0 for other in counts if other != room)
    assert sum(report[f"needs-{n}"]["total"] for n in range(4) if f"needs-{n}" in report) == len(tasks)
    low, high = report["all"]["ci95"]
    assert low < frequency / len(tasks) < high
    assert constant_answer_score(tasks) == {"answer": room, "score": frequency / len(tasks)}
    assert constant_answer_score([]) == {"answer": "", "score": 0.0}
