"""SQuAD-style answer scores (docs/methods.md#answer-scores): normalisation, EM, F1, CoverEM.

Every expected value is worked out by hand in a comment. Normalisation, in order:
lower-case, delete ASCII punctuation, replace the whole words a/an/the by a space, then
collapse white space (the order of the SQuAD v1.1 evaluation script).
"""

from __future__ import annotations

import pytest

from searchgym.envs.metrics import cover_exact_match, exact_match, f1_score, normalize_answer

# -- normalize_answer ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # lower-case, then "the" is dropped: "the eiffel tower" → "eiffel tower"
        ("The Eiffel Tower", "eiffel tower"),
        # "  an   apple,  a day!! " → no punctuation "  an   apple  a day " → articles become
        # spaces → "     apple    day " → collapsed "apple day"
        ("  An   apple,  a day!! ", "apple day"),
        # articles only as whole words: "theater", "another", "banana" keep their letters
        ("Theater another banana", "theater another banana"),
        # punctuation is deleted, not replaced by a space: "eiffel-tower" → "eiffeltower"
        ("Eiffel-Tower", "eiffeltower"),
        # "u.s.a." → "usa"
        ("U.S.A.", "usa"),
        # tabs and newlines are white space too: "paris\n\tfrance" → "paris france"
        ("Paris\n\tFrance", "paris france"),
        # an article-only answer normalises to the empty string
        ("The the THE", "the the the"),  # only articles: kept, see normalize_answer
        # a punctuation-only answer too
        ("?!...", ""),
        ("", ""),
        # unicode letters are kept and lower-cased: "Å" → "å", "É" → "é"
        ("Ångström ÉCOLE", "ångström école"),
        # str.lower keeps "ß" (no case folding to "ss")
        ("Straße", "straße"),
        # only ASCII punctuation is deleted, as in the SQuAD script: curly quotes stay
        ("“Paris”", "“paris”"),
    ],
)
def test_normalize_answer(text, expected):
    assert normalize_answer(text) == expected


def test_normalize_answer_is_idempotent():
    # normalising twice changes nothing: "  The  U.S.A.!" → "usa" → "usa"
    once = normalize_answer("  The  U.S.A.!")
    assert once == "usa"
    assert normalize_answer(once) == once


# -- exact_match -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("prediction", "golds", "expected"),
    [
        # "the eiffel tower!" → "eiffel tower" == "eiffel tower" → 1
        ("the Eiffel Tower!", ["Eiffel Tower"], 1.0),
        # "eiffel tower in paris" != "eiffel tower" → 0
        ("the Eiffel tower in Paris", ["Eiffel Tower"], 0.0),
        # max over aliases: "nyc" != "new york city" but == "nyc" → max(0, 1) = 1
        ("NYC", ["New York City", "NYC"], 1.0),
        # no alias matches → max(0, 0) = 0
        ("Boston", ["New York City", "NYC"], 0.0),
        # unicode: "köln" == "köln" → 1
        ("KÖLN", ["Köln"], 1.0),
        # "" != "paris" → 0
        ("", ["Paris"], 0.0),
        # an article-only prediction normalises to "" and matches no real answer → 0
        ("the", ["Paris"], 0.0),
        # no answer given → 0
        (None, ["Paris"], 0.0),
        # no gold aliases: nothing to match → 0
        ("Paris", [], 0.0),
    ],
)
def test_exact_match(prediction, golds, expected):
    assert exact_match(prediction, golds) == expected


def test_exact_match_accepts_a_tuple_of_golds():
    # Question.golden_answers is a tuple: "paris" == "paris" → 1
    assert exact_match("Paris", ("London", "Paris")) == 1.0


# -- f1_score --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("prediction", "golds", "expected"),
    [
        # [eiffel, tower, in, paris] vs [eiffel, tower]: overlap 2, P = 2/4, R = 2/2,
        # F1 = 2·0.5·1 / 1.5 = 2/3
        ("the Eiffel tower in Paris", ["Eiffel Tower"], 2 / 3),
        # [eiffel] vs [eiffel, tower]: overlap 1, P = 1, R = 1/2, F1 = 2·1·0.5 / 1.5 = 2/3
        ("Eiffel", ["Eiffel Tower"], 2 / 3),
        # identical after normalisation: P = R = 1, F1 = 1
        ("The Eiffel Tower.", ["eiffel tower"], 1.0),
        # repeated tokens count once per gold occurrence: [paris, paris] vs [paris],
        # overlap min(2, 1) = 1, P = 1/2, R = 1, F1 = 2·0.5·1 / 1.5 = 2/3
        ("Paris Paris", ["Paris"], 2 / 3),
        # max over aliases: [new, york] vs [new, york, city]: overlap 2, P = 1, R = 2/3,
        # F1 = 2·1·(2/3) / (5/3) = 4/5; vs [big, apple]: 0 → max = 0.8
        ("New York", ["New York City", "Big Apple"], 0.8),
        # no shared token → 0
        ("London", ["Paris"], 0.0),
        # unicode: [kreisfreie, stadt, köln] vs [köln]: overlap 1, P = 1/3, R = 1,
        # F1 = 2·(1/3)·1 / (4/3) = 0.5
        ("Kreisfreie Stadt Köln", ["Köln"], 0.5),
        # an article-only prediction has no tokens → overlap 0 → 0
        ("the", ["Paris"], 0.0),
        # punctuation only, same → 0
        ("...", ["Paris"], 0.0),
        (None, ["Paris"], 0.0),
        # no gold aliases → the maximum over nothing defaults to 0
        ("Paris", [], 0.0),
    ],
)
def test_f1_score(prediction, golds, expected):
    assert f1_score(prediction, golds) == pytest.approx(expected)


def test_f1_is_symmetric_in_precision_and_recall():
    # swapping prediction and gold swaps P and R, and F1 is symmetric in them:
    # [a1, b1, c1] vs [a1]: P = 1/3, R = 1 → 0.5; [a1] vs [a1, b1, c1]: P = 1, R = 1/3 → 0.5
    assert f1_score("a1 b1 c1", ["a1"]) == pytest.approx(0.5)
    assert f1_score("a1", ["a1 b1 c1"]) == pytest.approx(0.5)


# -- cover_exact_match -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("prediction", "golds", "expected"),
    [
        # "it is eiffel tower in paris" contains "eiffel tower" → 1
        ("It is the Eiffel Tower in Paris.", ["Eiffel Tower"], 1.0),
        # "eiffel" does not contain "eiffel tower" → 0
        ("Eiffel", ["Eiffel Tower"], 0.0),
        # max over aliases: "big apple" contains "big apple" (second alias) → 1
        ("The Big Apple", ["New York", "big apple"], 1.0),
        # docs/methods.md#answer-scores defines CoverEM as a substring test on the normalised strings, so it
        # is character-level: "party" contains "art" → 1
        ("party", ["art"], 1.0),
        # unicode: "kreisfreie stadt köln" contains "köln" → 1
        ("Kreisfreie Stadt Köln", ["KÖLN"], 1.0),
        # an alias that normalises to "" covers nothing (every string contains "") → 0
        ("anything at all", ["The"], 0.0),
        # an article-only prediction "" contains no real alias → 0
        ("the", ["Paris"], 0.0),
        (None, ["Paris"], 0.0),
        ("Paris", [], 0.0),
    ],
)
def test_cover_exact_match(prediction, golds, expected):
    assert cover_exact_match(prediction, golds) == expected


def test_exact_match_implies_cover_and_full_f1_on_ordinary_answers():
    # "The Eiffel Tower!" vs "eiffel tower": EM 1, so CoverEM 1 and F1 1 as well
    prediction, golds = "The Eiffel Tower!", ["eiffel tower"]
    assert exact_match(prediction, golds) == 1.0
    assert cover_exact_match(prediction, golds) == 1.0
    assert f1_score(prediction, golds) == 1.0


# -- Known bug: multiple-choice letters (MMLU's golds are "A", "B", "C", "D") ------------------


@pytest.mark.parametrize(
    "answer",
    [
        "Paris",
        "Eiffel Tower",
        "B",
        "A",
    ],
)
def test_the_gold_itself_gets_full_marks_on_every_score(answer):
    # a prediction equal to the gold must score 1 on EM, F1 and CoverEM
    assert exact_match(answer, [answer]) == 1.0
    assert f1_score(answer, [answer]) == 1.0
    assert cover_exact_match(answer, [answer]) == 1.0


@pytest.mark.parametrize("prediction", [".", "the", "An"])
def test_a_contentless_answer_does_not_match_the_gold_letter_a(prediction):
    # "." / "the" / "An" carry no answer; against gold "A" they should score EM 0
    assert exact_match(prediction, ["A"]) == 0.0
