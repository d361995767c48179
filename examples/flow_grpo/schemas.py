"""Structured outputs of the solver's roles (and of the optional LLM judge).

Every role answers with one small JSON object validated by one of these models. Field names are short and flat so
that a 135M-parameter model can produce them; the tolerant parser (:mod:`examples.flow_grpo.parsing`) maps common
spelling variants of the keys onto these names.
"""

from __future__ import annotations

from pydantic import BaseModel, Field, field_validator

__all__ = ["FinalAnswer", "JudgeVerdict", "NextStep", "QueryAnalysis", "ToolCommand", "Verification"]


def _strip(value: object) -> object:
    return value.strip() if isinstance(value, str) else value


class QueryAnalysis(BaseModel):
    """Query analyzer: what is asked and which tools look useful."""

    summary: str = Field(description="One sentence saying what the query asks for.")
    tools: list[str] = Field(default_factory=list, description="Names of the tools that look useful.")

    @field_validator("tools", mode="before")
    @classmethod
    def _tools_as_list(cls, value: object) -> object:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value


class NextStep(BaseModel):
    """Planner (the trained role): the next tool to use and what it should achieve, or the stop action."""

    justification: str = Field(default="", description="Why this tool now.")
    context: str = Field(default="", description="Facts from earlier steps the tool needs.")
    sub_goal: str = Field(default="", description="What the tool call must achieve (empty with the stop action).")
    tool_name: str = Field(description="A tool name, or the stop action.")

    @field_validator("justification", "context", "sub_goal", "tool_name", mode="before")
    @classmethod
    def _strip_text(cls, value: object) -> object:
        return _strip(value)


class ToolCommand(BaseModel):
    """Executor: the single input string handed to the chosen tool."""

    tool_input: str = Field(description="Code, expression, search query or question, depending on the tool.")


class Verification(BaseModel):
    """Verifier: whether the memory already answers the query. Only ``stop`` decides; ``analysis`` is free text."""

    analysis: str = Field(default="", description="What is known and what is missing.")
    stop: bool = Field(description="True when the memory is enough to answer the query.")


class FinalAnswer(BaseModel):
    """Solution generator: the short final answer."""

    answer: str = Field(description="The final answer only (a number, a name, a date...).")

    @field_validator("answer", mode="before")
    @classmethod
    def _answer_as_text(cls, value: object) -> object:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
        return _strip(value)


class JudgeVerdict(BaseModel):
    """Optional LLM judge: is the model's single committed answer equivalent to one of the gold answers.

    The judge is asked only about answers the rule neither accepts nor refuses; ``true_false`` can only turn the
    rule's 0 into 1 (see :class:`~examples.flow_grpo.reward.LLMJudge`).
    """

    analysis: str = Field(default="", description="Short comparison of the answer with the gold answers.")
    true_false: bool = Field(description="True only when the answer is one value or name equivalent to a gold answer.")
