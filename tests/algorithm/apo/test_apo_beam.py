"""APO's beam search run by a Trainer against a scripted optimizer served over HTTP (apo_standin.py)."""

from __future__ import annotations

import asyncio
import json
import logging
import random
import re
from typing import Any

import pytest
from apo_standin import GOOD_TEMPLATE, SEED_TEMPLATE, TRAIN, VAL, Script, fit, make_apo

import agentbolt as agl
from agentbolt.algorithm.apo import APO, OptimizerError, ParetoAPO, load_search_run
from agentbolt.algorithm.apo.search import keyed


def test_apo_is_the_class_behind_agl_and_keeps_the_contract_defaults() -> None:
    assert agl.APO is APO and agl.algorithm.APO is APO
    apo = APO(None)
    assert (apo.gradient_model, apo.apply_edit_model) == ("gpt-5-mini", "gpt-4.1-mini")
    assert (apo.diversity_temperature, apo.gradient_batch_size, apo.val_batch_size) == (1.0, 4, 16)
    assert (apo.beam_width, apo.branch_factor, apo.beam_rounds) == (4, 4, 3)
    assert (apo.rollout_batch_timeout, apo.run_initial_validation) == (3600.0, True)
    assert apo._history_best_prompt is None and apo._history_best_score == float("-inf")
    assert apo._history_best_version is None and apo._version_counter == 0
    with pytest.raises(ValueError, match="No best prompt found"):
        apo.get_best_prompt()


def test_log_prefix_and_versions() -> None:
    apo = APO(None)
    assert apo._format_log_prefix(round_num=1, beam_idx=2, branch_idx=3, prompt_version="v4") == (
        "[Round 01 | Beam 02 | Branch 03 | Prompt v4]"
    )
    assert apo._format_log_prefix(round_num=12) == "[Round 12]"
    assert apo._format_log_prefix() == ""
    template = agl.PromptTemplate(template="x", engine="f-string")
    assert [apo._create_versioned_prompt(template).version for _ in range(3)] == ["v0", "v1", "v2"]


def test_beam_search_finds_the_better_prompt(script: Script, optimizer_client: Any, caplog: Any) -> None:
    apo = make_apo(optimizer_client, use_poml=None)
    with caplog.at_level(logging.INFO, logger="agentbolt.algorithm.apo.apo"):
        store = fit(apo)
    assert apo.get_best_prompt().template == GOOD_TEMPLATE
    assert apo.best_version == "v1" and apo.best_score == 1.0
    # the critique saw the parent's training rollouts: messages of the agent, reward and status
    critique_request = script.calls("critic")[0]["messages"][-1]["content"]
    assert "reward" in critique_request and "Capital of" in critique_request and SEED_TEMPLATE in critique_request
    # the edit call got the critique and the placeholders to keep
    edit_request = script.calls("editor")[0]["messages"][-1]["content"]
    assert "city name alone" in edit_request and "{country}" in edit_request
    assert "[Round 01 | Beam 00 | Branch 00 | Prompt v0]" in caplog.text
    # every candidate is in the store with its scores; the best is the latest resources
    records = asyncio.run(load_search_run(store, apo.run_id))
    assert [r.version for r in records] == ["v0", "v1"]
    assert records[0].mean("val-full") == pytest.approx(0.25)  # only Kenya is easy
    assert records[1].origin == "edit" and records[1].parents == ["v0"] and "city name" in records[1].note
    assert records[1].scores["val-full"] == {key: 1.0 for key, _ in keyed(VAL)}
    latest = asyncio.run(store.get_latest_resources())
    assert latest.resources_id == f"{apo.run_id}-best"
    assert latest.resources["prompt_template"].template == GOOD_TEMPLATE
    summary = apo.summary()
    assert summary["optimizer_calls"] == 2 and summary["optimizer_prompt_tokens"] > 0
    assert summary["rollouts"] == len(VAL) + 2 + 2 * 2 + len(VAL)


def test_a_failing_optimizer_call_is_retried_with_backoff(script: Script, optimizer_client: Any) -> None:
    script.push("critic", 500, 503)
    apo = make_apo(optimizer_client)
    fit(apo)
    assert len(script.calls("critic")) == 3
    assert apo.get_best_prompt().template == GOOD_TEMPLATE
    assert apo.optimizer.usage.failed_calls == 0


def test_an_optimizer_call_failing_every_retry_skips_the_candidate(
    script: Script, optimizer_client: Any, caplog: Any
) -> None:
    script.push("critic", 500, 500, 0.5)  # round 1 fails every attempt; round 2 gets the default replies
    apo = make_apo(optimizer_client, optimizer_retries=2, optimizer_timeout=0.2, beam_rounds=2)
    with caplog.at_level(logging.WARNING):
        fit(apo)
    assert "Optimizer critique call failed after 3 attempts (timed out)" in caplog.text
    assert "[Round 01 | Beam 00 | Branch 00 | Prompt v0] Skipped this branch" in caplog.text
    assert apo.optimizer.usage.failed_calls == 1 and apo.skipped_candidates == 1
    assert apo.get_best_prompt().template == GOOD_TEMPLATE


def test_a_search_in_which_every_optimizer_call_failed_ends_with_an_error(
    script: Script, optimizer_client: Any, caplog: Any
) -> None:
    script.push("critic", 500, 500, 0.5)
    apo = make_apo(optimizer_client, optimizer_retries=2, optimizer_timeout=0.2, beam_rounds=1)
    with caplog.at_level(logging.WARNING), pytest.raises(OptimizerError, match=r"Every optimizer call failed \(1 of 1"):
        store = agl.InMemoryLightningStore()
        fit(apo, store=store)
    assert "best prompt stays v0" in caplog.text
    assert apo.get_best_prompt().template == SEED_TEMPLATE and apo.best_version == "v0"  # the seed, never lost
    latest = asyncio.run(store.get_latest_resources())
    assert latest.resources_id == f"{apo.run_id}-best"


@pytest.mark.parametrize("status", [401, 403, 404])
def test_a_refused_model_key_or_url_fails_the_run_at_once(script: Script, optimizer_client: Any, status: int) -> None:
    script.push("critic", status)
    apo = make_apo(optimizer_client, beam_rounds=3)
    with pytest.raises(OptimizerError) as raised:
        fit(apo)
    message = str(raised.value)
    assert f"model 'critic' (gradient_model) with HTTP {status}" in message
    assert optimizer_client.base_url.host in message and "check the model name, the base URL and the API key" in message
    assert len(script.calls("critic")) == 1 and not script.calls("editor")  # no retry, no further round
    assert apo.get_best_prompt().template == SEED_TEMPLATE


@pytest.mark.parametrize(("status", "attempts"), [(400, 1), (422, 1), (408, 2), (409, 2), (429, 2), (500, 2)])
def test_only_statuses_a_retry_can_cure_are_retried(
    script: Script, optimizer_client: Any, caplog: Any, status: int, attempts: int
) -> None:
    script.push("critic", status)  # round 1's critique; round 2 gets the default replies
    apo = make_apo(optimizer_client, beam_rounds=2)
    with caplog.at_level(logging.WARNING):
        fit(apo)
    assert len(script.calls("critic")) == attempts + 1
    assert apo.optimizer.usage.failed_calls == (1 if attempts == 1 else 0)
    assert (f"critique call failed with HTTP {status}, which a retry cannot mend" in caplog.text) == (attempts == 1)
    assert apo.get_best_prompt().template == GOOD_TEMPLATE


def test_a_reply_without_content_is_a_failed_call(script: Script, optimizer_client: Any) -> None:
    script.push("editor", None)  # round 1's edit; round 2 gets the default replies
    apo = make_apo(optimizer_client, beam_rounds=2)
    fit(apo)
    summary = apo.summary()
    # three replies with text (two critiques, one edit), one without
    assert (summary["optimizer_calls"], summary["optimizer_failed_calls"], summary["skipped_candidates"]) == (3, 1, 1)


def test_an_edit_that_drops_a_placeholder_is_skipped(script: Script, optimizer_client: Any, caplog: Any) -> None:
    script.push("editor", "Answer with ONLY THE CITY name. Capital of France?")
    apo = make_apo(optimizer_client)
    with caplog.at_level(logging.WARNING):
        fit(apo)
    assert "the rewritten template dropped ['country']" in caplog.text
    assert apo.skipped_candidates == 1 and apo.get_best_prompt().template == SEED_TEMPLATE


def test_failed_rollouts_score_zero_and_are_counted(optimizer_client: Any, caplog: Any) -> None:
    apo = make_apo(optimizer_client, beam_rounds=0)
    val = [*VAL[:1], {"country": "Kenya", "crash": True}]
    with caplog.at_level(logging.WARNING):
        fit(apo, val=val)
    assert apo.best_score == 0.5 and apo.rollouts_failed == 1
    assert "1 rollout(s) failed and 0 timed out of 2" in caplog.text


def test_rollouts_past_the_batch_timeout_are_cancelled_and_score_zero(optimizer_client: Any) -> None:
    apo = make_apo(optimizer_client, beam_rounds=0, rollout_batch_timeout=0.01)
    store = fit(apo)
    assert apo.rollouts_timed_out + apo.rollouts_failed >= 1 and apo.best_score < 0.25 + 1e-9
    statuses = {r.status for r in asyncio.run(store.query_rollouts())}
    assert statuses <= {"succeeded", "cancelled", "failed"}


def test_the_token_budget_stops_the_search_with_the_best_prompt(script: Script, optimizer_client: Any) -> None:
    apo = make_apo(optimizer_client, beam_rounds=3, max_optimizer_tokens=1)
    fit(apo)
    assert apo.optimizer.usage.calls == 1  # the critique spent the budget; the edit never ran
    assert apo.get_best_prompt().template == SEED_TEMPLATE


def test_resume_continues_a_stored_run(script: Script, optimizer_client: Any, standin: Any, sqlite_path: Any) -> None:
    from openai import AsyncOpenAI

    first = make_apo(optimizer_client, run_id="resumable", beam_rounds=1)
    fit(first, store=agl.SqliteLightningStore(sqlite_path))
    assert first.best_version == "v1"
    script.push("editor", "City only, please: ONLY THE CITY. Capital of {country}?")
    # a new process would build a new client; one client's connections belong to the event loop that opened them
    client = AsyncOpenAI(base_url=standin.base_url, api_key="stand-in", max_retries=0)
    second = make_apo(client, run_id="resumable", resume=True, beam_rounds=2)
    store = fit(second, store=agl.SqliteLightningStore(sqlite_path))
    assert second.best_version == "v1" and second.best_score == 1.0  # restored, not recomputed
    records = asyncio.run(load_search_run(store, "resumable"))
    assert [r.version for r in records] == ["v0", "v1", "v2"]
    assert records[2].round == 2 and records[2].parents == ["v1"]
    assert len(script.calls("critic")) == 2  # one per round: round 1 was not redone


def test_a_resumed_run_continues_after_the_last_finished_round(
    script: Script, optimizer_client: Any, standin: Any, sqlite_path: Any, caplog: Any
) -> None:
    from openai import AsyncOpenAI

    # Round 1 finds v1; round 2's candidate ties with it, so v1 stays the leader and its stored full-validation
    # scores are reused. The rollout budget then stops the run at the start of round 3.
    script.push("editor", GOOD_TEMPLATE, "Reply with ONLY THE CITY name, nothing else. Capital of {country}?")
    rollouts_through_round_2 = len(VAL) + (2 + 2 * 2 + len(VAL)) + (2 + 2 * 2)
    first = make_apo(optimizer_client, run_id="stopped", beam_rounds=3, max_rollouts=rollouts_through_round_2)
    fit(first, store=agl.SqliteLightningStore(sqlite_path))
    assert first.summary()["rollouts"] == rollouts_through_round_2 and len(script.calls("critic")) == 2
    records = asyncio.run(load_search_run(agl.SqliteLightningStore(sqlite_path), "stopped"))
    assert max(r.validated_in_round for r in records) == 2  # the reuse in round 2 is in the store

    client = AsyncOpenAI(base_url=standin.base_url, api_key="stand-in", max_retries=0)
    second = make_apo(client, run_id="stopped", resume=True, beam_rounds=3)
    with caplog.at_level(logging.INFO, logger="agentbolt.algorithm.apo.apo"):
        fit(second, store=agl.SqliteLightningStore(sqlite_path))
    assert "Rounds 1-2 of 3 are done; continuing with round 3." in caplog.text
    assert "Round 3/3" in caplog.text and "Round 1/3" not in caplog.text and "Round 2/3" not in caplog.text
    assert len(script.calls("critic")) == 3  # only round 3 asked for a critique
    assert second.best_version == "v1" and second.best_score == 1.0


def _batches_in_order(dataset: Any, batch_size: int) -> Any:
    """Consecutive slices of ``dataset`` in turn: batches a test can name, instead of random draws."""
    start = 0
    while True:
        yield [dataset[(start + i) % len(dataset)] for i in range(batch_size)]
        start += batch_size


def test_a_resumed_run_continues_from_the_beam_its_last_round_kept(
    script: Script, standin: Any, sqlite_path: Any, monkeypatch: Any, caplog: Any
) -> None:
    from openai import AsyncOpenAI

    import agentbolt.algorithm.apo.apo as apo_module

    monkeypatch.setattr(apo_module, "batch_iter_over_dataset", _batches_in_order)
    # One validation task per round: Kenya (which every prompt solves), then Peru (which these prompts miss).
    # Round 1: v1 ties with the seed on Kenya, the seed stays. Round 2: v2 ties with it on Peru, the seed stays.
    # v1's score on Kenya alone is the best of the run, but on another task than the seed's scores: the beam
    # round 2 kept is the seed.
    script.push("editor", "Be brief. Capital of {country}?", "Be short. Capital of {country}?")
    first = make_apo(
        AsyncOpenAI(base_url=standin.base_url, api_key="stand-in", max_retries=0),
        run_id="kept",
        val_batch_size=1,
        beam_rounds=2,
    )
    fit(first, store=agl.SqliteLightningStore(sqlite_path))
    assert [c["messages"][-1]["content"].count(SEED_TEMPLATE) > 0 for c in script.calls("critic")] == [True, True]

    second = make_apo(
        AsyncOpenAI(base_url=standin.base_url, api_key="stand-in", max_retries=0),
        run_id="kept",
        val_batch_size=1,
        beam_rounds=3,
        resume=True,
    )
    with caplog.at_level(logging.INFO, logger="agentbolt.algorithm.apo.apo"):
        store = fit(second, store=agl.SqliteLightningStore(sqlite_path))
    records = asyncio.run(load_search_run(store, "kept"))
    assert records[3].round == 3 and records[3].parents == ["v0"]
    assert "continuing with round 3. Beam ['v0']: the one round 2 kept." in caplog.text
    assert records[1].batch_scores == {1: {keyed(VAL)[0][0]: 1.0}}


def test_resume_of_an_unknown_run_is_an_error(optimizer_client: Any) -> None:
    apo = make_apo(optimizer_client, run_id="never-ran", resume=True)
    with pytest.raises(ValueError, match="no candidates of run 'never-ran'"):
        fit(apo)
    assert apo.get_best_prompt().template == SEED_TEMPLATE


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"train": []}, "non-empty train_dataset"),
        ({"val": []}, "non-empty val_dataset"),
        ({"initial_resources": None}, "No initial resources"),
        ({"initial_resources": {"llm": agl.LLM(endpoint="http://x", model="m")}}, "No PromptTemplate"),
        ({"adapter": agl.TracerTraceToTriplet()}, "TraceToMessages"),
    ],
)
def test_bad_input_is_a_clear_error(optimizer_client: Any, kwargs: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        fit(make_apo(optimizer_client), **kwargs)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"beam_width": 0}, "beam_width must be at least 1"),
        ({"beam_rounds": -1}, "beam_rounds"),
        ({"rollout_batch_timeout": 0}, "rollout_batch_timeout"),
        ({"resume": True}, "needs the run_id"),
        ({"max_optimizer_tokens": 0}, "max_optimizer_tokens"),
        ({"gradient_prompt_files": ["/no/such.poml"]}, "does not exist"),
    ],
)
def test_bad_options_are_rejected(kwargs: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        APO(None, **kwargs)


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"rollout_batch_timeout": float("nan")}, ValueError, "rollout_batch_timeout must be a finite number"),
        ({"optimizer_timeout": float("nan")}, ValueError, "optimizer_timeout must be a finite number"),
        ({"optimizer_timeout": float("inf")}, ValueError, "optimizer_timeout must be a finite number"),
        ({"optimizer_timeout": 0}, ValueError, "optimizer_timeout must be > 0"),
        ({"max_optimizer_tokens": float("nan")}, TypeError, "max_optimizer_tokens must be an integer or None"),
        ({"max_optimizer_tokens": True}, TypeError, "max_optimizer_tokens must be an integer or None, got bool"),
        ({"optimizer_max_tokens": 0}, ValueError, "optimizer_max_tokens must be at least 1"),
        ({"optimizer_retries": 1.0}, TypeError, "optimizer_retries must be an integer"),
        ({"optimizer_backoff": -5}, ValueError, "optimizer_backoff must be at least 0"),
        ({"max_rollouts": True}, TypeError, "max_rollouts must be an integer or None, got bool"),
        ({"beam_width": True}, TypeError, "beam_width must be an integer, got bool"),
        ({"beam_rounds": 2.0}, TypeError, "beam_rounds must be an integer, got float"),
        ({"diversity_temperature": float("nan")}, ValueError, "diversity_temperature must be a finite number"),
    ],
)
def test_durations_and_budgets_must_be_finite_and_counts_integers(options: Any, error: Any, message: str) -> None:
    with pytest.raises(error, match=message):
        APO(None, **options)


def test_a_temperature_the_api_refuses_is_refused_when_built() -> None:
    with pytest.raises(
        ValueError, match=r"diversity_temperature must be at most 2 \(the OpenAI API's limit\), got 5.0"
    ):
        APO(None, diversity_temperature=5.0)
    with pytest.raises(ValueError, match="temperature must be at most 2"):
        ParetoAPO(None, temperature=2.5)
    assert APO(None, diversity_temperature=2).diversity_temperature == 2


@pytest.mark.parametrize(
    "edit",
    [
        "{country:d} x",  # a format spec: fails on every string
        "{country.__class__} of {country}",  # attribute lookup on the value
        "{country[0]} {country}",  # indexing into the value
        "{country!r} please",  # a conversion
    ],
)
def test_an_edit_writing_more_than_plain_placeholders_is_skipped(
    script: Script, optimizer_client: Any, caplog: Any, edit: str
) -> None:
    script.push("editor", edit)
    apo = make_apo(optimizer_client)
    with caplog.at_level(logging.WARNING):
        store = fit(apo)
    assert "only plain {name} placeholders are allowed" in caplog.text
    assert apo.skipped_candidates == 1 and apo.rollouts_failed == 0
    assert [r.version for r in asyncio.run(load_search_run(store, apo.run_id))] == ["v0"]


def test_an_edit_repeating_a_known_prompt_is_not_evaluated_again(script: Script, optimizer_client: Any) -> None:
    script.push("editor", f"{SEED_TEMPLATE}  \n", GOOD_TEMPLATE, GOOD_TEMPLATE + "\n")
    apo = make_apo(optimizer_client, branch_factor=3)
    store = fit(apo)
    assert apo.summary()["duplicate_candidates"] == 2 and apo.skipped_candidates == 0
    records = asyncio.run(load_search_run(store, apo.run_id))
    assert [r.version for r in records] == ["v0", "v1"] and records[1].template.template == GOOD_TEMPLATE
    assert apo.summary()["rollouts"] == len(VAL) + 3 * 2 + 2 * 2 + len(VAL)  # seed and v1 on the batch, once each


def test_an_empty_critique_leaves_the_parent_and_nothing_is_evaluated_again(
    script: Script, optimizer_client: Any
) -> None:
    script.push("critic", "  \n ")
    apo = make_apo(optimizer_client)
    store = fit(apo)
    assert not script.calls("editor") and apo.summary()["duplicate_candidates"] == 1
    assert [r.version for r in asyncio.run(load_search_run(store, apo.run_id))] == ["v0"]


@pytest.mark.parametrize(
    ("template", "engine"),
    [("Capital of {country} in {year}?", "f-string"), ("Capital of {{ country }} in {{ year }}?", "jinja")],
)
def test_a_seed_no_task_can_fill_fails_fast_naming_the_placeholder(
    script: Script, optimizer_client: Any, template: str, engine: str
) -> None:
    apo = make_apo(optimizer_client, beam_rounds=3)
    seed = agl.PromptTemplate(template=template, engine=engine)
    with pytest.raises(
        ValueError, match=r"no value for the placeholder 'year'\. The tasks have the fields \['country'\]"
    ):
        fit(apo, initial_resources={"prompt_template": seed})
    assert apo.summary()["rollouts"] == len(VAL) and not script.calls("critic")


def test_a_seed_failing_for_other_reasons_is_searched_on(optimizer_client: Any) -> None:
    crashing = [{"country": c["country"], "crash": True} for c in VAL]
    apo = make_apo(optimizer_client, beam_rounds=0)
    fit(apo, val=crashing)  # every rollout fails, but not on the template: no reason to stop
    assert apo.rollouts_failed == len(VAL) and apo.best_score == 0.0


def test_the_edit_is_taken_out_of_the_code_fence_the_model_wraps_it_in(script: Script, optimizer_client: Any) -> None:
    script.push("editor", f"Here is the improved template:\n```text\n{GOOD_TEMPLATE}\n```\nIt states the format.")
    apo = make_apo(optimizer_client)
    fit(apo)
    assert apo.get_best_prompt().template == GOOD_TEMPLATE and apo.best_score == 1.0


def test_a_fenced_output_format_in_the_edit_stays_part_of_the_template(script: Script, optimizer_client: Any) -> None:
    edited = f"{GOOD_TEMPLATE}\nFormat:\n```text\n<city>\n```"
    script.push("editor", edited)  # the bare template, as the edit prompt asks, holding a fenced block of its own
    apo = make_apo(optimizer_client)
    fit(apo)
    assert apo.get_best_prompt().template == edited and apo.best_score == 1.0


def _placeholders_to_keep(request: Any) -> str:
    """The placeholder list an edit, reflection or merge request tells the optimizer model to keep."""
    content = request["messages"][-1]["content"]
    return re.search(r"Keep these placeholders exactly as written[^:]*: (.*?)\.( Return|$)", content).group(1)


def test_the_placeholders_to_keep_are_written_in_the_seeds_own_syntax(script: Script, optimizer_client: Any) -> None:
    seed = agl.PromptTemplate(template="Answer the question. Capital of {{ country }}?", engine="jinja")
    edited = "Answer with ONLY THE CITY name. Capital of {{ country }}?"
    script.push("editor", edited)
    apo = make_apo(optimizer_client)
    fit(apo, initial_resources={"prompt_template": seed})
    assert _placeholders_to_keep(script.calls("editor")[0]) == "{{ country }}"
    assert apo.get_best_prompt() == agl.PromptTemplate(template=edited, engine="jinja") and apo.best_score == 1.0


def test_a_resumed_run_validates_again_on_changed_validation_tasks(standin: Any, sqlite_path: Any) -> None:
    # The seed solves only the easy countries: Kenya of VAL; France and Japan of the other validation set.
    other_val = [{"country": c} for c in ("France", "Japan", "Peru", "Canada")]

    def run(val: Any, **options: Any) -> APO:
        apo = make_apo(None, run_id="changing-val", beam_rounds=0, **options)
        fit(apo, val=val, store=agl.SqliteLightningStore(sqlite_path))
        return apo

    first = run(VAL)
    assert (first.best_score, first.summary()["rollouts"]) == (0.25, len(VAL))
    changed = run(other_val, resume=True)  # as many tasks, other ones: the stored scores do not apply
    assert (changed.best_score, changed.summary()["rollouts"]) == (0.5, len(other_val))
    reordered = run(VAL[::-1], resume=True)  # the first tasks in another order: their stored scores apply
    assert (reordered.best_score, reordered.summary()["rollouts"]) == (0.25, 0)


def test_two_runs_with_one_seed_draw_the_same_training_batches(standin: Any) -> None:
    from openai import AsyncOpenAI

    batches = []
    for other_use in (1, 2):
        random.seed(other_use)  # whatever else the process did with the module-level generator
        client = AsyncOpenAI(base_url=standin.base_url, api_key="stand-in", max_retries=0)
        apo = make_apo(client, seed=0, gradient_batch_size=3, run_initial_validation=False)
        fit(apo)
        batches.append([e.task_keys for e in apo.evaluations if e.purpose == "train"])
    assert batches[0] == batches[1] and len(batches[0][0]) == 3


def test_apo_is_built_from_a_plain_dict_spec(optimizer_client: Any) -> None:
    apo = agl.build_component(
        {"type": "agentbolt.algorithm.apo.APO", "async_openai_client": optimizer_client, "beam_rounds": 1},
        expected_type=agl.Algorithm,
        spec_name="algorithm",
    )
    assert isinstance(apo, APO) and apo.beam_rounds == 1
    assert TRAIN and SEED_TEMPLATE  # the module's datasets are the ones the runs above use


def test_the_optimizer_client_can_be_given_as_plain_values() -> None:
    from openai import AsyncOpenAI

    by_url = APO("http://127.0.0.1:9/v1")
    assert isinstance(by_url.async_openai_client, AsyncOpenAI)
    assert str(by_url.async_openai_client.base_url) == "http://127.0.0.1:9/v1/"
    apo = agl.build_component(
        {
            "type": "agentbolt.algorithm.apo.APO",
            "async_openai_client": {"base_url": "http://127.0.0.1:9/v1", "api_key": "k", "max_retries": 0},
            "gradient_model": "critic",
        },
        expected_type=agl.Algorithm,
        spec_name="algorithm",
    )
    assert apo.async_openai_client.api_key == "k" and apo.async_openai_client.max_retries == 0


def test_the_summary_of_a_run_that_validated_nothing_is_plain_json(script: Script, optimizer_client: Any) -> None:
    apo = make_apo(optimizer_client, beam_rounds=0, run_initial_validation=False)
    fit(apo)
    summary = apo.summary()
    assert (summary["best_version"], summary["best_score"], apo.best_score) == (None, None, float("-inf"))
    json.dumps(summary, allow_nan=False)  # a strict reader refuses -Infinity


def test_the_run_ends_reporting_the_best_prompt_and_how_many_validation_tasks_score_it(
    optimizer_client: Any, caplog: Any
) -> None:
    apo = make_apo(optimizer_client)
    with caplog.at_level(logging.INFO, logger="agentbolt.algorithm.apo.apo"):
        fit(apo)
    assert f"Best prompt v1: mean reward 1.000 on the {len(VAL)} validation tasks; " in caplog.text
    assert apo.summary()["validation_tasks"] == len(VAL)


def test_a_run_that_validated_nothing_says_so_instead_of_an_infinite_score(optimizer_client: Any, caplog: Any) -> None:
    apo = make_apo(optimizer_client, beam_rounds=0, run_initial_validation=False)
    with caplog.at_level(logging.INFO, logger="agentbolt.algorithm.apo.apo"):
        fit(apo)
    assert "Best prompt: the seed, never scored on the whole validation set; " in caplog.text
    assert "-inf" not in caplog.text and "Best prompt None" not in caplog.text
