"""ParetoAPO's front bookkeeping and reflective search; FewShotAPO's demonstrations and selection search."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Dict, List

import pytest
from apo_standin import (
    GOOD_TEMPLATE,
    SEED_TEMPLATE,
    TRAIN,
    VAL,
    Script,
    capital_agent_without_examples,
    fit,
    parrot_agent,
)

import agentbolt as agl
from agentbolt.algorithm.apo import FewShotAPO, ParetoAPO, load_search_run, pareto_front
from agentbolt.algorithm.apo.fewshot import (
    REFUSED_FULL_VAL,
    Demonstration,
    demonstration_messages,
    echo_check,
    final_answer,
    render_demonstration,
)
from agentbolt.algorithm.apo.search import (
    METADATA_KEY,
    Evaluation,
    RolloutResultForAPO,
    VersionedPromptTemplate,
    keyed,
    template_key,
)

# -- Pareto front ---------------------------------------------------------------------------------------------------


def test_front_keeps_candidates_best_on_some_task() -> None:
    scores = {
        "v0": {"a": 1.0, "b": 0.0, "c": 0.0},
        "v1": {"a": 0.0, "b": 1.0, "c": 0.0},
        "v2": {"a": 0.5, "b": 0.5, "c": 0.0},
    }
    assert pareto_front(scores) == {"v0": ["a"], "v1": ["b"]}


def test_front_drops_dominated_candidates_even_when_tied_best() -> None:
    scores = {"v0": {"a": 1.0, "b": 0.0}, "v1": {"a": 1.0, "b": 1.0}}
    assert pareto_front(scores) == {"v1": ["a", "b"]}


def test_ties_count_for_every_tied_candidate_and_unsolved_tasks_are_ignored() -> None:
    scores = {"v0": {"a": 1.0, "b": 0.0}, "v1": {"a": 1.0, "b": 0.0}}
    assert pareto_front(scores) == {"v0": ["a"], "v1": ["a"]}
    assert pareto_front({"v0": {"a": 0.0}}) == {}
    assert pareto_front({}) == {}


def test_negative_rewards_still_make_a_front() -> None:
    """With -1 for wrong and 0 for right, the top score of a task is 0: the task counts when candidates differ."""
    scores = {"v0": {"a": 0.0, "b": -1.0, "c": -1.0}, "v1": {"a": -1.0, "b": 0.0, "c": -1.0}}
    assert pareto_front(scores) == {"v0": ["a"], "v1": ["b"]}  # "c", failed by both, tells nothing
    assert pareto_front({"v0": {"a": -0.5}, "v1": {"a": -1.0}}) == {"v0": ["a"]}


def test_a_missing_score_counts_as_zero() -> None:
    assert pareto_front({"v0": {"a": 1.0}, "v1": {"b": 1.0}}) == {"v0": ["a"], "v1": ["b"]}


def test_pareto_search_reflects_on_traces_and_admits_a_better_child(script: Script, optimizer_client: Any) -> None:
    search = ParetoAPO(
        optimizer_client,
        reflection_model="reflector",
        reflection_batch_size=3,
        rounds=1,
        use_poml=False,
        optimizer_backoff=0.01,
        seed=1,
    )
    store = fit(search)
    assert search.get_best_prompt().template == GOOD_TEMPLATE and search.best_version == "v1"
    assert set(search.pool) == {"v0", "v1"} and search.front() == {"v1": sorted(key for key, _ in keyed(VAL))}
    reflection = script.calls("reflector")[0]["messages"][-1]["content"]
    assert "[assistant] The capital of" in reflection and "[feedback] expected" in reflection and "reward" in reflection
    records = asyncio.run(load_search_run(store, search.run_id))
    assert records[1].origin == "reflection" and records[1].parents == ["v0"]


def test_pareto_asks_to_keep_the_placeholders_in_the_seeds_own_syntax(script: Script, optimizer_client: Any) -> None:
    seed = agl.PromptTemplate(template="Answer the question. Capital of {{ country }}?", engine="jinja")
    child = "Answer with ONLY THE CITY name. Capital of {{ country }}?"
    script.push("reflector", f"```\n{child}\n```")
    search = ParetoAPO(optimizer_client, reflection_model="reflector", rounds=1, use_poml=False, seed=1)
    fit(search, initial_resources={"prompt_template": seed})
    reflection = script.calls("reflector")[0]["messages"][-1]["content"]
    assert "Keep these placeholders exactly as written: {{ country }}." in reflection
    assert search.get_best_prompt() == agl.PromptTemplate(template=child, engine="jinja")


def test_a_resumed_pareto_run_rebuilds_its_pool_only_from_scores_on_the_current_tasks(
    standin: Any, sqlite_path: Any
) -> None:
    other_val = [{"country": c} for c in ("France", "Japan", "Peru", "Canada")]  # as many tasks as VAL, two easy
    first = ParetoAPO(None, rounds=0, run_id="pareto-val", use_poml=False)
    fit(first, val=VAL, store=agl.SqliteLightningStore(sqlite_path))
    assert first.best_score == 0.25
    resumed = ParetoAPO(None, rounds=0, run_id="pareto-val", resume=True, use_poml=False)
    fit(resumed, val=other_val, store=agl.SqliteLightningStore(sqlite_path))
    assert resumed.best_score == 0.5 and resumed.summary()["rollouts"] == len(other_val)
    assert list(resumed.pool) == ["v1"] and set(resumed.val_scores["v1"]) == {key for key, _ in keyed(other_val)}


def test_pareto_rejects_a_child_that_does_no_better_on_the_minibatch(script: Script, optimizer_client: Any) -> None:
    script.push("reflector", f"```\n{SEED_TEMPLATE} Think first.\n```")
    search = ParetoAPO(optimizer_client, reflection_model="reflector", rounds=1, use_poml=False, seed=1)
    fit(search)
    assert set(search.pool) == {"v0"} and search.best_version == "v0"


def test_pareto_merges_two_complementary_front_candidates(script: Script, optimizer_client: Any) -> None:
    search = ParetoAPO(optimizer_client, reflection_model="reflector", rounds=3, merge_every=3, use_poml=False)
    search.set_store(agl.InMemoryLightningStore())
    seed = agl.PromptTemplate(template=SEED_TEMPLATE, engine="f-string")
    other = agl.PromptTemplate(template="Reply briefly. Capital of {country}?", engine="f-string")
    a, b = search._create_versioned_prompt(seed), search._create_versioned_prompt(other)
    search.pool = {"v0": a, "v1": b}
    search.val_scores = {"v0": {"0": 1.0, "1": 0.0}, "v1": {"0": 0.0, "1": 1.0}}
    assert search._merge_pair() == (a, b)


# -- few-shot -------------------------------------------------------------------------------------------------------


def _result(messages: List[Dict[str, Any]], status: str = "succeeded") -> RolloutResultForAPO:
    return RolloutResultForAPO(status=status, final_reward=1.0, spans=[], messages=[{"messages": messages}])  # type: ignore[typeddict-item]


def test_a_demonstration_keeps_the_request_data_tool_calls_results_and_answer() -> None:
    seed = agl.PromptTemplate(template="Book a room.\nDate: {date}", engine="f-string")
    messages = [
        {"role": "user", "content": "Book a room.\nDate: 2025-10-01"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "rooms", "arguments": '{"d": 1}'}}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": '[{"room": "Nova"}]'},
        {"role": "assistant", "content": "Nova"},
    ]
    text = render_demonstration(messages, seed)
    assert text == (
        "Request: Date: 2025-10-01\n"
        'Assistant: <tool_call>{"name": "rooms", "arguments": {"d": 1}}</tool_call>\n'
        'Tool result: [{"room": "Nova"}]\n'
        "Assistant: Nova"
    )
    assert render_demonstration(messages[:2], seed) is None  # no final answer: no demonstration


def test_a_demonstration_as_chat_turns_keeps_real_tool_calls_with_fresh_ids() -> None:
    messages = [
        {"role": "system", "content": "You book rooms."},
        {"role": "user", "content": "Book a room for 4."},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "call_x", "type": "function", "function": {"name": "rooms", "arguments": {"n": 4}}},
                {"id": "call_y", "type": "function", "function": {"name": "rooms", "arguments": '{"n": 5}'}},
            ],
        },
        {"role": "tool", "tool_call_id": "call_x", "content": [{"room": "Nova"}]},
        {"role": "tool", "tool_call_id": "call_y", "content": "none"},
        {"role": "assistant", "content": "Nova", "refusal": None},
    ]
    turns = demonstration_messages(messages, call_id_prefix="example_3")
    assert turns == [
        {"role": "user", "content": "Book a room for 4."},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "example_3_1", "type": "function", "function": {"name": "rooms", "arguments": '{"n": 4}'}},
                {"id": "example_3_2", "type": "function", "function": {"name": "rooms", "arguments": '{"n": 5}'}},
            ],
        },
        {"role": "tool", "tool_call_id": "example_3_1", "content": '[{"room": "Nova"}]'},
        {"role": "tool", "tool_call_id": "example_3_2", "content": "none"},
        {"role": "assistant", "content": "Nova"},
    ]
    agl.PromptTemplate(template="x", engine="f-string", examples=turns)  # valid worked examples
    assert demonstration_messages(messages[:3], call_id_prefix="e") == []  # ends on a tool call: no answer
    assert demonstration_messages(messages[:2], call_id_prefix="e") == []  # no answer at all
    assert demonstration_messages([{"role": "assistant", "content": ""}], call_id_prefix="e") == []


def test_candidates_differing_only_in_their_examples_are_different_prompts() -> None:
    plain = agl.PromptTemplate(template="Q: {q}", engine="f-string")
    worked = agl.PromptTemplate(template="Q: {q}", engine="f-string", examples=[{"role": "user", "content": "Q: 1"}])
    assert template_key(plain) != template_key(worked)
    assert template_key(worked) == template_key(worked.model_copy(deep=True))


def test_demonstrations_are_rewarded_runs_one_per_task_best_first() -> None:
    seed = agl.PromptTemplate(template="Q: {q}", engine="f-string")
    search = FewShotAPO(demo_min_reward=1.0)

    def run(answer: str) -> RolloutResultForAPO:
        return _result([{"role": "user", "content": "Q: x"}, {"role": "assistant", "content": answer}])

    demos = search.collect_demonstrations(
        [
            ("0", 1.0, run("a much longer answer")),
            ("0", 1.0, run("short")),
            ("1", 0.0, run("wrong")),
            ("2", 1.0, _result([{"role": "assistant", "content": "x"}], status="failed")),
            ("3", 1.0, run("three")),
        ],
        seed,
    )
    assert [(d.task_key, d.text.splitlines()[-1]) for d in demos] == [
        ("0", "Assistant: short"),
        ("3", "Assistant: three"),
    ]


def test_demonstrations_are_escaped_for_the_template_engine() -> None:
    search = FewShotAPO()
    demo = Demonstration("0", 1.0, 'Tool result: {"room": "Nova"}')
    for engine, fields in (("f-string", {"q": "Q"}), ("jinja", {"q": "Q"})):
        template = agl.PromptTemplate(template="{q}" if engine == "f-string" else "{{ q }}", engine=engine)
        filled = search.with_demonstrations(template, [demo]).format(**fields)
        assert filled.startswith("Examples of solved tasks:\n\nExample 1:") and filled.endswith("\n\nQ")
        assert '{"room": "Nova"}' in filled
    after = FewShotAPO(demo_position="after").with_demonstrations(
        agl.PromptTemplate(template="{q}", engine="f-string"), [demo]
    )
    assert after.format(q="Q").startswith("Q\n\nExamples of solved tasks:")


def test_candidate_selections_start_with_the_top_and_are_distinct() -> None:
    search = FewShotAPO(max_demos=2, num_candidate_sets=5, seed=3)
    selections = search.candidate_selections(4)
    assert selections[0] == (0, 1) and len(selections) == len(set(selections)) == 5
    assert all(1 <= len(s) <= 2 for s in selections)
    assert search.candidate_selections(1) == [(0,)] and search.candidate_selections(0) == []


def test_fewshot_search_adds_demonstrations_that_raise_the_score(script: Script, optimizer_client: Any) -> None:
    search = FewShotAPO(max_demos=2, bootstrap_tasks=6, num_candidate_sets=3, val_batch_size=2, use_poml=False)
    store = fit(search)
    best = search.get_best_prompt()
    assert search.best_score == 1.0 and "Examples of solved tasks" in best.template
    assert best.format(country="Peru").endswith("Answer the question. Capital of Peru?")
    easy = {key for key, task in keyed(TRAIN) if task["country"] in ("France", "Japan")}  # the easy training tasks
    assert {d.task_key for d in search.demonstrations} == easy
    assert not script.calls("critic")  # no optimizer model needed
    records = asyncio.run(load_search_run(store, search.run_id))
    assert records[0].scores["bootstrap"] and records[1].origin == "demonstrations"


def test_fewshot_as_chat_turns_sends_the_demonstrations_before_the_request(
    script: Script, optimizer_client: Any
) -> None:
    seed_example = [{"role": "user", "content": "A geography quiz follows."}]  # sent by the seed, not by a run
    seed = agl.PromptTemplate(template=SEED_TEMPLATE, engine="f-string", examples=seed_example)
    search = FewShotAPO(
        max_demos=2, bootstrap_tasks=6, num_candidate_sets=3, val_batch_size=2, demo_format="messages", use_poml=False
    )
    store = fit(search, initial_resources={"prompt_template": seed})
    best = search.get_best_prompt()
    assert search.best_score == 1.0 and best.template == SEED_TEMPLATE  # the text is left as it was
    assert best.examples[:1] == seed_example and len(best.examples) > 1
    # every demonstration is one training run without the seed's example: its request and its answer
    for demo in search.demonstrations:
        assert [turn["role"] for turn in demo.messages] == ["user", "assistant"]
        assert demo.messages[0]["content"].startswith("Answer the question. Capital of")
    sent = [call["messages"] for call in script.calls("agent")]
    assert any(messages[:-1] == best.examples for messages in sent)  # the agent sent the winner's examples
    records = asyncio.run(load_search_run(store, search.run_id))
    assert records[-1].template.examples  # the stored candidates keep their examples (a resumed run sees them)


def test_fewshot_warns_when_the_agent_does_not_send_the_examples(optimizer_client: Any, caplog: Any) -> None:
    search = FewShotAPO(bootstrap_tasks=6, num_candidate_sets=1, val_batch_size=2, demo_format="messages")
    with caplog.at_level(logging.WARNING):
        fit(search, agent=capital_agent_without_examples)
    assert "prompt_template.format_messages" in caplog.text


def test_fewshot_without_any_rewarded_run_keeps_the_seed(optimizer_client: Any, caplog: Any) -> None:
    search = FewShotAPO(bootstrap_tasks=2, use_poml=False)
    with caplog.at_level(logging.WARNING):
        fit(search, train=[{"country": "Chile"}, {"country": "Egypt"}])
    assert "no demonstration to add" in caplog.text
    assert search.get_best_prompt().template == SEED_TEMPLATE and search.best_version == "v0"


def test_the_rollout_budget_stops_the_search(optimizer_client: Any, caplog: Any) -> None:
    search = FewShotAPO(bootstrap_tasks=6, use_poml=False, max_rollouts=len(VAL) + 1)
    with caplog.at_level(logging.WARNING):
        fit(search)
    assert "rollout budget spent" in caplog.text and search.rollouts_enqueued == len(VAL)
    assert search.get_best_prompt().template == SEED_TEMPLATE


# -- the repetition guard -------------------------------------------------------------------------------------------


def _answered(*answers: str) -> Evaluation:
    """A candidate's evaluation on tasks "0", "1", ...: reward 1 where the answer is the task's gold ``g<key>`` or
    ``Paris`` on task 0 (the only task whose gold is the demonstration's answer)."""
    keys = [str(i) for i in range(len(answers))]
    rewards = [1.0 if a == f"g{i}" or (i == 0 and a.strip().lower() == "paris") else 0.0 for i, a in enumerate(answers)]
    outcomes = [_result([{"role": "user", "content": "Q"}, {"role": "assistant", "content": a}]) for a in answers]
    return Evaluation("v1", "val-batch", keys, rewards, outcomes)


def test_a_candidate_gaining_only_where_it_repeats_a_demonstration_is_refused() -> None:
    seed = {"0": 0.0, "1": 0.0, "2": 0.0, "3": 0.0}
    check = echo_check(_answered(" PARIS", "Paris", "paris ", "Paris"), seed, {"paris"})
    assert check.answer == "paris" and check.share == 1.0 and check.gain_elsewhere == 0.0 and check.refused
    # repeating on some tasks, wrong on the rest: still nothing gained elsewhere
    assert echo_check(_answered("Paris", "Paris", "x", "y"), seed, {"paris"}).refused


def test_a_candidate_that_also_gains_elsewhere_or_repeats_nothing_is_admitted() -> None:
    seed = {"0": 0.0, "1": 0.0, "2": 0.0, "3": 0.0}
    check = echo_check(_answered("Paris", "g1", "Paris", "x"), seed, {"paris", "tokyo"})
    assert check.answer == "paris" and check.share == 0.5 and check.gain_elsewhere == 0.25 and not check.refused
    fresh = echo_check(_answered("g0", "g1", "x", "y"), seed, {"paris"})
    assert fresh.answer is None and fresh.share == 0.0 and fresh.gain_elsewhere == 0.5 and not fresh.refused
    # the seed already solved the task gained elsewhere: no gain there, so refused
    assert echo_check(_answered("Paris", "g1", "Paris", "x"), {**seed, "1": 1.0}, {"paris"}).refused


def test_scores_without_runs_or_answers_are_not_taken_for_repetition() -> None:
    cached = Evaluation("v1", "val-full", ["0", "1"], [1.0, 0.0])  # scores reused from the store: no runs
    assert not echo_check(cached, {}, {"paris"}).refused
    silent = _result([{"role": "user", "content": "Q"}, {"role": "assistant", "content": "  "}])
    assert final_answer(silent) is None
    assert final_answer(_result([{"role": "user", "content": "Q"}])) is None


def test_fewshot_refuses_a_demonstration_the_model_only_parrots(
    script: Script, optimizer_client: Any, caplog: Any
) -> None:
    search = FewShotAPO(max_demos=1, bootstrap_tasks=3, num_candidate_sets=1, val_batch_size=4, use_poml=False)
    train = [{"country": "France", "easy": True}, {"country": "Chile"}, {"country": "Egypt"}]
    val = [{"country": c} for c in ("France", "France", "Peru", "Canada")]
    with caplog.at_level(logging.INFO):
        fit(search, agent=parrot_agent, train=train, val=val)
    assert [d.answer for d in search.demonstrations] == ["paris"]
    check = search.echo_checks["v1"]
    assert check.refused and check.answer == "paris" and check.share == 1.0
    assert search.best_version == "v0" and search.get_best_prompt().template == SEED_TEMPLATE
    assert "refused: its gain is only repetition" in caplog.text
    assert search.summary()["echo_checks"]["v1"]["refused"] is True
    # unguarded, the parroting candidate would have won: it scores 0.5 where the seed scores 0
    scores = {e.version: e.mean for e in search.evaluations if e.purpose == "val-batch"}
    assert scores == {"v1": 0.5} and search.best_score == 0.0


def test_a_refused_finalist_is_filed_apart_so_that_a_resumed_run_ignores_it() -> None:
    store = agl.InMemoryLightningStore()
    search = FewShotAPO()
    search.set_store(store)
    candidate = VersionedPromptTemplate("v1", agl.PromptTemplate(template=SEED_TEMPLATE, engine="f-string"))
    search._full_val_cache[template_key(candidate.prompt_template)] = {"0": 1.0}

    async def refuse() -> List[Any]:
        tag = {"run_id": search.run_id, "version": "v1", "purpose": "val-full", "task": "0", "reward": 1.0}
        rollout = await store.enqueue_rollout(input={}, mode="val", metadata={METADATA_KEY: tag})
        evaluation = Evaluation("v1", "val-full", ["0"], [1.0], rollout_ids=[rollout.rollout_id])
        await search._file_as_refused(candidate, evaluation)
        return await load_search_run(store, search.run_id)

    records = asyncio.run(refuse())
    assert records[0].scores == {REFUSED_FULL_VAL: {"0": 1.0}} and not search._full_val_cache


@pytest.mark.parametrize(
    ("cls", "kwargs", "message"),
    [
        (FewShotAPO, {"max_demos": 0}, "max_demos"),
        (FewShotAPO, {"demo_position": "middle"}, "demo_position"),
        (FewShotAPO, {"demo_format": "json"}, "demo_format"),
        (FewShotAPO, {"max_rollouts": 0}, "max_rollouts"),
        (ParetoAPO, {"rounds": -1}, "rounds"),
        (ParetoAPO, {"reflection_batch_size": 0}, "reflection_batch_size"),
        (ParetoAPO, {"temperature": 2.5}, "temperature must be at most 2"),
    ],
)
def test_bad_options_are_rejected(cls: Any, kwargs: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        cls(None, **kwargs)
