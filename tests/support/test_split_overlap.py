"""The shared split-overlap checker flags reworded, reordered and same-fact questions and nothing else."""

from __future__ import annotations

from decimal import Decimal

import pytest

from support.split_overlap import content_words, describe, find_overlaps, jaccard, numbers, words


def test_words_are_lower_case_tokens_without_punctuation() -> None:
    assert words("What's the Eiffel Tower's height, in metres?") == [
        "what's",
        "the",
        "eiffel",
        "tower's",
        "height",
        "in",
        "metres",
    ]
    assert words("Compute 1,250.5 + 3.") == ["compute", "1,250.5", "3"]


def test_numbers_are_a_multiset_of_values() -> None:
    assert numbers("1,000 and 1000.0 and 7") == {Decimal(1000): 2, Decimal(7): 1}
    assert not numbers("no digits here")


def test_content_words_drop_stop_words() -> None:
    assert content_words("In what year was the Eiffel Tower completed?") == {"year", "eiffel", "tower", "completed"}


def test_jaccard_of_sets() -> None:
    assert jaccard(frozenset("ab"), frozenset("bc")) == pytest.approx(1 / 3)
    assert jaccard(frozenset(), frozenset()) == 1.0


def test_a_reordered_question_is_flagged_as_same_words() -> None:
    (hit,) = find_overlaps(["Who built the bridge over the river?"], ["The river: who built the bridge over?"])
    assert (hit.train_index, hit.val_index, hit.reason) == (0, 0, "same words")


def test_an_arithmetic_question_reworded_is_flagged_as_same_numbers() -> None:
    (hit,) = find_overlaps(["What is 12 * 40?"], ["Multiply 40 by 12."])
    assert hit.reason == "same numbers"


def test_min_numbers_limits_the_number_check() -> None:
    train, val = ["Which city hosted the fair of 1889?"], ["Name the river crossed in 1889."]
    assert [o.reason for o in find_overlaps(train, val)] == ["same numbers"]
    assert find_overlaps(train, val, min_numbers=2) == []


def test_a_paraphrase_keeping_the_key_words_is_flagged_by_jaccard() -> None:
    (hit,) = find_overlaps(["In what year was the Eiffel Tower completed?"], ["When was the Eiffel Tower completed?"])
    assert hit.reason.startswith("jaccard ")
    assert float(hit.reason.split()[1]) >= 0.7


def test_different_questions_from_one_template_are_not_flagged() -> None:
    train = ["In what year was the Eiffel Tower completed?", "Who designed the Tower Bridge?"]
    val = ["In what year was the Sydney Opera House completed?", "Who designed the Golden Gate Bridge?"]
    assert find_overlaps(train, val) == []


def test_same_chain_is_flagged_even_when_the_wording_differs() -> None:
    train = ["Which year saw the completion of the tower in the city of the 1889 fair?"]
    val = ["The 1889 fair's host city has a famous tower; when was that finished?"]
    chains = [(("1889 fair", "host city"), ("host city", "tower"))]
    assert find_overlaps(train, val, min_numbers=2) == []
    (hit,) = find_overlaps(train, val, train_chains=chains, val_chains=list(chains), min_numbers=2)
    assert hit.reason == "same chain"
    assert find_overlaps(train, val, train_chains=[None], val_chains=[None], min_numbers=2) == []


def test_pairs_are_ordered_by_val_then_train_index() -> None:
    train = ["What is 2 + 3?", "Add 3 and 2.", "Who wrote Hamlet?"]
    val = ["Add 2 to 3.", "Who wrote Hamlet?"]
    hits = find_overlaps(train, val)
    assert [(o.val_index, o.train_index) for o in hits] == [(0, 0), (0, 1), (1, 2)]
    assert "val[1] 'Who wrote Hamlet?' ~ train[2]" in describe(hits)
    assert describe(hits, limit=1).endswith("... and 2 more")


def test_invalid_arguments_are_rejected() -> None:
    with pytest.raises(ValueError, match="both"):
        find_overlaps(["a"], ["b"], train_chains=["x"])
    with pytest.raises(ValueError, match="train_chains has 2 keys for 1 questions"):
        find_overlaps(["a"], ["b"], train_chains=["x", "y"], val_chains=["z"])
    with pytest.raises(ValueError, match="jaccard_threshold"):
        find_overlaps(["a"], ["b"], jaccard_threshold=0.0)
