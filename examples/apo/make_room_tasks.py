"""Generate ``room_tasks.jsonl``: booking requests with the room the grader expects, in three disjoint splits.

Run ``python -m examples.apo.make_room_tasks`` to rebuild the shipped file (fixed seed, same output every time).
The splits use different dates (train: 1-12 October 2025, val: 13-20, test: 21-31), so no request of one split is a
rewording of another's: the rooms' bookings differ by day, and so do the answers. Requests with no fitting room are
dropped, and no room may be the answer to more than a quarter of a split (a model always naming one room cannot
score above 25%).
"""

from __future__ import annotations

import argparse
import json
import random
from collections import Counter
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from examples.apo.room_selector import EQUIPMENT, TASKS_FILE, best_room

SPLITS = {"train": (1, 12, 40), "val": (13, 20, 24), "test": (21, 31, 48)}
"""split -> (first day, last day, number of tasks)."""
SEED = 20251013


def make_split(rng: random.Random, name: str, first_day: int, last_day: int, count: int) -> List[Dict[str, Any]]:
    """``count`` tasks on days ``first_day``..``last_day`` of October 2025."""
    tasks: List[Dict[str, Any]] = []
    answers: Counter[str] = Counter()
    seen = set()
    while len(tasks) < count:
        request = {
            "date": f"2025-10-{rng.randint(first_day, last_day):02d}",
            "time": f"{rng.randint(8, 16):02d}:{rng.choice(['00', '30'])}",
            "duration_min": rng.choice([30, 45, 60, 90]),
            "attendees": rng.randint(2, 24),
            "needs": sorted(rng.sample(EQUIPMENT, rng.choice([0, 1, 1, 2]))),
            "accessible_required": rng.random() < 0.3,
        }
        key = json.dumps(request, sort_keys=True)
        answer = best_room(**request)
        if answer is None or key in seen or answers[answer] >= count // 4:
            continue
        seen.add(key)
        answers[answer] += 1
        tasks.append(
            {"id": f"{name}-{len(tasks):03d}", "split": name, "task_input": request, "expected_choice": answer}
        )
    return tasks


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, default=TASKS_FILE)
    args = parser.parse_args(argv)
    rng = random.Random(SEED)
    lines = [
        json.dumps(task)
        for name, (first, last, count) in SPLITS.items()
        for task in make_split(rng, name, first, last, count)
    ]
    args.output.write_text("\n".join(lines) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
