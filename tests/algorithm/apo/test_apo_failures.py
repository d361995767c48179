"""Budgets under concurrent evaluations, a failed resume, and bad seeds or clients, against the scripted stand-in."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from apo_standin import VAL, Script, fit, make_apo

import agentbolt as agl
from agentbolt.algorithm.apo import APO, APPLY_EDIT_PROMPT_FILES, GRADIENT_PROMPT_FILES, FewShotAPO, ParetoAPO
from agentbolt.algorithm.apo.search import METADATA_KEY


def _tagged_rollouts(store: Any) -> list:
    return [r for r in asyncio.run(store.query_rollouts()) if METADATA_KEY in (r.metadata or {})]


def test_concurrent_branches_never_enqueue_more_rollouts_than_the_budget(
    optimizer_client: Any, sqlite_path: Any
) -> None:
    budget = len(VAL) + 2  # the seed's validation and one branch's training batch; three branches run at once
    apo = make_apo(optimizer_client, branch_factor=3, max_rollouts=budget)
    store = fit(apo, store=agl.SqliteLightningStore(sqlite_path))
    enqueued = _tagged_rollouts(store)
    assert len(enqueued) <= budget
    assert apo.summary()["rollouts"] == len(enqueued)


def test_a_spent_budget_ends_the_search_once_the_evaluations_under_way_are_scored(
    script: Script, optimizer_client: Any
) -> None:
    # three new candidates: the beam and two of them fit in the budget on the validation batch, the third does not
    script.push(
        "editor",
        "Answer with ONLY THE CITY name. Capital of {country}?",
        "ONLY THE CITY, please. Capital of {country}?",
        "Reply with ONLY THE CITY. Capital of {country}?",
    )
    budget = len(VAL) + 3 * 2 + 3 * 2
    apo = make_apo(optimizer_client, beam_width=3, max_rollouts=budget)  # three branches of the seed
    store = fit(apo)
    enqueued = _tagged_rollouts(store)
    assert apo.summary()["rollouts"] == len(enqueued) == budget
    assert all(r.status == "succeeded" for r in enqueued)
    assert all(r.metadata[METADATA_KEY].get("reward") is not None for r in enqueued)  # every score was recorded


def test_resume_of_an_unknown_run_writes_nothing(optimizer_client: Any) -> None:
    store = agl.InMemoryLightningStore()
    apo = make_apo(optimizer_client, run_id="never-ran", resume=True)
    with pytest.raises(ValueError, match="no candidates of run 'never-ran'"):
        fit(apo, store=store)
    assert asyncio.run(store.get_resources_by_id("never-ran-best")) is None
    assert asyncio.run(store.get_latest_resources()) is None and not asyncio.run(store.query_rollouts())


@pytest.mark.parametrize(
    ("template", "engine"),
    [("Capital of {country", "f-string"), ("Capital of {{ country ?", "jinja"), ("Capital of {}?", "f-string")],
)
def test_a_seed_that_is_not_a_valid_template_is_an_error_naming_it(
    optimizer_client: Any, template: str, engine: str
) -> None:
    apo = make_apo(optimizer_client)
    store = agl.InMemoryLightningStore()
    seed = agl.PromptTemplate(template=template, engine=engine)
    with pytest.raises(ValueError, match=f"The seed PromptTemplate 'prompt_template' is not a valid {engine} template"):
        fit(apo, store=store, initial_resources={"prompt_template": seed})
    assert not asyncio.run(store.query_rollouts())


@pytest.mark.parametrize("build", [lambda: make_apo(None), lambda: ParetoAPO(None, use_poml=False)])
def test_a_search_asking_an_optimizer_model_without_a_client_fails_before_any_rollout(build: Any) -> None:
    store = agl.InMemoryLightningStore()
    with pytest.raises(ValueError, match="async_openai_client is None"):
        fit(build(), store=store)
    assert not asyncio.run(store.query_rollouts())


def test_searches_that_ask_no_optimizer_model_need_no_client(standin: Any) -> None:
    for algorithm in (make_apo(None, beam_rounds=0), FewShotAPO(None, bootstrap_tasks=2, val_batch_size=2)):
        fit(algorithm)
        assert algorithm.best_version is not None


def test_a_seed_no_task_can_fill_stops_every_branch_before_any_optimizer_call(
    script: Script, optimizer_client: Any
) -> None:
    apo = make_apo(optimizer_client, branch_factor=3, run_initial_validation=False)
    seed = agl.PromptTemplate(template="Capital of {country} in {year}?", engine="f-string")
    with pytest.raises(ValueError, match="no value for the placeholder 'year'"):
        fit(apo, initial_resources={"prompt_template": seed})
    assert not script.calls("critic") and apo.optimizer.usage.failed_calls == 0


def _prompt_file(tmp_path: Any, body: str) -> Any:
    path = tmp_path / "mine.poml"
    path.write_text(
        f'<poml>\n<system-msg>You review prompts.</system-msg>\n<human-msg whiteSpace="pre">{body}</human-msg>\n</poml>\n'
    )
    return path


@pytest.mark.parametrize(
    ("build", "option", "known"),
    [
        (lambda f: APO(None, gradient_prompt_files=[f]), "gradient_prompt_files", "experiments_text"),
        (lambda f: APO(None, apply_edit_prompt_files=[f]), "apply_edit_prompt_files", "critique"),
        (lambda f: ParetoAPO(None, reflect_prompt_files=[f]), "reflect_prompt_files", "experiments_text"),
        (lambda f: ParetoAPO(None, merge_prompt_files=[f]), "merge_prompt_files", "template_a"),
    ],
)
def test_a_prompt_file_using_a_name_the_optimizer_does_not_fill_is_refused_when_built(
    tmp_path: Any, build: Any, option: str, known: str
) -> None:
    path = _prompt_file(tmp_path, "{{ prompt_templat }} and {{ runs }}")
    with pytest.raises(ValueError, match=rf"{option}: the prompt file .*mine.poml uses \['prompt_templat', 'runs'\]"):
        build(path)
    with pytest.raises(ValueError, match=known):
        build(path)


def test_a_prompt_file_may_use_the_names_it_binds_itself(tmp_path: Any) -> None:
    path = _prompt_file(
        tmp_path,
        '<let name="intro" value="Runs:" />{{ intro }}\n<list><item for="run in experiments">{{ run }}</item></list>\n'
        "{{ prompt_template }}",
    )
    assert APO(None, gradient_prompt_files=[path]).gradient_prompt_files == [path]


def test_the_shipped_prompt_files_pass_the_check_when_given_explicitly() -> None:
    from agentbolt.algorithm.apo.prompts import MERGE_PROMPT_FILES, REFLECT_PROMPT_FILES

    apo = APO(None, gradient_prompt_files=GRADIENT_PROMPT_FILES, apply_edit_prompt_files=APPLY_EDIT_PROMPT_FILES)
    pareto = ParetoAPO(None, reflect_prompt_files=REFLECT_PROMPT_FILES, merge_prompt_files=MERGE_PROMPT_FILES)
    assert apo.gradient_prompt_files == GRADIENT_PROMPT_FILES and pareto.merge_prompt_files == MERGE_PROMPT_FILES


def test_a_new_run_under_the_run_id_of_a_stored_run_is_refused(standin: Any, sqlite_path: Any) -> None:
    fit(make_apo(None, run_id="exp", beam_rounds=0), store=agl.SqliteLightningStore(sqlite_path))
    store = agl.SqliteLightningStore(sqlite_path)
    stored = len(_tagged_rollouts(store))
    with pytest.raises(ValueError, match="already holds run 'exp': pass resume=True to continue it, or another run_id"):
        fit(make_apo(None, run_id="exp", beam_rounds=0), store=store)
    assert len(_tagged_rollouts(store)) == stored


@pytest.mark.parametrize(
    "build",
    [
        lambda: make_apo(None, beam_rounds=0),
        lambda: ParetoAPO(None, rounds=0, use_poml=False),
        lambda: FewShotAPO(None, bootstrap_tasks=2, val_batch_size=2, seed=0),
    ],
)
def test_each_run_of_one_optimizer_is_a_run_of_its_own(standin: Any, build: Any) -> None:
    store = agl.InMemoryLightningStore()
    algorithm = build()
    fit(algorithm, store=store)
    first_id, first = algorithm.run_id, algorithm.summary()
    fit(algorithm, store=store)
    second = algorithm.summary()
    assert algorithm.run_id != first_id
    assert (second["best_version"], second["best_score"]) == (first["best_version"], first["best_score"])
    # the second run's counts and budgets are its own, and the store keeps the two runs apart
    assert second["rollouts"] == first["rollouts"] > 0
    runs = [r.metadata[METADATA_KEY]["run_id"] for r in _tagged_rollouts(store)]
    assert (runs.count(first_id), runs.count(algorithm.run_id)) == (first["rollouts"], second["rollouts"])


@agl.rollout
async def _reward_from_task(task: Any, prompt_template: agl.PromptTemplate) -> Any:
    """Fills the template and returns the task's own ``reward``: None (no reward), NaN, or a number."""
    prompt_template.format(country=task["country"])
    return task["reward"]


def test_rollouts_that_succeed_without_a_reward_score_zero_and_are_counted(standin: Any, caplog: Any) -> None:
    val = [{"country": "Peru", "reward": None}, {"country": "Chile", "reward": float("nan")}]
    val.append({"country": "Kenya", "reward": 1.0})
    apo = make_apo(None, beam_rounds=0)
    with caplog.at_level(logging.WARNING, logger="agentbolt.algorithm.apo.apo"):
        fit(apo, val=val, agent=_reward_from_task)
    assert apo.best_score == pytest.approx(1 / 3)
    assert (apo.summary()["rollouts_unrewarded"], apo.summary()["rollouts_failed"]) == (2, 0)
    assert "2 rollout(s) of 3 succeeded without a reward; each scored 0" in caplog.text


@agl.rollout
async def _fails_or_scores_below_zero(task: Any, prompt_template: agl.PromptTemplate) -> Any:
    """Fills the template; fails for a task without a ``reward``, else returns it."""
    prompt_template.format(country=task["country"])
    if task["reward"] is None:
        raise RuntimeError("the agent crashed")
    return task["reward"]


def test_failures_scoring_above_negative_rewards_are_pointed_out(standin: Any, caplog: Any) -> None:
    val = [{"country": "Peru", "reward": None}, {"country": "Chile", "reward": -1.0}]
    apo = make_apo(None, beam_rounds=0)
    with caplog.at_level(logging.WARNING, logger="agentbolt.algorithm.apo.apo"):
        fit(apo, val=val, agent=_fails_or_scores_below_zero)
    assert apo.summary()["rollouts_failed"] == 1
    assert "1 rollout(s) failed and 0 timed out of 2; each scored 0. 1 rollout(s) that worked scored below 0" in (
        caplog.text
    )


def test_failures_with_non_negative_rewards_say_no_more(standin: Any, caplog: Any) -> None:
    val = [{"country": "Peru", "reward": None}, {"country": "Chile", "reward": 0.0}]
    apo = make_apo(None, beam_rounds=0)
    with caplog.at_level(logging.WARNING, logger="agentbolt.algorithm.apo.apo"):
        fit(apo, val=val, agent=_fails_or_scores_below_zero)
    assert "timed out of 2; each scored 0." in caplog.text
    assert "scored below 0" not in caplog.text
