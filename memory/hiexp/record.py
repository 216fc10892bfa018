"""HiExp's experience record and the interface of the case summarisers that write it
(docs/methods.md#hiexp).

A level-1 record contrasts the successful and failed rollouts of one question; a record of
level l > 1 generalises a cluster of level l-1 records. Both are written by a *case
summariser*: any object with the two methods of :class:`CaseSummarizer`. The default is
:class:`~searchgym.memory.hiexp.summary.RuleCaseSummarizer`; an LLM backend implements the
same two methods.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any, Protocol, runtime_checkable

from ...checks import check_int
from ...envs.records import Question, Trajectory
from ...error import InvalidArgumentError

__all__ = ["ExperienceRecord", "CaseSummarizer", "MAX_TAGS", "MAX_WORDS"]

logger = logging.getLogger(__name__)

MAX_TAGS = 4
"""Tags per record: HiExp asks for fewer than five."""
MAX_WORDS = 100
"""Words in ``description`` and in ``thinking``: HiExp asks for at most 100 each."""


def _clip_words(text: str, field_name: str, title: str) -> str:
    words = text.split()
    if len(words) <= MAX_WORDS:
        return text
    logger.warning(
        "experience record %r: %s has %d words, truncated to %d",
        title[:60],
        field_name,
        len(words),
        MAX_WORDS,
    )
    return " ".join(words[:MAX_WORDS])


def _str_tuple(name: str, value: object) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise InvalidArgumentError(f"ExperienceRecord.{name} must be a list of strings, got {value!r:.200}.")
    if not all(isinstance(v, str) for v in value):
        raise InvalidArgumentError(f"ExperienceRecord.{name} must hold only strings, got {value!r:.200}.")
    return tuple(value)


@dataclass(frozen=True)
class ExperienceRecord:
    """One experience of HiExp's hierarchy.

    Over-long text never raises: more than :data:`MAX_TAGS` tags keep the first four and
    ``description`` or ``thinking`` over :data:`MAX_WORDS` words keep their first 100
    words, each with a warning in the log. Wrong types raise
    :class:`~searchgym.error.InvalidArgumentError`.

    Attributes:
        level: 1 for a case record (one question), l > 1 for a record generalising a
            cluster of level l-1 records.
        type: Category of the experience (the rule-based summariser's are
            :data:`~searchgym.memory.hiexp.summary.EXPERIENCE_TYPES`).
        title: One sentence; the retrieval key that questions and queries are compared to.
        tags: Fewer than five keywords.
        description: The content given to the policy, at most 100 words.
        thinking: Why: the contrast or the differences behind the record, at most 100 words.
        sources: Question ids (level 1) or the titles of the child records (higher levels).
    """

    level: int
    type: str
    title: str
    tags: tuple[str, ...]
    description: str
    thinking: str
    sources: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        check_int("ExperienceRecord.level", self.level, 1)
        for name in ("type", "title", "description", "thinking"):
            value = getattr(self, name)
            if not isinstance(value, str):
                raise InvalidArgumentError(f"ExperienceRecord.{name} must be a string, got {value!r:.200}.")
        if not self.title.strip():
            raise InvalidArgumentError(
                "ExperienceRecord.title is the retrieval key and must not be empty; got "
                f"{self.title!r} (description {self.description[:80]!r})."
            )
        tags = tuple(t.strip() for t in _str_tuple("tags", self.tags) if t.strip())
        if len(tags) > MAX_TAGS:
            logger.warning(
                "experience record %r: %d tags, kept the first %d", self.title[:60], len(tags), MAX_TAGS
            )
            tags = tags[:MAX_TAGS]
        object.__setattr__(self, "tags", tags)
        object.__setattr__(self, "sources", _str_tuple("sources", self.sources))
        object.__setattr__(self, "description", _clip_words(self.description, "description", self.title))
        object.__setattr__(self, "thinking", _clip_words(self.thinking, "thinking", self.title))

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (tuples become lists)."""
        data = asdict(self)
        data["tags"], data["sources"] = list(self.tags), list(self.sources)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ExperienceRecord:
        """The inverse of :meth:`to_dict`; missing or unknown keys raise InvalidArgumentError."""
        if not isinstance(data, Mapping):
            raise InvalidArgumentError(f"An experience record must be a JSON object, got {data!r:.200}.")
        names = [f.name for f in fields(cls)]
        missing = [n for n in names if n not in data and n != "sources"]
        unknown = sorted(set(data) - set(names))
        if missing or unknown:
            raise InvalidArgumentError(
                f"Experience record keys: missing {missing}, unknown {unknown}; expected {names}."
            )
        return cls(**{n: data[n] for n in names if n in data})

    def render(self) -> str:
        """The text a prompt shows: title, then description."""
        return f"{self.title}\n{self.description}"


@runtime_checkable
class CaseSummarizer(Protocol):
    """What HiExp's construction needs from a summariser (rule-based, local model, HTTP).

    Implementations should be deterministic given their inputs where they can, and must
    return a valid :class:`ExperienceRecord`; construction logs and skips a ``contrast``
    that raises, and falls back to the rule-based ``merge`` when ``merge`` raises.
    """

    def contrast(
        self, question: Question, successes: Sequence[Trajectory], failures: Sequence[Trajectory]
    ) -> ExperienceRecord:
        """A level-1 record from the successful and failed rollouts of ``question`` (both non-empty)."""
        ...

    def merge(self, records: Sequence[ExperienceRecord], level: int) -> ExperienceRecord:
        """One record of ``level`` that generalises ``records`` (a cluster of level ``level - 1``)."""
        ...
