"""Few-shot prompt optimization of the name formatter, then seed and best prompt scored on held-out requests.

``FewShotAPO`` runs the seed prompt (the rule in words) on training requests, keeps the runs the grader rewarded as
worked examples, and searches which of them to put into the prompt; no optimizer model is asked. By default the
embedded SmolLM2-135M-Instruct is the agent, served by agentbolt's transformers engine on 127.0.0.1; with
``--hosted`` the agent is the OpenAI-compatible service named by ``OPENAI_BASE_URL`` / ``OPENAI_API_KEY``::

    python -m examples.apo.fewshot_names                 # embedded model, minutes on 2 cores
    python -m examples.apo.fewshot_names --limit 8       # a quick look

The optimizer chooses prompts on the ``val`` split; the figures printed at the end (a JSON document, also written
with ``--output``) are measured on the ``test`` split, whose names share no first, middle or last name with the
others. Beside them: the score of the best constant answer, per-shape slices with 95% Wilson intervals, and the
optimizer's repetition guard per candidate (``search.echo_checks``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import time
from pathlib import Path
from typing import Any, Dict, Optional, Sequence

import agentbolt as agl
from agentbolt.utils.server_launcher import pick_free_port
from examples.apo.name_formatter import (
    make_name_tasks,
    name_formatter,
    name_task_slices,
    prompt_template_names_baseline,
)
from examples.apo.room_selector_apo import EMBEDDED_MODEL, OptimizeThenTest, embedded_model

logger = logging.getLogger("examples.apo.fewshot_names")


def build_optimizer(args: argparse.Namespace) -> agl.FewShotAPO:
    """FewShotAPO configured for a CPU run."""
    return agl.FewShotAPO(
        max_demos=args.max_demos,
        bootstrap_tasks=args.limit or 40,
        bootstrap_repeats=args.bootstrap_repeats,
        num_candidate_sets=args.candidates,
        val_batch_size=args.val_batch_size,
        finalists=args.finalists,
        demo_format=args.demo_format,
        seed=args.seed,
        rollout_batch_timeout=1800.0,
    )


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Few-shot optimize the name formatter's prompt; test it held out.")
    parser.add_argument(
        "--hosted", action="store_true", help="use OPENAI_BASE_URL / OPENAI_API_KEY, not the embedded model"
    )
    parser.add_argument("--agent-model", default=None, help="model of the agent (default: embedded, or gpt-4.1-nano)")
    parser.add_argument("--max-tokens", type=int, default=16, help="completion budget of each agent call")
    parser.add_argument("--max-demos", type=int, default=3, help="most demonstrations in one prompt")
    parser.add_argument("--candidates", type=int, default=4, help="candidate selections of demonstrations")
    parser.add_argument("--val-batch-size", type=int, default=12)
    parser.add_argument("--finalists", type=int, default=2, help="candidates scored on the whole val split")
    parser.add_argument("--bootstrap-repeats", type=int, default=2, help="runs of the seed per training request")
    parser.add_argument(
        "--demo-format",
        choices=["text", "messages"],
        default="messages",
        help="examples sent as earlier chat turns (default: what the 135M model follows), or written into the prompt",
    )
    parser.add_argument("--runners", type=int, default=4)
    parser.add_argument("--threads", type=int, default=None, help="torch threads of the embedded engine")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--limit", type=int, default=None, help="use only the first N requests of each split (a quick look)"
    )
    parser.add_argument("--port", type=int, default=None, help="port of the trainer's store server (default: free)")
    parser.add_argument(
        "--store", default=None, help="SQLite file keeping every rollout and candidate (default: memory)"
    )
    parser.add_argument("--output", type=Path, default=None, help="write the result JSON here too")
    return parser.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", datefmt="%H:%M:%S")
    started = time.perf_counter()
    with contextlib.ExitStack() as stack:
        if args.hosted:
            agent_model = args.agent_model or "gpt-4.1-nano"
        else:
            base_url = stack.enter_context(embedded_model(args.runners, args.threads))
            os.environ["OPENAI_BASE_URL"] = base_url
            os.environ["OPENAI_API_KEY"] = "local"
            agent_model = args.agent_model or EMBEDDED_MODEL
        os.environ["NAME_FORMATTER_MODEL"] = agent_model
        os.environ["NAME_FORMATTER_MAX_TOKENS"] = str(args.max_tokens)
        train, val, test = (make_name_tasks(split)[: args.limit] for split in ("train", "val", "test"))
        algorithm = OptimizeThenTest(
            build_optimizer(args), test, slices_of=name_task_slices, expected_of=lambda task: task["expected"]
        )
        trainer = agl.Trainer(
            algorithm=algorithm,
            n_runners=args.runners,
            port=args.port or pick_free_port("127.0.0.1"),  # the store server the runner processes talk to
            store=args.store,
            initial_resources={"prompt_template": prompt_template_names_baseline()},
            adapter=agl.TraceToMessages(),
        )
        import openai  # noqa: F401  (loaded before the runner processes fork, so they share it)

        trainer.fit(name_formatter, train_dataset=train, val_dataset=val)
    report = {
        **algorithm.report,
        "agent_model": agent_model,
        "agent_max_tokens": args.max_tokens,
        "runners": args.runners,
        "wall_seconds": time.perf_counter() - started,
    }
    text = json.dumps(report, indent=1)
    if args.output:
        args.output.write_text(text + "\n", encoding="utf-8")
    print(text)
    return report


if __name__ == "__main__":
    main()
