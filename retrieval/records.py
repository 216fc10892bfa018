"""The record a retriever returns: one passage."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Doc"]


@dataclass(frozen=True)
class Doc:
    """One retrieved passage.

    Attributes:
        id: The passage's id in its corpus.
        title: The passage's title (``""`` when the corpus gives none).
        text: The passage's text.
        score: The retriever's score for the query (0 for a passage loaded from a corpus file).
    """

    id: str
    title: str
    text: str
    score: float = 0.0
