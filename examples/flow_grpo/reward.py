"""Binary trajectory reward: rule-based by default, an LLM judge optionally, both behind one interface.

* Math (``source`` in :data:`MATH_SOURCES`): the answer is correct when it equals a gold answer numerically or
  symbolically (sympy), so ``1/2``, ``0.5`` and ``\\frac{1}{2}`` all match. Answers are read from ``\\boxed{}``,
  from the text after "answer is"/"=", or as the last number in the text.
* QA (every other source): normalized exact match (lower case, no punctuation, no articles, single spaces)
  against *any* of the gold answers, which are kept as a list.
* :class:`LLMJudge` asks a fixed LLM for a :class:`~examples.flow_grpo.schemas.JudgeVerdict`; when the call
  fails or the verdict does not parse, it falls back to the rule and counts the failure.

Model output is never evaluated as Python: math strings are checked against a small allow-list of characters and
names before sympy parses them.
"""

from __future__ import annotations

import logging
import re
import string
import threading
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Protocol, Sequence

from examples.flow_grpo.parsing import parse_output
from examples.flow_grpo.schemas import JudgeVerdict

if TYPE_CHECKING:
    from examples.flow_grpo.agents import RoleLLM

__all__ = [
    "MATH_SOURCES",
    "LLMJudge",
    "RewardFunction",
    "RuleReward",
    "gold_answers",
    "math_equivalent",
    "normalize_answer",
    "qa_match",
]

logger = logging.getLogger(__name__)

MATH_SOURCES = frozenset({"math", "mathhard", "deepmath", "arithmetic", "mixed"})
"""Task sources scored by math equivalence."""

_ALLOWED_NAMES = frozenset({"sqrt", "pi", "e", "E", "log", "ln", "exp", "sin", "cos", "tan", "oo", "I", "frac"})
_SAFE_MATH = re.compile(r"^[0-9a-zA-Z+\-*/^().,\s]*$")
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:/\d+)?")
_MAX_EXPRESSION = 120


class RewardFunction(Protocol):
    """Scores a final answer for a task in the dataset schema (1.0 correct, 0.0 otherwise)."""

    def __call__(self, task: Mapping[str, Any], answer: str) -> float: ...


def gold_answers(task: Mapping[str, Any]) -> List[str]:
    """The gold answers of a task: ``extra_info.ground_truth`` (a list or a string), else ``result``."""
    extra = task.get("extra_info") or {}
    truth = extra.get("ground_truth") if isinstance(extra, Mapping) else None
    if truth is None:
        truth = task.get("result")
    if truth is None:
        return []
    values = list(truth) if isinstance(truth, (list, tuple)) else [truth]
    return [str(v).strip() for v in values if v is not None and str(v).strip()]


def normalize_answer(text: str) -> str:
    """SQuAD-style normalization: lower case, no punctuation, no articles, single spaces."""
    text = text.lower()
    text = "".join(" " if ch in string.punctuation else ch for ch in text)
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def qa_match(answer: str, golds: Sequence[str]) -> bool:
    """Whether the normalized answer equals any normalized gold answer."""
    normalized = normalize_answer(answer)
    return bool(normalized) and any(normalized == normalize_answer(g) for g in golds)


def _latex_to_plain(text: str) -> str:
    text = text.strip().strip("$").strip()
    text = re.sub(r"\\(?:left|right|,|!|;|displaystyle)", "", text)
    for _ in range(3):
        text = re.sub(r"\\[dt]?frac\{([^{}]*)\}\{([^{}]*)\}", r"((\1)/(\2))", text)
        text = re.sub(r"\\sqrt\{([^{}]*)\}", r"sqrt(\1)", text)
    text = text.replace("\\pi", "pi").replace("\\cdot", "*").replace("\\times", "*").replace("{", "(").replace("}", ")")
    text = re.sub(r"(?<=\d),(?=\d{3}\b)", "", text)  # 1,000 -> 1000
    return text.rstrip(".").strip()


def _to_sympy(text: str) -> Any:
    """Parse a plain math string with sympy after checking it is harmless; None when it is not math."""
    from sympy.parsing.sympy_parser import (
        convert_xor,
        implicit_multiplication_application,
        parse_expr,
        standard_transformations,
    )

    plain = _latex_to_plain(text)
    if not plain or len(plain) > _MAX_EXPRESSION or not _SAFE_MATH.match(plain) or "__" in plain:
        return None
    names = set(re.findall(r"[A-Za-z_]\w*", plain))
    if any(len(name) > 1 and name not in _ALLOWED_NAMES for name in names):
        return None
    if re.search(r"(\*\*|\^)\s*\(?\s*\d{5,}", plain):  # refuse huge powers before sympy evaluates them
        return None
    transformations = (*standard_transformations, convert_xor, implicit_multiplication_application)
    try:
        return parse_expr(plain, transformations=transformations, evaluate=False)
    except Exception:  # sympy raises many types (SyntaxError, TokenError, TypeError...) for non-math text
        return None


def _equal(left: Any, right: Any) -> bool:
    import sympy

    try:
        if not left.free_symbols and not right.free_symbols:
            # Arbitrary-precision floats: no overflow to inf for huge values.
            a, b = sympy.N(left, 30), sympy.N(right, 30)
            if not (a.is_finite and b.is_finite):
                return False
            scale = sympy.Max(1, sympy.Abs(a), sympy.Abs(b))
            return bool(sympy.Abs(a - b) <= sympy.Float("1e-6") * scale)
        return bool(sympy.simplify(left - right) == 0)
    except Exception:  # non-numeric objects (sets, relations) or sympy failures count as "not equal"
        return False


def _answer_candidates(answer: str) -> List[str]:
    text = answer.strip()
    candidates = [text]
    boxed = re.findall(r"\\boxed\{((?:[^{}]|\{[^{}]*\})*)\}", text)
    candidates.extend(boxed)
    after = re.split(r"(?i)answer is|answer:|=", text)
    if len(after) > 1:
        candidates.append(after[-1])
    numbers = _NUMBER.findall(text.replace(",", ""))
    if numbers:
        candidates.append(numbers[-1])
    return [c.strip() for c in candidates if c.strip()]


def math_equivalent(answer: str, golds: Sequence[str]) -> bool:
    """Whether the answer equals any gold answer numerically or symbolically (or as normalized text)."""
    if qa_match(answer, golds):
        return True
    gold_exprs = [expr for expr in (_to_sympy(g) for g in golds) if expr is not None]
    if not gold_exprs:
        return False
    for candidate in _answer_candidates(answer):
        expr = _to_sympy(candidate)
        if expr is not None and any(_equal(expr, gold) for gold in gold_exprs):
            return True
    return False


class RuleReward:
    """Rule-based reward: math equivalence for math sources, normalized exact match otherwise.

    Args:
        math_sources: Sources scored as math.
    """

    def __init__(self, math_sources: frozenset[str] = MATH_SOURCES) -> None:
        self.math_sources = math_sources

    def __call__(self, task: Mapping[str, Any], answer: str) -> float:
        """1.0 when ``answer`` matches a gold answer of ``task``, else 0.0 (also when the task has no gold)."""
        golds = gold_answers(task)
        if not golds or not answer.strip():
            return 0.0
        source = str(task.get("source", "")).lower()
        correct = math_equivalent(answer, golds) if source in self.math_sources else qa_match(answer, golds)
        return 1.0 if correct else 0.0


JUDGE_SYSTEM = (
    "You are a strict judge. Decide whether the model's answer means the same as one of the gold answers. "
    "Ignore formatting differences.\n"
    'Reply with JSON only: {"analysis": "...", "true_false": true}'
)


class LLMJudge:
    """Reward from an LLM judge, with the rule as fallback.

    Args:
        llm: The judge endpoint (a fixed model; recorded under the role name ``judge``).
        fallback: Reward used when the judge call fails or its verdict does not parse.
        max_tokens: Judge answer budget.

    Attributes:
        calls: Judge calls made.
        failures: Calls that fell back to ``fallback`` (endpoint error or unparsable verdict).
    """

    def __init__(self, llm: RoleLLM, fallback: Optional[RewardFunction] = None, max_tokens: int = 96) -> None:
        self.llm = llm
        self.fallback: RewardFunction = fallback or RuleReward()
        self.max_tokens = max_tokens
        self.calls = 0
        self.failures = 0
        self._lock = threading.Lock()

    def stats(self) -> Dict[str, int]:
        """``{"calls": n, "failures": m}``."""
        with self._lock:
            return {"calls": self.calls, "failures": self.failures}

    def __call__(self, task: Mapping[str, Any], answer: str) -> float:
        """1.0 when the judge says the answer is correct; the fallback's score when the judge fails."""
        golds = gold_answers(task)
        user = f"Question: {task.get('question', '')}\nGold answers: {golds}\nModel's answer: {answer}\nJSON:"
        with self._lock:
            self.calls += 1
        try:
            raw = self.llm.chat("judge", JUDGE_SYSTEM, user, max_tokens=self.max_tokens)
            verdict = parse_output(raw, JudgeVerdict, JudgeVerdict(true_false=False))
            error = None if verdict.ok else f"unparsable verdict ({verdict.error})"
        except Exception as exc:  # any endpoint failure falls back to the rule
            verdict, error = None, f"{type(exc).__name__}: {exc}"
        if verdict is None or error is not None:
            with self._lock:
                self.failures += 1
            logger.warning("LLM judge failed (%s); using the rule-based reward.", error)
            return self.fallback(task, answer)
        return 1.0 if verdict.value.true_false else 0.0
