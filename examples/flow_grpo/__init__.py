"""Flow-GRPO example: a multi-agent tool-using solver whose planner is trained with GRPO.

Roles (query analyzer, planner, executor, verifier, solution generator) are ordinary OpenAI-SDK calls with JSON
outputs; tools are a Python runner, a calculator, BM25 search over a shipped corpus and a generalist LLM. See
``examples/flow_grpo/README.md``.
"""

from examples.flow_grpo.agents import PLANNER, ROLES, RoleLLM
from examples.flow_grpo.reward import LLMJudge, RewardFunction, RuleReward
from examples.flow_grpo.solver import FlowGRPOAgent, FlowSolver, SolverConfig, SolveResult

__all__ = [
    "PLANNER",
    "ROLES",
    "FlowGRPOAgent",
    "FlowSolver",
    "LLMJudge",
    "RewardFunction",
    "RoleLLM",
    "RuleReward",
    "SolveResult",
    "SolverConfig",
]
