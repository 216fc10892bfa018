"""The protocol interface: how instructions are rendered and actions are parsed."""

from __future__ import annotations

import functools
import re
from abc import ABC, abstractmethod
from collections.abc import Sequence

from ...retrieval.records import Doc
from ..records import Action

__all__ = ["Protocol", "neutralise_tags"]


def neutralise_tags(text: str, tags: Sequence[str]) -> str:
    """Escape opening and closing forms of ``tags`` in ``text`` (e.g. ``<answer>`` → ``&lt;answer&gt;``).

    Used on retrieved documents and questions, so that text the policy did not write can
    never close an observation block or pass for an action.
    """
    if not tags or "<" not in text:  # most text holds no tag at all: skip the regex
        return text
    return _tag_pattern(tuple(tags)).sub(lambda m: f"&lt;{m.group(1)}{m.group(2)}&gt;", text)


@functools.lru_cache(maxsize=64)
def _tag_pattern(tags: tuple[str, ...]) -> re.Pattern[str]:
    names = "|".join(re.escape(t) for t in tags)
    return re.compile(rf"<(/?)({names})>", re.IGNORECASE)


class Protocol(ABC):
    """Renders the instructions and observations of one tag format and parses actions.

    Subclasses set ``name`` and ``tags`` (every tag name the format uses) and implement
    :meth:`instructions`, :meth:`parse`, :meth:`render_docs` and :meth:`write_action`. Nothing else in searchgym
    knows a protocol's tags.
    """

    name: str = ""
    tags: tuple[str, ...] = ()

    @abstractmethod
    def instructions(self) -> str:
        """The task instructions put before the question."""

    @abstractmethod
    def parse(self, text: str, turn: int) -> Action:
        """Read one action. ``turn`` is the 0-based index of this action in the episode.

        Must never raise: any string (any size, any content) yields an :class:`Action`;
        a malformed one has ``format_ok=False`` and ``kind="invalid"`` (or the recovered
        kind) with ``error`` set to a plain message.
        """

    @abstractmethod
    def render_docs(self, docs: Sequence[Doc]) -> str:
        """The observation returned after a search."""

    @abstractmethod
    def write_action(self, *, query: str | None = None, answer: str | None = None, think: str = "") -> str:
        """A well-formed action of this protocol: a search for ``query``, else an ``answer``.

        Scripted policies and demonstrations use it; ``parse`` reads it back unchanged.
        """

    def render_prompt(self, question: str, instructions: str | None = None) -> str:
        """Instructions followed by the question, the observation returned by ``reset``.

        ``instructions`` replaces :meth:`instructions` (e.g. a brief text for a tiny model).
        """
        head = self.instructions() if instructions is None else instructions
        return f"{head}\n\nQuestion: {neutralise_tags(question, self.tags)}\n"

    def render_error(self, message: str) -> str:
        """The observation returned after a malformed action."""
        return f"\n[format error] {message}\n"

    def format_doc_list(self, docs: Sequence[Doc]) -> str:
        """Documents as ``Doc 1 (Title: ...) text`` lines, with protocol tags neutralised."""
        # A plain loop and no call when there is no tag: this runs on every search step.
        lines = []
        for i, d in enumerate(docs, start=1):
            lines.append(f"Doc {i} (Title: {d.title}) {d.text}")
        text = "\n".join(lines)
        return neutralise_tags(text, self.tags) if "<" in text else text

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"
