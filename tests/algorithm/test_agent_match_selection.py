"""GRPO, SFT and the VERL bridge select the trained agent's calls by the same ``agent_match`` rule."""

from __future__ import annotations

import logging
import re
import uuid
from typing import List, Optional

import pytest

from agentbolt.algorithm.grpo.samples import triplets_to_samples
from agentbolt.algorithm.sft.data import samples_from_triplets
from agentbolt.types import Triplet
from agentbolt.verl.daemon import AgentModeDaemon, aggregate_rollout

AGENTS = ["planner", "planner_v2", "sub-planner", "executor", "", None]


def _calls(names: List[Optional[str]]) -> List[Triplet]:
    return [
        Triplet(
            prompt={"token_ids": [1, 2, 3]},
            response={"token_ids": [4, 5]},
            metadata={"agent_name": name, "response_id": f"call-{i}"},
        )
        for i, name in enumerate(names)
    ]


def _trained(agent_match: Optional[str]) -> dict:
    """Indices of the calls each consumer trains on, and how many it counted as other agents' calls."""
    calls = _calls(AGENTS)
    grpo, grpo_stats = triplets_to_samples(
        calls, rollout_id="ro-1", group_id="g", final_reward=1.0, agent_match=agent_match
    )
    sft, sft_stats = samples_from_triplets(calls, final_reward=1.0, agent_match=agent_match, rollout_id="ro-1")
    verl, verl_stats = aggregate_rollout(calls, rollout_id="ro-1", uid="g", reward=1.0, agent_match=agent_match)
    return {
        "grpo": (len(grpo), grpo_stats.other_agents),
        "sft": (len(sft), sft_stats.other_agents),
        "verl": (len(verl), verl_stats.calls_of_other_agents),
    }


@pytest.mark.parametrize(
    ("agent_match", "kept"),
    [
        (None, 6),  # every call, named or not
        ("planner", 3),  # searched: planner, planner_v2, sub-planner
        ("^planner$", 1),
        ("", 4),  # every call with an agent name; an empty name is no name
        ("nobody", 0),
    ],
)
def test_grpo_sft_and_verl_keep_the_same_calls(agent_match: Optional[str], kept: int) -> None:
    assert set(_trained(agent_match).values()) == {(kept, len(AGENTS) - kept)}


def test_an_invalid_agent_match_is_refused_naming_the_pattern_everywhere() -> None:
    calls = _calls(["planner"])
    expected = r"agent_match must be a regular expression; 'plan\[' is not"
    with pytest.raises(ValueError, match=expected):
        triplets_to_samples(calls, rollout_id="r", group_id="g", final_reward=1.0, agent_match="plan[")
    with pytest.raises(ValueError, match=expected):
        samples_from_triplets(calls, final_reward=1.0, agent_match="plan[")
    with pytest.raises(ValueError, match=expected):
        aggregate_rollout(calls, rollout_id="r", uid="g", reward=1.0, agent_match="plan[")
    with pytest.raises(re.error, match=r"agentbolt\.agent_match must be a regular expression; 'plan\[' is not"):
        AgentModeDaemon(store=None, adapter=None, llm_proxy=None, agent_match="plan[")  # type: ignore[arg-type]


@pytest.mark.parametrize("consumer", ["grpo", "sft", "verl"])
def test_an_agent_match_that_selects_nothing_is_reported_once_with_the_agents_seen(
    consumer: str, caplog: pytest.LogCaptureFixture
) -> None:
    pattern = f"^planer-{uuid.uuid4().hex[:6]}$"  # a misspelt name, unique to this test
    calls = _calls(["planner", "executor", None])
    with caplog.at_level(logging.WARNING, logger="agentbolt.adapter.agent_match"):
        for rollout_id in ("ro-1", "ro-2"):
            if consumer == "grpo":
                samples, _ = triplets_to_samples(
                    calls, rollout_id=rollout_id, group_id="g", final_reward=1.0, agent_match=pattern
                )
            elif consumer == "sft":
                samples, _ = samples_from_triplets(calls, final_reward=1.0, agent_match=pattern, rollout_id=rollout_id)
            else:
                samples, _ = aggregate_rollout(calls, rollout_id=rollout_id, uid="g", reward=1.0, agent_match=pattern)
            assert samples == []
    (record,) = caplog.records
    assert record.getMessage().startswith(
        f"agent_match {pattern!r} selects none of the 3 LLM call(s) of rollout ro-1, so none of them is trained; "
        "their agents: 'executor', 'planner', 1 call(s) without an agent name."
    )


def test_an_sft_selection_emptied_by_agent_match_says_so() -> None:
    from agentbolt.algorithm.sft.algorithm import empty_selection_reasons
    from agentbolt.algorithm.sft.data import CallStats, TokenizeStats
    from agentbolt.algorithm.sft.selection import SelectionStats

    reasons = empty_selection_reasons(CallStats(calls=3, other_agents=3), TokenizeStats(), SelectionStats())
    assert reasons == "other agents' calls (agent_match): 3"
