"""The multi-agent solver and its agentbolt ``LitAgent``.

One solve: the query analyzer reads the question once; then, for at most ``max_turns`` turns, the **planner** picks
a tool and a sub-goal (or the stop action), the executor writes the tool's input, the tool runs, its result goes
into the rollout's memory and the verifier decides (structured ``stop`` field) whether the memory answers the
question; finally the solution generator writes the answer. Only the planner uses the ``planner_llm`` resource (the
model being trained, normally through the LLM gateway); every other role and the generalist tool use ``fixed_llm``.

Flow-GRPO credit: the rollout's binary reward is emitted once per planner call, after all of them, so that trace
adapters with ``agent_match="planner"`` (which give each reward to the latest earlier kept call without one) attach
the trajectory reward to *every* planner turn. The final reward of the rollout is that same value.

Optionally, training rollouts (``rollout.mode == "train"``) get a small format credit on top of the binary reward when
the trajectory is well formed (:attr:`SolveResult.well_formed`): every planner step is valid JSON naming a real tool
or the stop action, and at least one tool ran. Validation rollouts always get the strict binary reward.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Literal, Mapping, Optional

from agentbolt.litagent import LitAgent
from agentbolt.tracer.base import get_active_tracer
from agentbolt.types import NamedResources, Rollout, RolloutRawResult
from examples.flow_grpo import agents
from examples.flow_grpo.agents import RoleLLM, RoleOutput, is_stop_action
from examples.flow_grpo.memory import Memory
from examples.flow_grpo.reward import RewardFunction, RuleReward, gold_answers
from examples.flow_grpo.schemas import NextStep, QueryAnalysis
from examples.flow_grpo.tools import SearchTool, Tool, Toolbox, default_toolbox

__all__ = ["FlowGRPOAgent", "FlowSolver", "SolveResult", "SolverConfig", "TurnRecord"]

logger = logging.getLogger(__name__)

EventCallback = Callable[[str, Dict[str, Any]], None]
"""Receives ``(event, data)`` as the solve progresses: ``analysis``, ``plan``, ``command``, ``tool``,
``verification``, ``answer``."""


@dataclass
class SolverConfig:
    """Knobs of the solve loop.

    Attributes:
        max_turns: Planner turns at most (each: plan, command, tool, verification).
        planner_max_tokens: Planner answer budget (the others are fixed, see :mod:`examples.flow_grpo.agents`).
        python_timeout: Wall-clock limit of one Python tool call (seconds).
        memory_result_chars: Budget of each tool result kept in memory.
        planner_examples: Show the planner its worked examples as earlier chat turns. A planner that was never
            trained needs them to answer in its format; one warm-started by SFT has learnt the format, and without
            them each planner call is about 300 tokens shorter, in every rollout and every update.
        planner_guide: Guide the planner's decoding (the endpoint's ``guided_regex``, see
            :func:`examples.flow_grpo.prompts.planner_step_pattern`): ``"none"``, free text; ``"tools"``, every
            answer is a step in its JSON format naming a real tool or the stop action, so that sampling explores
            the tools instead of invented names; ``"question"``, the same with the question, verbatim, as the
            sub-goal: the planner then decides which tool each turn calls and when to stop, and nothing else. The
            endpoint reports the unguided model's log-probabilities either way.
    """

    max_turns: int = 4
    planner_max_tokens: int = 128
    python_timeout: float = 10.0
    memory_result_chars: int = 400
    planner_examples: bool = True
    planner_guide: Literal["none", "tools", "question"] = "none"

    def __post_init__(self) -> None:
        if self.max_turns < 1:
            raise ValueError(f"max_turns must be at least 1, got {self.max_turns}")
        if self.planner_guide not in ("none", "tools", "question"):
            raise ValueError(f"planner_guide must be 'none', 'tools' or 'question', got {self.planner_guide!r}")


@dataclass
class TurnRecord:
    """What happened in one planner turn."""

    turn: int
    plan: NextStep
    plan_valid: bool
    planner_raw: str
    tool_name: Optional[str] = None
    tool_input: Optional[str] = None
    observation: Optional[str] = None
    stop: bool = False
    known_action: bool = False
    """The plan was valid and named a tool of the toolbox or the stop action."""
    verifier_stop: Optional[bool] = None
    """The verifier's decision after this turn's tool call (None: the verifier did not run)."""

    def to_dict(self) -> Dict[str, Any]:
        """The turn as plain JSON-serialisable data (what the planner chose, what the tool got and returned)."""
        return {
            "turn": self.turn,
            "tool": self.plan.tool_name if self.plan_valid else "(invalid)",
            "sub_goal": self.plan.sub_goal,
            "tool_input": self.tool_input,
            "result": self.observation,
            "verifier_stop": self.verifier_stop,
        }


@dataclass
class SolveResult:
    """Outcome of :meth:`FlowSolver.solve`.

    Attributes:
        answer: The solution generator's final answer.
        stop_reason: ``"planner"`` (stop action), ``"verifier"`` (stop field) or ``"max_turns"``.
        planner_calls: Number of planner calls (the number of trainable turns).
    """

    question: str
    analysis: QueryAnalysis
    turns: List[TurnRecord]
    answer: str
    stop_reason: str
    memory: Memory = field(repr=False, default_factory=Memory)

    @property
    def planner_calls(self) -> int:
        """Planner calls made."""
        return len(self.turns)

    @property
    def tool_calls(self) -> int:
        """Tool calls made (including calls of unknown tools and invalid steps, which return an error)."""
        return len(self.memory.actions)

    def to_record(self, task: Mapping[str, Any], reward: float) -> Dict[str, Any]:
        """The solve as JSON-serialisable data for evaluation: task, answer, ``reward``, loop statistics, turns."""
        return {
            "id": task.get("id"),
            "source": str(task.get("source", "")),
            "question": self.question,
            "gold": gold_answers(task),
            "answer": self.answer,
            "reward": reward,
            "planner_turns": self.planner_calls,
            "tool_calls": self.tool_calls,
            "stop_reason": self.stop_reason,
            "steps": [turn.to_dict() for turn in self.turns],
        }

    @property
    def well_formed(self) -> bool:
        """Every planner step named a real tool or the stop action, and at least one tool ran."""
        return all(t.known_action for t in self.turns) and any(t.observation is not None for t in self.turns)


class FlowSolver:
    """The multi-agent solve loop (see the module docstring).

    Args:
        config: Loop settings.
        search: The search tool (shared across solves: its BM25 index is built once); default: shipped corpus.
    """

    def __init__(self, config: Optional[SolverConfig] = None, search: Optional[SearchTool] = None) -> None:
        self.config = config or SolverConfig()
        self.search = search or SearchTool()

    def toolbox(self, fixed: RoleLLM, question: Optional[str] = None, memory: Optional[Memory] = None) -> Toolbox:
        """The tools of one solve: the generalist answers with ``fixed``; given the solve's ``question`` and
        ``memory``, search follows the entity the newest result introduced (see :meth:`SearchTool.follow_up`)."""
        search: Tool = self.search
        if question is not None and memory is not None:
            search = self.search.follow_up(question, lambda: memory.actions[-1].result if memory.actions else "")
        return default_toolbox(fixed, search=search, python_timeout=self.config.python_timeout)

    def solve(
        self, question: str, planner: RoleLLM, fixed: RoleLLM, on_event: Optional[EventCallback] = None
    ) -> SolveResult:
        """Solve ``question`` with ``planner`` for the planner role and ``fixed`` for all the others.

        Raises:
            openai.OpenAIError: An LLM endpoint failed (tool failures never raise: they become observations).
        """
        emit = on_event or (lambda _event, _data: None)
        config = self.config
        memory = Memory(max_result_chars=config.memory_result_chars)
        toolbox = self.toolbox(fixed, question, memory)
        tools_text = toolbox.describe()

        analysis_out = agents.analyze_query(fixed, question, tools_text)
        analysis: QueryAnalysis = analysis_out.value
        analysis_text = analysis.summary + (f" Useful tools: {', '.join(analysis.tools)}." if analysis.tools else "")
        emit("analysis", {"summary": analysis.summary, "tools": analysis.tools, "parsed": analysis_out.parsed.ok})

        turns: List[TurnRecord] = []
        stop_reason = "max_turns"
        for turn in range(1, config.max_turns + 1):
            plan_out = agents.plan_next_step(
                planner,
                question,
                tools_text,
                analysis_text,
                memory.render(),
                turn,
                config.max_turns,
                max_tokens=config.planner_max_tokens,
                examples=config.planner_examples,
                guided_tools=None if config.planner_guide == "none" else toolbox.names,
                guided_sub_goal=question if config.planner_guide == "question" else None,
            )
            record = self._plan_record(turn, plan_out)
            turns.append(record)
            emit("plan", {"turn": turn, **record.plan.model_dump(), "valid": record.plan_valid})
            if record.plan_valid and is_stop_action(record.plan):
                record.stop = record.known_action = True
                stop_reason = "planner"
                break
            self._act(record, question, toolbox, fixed, memory, emit)
            verification = agents.verify(fixed, question, memory.render())
            record.stop = record.verifier_stop = bool(verification.parsed.ok and verification.value.stop)
            emit(
                "verification",
                {
                    "turn": turn,
                    "analysis": verification.value.analysis,
                    "stop": record.stop,
                    "parsed": verification.parsed.ok,
                },
            )
            if record.stop:
                stop_reason = "verifier"
                break

        final = agents.generate_solution(fixed, question, memory.last_result())
        answer = final.value.answer
        emit("answer", {"answer": answer, "stop_reason": stop_reason, "parsed": final.parsed.ok})
        return SolveResult(question, analysis, turns, answer, stop_reason, memory)

    @staticmethod
    def _plan_record(turn: int, plan_out: RoleOutput) -> TurnRecord:
        plan: NextStep = plan_out.value
        valid = plan_out.parsed.ok and bool(plan.tool_name)
        return TurnRecord(turn=turn, plan=plan, plan_valid=valid, planner_raw=plan_out.raw)

    @staticmethod
    def _act(
        record: TurnRecord, question: str, toolbox: Toolbox, fixed: RoleLLM, memory: Memory, emit: EventCallback
    ) -> None:
        """Executor + tool for a turn; invalid plans and unknown tools become error observations in memory."""
        plan = record.plan
        tool = toolbox.get(plan.tool_name) if record.plan_valid else None
        if not record.plan_valid:
            observation = 'Error: the planner\'s answer was not a valid JSON step with a "tool_name".'
            record.tool_name, record.tool_input = "(invalid step)", ""
        elif tool is None:
            observation = toolbox.execute(plan.tool_name, "").output
            record.tool_name, record.tool_input = plan.tool_name, ""
        else:
            command = agents.generate_command(fixed, tool.metadata, plan.sub_goal, plan.context, memory.last_result())
            record.tool_name, record.tool_input = tool.name, command.value.tool_input
            record.known_action = True
            emit(
                "command",
                {"turn": record.turn, "tool": tool.name, "input": record.tool_input, "parsed": command.parsed.ok},
            )
            observation = tool.execute(record.tool_input).output
        action = memory.add(record.tool_name or "", plan.sub_goal, record.tool_input or "", observation)
        record.observation = action.result
        emit("tool", {"turn": record.turn, "tool": record.tool_name, "result": action.result})


class FlowGRPOAgent(LitAgent[Dict[str, Any]]):
    """The solver as an agentbolt agent: one rollout solves one task and scores its answer.

    Tasks use the dataset schema (``question``, ``source``, ``extra_info.ground_truth``...). The planner calls the
    ``planner_resource`` LLM (falling back to ``main_llm``, the resource name agentbolt's GRPO publishes); every
    other role calls ``fixed_resource``.

    Args:
        solver: The solve loop (default settings when None).
        reward: Scores the answer (default: :class:`~examples.flow_grpo.reward.RuleReward`).
        planner_resource: Resource name of the trained model.
        fixed_resource: Resource name of the fixed model.
        train_format_bonus: Added to the reward of a training rollout whose trajectory is well formed
            (:attr:`SolveResult.well_formed`); 0 disables it. Validation rollouts never get it.
    """

    def __init__(
        self,
        solver: Optional[FlowSolver] = None,
        reward: Optional[RewardFunction] = None,
        planner_resource: str = "planner_llm",
        fixed_resource: str = "fixed_llm",
        train_format_bonus: float = 0.0,
    ) -> None:
        super().__init__()
        if not 0.0 <= train_format_bonus < 1.0:
            raise ValueError(f"train_format_bonus must be in [0, 1), got {train_format_bonus}")
        self.train_format_bonus = train_format_bonus
        self.solver = solver or FlowSolver()
        self.reward: RewardFunction = reward or RuleReward()
        self.planner_resource = planner_resource
        self.fixed_resource = fixed_resource

    def _resource(self, resources: NamedResources, names: List[str]) -> Any:
        for name in names:
            if name in resources:
                return resources[name]
        raise ValueError(f"missing LLM resource: expected one of {names}, got {sorted(resources)}")

    def rollout(self, task: Dict[str, Any], resources: NamedResources, rollout: Rollout) -> RolloutRawResult:
        """Solve the task, then emit the reward once per planner turn (see the module docstring).

        Returns:
            None under a tracer (the reward spans carry the result), else the reward.

        Raises:
            ValueError: The task has no question or a resource is missing.
        """
        if not isinstance(task, Mapping) or not isinstance(task.get("question"), str):
            raise ValueError("a task must be a mapping with a 'question' string")
        planner_llm = self._resource(resources, [self.planner_resource, "main_llm"])
        fixed_llm = self._resource(resources, [self.fixed_resource])
        planner = RoleLLM.from_resource(planner_llm, rollout)
        fixed = RoleLLM.from_resource(fixed_llm, rollout)
        try:
            result = self.solver.solve(task["question"], planner, fixed)
        finally:
            planner.close()
            fixed.close()
        strict = float(self.reward(task, result.answer))
        reward = strict
        if rollout.mode == "train" and result.well_formed:
            reward += self.train_format_bonus
        logger.info(
            "Rollout %s: %d planner turn(s), stop=%s, answer=%r, reward=%.1f",
            rollout.rollout_id,
            result.planner_calls,
            result.stop_reason,
            result.answer,
            reward,
        )
        if get_active_tracer() is None:
            return reward
        from agentbolt.emitter import emit_object, emit_reward
        from examples.flow_grpo.evaluation import SOLVE_RECORD_KIND

        emit_object(result.to_record(task, strict), attributes={"flow_grpo.kind": SOLVE_RECORD_KIND})

        for _ in range(max(1, result.planner_calls)):
            emit_reward(reward)
        return None
