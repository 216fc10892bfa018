"""The batched policy interface and helpers scripted policies share."""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Sequence

from ..envs.protocols import PROTOCOLS

__all__ = ["Policy", "split_context", "extract_doc_lines"]

_RESULT_TAGS = tuple(
    f"</{tag}>"
    for cls in PROTOCOLS.values()
    for tag in cls.tags
    if tag not in ("think", "answer", "search", "tool_call")
)
"""Closing tags that can end a rendered document block (``</information>``, ``</result>``, …)."""

_DOC_START = re.compile(r"(?:^|>)Doc \d+ \(Title: ", re.M)


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
    """``(title, text)`` of every document line in ``context``, in order of appearance.

    Reads the ``Doc i (Title: <title>) <text>`` lines that ``Protocol.format_doc_list``
    writes. The title ends at the parenthesis that balances ``(Title:``; the text runs to the
    end of the line, less the protocol's closing result tag on the last document of a block.
    """
    docs = []
    for match in _DOC_START.finditer(context):
        line_end = context.find("\n", match.end())
        line = context[match.end() : len(context) if line_end < 0 else line_end]
        depth, close = 1, -1
        for i, char in enumerate(line):
            depth += {"(": 1, ")": -1}.get(char, 0)
            if depth == 0:
                close = i
                break
        if close < 0:
            continue
        text = line[close + 2 :]
        for tag in _RESULT_TAGS:
            if text.endswith(tag):
                text = text[: -len(tag)]
                break
        docs.append((line[:close], text))
    return docs
