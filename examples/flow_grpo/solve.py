"""Run the Flow-GRPO solver on one question and print every step.

Examples::

    # Embedded SmolLM2-135M for every role, served in-process (no API key, CPU):
    python -m examples.flow_grpo.solve "Calculate 12 squared, then find a major historical event in that year"

    # The planner from a GRPO checkpoint (a LoRA adapter on the same base model); other roles use the base model:
    python -m examples.flow_grpo.solve --checkpoint checkpoints/step_000100 "What is (17 + 25) * 3?"

    # Any OpenAI-compatible endpoints (vLLM, agentbolt serve, a hosted API):
    python -m examples.flow_grpo.solve --planner-url http://127.0.0.1:8000/v1 --planner-model planner \\
        --fixed-url http://127.0.0.1:8001/v1 --fixed-model Qwen/Qwen2.5-7B-Instruct "Who painted the Mona Lisa?"

``--checkpoint`` accepts a checkpoint written by agentbolt's GRPO (``step_*`` with ``adapter/`` or
``model.safetensors``), a directory of such checkpoints (the latest is used), or a PEFT adapter directory. The
prompts, tools and tool names are the ones used in training, and so is the solve loop when the checkpoint lies in a
training run's directory: its ``config.json`` gives the ``solver`` settings the planner was trained with (turns,
worked examples, decoding guide, memory budget); ``--max-turns`` overrides the turns only.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

from examples.flow_grpo.agents import RoleLLM
from examples.flow_grpo.solver import FlowSolver, SolverConfig

__all__ = [
    "local_endpoints",
    "main",
    "open_endpoints",
    "resolve_checkpoint",
    "resolve_checkpoint_argument",
    "training_solver_config",
]

_STEP_PREFIX = "step_"


class CheckpointError(ValueError):
    """The ``--checkpoint`` path is not something the solver can load."""


def resolve_checkpoint(path: Path) -> Tuple[str, Path]:
    """``("adapter", adapter_dir)`` or ``("full", weights_file)`` for a checkpoint path.

    Raises:
        CheckpointError: Nothing loadable at ``path``.
    """
    if not path.exists():
        raise CheckpointError(f"checkpoint {path} does not exist")
    if (path / "adapter" / "adapter_config.json").is_file():
        return "adapter", path / "adapter"
    if (path / "adapter_config.json").is_file():
        return "adapter", path
    if (path / "model.safetensors").is_file() and (path / "trainer_state.json").is_file():
        return "full", path / "model.safetensors"
    steps = (
        sorted(
            (
                p
                for p in path.iterdir()
                if p.is_dir() and p.name.startswith(_STEP_PREFIX) and (p / "trainer_state.json").is_file()
            ),
            key=lambda p: p.name,
        )
        if path.is_dir()
        else []
    )
    if steps:
        return resolve_checkpoint(steps[-1])
    raise CheckpointError(
        f"{path} is neither a GRPO checkpoint (adapter/ or model.safetensors with trainer_state.json), "
        "a directory of step_* checkpoints, nor a PEFT adapter directory"
    )


def training_solver_config(checkpoint: Optional[Path]) -> Tuple[SolverConfig, Optional[Path]]:
    """The solve loop a planner checkpoint was trained in, and the file it was read from.

    It is the ``flow.solver`` section of the training run's ``config.json``, the nearest one in ``checkpoint`` or up
    to three folders above it (``RUN/checkpoints/step_N/adapter``). Without one (no checkpoint, or an adapter from
    elsewhere): the :class:`SolverConfig` defaults and None.
    """
    if checkpoint is not None:
        for folder in [checkpoint, *checkpoint.resolve().parents][:4]:
            path = folder / "config.json"
            try:
                data = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None
            except ValueError:
                continue
            flow = data.get("flow") if isinstance(data, dict) else None
            solver = flow.get("solver") if isinstance(flow, dict) else None
            if isinstance(solver, dict):
                return SolverConfig(**solver), path
    return SolverConfig(), None


def _parse_args(argv: Optional[List[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m examples.flow_grpo.solve", description="Solve one question with the multi-agent solver."
    )
    parser.add_argument("question", help="The question to solve.")
    parser.add_argument("--model", default="smollm2-135m-instruct", help="Base model served locally for every role.")
    parser.add_argument("--checkpoint", type=Path, help="Planner checkpoint (see the module help).")
    parser.add_argument("--planner-url", help="OpenAI-compatible base URL of the planner (instead of a local model).")
    parser.add_argument("--planner-model", help="Model name at --planner-url.")
    parser.add_argument("--fixed-url", help="Base URL of the fixed model for the other roles (default: --planner-url).")
    parser.add_argument("--fixed-model", help="Model name at --fixed-url (default: --planner-model).")
    parser.add_argument("--api-key", default=None, help="API key for the endpoints.")
    parser.add_argument(
        "--max-turns",
        type=int,
        default=None,
        help="Planner turns at most (default: the checkpoint's training run's, else 4).",
    )
    parser.add_argument("--temperature", type=float, default=0.0, help="Planner sampling temperature (default 0).")
    parser.add_argument(
        "--dtype",
        default="auto",
        help="Local engine dtype (default auto: bfloat16 where the CPU multiplies it natively, else float32).",
    )
    parser.add_argument("--threads", type=int, default=None, help="Local engine CPU threads.")
    parser.add_argument("--json", action="store_true", help="Print the result as one JSON object at the end.")
    args = parser.parse_args(argv)
    if args.max_turns is not None and args.max_turns < 1:
        parser.error("--max-turns must be at least 1")
    if (args.planner_url is None) != (args.planner_model is None):
        parser.error("--planner-url and --planner-model go together")
    if args.planner_url is None and (args.fixed_url or args.fixed_model):
        parser.error("--fixed-url/--fixed-model need --planner-url (the local mode serves one base model)")
    if args.planner_url is not None and args.checkpoint is not None:
        parser.error("--checkpoint loads into the local engine; serve it yourself when using --planner-url")
    resolve_checkpoint_argument(parser, args)
    return args


def resolve_checkpoint_argument(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Set ``args.checkpoint_kind`` / ``args.checkpoint_path`` from ``--checkpoint`` (exit 2 with the reason if bad)."""
    if args.checkpoint is not None:
        try:
            args.checkpoint_kind, args.checkpoint_path = resolve_checkpoint(args.checkpoint)
        except CheckpointError as exc:
            parser.error(str(exc))


def open_endpoints(args: argparse.Namespace, stack: contextlib.ExitStack) -> Tuple[str, str, str, str]:
    """(planner url, model, fixed url, model): the ``--planner-url``/``--fixed-url`` servers when given, else the
    base model (and planner checkpoint) served in-process until ``stack`` closes."""
    if args.planner_url is not None:
        return (
            args.planner_url,
            args.planner_model,
            args.fixed_url or args.planner_url,
            args.fixed_model or args.planner_model,
        )
    print(f"Loading {args.model} ...", file=sys.stderr)
    return stack.enter_context(local_endpoints(args))


@contextlib.contextmanager
def local_endpoints(args: argparse.Namespace) -> Iterator[Tuple[str, str, str, str]]:
    """Serve the base model (and the planner checkpoint) in-process; yield (planner url, model, fixed url, model).

    ``args`` needs ``model``, ``dtype`` and ``threads``, and ``checkpoint_kind`` / ``checkpoint_path`` (from
    :func:`resolve_checkpoint`) to load a planner checkpoint.
    """
    from agentbolt.demo.run import resolve_demo_dtype
    from agentbolt.serving.server import InferenceServer
    from agentbolt.serving.transformers_engine import TransformersEngine

    dtype = resolve_demo_dtype(args.dtype)
    servers: List[InferenceServer] = []
    try:
        base = InferenceServer(
            TransformersEngine(args.model, dtype=dtype, threads=args.threads, served_name="base"), port=0
        )
        base.start()
        servers.append(base)
        planner_url, planner_model = base.base_url, "base"
        kind = getattr(args, "checkpoint_kind", None)
        if kind == "adapter":
            base.engine.load_adapter("planner", args.checkpoint_path)
            planner_model = "planner"
        elif kind == "full":
            from safetensors.torch import load_file

            planner = InferenceServer(
                TransformersEngine(args.model, dtype=dtype, threads=args.threads, served_name="planner"), port=0
            )
            planner.start()
            servers.append(planner)
            planner.engine.load_state_dict(load_file(str(args.checkpoint_path)))
            planner_url, planner_model = planner.base_url, "planner"
        yield planner_url, planner_model, base.base_url, "base"
    finally:
        for server in reversed(servers):
            server.stop()


def _printer(event: str, data: Dict[str, Any]) -> None:
    turn = data.get("turn")
    if event == "analysis":
        tools = ", ".join(data["tools"]) or "-"
        print(f"== Query analysis\n   {data['summary']}\n   useful tools: {tools}")
    elif event == "plan":
        print(f"\n== Step {turn}: plan ({'valid' if data['valid'] else 'invalid answer'})")
        print(f"   tool: {data['tool_name'] or '-'}\n   sub-goal: {data['sub_goal'] or '-'}")
        if data["justification"]:
            print(f"   why: {data['justification']}")
    elif event == "command":
        print(f"== Step {turn}: command for {data['tool']}\n   {data['input']}")
    elif event == "tool":
        print(f"== Step {turn}: {data['tool']} output\n   " + str(data["result"]).replace("\n", "\n   "))
    elif event == "verification":
        verdict = "STOP" if data["stop"] else "CONTINUE"
        print(f"== Step {turn}: verification: {verdict}" + (f"\n   {data['analysis']}" if data["analysis"] else ""))
    elif event == "answer":
        print(f"\n== Final answer ({data['stop_reason']})\n   {data['answer']}")
    sys.stdout.flush()


def main(argv: Optional[List[str]] = None) -> int:
    """Command-line entry point; returns the exit status (2 for bad arguments, via argparse)."""
    args = _parse_args(argv)
    with contextlib.ExitStack() as stack:
        planner_url, planner_model, fixed_url, fixed_model = open_endpoints(args, stack)
        planner = RoleLLM.from_endpoint(
            planner_url, planner_model, api_key=args.api_key, sampling_parameters={"temperature": args.temperature}
        )
        fixed = RoleLLM.from_endpoint(fixed_url, fixed_model, api_key=args.api_key)
        stack.callback(planner.close)
        stack.callback(fixed.close)
        solver_config, source = training_solver_config(args.checkpoint)
        if source is not None:
            print(f"Solve loop settings of the training run: {source}", file=sys.stderr)
        if args.max_turns is not None:
            solver_config = dataclasses.replace(solver_config, max_turns=args.max_turns)
        result = FlowSolver(solver_config).solve(args.question, planner, fixed, _printer)
    if args.json:
        summary = {
            "question": result.question,
            "answer": result.answer,
            "stop_reason": result.stop_reason,
            "planner_calls": result.planner_calls,
            "steps": result.memory.to_list(),
        }
        print(json.dumps(summary, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
