"""What guided decoding (``guided_regex``) costs per generated token on the embedded model, beside the same requests
unguided, in one run.

The requests are Flow-GRPO planner-like: a system prompt naming four tools and a question; the guided variant keeps
the answer to ``{"tool_name": "<tool>", "sub_goal": "<any JSON string>"}``. For each temperature it runs
``--rounds`` alternating rounds of the unguided and the guided request (``n`` choices each, fixed seeds) and reports
the median seconds per generated token, their ratio, how many choices match the pattern, and the tokens the guided
choices generated.

Usage::

    python benchmarks/guided_decoding.py [--temperatures 0 0.7 1.0] [--rounds 3] [--n 8] [--threads 2]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any, Dict, List

from result_files import RunRecord, add_result_options

SYSTEM = (
    "You plan the next step towards answering a question. Tools:\n- search: look up a fact\n"
    "- calculator: compute with numbers\n- python: run a short program\n- finish: stop\n"
    'Reply with JSON only: {"tool_name": "...", "sub_goal": "..."}'
)
QUESTION = "Question: How many years passed between the founding of Ashstead and 1900?\nJSON:"
PATTERN = r'\{"tool_name": "(?:search|calculator|python|finish)", "sub_goal": "(?:[^"\\\x00-\x1f]|\\.)*"\}'


def main() -> None:
    record = RunRecord.start(__file__)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 0.7, 1.0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--n", type=int, default=8, help="choices per request")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    add_result_options(parser)
    args = parser.parse_args()

    import regex

    from agentbolt.serving.params import SamplingParams
    from agentbolt.serving.transformers_engine import TransformersEngine

    engine = TransformersEngine(args.model, dtype="float32", threads=args.threads, max_batch_size=args.n)
    engine.start()
    try:
        prompt = engine.encode_chat([{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}])
        # Build the token texts once before timing (the engine does it at its first guided request).
        engine.generate_sync(prompt, SamplingParams(max_tokens=1, temperature=0, guided_regex=PATTERN))
        rows: List[Dict[str, Any]] = []
        for temperature in args.temperatures:
            per_token: Dict[str, List[float]] = {"unguided": [], "guided": []}
            matched = tokens = 0
            for round_index in range(args.rounds):
                for variant in ("unguided", "guided"):
                    params = SamplingParams(
                        max_tokens=args.max_tokens,
                        temperature=temperature,
                        n=args.n,
                        seed=round_index * args.n,
                        guided_regex=PATTERN if variant == "guided" else None,
                    )
                    start = time.perf_counter()
                    out = engine.generate_sync(prompt, params)
                    elapsed = time.perf_counter() - start
                    generated = sum(len(choice.token_ids) for choice in out.choices)
                    per_token[variant].append(elapsed / generated)
                    if variant == "guided":
                        tokens += generated
                        matched += sum(1 for choice in out.choices if regex.fullmatch(PATTERN, choice.text))
            unguided_ms = statistics.median(per_token["unguided"]) * 1000
            guided_ms = statistics.median(per_token["guided"]) * 1000
            rows.append(
                {
                    "temperature": temperature,
                    "unguided_ms_per_token": round(unguided_ms, 3),
                    "guided_ms_per_token": round(guided_ms, 3),
                    "guided_over_unguided": round(guided_ms / unguided_ms, 3),
                    "guided_choices_matching": matched,
                    "guided_choices": args.rounds * args.n,
                    "guided_tokens": tokens,
                }
            )
            print(rows[-1], file=sys.stderr, flush=True)
    finally:
        engine.stop()
    report = {"model": args.model, "n": args.n, "rounds": args.rounds, "pattern": PATTERN, "by_temperature": rows}
    record.finish(report, args)


if __name__ == "__main__":
    main()
