"""Typed records of an episode: questions, parsed actions, turns, trajectories.

A turn's retrieved passages are :class:`~searchgym.retrieval.records.Doc` records.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from ..retrieval.records import Doc
from .metrics import cover_exact_match, exact_match, f1_score

__all__ = ["Question", "Action", "Turn", "Trajectory"]

ActionKind = Literal["search", "answer", "invalid"]


@dataclass(frozen=True)
class Question:
    """One question with its gold answer aliases (the FlashRAG convention)."""

    id: str
    question: str
    golden_answers: tuple[str, ...]
    known: bool | None = None
    """SyntheticFacts only: whether the facts belong to the memorisable subset."""
    hops: int | None = None
    """SyntheticFacts only: how many facts the question chains."""


@dataclass(frozen=True)
class Action:
    """A protocol's reading of one action string.

    ``kind`` is what the env does next: run ``query`` ("search"), end the episode with
    ``answer`` ("answer"), or report ``error`` ("invalid"). A search turn may also carry an
    ``answer`` (SEM's first answer, given before the optional search).
    """

    kind: ActionKind
    query: str | None = None
    answer: str | None = None
    error: str | None = None
    format_ok: bool = True
    think_blocks: int = 0
    answer_blocks: int = 0


@dataclass
class Turn:
    """One step of an episode: the policy's text, its parse, and what the env returned."""

    action_text: str
    action: Action
    docs: list[Doc] = field(default_factory=list)
    observation: str = ""


@dataclass
class Trajectory:
    """Everything a reward scheme may look at, for one finished (or running) episode."""

    question: Question
    protocol: str
    turns: list[Turn] = field(default_factory=list)
    truncated: bool = False
    reward: float | None = None
    """The terminal reward, set by the env when the episode ends (None while it runs)."""

    @property
    def answer(self) -> str | None:
        """The final answer: the answer of the last turn that ended the episode, if any."""
        if self.turns and self.turns[-1].action.kind == "answer":
            return self.turns[-1].action.answer
        return None

    @property
    def first_answer(self) -> str | None:
        """The answer given in the first turn (SEM's a1), whether or not a search followed."""
        return self.turns[0].action.answer if self.turns else None

    @property
    def num_searches(self) -> int:
        return sum(t.action.kind == "search" for t in self.turns)

    @property
    def queries(self) -> list[str]:
        return [
            t.action.query for t in self.turns if t.action.query is not None and t.action.kind == "search"
        ]

    @property
    def retrieved_ids(self) -> list[list[str]]:
        return [[d.id for d in t.docs] for t in self.turns if t.action.kind == "search"]

    @property
    def format_ok(self) -> bool:
        """True when every turn was well formed under the protocol."""
        return all(t.action.format_ok for t in self.turns)

    @property
    def reasoning_steps(self) -> int:
        """Number of ``<think>`` blocks over all turns."""
        return sum(t.action.think_blocks for t in self.turns)

    @property
    def action_chars(self) -> int:
        """Characters the policy wrote over all turns."""
        return sum(len(t.action_text) for t in self.turns)

    @property
    def em(self) -> float:
        return exact_match(self.answer, self.question.golden_answers)

    @property
    def f1(self) -> float:
        return f1_score(self.answer, self.question.golden_answers)

    @property
    def cover_em(self) -> float:
        return cover_exact_match(self.answer, self.question.golden_answers)
