"""The batched policy interface and helpers scripted policies share."""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Sequence

__all__ = ["Policy", "split_context", "extract_doc_lines"]

_DOC_LINE = re.compile(r"(?:^|>)Doc \d+ \(Title: (?P<title>[^\n]*?)\) (?P<text>[^\n]*)", re.M)
_CLOSING_TAG = re.compile(r"</[A-Za-z_]+>\s*$")


class Policy(ABC):
    """A batched policy: one action string per context.

    ``act`` receives, for each running episode, its whole text context so far: the prompt
    returned by ``reset`` followed by every action and observation (the way a language
    model sees it). It returns one action string per context, in order.
    """

    name: str = ""

    @abstractmethod
    def act(self, observations: Sequence[str]) -> list[str]:
        """One action per context."""


def split_context(context: str) -> tuple[str, str]:
    """Split a context into ``(question, history)``.

    A prompt rendered by a searchgym protocol ends with ``"Question: <question>\\n"``; the
    question runs until the first line that starts with ``<`` (the start of an action) and
    the history (actions and observations) is everything after it.
    """
    marker = "\n\nQuestion: "
    start = context.find(marker)
    if start < 0:
        return "", context
    rest = context[start + len(marker) :]
    end = rest.find("\n<")
    if end < 0:
        return rest.strip(), ""
    return rest[:end].strip(), rest[end + 1 :]


def extract_doc_lines(context: str) -> list[tuple[str, str]]:
    """``(title, text)`` of every document line in ``context``, in order of appearance."""
    return [(m.group("title"), _CLOSING_TAG.sub("", m.group("text"))) for m in _DOC_LINE.finditer(context)]
