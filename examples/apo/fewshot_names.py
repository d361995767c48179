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
import logging
import os
import time
from typing import Any, Dict, Optional, Sequence

import agentbolt as agl
from examples.apo.name_formatter import (
    make_name_tasks,
    name_formatter,
    name_task_slices,
    prompt_template_names_baseline,
)
from examples.apo.room_selector_apo import (
    OptimizeThenTest,
    add_run_options,
    agent_endpoint,
    check_hosted,
    fit,
    write_report,
)
from examples.common.arguments import count

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
    parser.add_argument("--max-tokens", type=count(), default=16, help="completion budget of each agent call")
    parser.add_argument("--max-demos", type=count(), default=3, help="most demonstrations in one prompt")
    parser.add_argument("--candidates", type=count(), default=4, help="candidate selections of demonstrations")
    parser.add_argument("--val-batch-size", type=count(), default=12)
    parser.add_argument("--finalists", type=count(), default=2, help="candidates scored on the whole val split")
    parser.add_argument("--bootstrap-repeats", type=count(), default=2, help="runs of the seed per training request")
    parser.add_argument(
        "--demo-format",
        choices=["text", "messages"],
        default="messages",
        help="examples sent as earlier chat turns (default: what the 135M model follows), or written into the prompt",
    )
    add_run_options(parser)
    args = parser.parse_args(argv)
    check_hosted(parser, args.hosted)
    return args


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", datefmt="%H:%M:%S")
    started = time.perf_counter()
    with agent_endpoint(args) as agent_model:
        os.environ["NAME_FORMATTER_MODEL"] = agent_model
        os.environ["NAME_FORMATTER_MAX_TOKENS"] = str(args.max_tokens)
        train, val, test = (make_name_tasks(split)[: args.limit] for split in ("train", "val", "test"))
        algorithm = OptimizeThenTest(
            build_optimizer(args), test, slices_of=name_task_slices, expected_of=lambda task: task["expected"]
        )
        fit(args, algorithm, name_formatter, prompt_template_names_baseline(), train, val)
    report = {
        **algorithm.report,
        "agent_model": agent_model,
        "agent_max_tokens": args.max_tokens,
        "runners": args.runners,
        "wall_seconds": time.perf_counter() - started,
    }
    write_report(report, args.output)
    return report


if __name__ == "__main__":
    main()
