"""Prompt optimization: :class:`APO` (beam search with textual gradients), :class:`ParetoAPO` (reflective search
over a Pareto front of prompts) and :class:`FewShotAPO` (demonstrations bootstrapped from rewarded traces).

All three tune the first :class:`~agentbolt.types.PromptTemplate` of the trainer's initial resources, run in
``Trainer.fit``, store every candidate they evaluate as a resource snapshot with its scores
(:func:`load_search_run`), and keep the best prompt found so far whatever stops them.
"""

from __future__ import annotations

from .apo import APO, APPLY_EDIT_PROMPT_FILES, GRADIENT_PROMPT_FILES, batch_iter_over_dataset
from .fewshot import FewShotAPO
from .optimizer import OptimizerError, OptimizerUsage, SearchBudgetExhausted
from .pareto import ParetoAPO, pareto_front
from .search import (
    CandidateRecord,
    Evaluation,
    PromptSearch,
    RolloutResultForAPO,
    VersionedPromptTemplate,
    load_search_run,
)
from .templates import PlaceholderMismatchError

__all__ = [
    "APO",
    "ParetoAPO",
    "FewShotAPO",
    "PromptSearch",
    "VersionedPromptTemplate",
    "RolloutResultForAPO",
    "Evaluation",
    "CandidateRecord",
    "load_search_run",
    "pareto_front",
    "OptimizerError",
    "OptimizerUsage",
    "SearchBudgetExhausted",
    "PlaceholderMismatchError",
    "GRADIENT_PROMPT_FILES",
    "APPLY_EDIT_PROMPT_FILES",
    "batch_iter_over_dataset",
]
