"""The ``agentbolt demo`` job: a calculator-using agent trained with GRPO on the embedded model.

* :mod:`agentbolt.demo.task` generates the arithmetic questions (fixed seed, held-out split) and parses answers;
* :mod:`agentbolt.demo.agent` is the agent (OpenAI SDK + a calculator function tool) and its reward;
* :mod:`agentbolt.demo.run` wires the store, GRPO, the gateway and the runners together.

Importing this package does not import torch or the OpenAI SDK.
"""

from agentbolt.demo.agent import (
    CALCULATOR_TOOL,
    SYSTEM_PROMPT,
    CalculatorAgent,
    Episode,
    RewardConfig,
    calculate,
    score,
)
from agentbolt.demo.run import DemoConfig, DemoInterrupted, DemoResult, run_demo, step_time_split
from agentbolt.demo.task import ArithmeticTask, make_splits, parse_answer

__all__ = [
    "ArithmeticTask",
    "CALCULATOR_TOOL",
    "CalculatorAgent",
    "DemoConfig",
    "DemoInterrupted",
    "DemoResult",
    "Episode",
    "RewardConfig",
    "SYSTEM_PROMPT",
    "calculate",
    "make_splits",
    "parse_answer",
    "run_demo",
    "score",
    "step_time_split",
]
