"""A small extractive reader: pull a short answer span out of a passage, no model needed."""

from __future__ import annotations

import re

__all__ = ["read_answer"]

_STOPWORDS = frozenset(
    "a an the of in on at to for by with from and or is was were be been are who what when where "
    "which whose how did does do that this these those as it its his her their which".split()
)
_SENTENCE = re.compile(r"(?<=[.!?])\s+")
_CANDIDATE = re.compile(r"\b(?:\d{3,4}|[A-Z][\w'\-]*(?:\s+(?:of\s+|de\s+|the\s+)?[A-Z][\w'\-]*)*)\b")


def _content_words(text: str) -> set[str]:
    return {w for w in re.findall(r"\w+", text.lower()) if w not in _STOPWORDS}


def read_answer(question: str, passage: str, fallback: str = "") -> str:
    """Return the span of ``passage`` most likely to answer ``question``.

    Picks the sentence sharing most content words with the question, then the last
    capitalised phrase or number in it whose words are not all in the question (numbers
    first when the question asks for a year or a time). Returns
    ``fallback`` when no candidate exists. A heuristic baseline, not a trained reader.
    """
    question_words = _content_words(question)
    sentences = [s for s in _SENTENCE.split(passage) if s.strip()]
    if not sentences:
        return fallback
    best = max(sentences, key=lambda s: len(_content_words(s) & question_words))
    candidates = [
        c for c in _CANDIDATE.findall(best) if not _content_words(c) <= question_words and _content_words(c)
    ]
    if re.search(r"\b(year|when)\b", question, re.I):
        candidates = [c for c in candidates if c.isdigit()] or candidates
    return candidates[-1] if candidates else fallback
