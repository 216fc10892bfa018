"""LightSearcher's experience bank, the trajectory summaries a summariser reads, and the
summariser interface.

A summariser reads compact summaries of Good and Bad trajectories (docs/methods.md#lightsearcher-memory: each with
its F1, its reward and an explanation of that reward) and writes an :class:`ExperienceBank`:
guidance in three groups (success strategies, pitfalls to avoid, reasoning guidelines).
The backends are in :mod:`~searchgym.memory.lightsearcher.rule_summarizer` (the default) and
:mod:`~searchgym.memory.lightsearcher.lm_summarizers`; :func:`~searchgym.memory.lightsearcher.summarizers.make_summarizer`
picks one by name.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, runtime_checkable

from ...checks import check_int
from ...envs.metrics import normalize_answer
from ...envs.records import Trajectory
from ...error import InvalidArgumentError, SearchGymError

__all__ = [
    "ExperienceBank",
    "TrajectorySummary",
    "Summarizer",
    "SummarizerError",
    "summarise_trajectory",
    "check_bank",
    "summarizer_name",
]


class SummarizerError(SearchGymError, RuntimeError):
    """A summariser failed, timed out, or wrote something that is not a bank."""


# -- the bank ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ExperienceBank:
    """One version of the experience bank: three groups of guidance sentences.

    ``step`` is the training step of the update that wrote it and ``version`` its number
    in the store's history (1 for the first); both are 0 for a bank not yet stored.
    """

    success_strategies: tuple[str, ...] = ()
    pitfalls: tuple[str, ...] = ()
    reasoning_guidelines: tuple[str, ...] = ()
    step: int = 0
    version: int = 0

    GROUPS: ClassVar[tuple[tuple[str, str], ...]] = (
        ("success_strategies", "Success strategies"),
        ("pitfalls", "Pitfalls to avoid"),
        ("reasoning_guidelines", "Reasoning guidelines"),
    )
    """``(field, heading)`` of each group, in display order."""

    def groups(self) -> list[tuple[str, tuple[str, ...]]]:
        """``(heading, items)`` of each group, in display order."""
        return [(heading, getattr(self, name)) for name, heading in self.GROUPS]

    def __len__(self) -> int:
        """Number of guidance items over the three groups."""
        return sum(len(getattr(self, name)) for name, _ in self.GROUPS)

    def to_text(self) -> str:
        """The bank as it goes into the prompt: each non-empty group under its heading."""
        blocks = [
            f"{heading}:\n" + "\n".join(f"- {item}" for item in items)
            for heading, items in self.groups()
            if items
        ]
        return "\n".join(blocks)

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe dict; :meth:`from_dict` reads it back."""
        data: dict[str, Any] = {name: list(getattr(self, name)) for name, _ in self.GROUPS}
        data["step"] = self.step
        data["version"] = self.version
        return data

    @classmethod
    def from_groups(
        cls, groups: Mapping[str, Sequence[str]], step: int = 0, version: int = 0
    ) -> ExperienceBank:
        """A bank from ``{field: items}`` of the three groups (the fields of :attr:`GROUPS`)."""
        return cls(
            success_strategies=tuple(groups["success_strategies"]),
            pitfalls=tuple(groups["pitfalls"]),
            reasoning_guidelines=tuple(groups["reasoning_guidelines"]),
            step=step,
            version=version,
        )

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ExperienceBank:
        """Read :meth:`to_dict`'s output; ``step`` and ``version`` default to 0.

        Raises:
            InvalidArgumentError: a group is missing or is not a list of strings.
        """
        if not isinstance(data, Mapping):
            raise InvalidArgumentError(f"An experience bank must be a dict, got {type(data).__name__}.")
        groups: dict[str, list[str]] = {}
        for name, _ in cls.GROUPS:
            items = data.get(name)
            if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
                raise InvalidArgumentError(
                    f"Experience bank field {name!r} must be a list of strings, got {items!r}."
                )
            groups[name] = items
        step, version = (
            check_int(f"Experience bank field {key!r}", data.get(key, 0), 0) for key in ("step", "version")
        )
        return cls.from_groups(groups, step, version)


def check_bank(bank: object, *, max_item_chars: int = 600) -> str | None:
    """Why ``bank`` cannot replace the current bank, or ``None`` when it can.

    A usable bank is an :class:`ExperienceBank` with at least one item, every item a
    non-empty string of at most ``max_item_chars`` characters.
    """
    if not isinstance(bank, ExperienceBank):
        return f"the summariser returned {type(bank).__name__}, not an ExperienceBank"
    if len(bank) == 0:
        return "the summariser returned an empty bank (no guidance in any group)"
    for name, _ in ExperienceBank.GROUPS:
        for item in getattr(bank, name):
            if not isinstance(item, str) or not item.strip():
                return f"group {name!r} holds an empty or non-string item {item!r}"
            if len(item) > max_item_chars:
                return f"group {name!r} holds an item of {len(item)} characters (limit {max_item_chars})"
    return None


# -- trajectory summaries ------------------------------------------------------------------------


@dataclass(frozen=True)
class TrajectorySummary:
    """What a summariser is told about one trajectory."""

    question: str
    answer: str | None
    gold: tuple[str, ...]
    f1: float
    reward: float
    num_searches: int
    explanation: str
    """Why the trajectory got its reward, in one sentence."""
    answer_in_docs: bool
    """A gold alias (normalised, as whole words) occurs in a retrieved passage's title or text."""
    format_errors: int
    """Malformed turns."""
    query_overlap: float | None
    """Mean over queries of the share of the query's distinct words that are in the question
    (normalised words); ``None`` without queries."""
    answer_words: int
    """Words in the normalised answer (0 without one)."""
    truncated: bool = False

    @property
    def answered(self) -> bool:
        return self.answer is not None


def _words(text: str) -> list[str]:
    return normalize_answer(text).split()


def _gold_in_docs(trajectory: Trajectory) -> bool:
    golds = [" ".join(_words(g)) for g in trajectory.question.golden_answers]
    golds = [g for g in golds if g]
    for turn in trajectory.turns:
        for doc in turn.docs:
            text = f" {' '.join(_words(doc.title + ' ' + doc.text))} "
            if any(f" {g} " in text for g in golds):
                return True
    return False


def _query_overlap(trajectory: Trajectory) -> float | None:
    question = set(_words(trajectory.question.question))
    shares = []
    for query in trajectory.queries:
        words = set(_words(query))
        if words:
            shares.append(len(words & question) / len(words))
    return sum(shares) / len(shares) if shares else None


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "es" if word.endswith("ch") else "s")


def summarise_trajectory(trajectory: Trajectory) -> TrajectorySummary:
    """Summarise one finished trajectory (its ``reward`` must be set).

    Raises:
        InvalidArgumentError: not a :class:`Trajectory`, or the episode has no reward yet.
    """
    if not isinstance(trajectory, Trajectory):
        raise InvalidArgumentError(f"Expected a Trajectory, got {type(trajectory).__name__}.")
    if trajectory.reward is None:
        raise InvalidArgumentError(
            f"Trajectory of question {trajectory.question.id!r} has no reward: summarise finished episodes only."
        )
    answer, f1, m = trajectory.answer, trajectory.f1, trajectory.num_searches
    errors = sum(not t.action.format_ok for t in trajectory.turns)
    in_docs = _gold_in_docs(trajectory)
    gold = trajectory.question.golden_answers
    parts = []
    if errors:
        parts.append(f"{_plural(errors, 'malformed turn')}")
    if answer is None:
        parts.append("no final answer" + (" before the turn limit" if trajectory.truncated else ""))
    else:
        parts.append(f"answer {answer!r} has F1 {f1:.2f} against {gold[0]!r}")
    parts.append(
        _plural(m, "search")
        + (
            ""
            if m == 0
            else "; the gold answer was " + ("" if in_docs else "not ") + "in the retrieved passages"
        )
    )
    explanation = f"Reward {trajectory.reward:.2f}: " + "; ".join(parts) + "."
    return TrajectorySummary(
        question=trajectory.question.question,
        answer=answer,
        gold=tuple(gold),
        f1=f1,
        reward=float(trajectory.reward),
        num_searches=m,
        explanation=explanation,
        answer_in_docs=in_docs,
        format_errors=errors,
        query_overlap=_query_overlap(trajectory),
        answer_words=len(_words(answer)) if answer is not None else 0,
        truncated=trajectory.truncated,
    )


# -- the summariser interface --------------------------------------------------------------------


@runtime_checkable
class Summarizer(Protocol):
    """Writes a bank from Good and Bad summaries; ``previous`` is the current bank, if any.

    A ``name`` attribute (optional) is recorded with every bank it writes. Raise, or return
    an empty bank, when there is nothing to say: the memory then keeps its current bank.
    """

    def summarize(
        self,
        good: list[TrajectorySummary],
        bad: list[TrajectorySummary],
        previous: ExperienceBank | None,
    ) -> ExperienceBank: ...


def summarizer_name(summarizer: object) -> str:
    """The name the bank history records for ``summarizer``: its ``name``, else its class name."""
    name = getattr(summarizer, "name", None)
    return name if isinstance(name, str) and name else type(summarizer).__name__
