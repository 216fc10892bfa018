"""SQuAD-style answer scores: EM, F1 and CoverEM, maximised over gold aliases.

Normalisation (docs/methods.md#answer-scores): lower-case, drop punctuation, drop the articles
a/an/the, collapse white space.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Sequence

__all__ = ["normalize_answer", "exact_match", "f1_score", "cover_exact_match"]

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = str.maketrans("", "", string.punctuation)


def normalize_answer(text: str) -> str:
    """Lower-case, strip punctuation and articles, and collapse white space.

    One departure from the SQuAD script: when dropping the articles would leave nothing,
    they are kept, so that a multiple-choice letter "A" normalises to "a" rather than to
    "" (which would make "A" unwinnable and any empty answer match it).
    """
    text = " ".join(text.lower().translate(_PUNCT).split())
    return " ".join(_ARTICLES.sub(" ", text).split()) or text


def exact_match(prediction: str | None, golds: Sequence[str]) -> float:
    """1.0 when the (non-empty) normalised prediction equals a normalised gold alias, else 0.0."""
    if prediction is None:
        return 0.0
    pred = normalize_answer(prediction)
    return float(bool(pred) and any(pred == normalize_answer(g) for g in golds))


def _f1(pred_tokens: list[str], gold_tokens: list[str]) -> float:
    common = Counter(pred_tokens) & Counter(gold_tokens)
    overlap = sum(common.values())
    if overlap == 0:
        return 0.0
    precision = overlap / len(pred_tokens)
    recall = overlap / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def f1_score(prediction: str | None, golds: Sequence[str]) -> float:
    """Token-level F1 of the normalised prediction, maximised over gold aliases."""
    if prediction is None:
        return 0.0
    pred_tokens = normalize_answer(prediction).split()
    return max((_f1(pred_tokens, normalize_answer(g).split()) for g in golds), default=0.0)


def cover_exact_match(prediction: str | None, golds: Sequence[str]) -> float:
    """1.0 when a normalised gold alias is a substring of the normalised prediction."""
    if prediction is None:
        return 0.0
    pred = normalize_answer(prediction)
    return float(any((g_norm := normalize_answer(g)) and g_norm in pred for g in golds))
