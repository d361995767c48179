"""Optimize the room selector's prompt with APO, ParetoAPO or FewShotAPO, then score seed and best on held-out tasks.

By default everything runs on this machine: the embedded SmolLM2-135M-Instruct is served by agentbolt's
transformers engine (an OpenAI-compatible server on 127.0.0.1) and plays both the agent and, for the optimizers
that ask a model, the optimizer. With ``--hosted`` the agent and the optimizer use the OpenAI-compatible service
named by ``OPENAI_BASE_URL`` / ``OPENAI_API_KEY`` instead::

    python -m examples.apo.room_selector_apo                       # few-shot search, embedded model
    python -m examples.apo.room_selector_apo --algorithm apo       # the tutorial's beam search
    python -m examples.apo.room_selector_apo --algorithm pareto --hosted --agent-model gpt-4.1-nano \\
        --optimizer-model gpt-5-mini

The optimizers choose prompts on the ``val`` split; the figures printed at the end (a JSON document, also written
with ``--output``) are measured on the ``test`` split, which no optimizer sees.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence

import agentbolt as agl
from agentbolt.algorithm.apo import PromptSearch, VersionedPromptTemplate, load_search_run
from agentbolt.utils.server_launcher import pick_free_port
from agentbolt.utils.stats import wilson_interval
from examples.apo.room_selector import (
    RoomSelectionTask,
    load_room_tasks,
    prompt_template_baseline,
    prompt_template_lookup_baseline,
    room_selector,
    room_selector_lookup,
)
from examples.common.arguments import count
from examples.common.environment import require_openai_service

logger = logging.getLogger("examples.apo.room_selector_apo")

EMBEDDED_MODEL = "smollm2-135m-instruct"


def check_hosted(parser: argparse.ArgumentParser, hosted: bool) -> None:
    """With ``--hosted``, exit 2 unless ``OPENAI_API_KEY`` is set and ``OPENAI_BASE_URL`` answers (checked before the
    runners start, so a missing key is one line, not a traceback or a run of failed rollouts)."""
    if hosted:
        require_openai_service(
            parser, needed_by="--hosted", alternative="drop --hosted to run on the embedded model, which needs no key"
        )


def task_slices(task: RoomSelectionTask) -> List[str]:
    """The slices a test task is reported in: how many equipment needs it has, and which room is right.

    The second slicing shows whether a prompt solves requests or only names one room more often: a model that
    always answers the same room scores 1.0 on that room's slice and 0 on every other.
    """
    return [f"needs-{len(task['needs'])}", f"expected-{task['expected_choice']}"]


def slice_report(
    tasks: Sequence[Any], rewards: Sequence[float], slices_of: Callable[[Any], List[str]] = task_slices
) -> Dict[str, Any]:
    """Score overall and per slice (``slices_of(task)`` names a task's slices), with 95% Wilson intervals."""
    groups: Dict[str, List[float]] = defaultdict(list)
    for task, reward in zip(tasks, rewards, strict=True):
        groups["all"].append(reward)
        for name in slices_of(task):
            groups[name].append(reward)
    report = {}
    for name, values in sorted(groups.items()):
        solved = sum(1 for v in values if v >= 1.0)
        low, high = wilson_interval(solved, len(values))
        report[name] = {"solved": solved, "total": len(values), "score": solved / len(values), "ci95": [low, high]}
    return report


def _expected_room(task: RoomSelectionTask) -> str:
    return task["expected_choice"]


def constant_answer_score(tasks: Sequence[Any], expected_of: Callable[[Any], str] = _expected_room) -> Dict[str, Any]:
    """The best score an answer that ignores the request can reach: always giving the most frequent right answer
    (``expected_of(task)``; by default the room)."""
    counts = Counter(expected_of(task) for task in tasks)
    answer, solved = counts.most_common(1)[0] if counts else ("", 0)
    return {"answer": answer, "score": solved / len(tasks) if tasks else 0.0}


class OptimizeThenTest(agl.Algorithm):
    """Run a prompt optimizer, then score the seed and its best prompt on held-out tasks with the same runners.

    ``slices_of`` and ``expected_of`` describe the test tasks (by default the room selector's): the slices a task
    is reported in and its right answer (for the constant-answer baseline).
    """

    def __init__(
        self,
        optimizer: PromptSearch,
        test_tasks: Sequence[Any],
        *,
        slices_of: Callable[[Any], List[str]] = task_slices,
        expected_of: Callable[[Any], str] = _expected_room,
    ) -> None:
        self.optimizer = optimizer
        self.test_tasks = list(test_tasks)
        self.slices_of = slices_of
        self.expected_of = expected_of
        self.report: Dict[str, Any] = {}

    async def run(self, train_dataset: Any = None, val_dataset: Any = None) -> None:
        optimizer = self.optimizer
        optimizer.set_store(self.get_store())
        optimizer.set_adapter(self.get_adapter())
        optimizer.set_initial_resources(self.get_initial_resources() or {})
        started = time.perf_counter()
        await optimizer.run(train_dataset=train_dataset, val_dataset=val_dataset)
        search_seconds = time.perf_counter() - started
        search = optimizer.summary()  # before the test rollouts below, which the optimizer counts too
        _, seed = optimizer.get_seed_prompt_template()
        best = optimizer.get_best_prompt()
        tasks = [(str(i), task) for i, task in enumerate(self.test_tasks)]
        optimizer.current_round = -1
        seed_eval, best_eval = await asyncio.gather(
            optimizer.evaluate(VersionedPromptTemplate("test-seed", seed), tasks, mode="test", purpose="test"),
            optimizer.evaluate(VersionedPromptTemplate("test-best", best), tasks, mode="test", purpose="test"),
        )
        self.report = {
            "algorithm": type(optimizer).__name__,
            "search_seconds": search_seconds,
            "search": search,
            "best_prompt": best.template,
            "test_seed": slice_report(self.test_tasks, seed_eval.rewards, self.slices_of),
            "test_best": slice_report(self.test_tasks, best_eval.rewards, self.slices_of),
            "test_constant_answer": constant_answer_score(self.test_tasks, self.expected_of),
            "candidates": [
                {
                    "version": record.version,
                    "origin": record.origin,
                    "parents": record.parents,
                    "val_full": record.mean("val-full"),
                    "val_batch": record.mean("val-batch"),
                    "note": record.note[:400],
                }
                for record in await load_search_run(self.get_store(), optimizer.run_id)
                if not record.version.startswith("test-")
            ],
        }


def build_optimizer(args: argparse.Namespace, client: Any) -> PromptSearch:
    """The optimizer named by ``--algorithm``, configured for a CPU run."""
    common: Dict[str, Any] = {
        "seed": args.seed,
        "rollout_batch_timeout": 1800.0,
        "optimizer_max_tokens": args.optimizer_max_tokens,
    }
    if args.max_optimizer_tokens:
        common["max_optimizer_tokens"] = args.max_optimizer_tokens
    if args.algorithm == "apo":
        return agl.APO(
            client,
            gradient_model=args.optimizer_model,
            apply_edit_model=args.optimizer_model,
            val_batch_size=args.val_batch_size,
            gradient_batch_size=4,
            beam_width=2,
            branch_factor=2,
            beam_rounds=args.rounds,
            **common,
        )
    if args.algorithm == "pareto":
        return agl.ParetoAPO(
            client, reflection_model=args.optimizer_model, reflection_batch_size=4, rounds=args.rounds * 2, **common
        )
    return agl.FewShotAPO(
        max_demos=3,
        bootstrap_tasks=args.limit or 40,
        bootstrap_repeats=args.bootstrap_repeats,
        num_candidate_sets=4,
        val_batch_size=args.val_batch_size,
        finalists=1,
        demo_format=args.demo_format,
        **common,
    )


@contextlib.contextmanager
def embedded_model(runners: int, threads: Optional[int]) -> Iterator[str]:
    """Serve the embedded model on 127.0.0.1; yields the OpenAI base URL."""
    from agentbolt.demo.run import resolve_demo_dtype
    from agentbolt.models import resolve_model
    from agentbolt.serving.server import InferenceServer
    from agentbolt.serving.transformers_engine import TransformersEngine

    engine = TransformersEngine(
        resolve_model(EMBEDDED_MODEL).path,
        dtype=resolve_demo_dtype("auto"),
        served_name=EMBEDDED_MODEL,
        threads=threads,
        max_batch_size=max(1, runners),
    )
    server = InferenceServer(engine, host="127.0.0.1", port=0)
    server.start()
    try:
        yield server.base_url
    finally:
        server.stop()


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Optimize the room selector's prompt and test it on held-out tasks.")
    parser.add_argument("--algorithm", choices=["fewshot", "apo", "pareto"], default="fewshot")
    parser.add_argument(
        "--hosted", action="store_true", help="use OPENAI_BASE_URL / OPENAI_API_KEY, not the embedded model"
    )
    parser.add_argument("--agent-model", default=None, help="model of the agent (default: embedded, or gpt-4.1-nano)")
    parser.add_argument("--optimizer-model", default=None, help="model of the optimizer (default: the agent's model)")
    parser.add_argument(
        "--variant",
        choices=["tool", "lookup"],
        default=None,
        help="tool: the model calls the lookup tool (the tutorial's agent; default with --hosted); lookup: the agent "
        "runs the lookup and the model only chooses (default with the embedded model, which emits no tool calls)",
    )
    parser.add_argument("--max-tokens", type=count(), default=None, help="completion budget of each agent call")
    parser.add_argument(
        "--optimizer-max-tokens", type=count(), default=400, help="completion budget of optimizer calls"
    )
    parser.add_argument("--rounds", type=count(0), default=2, help="beam rounds (apo); pareto runs twice as many")
    parser.add_argument("--val-batch-size", type=count(), default=12)
    parser.add_argument("--bootstrap-repeats", type=count(), default=2, help="fewshot: runs per bootstrap task")
    parser.add_argument(
        "--demo-format",
        choices=["text", "messages"],
        default="text",
        help="fewshot: examples written into the prompt, or sent as earlier chat turns with their tool calls",
    )
    parser.add_argument("--max-optimizer-tokens", type=count(), default=None)
    add_run_options(parser)
    args = parser.parse_args(argv)
    check_hosted(parser, args.hosted)
    return args


def add_run_options(parser: argparse.ArgumentParser) -> None:
    """The options every optimize-then-test example shares: runners, engine threads, seed, limit, store, output."""
    parser.add_argument("--runners", type=count(), default=4)
    parser.add_argument("--threads", type=count(), default=None, help="torch threads of the embedded engine")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--limit", type=count(), default=None, help="use only the first N tasks of each split (a quick look)"
    )
    parser.add_argument("--port", type=int, default=None, help="port of the trainer's store server (default: free)")
    parser.add_argument(
        "--store", default=None, help="SQLite file keeping every rollout and candidate (default: memory)"
    )
    parser.add_argument("--output", type=Path, default=None, help="write the result JSON here too")


@contextlib.contextmanager
def agent_endpoint(args: argparse.Namespace) -> Iterator[str]:
    """Point the OpenAI environment at the agent's model: the embedded one served here, or with ``--hosted`` the
    service already named by ``OPENAI_BASE_URL`` / ``OPENAI_API_KEY``. Yields the agent's model name."""
    if args.hosted:
        yield args.agent_model or "gpt-4.1-nano"
        return
    with embedded_model(args.runners, args.threads) as base_url:
        os.environ["OPENAI_BASE_URL"] = base_url
        os.environ["OPENAI_API_KEY"] = "local"
        yield args.agent_model or EMBEDDED_MODEL


def fit(
    args: argparse.Namespace, algorithm: agl.Algorithm, agent: Any, seed: agl.PromptTemplate, train: Any, val: Any
) -> None:
    """Run ``algorithm`` on ``agent`` under a Trainer with ``args.runners`` runner processes."""
    trainer = agl.Trainer(
        algorithm=algorithm,
        n_runners=args.runners,
        port=args.port or pick_free_port("127.0.0.1"),  # the store server the runner processes talk to
        store=args.store,
        initial_resources={"prompt_template": seed},
        adapter=agl.TraceToMessages(),
    )
    import openai  # noqa: F401  (loaded before the runner processes fork, so they share it)

    trainer.fit(agent, train_dataset=train, val_dataset=val)


def write_report(report: Dict[str, Any], output: Optional[Path]) -> None:
    """Print the report as JSON, and write it to ``output`` too when given."""
    text = json.dumps(report, indent=1)
    if output:
        output.write_text(text + "\n", encoding="utf-8")
    print(text)


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", datefmt="%H:%M:%S")
    started = time.perf_counter()
    with agent_endpoint(args) as agent_model:
        os.environ["ROOM_SELECTOR_MODEL"] = agent_model
        variant = args.variant or ("tool" if args.hosted else "lookup")
        max_tokens = args.max_tokens or (120 if args.hosted else 24)
        os.environ["ROOM_SELECTOR_MAX_TOKENS"] = str(max_tokens)
        args.optimizer_model = args.optimizer_model or agent_model
        from openai import AsyncOpenAI

        client = AsyncOpenAI(base_url=os.environ.get("OPENAI_BASE_URL"), api_key=os.environ.get("OPENAI_API_KEY"))
        train, val, test = (load_room_tasks(split)[: args.limit] for split in ("train", "val", "test"))
        algorithm = OptimizeThenTest(build_optimizer(args, client), test)
        if variant == "tool":
            agent, seed = room_selector, prompt_template_baseline()
        else:
            agent, seed = room_selector_lookup, prompt_template_lookup_baseline()
        fit(args, algorithm, agent, seed, train, val)
    report = {
        **algorithm.report,
        "agent_model": agent_model,
        "variant": variant,
        "agent_max_tokens": max_tokens,
        "optimizer_model": args.optimizer_model if args.algorithm != "fewshot" else None,
        "runners": args.runners,
        "wall_seconds": time.perf_counter() - started,
    }
    write_report(report, args.output)
    return report


if __name__ == "__main__":
    main()
