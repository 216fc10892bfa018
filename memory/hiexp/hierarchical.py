"""HiExp's hierarchical experience: the levels of records and their retrieval (docs/methods.md#hiexp).

:class:`HierarchicalExperience` holds the records of every level.
:meth:`~HierarchicalExperience.build` constructs them offline from K rollouts per question
(:mod:`~searchgym.memory.hiexp.build`, with the encoder and clustering of
:mod:`~searchgym.memory.hiexp.encode`); :meth:`~HierarchicalExperience.save` and
:meth:`~HierarchicalExperience.load` keep them in a store folder
(:mod:`~searchgym.memory.hiexp.levels_file`).

Retrieval: :meth:`~HierarchicalExperience.strategies` returns the top-k records of level 2
(or 3) by cosine similarity of the question to their titles, for the prompt at reset;
:meth:`~HierarchicalExperience.hints` returns the level-1 records whose title has cosine
>= 0.8 with the current search query.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import numpy as np

from ...checks import check_int, check_number
from ...envs.records import Trajectory
from ...error import InvalidArgumentError
from .build import BuildReport, build_levels, distill
from .encode import DEFAULT_THRESHOLDS, Encoder, MiniLMEncoder, embed
from .levels_file import hiexp_file, load_records, save_records
from .record import CaseSummarizer, ExperienceRecord
from .summary import make_case_summarizer

__all__ = ["HierarchicalExperience"]


class HierarchicalExperience:
    """HiExp's levels of experience records, with retrieval by title similarity.

    Args:
        records: The records of every level (any order; each carries its level).
        encoder: ``list[str] -> np.ndarray`` used for retrieval; default
            :class:`MiniLMEncoder` (loaded on first use).
        strategy_level: Level that :meth:`strategies` draws from (2 or 3 in HiExp; the
            highest existing level below it when the hierarchy is shallower).
        path: Store directory that :meth:`save` writes by default.
    """

    def __init__(
        self,
        records: Iterable[ExperienceRecord] = (),
        *,
        encoder: Encoder | None = None,
        strategy_level: int = 2,
        path: str | os.PathLike[str] | None = None,
    ):
        check_int("strategy_level", strategy_level, 1, note=" (2 or 3 in HiExp)")
        if encoder is not None and not callable(encoder):
            raise InvalidArgumentError(
                f"encoder must be a callable list[str] -> np.ndarray, got {encoder!r:.200}."
            )
        levels: dict[int, list[ExperienceRecord]] = {}
        for r in records:
            if not isinstance(r, ExperienceRecord):
                raise InvalidArgumentError(
                    f"HierarchicalExperience holds ExperienceRecord objects, got {r!r:.200}."
                )
            levels.setdefault(r.level, []).append(r)
        self._levels = {lv: tuple(levels[lv]) for lv in sorted(levels)}
        self.encoder: Encoder = encoder if encoder is not None else MiniLMEncoder()
        self.strategy_level = strategy_level
        self.path = Path(path) if path is not None else None
        self.report: BuildReport | None = None
        self._title_vectors: dict[int, np.ndarray] = {}

    # -- construction ------------------------------------------------------------------

    @classmethod
    def build(
        cls,
        trajectories: Iterable[Trajectory],
        *,
        summarizer: str | CaseSummarizer = "rule",
        encoder: Encoder | None = None,
        thresholds: float | Sequence[float] = DEFAULT_THRESHOLDS,
        max_levels: int = 4,
        success_threshold: float = 0.5,
        strategy_level: int = 2,
        path: str | os.PathLike[str] | None = None,
        progress: bool = True,
    ) -> HierarchicalExperience:
        """Build the hierarchy from finished trajectories (K rollouts per question).

        Args:
            trajectories: Finished :class:`~searchgym.envs.records.Trajectory` records with
                ``reward`` set (the env sets it when the episode ends).
            summarizer: ``"rule"`` or any object with ``contrast`` and ``merge``
                (:class:`~searchgym.memory.hiexp.record.CaseSummarizer`). A ``merge`` that
                raises falls back to the rule-based merge, with a log line.
            encoder: ``list[str] -> np.ndarray`` for titles; default all-MiniLM-L6-v2.
            thresholds: Ward distance τ_l for levels 2, 3, …; the last one repeats for
                deeper levels.
            max_levels: Deepest level built (1 = level 1 only).
            success_threshold: A rollout succeeded when its reward is at least this. 0.5
                splits 0/1 outcome rewards and F1 rewards at half credit; with a shaped
                reward (``lightsearcher``, ``cost``) pick the value that means "correct".
            strategy_level: Level :meth:`strategies` draws from.
            path: When given, the store directory the result is saved to.
            progress: Show progress bars.
        """
        check_int("max_levels", max_levels, 1)
        check_number("success_threshold", success_threshold)
        case_summarizer = make_case_summarizer(summarizer)
        trajectories = list(trajectories)
        start = time.perf_counter()
        cases = distill(trajectories, case_summarizer, success_threshold=success_threshold, progress=progress)
        distill_s = time.perf_counter() - start
        result = cls.build_levels(
            cases,
            summarizer=case_summarizer,
            encoder=encoder,
            thresholds=thresholds,
            max_levels=max_levels,
            strategy_level=strategy_level,
            path=path,
            progress=progress,
        )
        assert result.report is not None  # build_levels always sets it
        result.report.trajectories, result.report.distill_s = len(trajectories), distill_s
        return result

    @classmethod
    def build_levels(
        cls,
        cases: Iterable[ExperienceRecord],
        *,
        summarizer: str | CaseSummarizer = "rule",
        encoder: Encoder | None = None,
        thresholds: float | Sequence[float] = DEFAULT_THRESHOLDS,
        max_levels: int = 4,
        strategy_level: int = 2,
        path: str | os.PathLike[str] | None = None,
        progress: bool = True,
    ) -> HierarchicalExperience:
        """Levels 2 … ``max_levels`` over given level-1 records (step 2 of :meth:`build`).

        Arguments as in :meth:`build`; ``cases`` are level-1 records, e.g. written by hand
        or distilled earlier with :func:`~searchgym.memory.hiexp.build.distill`. See
        :func:`~searchgym.memory.hiexp.build.build_levels`.
        """
        encoder = encoder if encoder is not None else MiniLMEncoder()
        records, vectors, report = build_levels(
            cases,
            encoder,
            summarizer=summarizer,
            thresholds=thresholds,
            max_levels=max_levels,
            progress=progress,
        )
        result = cls(records, encoder=encoder, strategy_level=strategy_level, path=path)
        result._title_vectors = vectors
        result.report = report
        if path is not None:
            result.save(path)
        return result

    # -- access ------------------------------------------------------------------------

    @property
    def levels(self) -> dict[int, tuple[ExperienceRecord, ...]]:
        """Records by level (a copy of the mapping; records are immutable)."""
        return dict(self._levels)

    def records(self, level: int) -> tuple[ExperienceRecord, ...]:
        """The records of ``level`` (empty when it does not exist)."""
        return self._levels.get(level, ())

    @property
    def depth(self) -> int:
        """The highest level present (0 when empty)."""
        return max(self._levels, default=0)

    def __len__(self) -> int:
        return sum(len(rs) for rs in self._levels.values())

    def __iter__(self) -> Iterator[ExperienceRecord]:
        for records in self._levels.values():
            yield from records

    def __repr__(self) -> str:
        sizes = ", ".join(f"E{lv}={len(rs)}" for lv, rs in self._levels.items())
        return f"HierarchicalExperience({sizes or 'empty'})"

    def add(self, trajectory: Trajectory) -> None:
        """Accepted and ignored: HiExp's hierarchy is built offline by :meth:`build`.

        Present so that a wrapper recording every episode into its memory works unchanged.
        """

    def step(self) -> None:
        """Accepted and ignored (see :meth:`add`)."""

    # -- retrieval ---------------------------------------------------------------------

    def _vectors(self, level: int) -> np.ndarray:
        if level not in self._title_vectors:
            self._title_vectors[level] = embed(self.encoder, [r.title for r in self.records(level)])
        return self._title_vectors[level]

    def search(
        self, text: str, level: int, *, k: int | None = None, threshold: float | None = None
    ) -> list[tuple[ExperienceRecord, float]]:
        """Records of ``level`` by cosine similarity of ``text`` to their titles, best first.

        Args:
            text: The question or query (embedded once per call).
            level: Which level to search.
            k: Keep at most this many (None: all).
            threshold: Keep only similarities >= this (None: no filter).
        """
        if not isinstance(text, str):
            raise InvalidArgumentError(f"search text must be a string, got {text!r:.200}.")
        check_int("k", k, 0, optional=True)
        records = self.records(level)
        if not records or k == 0 or not text.strip():
            return []
        scores = self._vectors(level) @ embed(self.encoder, [text])[0]
        order = np.argsort(-scores, kind="stable")
        hits = [(records[i], float(scores[i])) for i in order if threshold is None or scores[i] >= threshold]
        return hits if k is None else hits[:k]

    def strategies(self, question: str, k: int = 5) -> list[ExperienceRecord]:
        """The top-k strategy records for ``question`` (HiExp puts five in the system prompt).

        Drawn from ``strategy_level``, or from the highest level below it that exists when
        the hierarchy stopped earlier; empty when there is no level above 1.
        """
        levels = [lv for lv in self._levels if 2 <= lv <= self.strategy_level]
        if not levels:
            return []
        return [r for r, _ in self.search(question, max(levels), k=k)]

    def hints(self, query: str, threshold: float = 0.8, k: int | None = None) -> list[ExperienceRecord]:
        """Level-1 records whose title has cosine >= ``threshold`` with ``query``, best first."""
        return [r for r, _ in self.search(query, 1, k=k, threshold=threshold)]

    # -- storage -----------------------------------------------------------------------

    def save(self, path: str | os.PathLike[str] | None = None) -> Path:
        """Write every record to ``hiexp_levels.jsonl`` in the store directory, atomically.

        Returns the file written. ``path`` defaults to the one given at construction.
        """
        target = path if path is not None else self.path
        if target is None:
            raise InvalidArgumentError("save needs a store directory: pass path= here or to the constructor.")
        file = hiexp_file(target)
        save_records(self, file)
        return file

    @classmethod
    def load(
        cls,
        path: str | os.PathLike[str],
        encoder: Encoder | None = None,
        *,
        strategy_level: int = 2,
        repair: bool = False,
    ) -> HierarchicalExperience:
        """Read a hierarchy saved by :meth:`save`.

        Args:
            path: The store directory (or the ``.jsonl`` file itself).
            encoder: As in the constructor.
            strategy_level: As in the constructor.
            repair: Also write the readable records back, keeping the original file
                beside it as ``.corrupt``. Either way a line that is not a valid record is
                skipped and logged with the file and the line.

        Raises:
            DataFileError: The file is missing.
        """
        file = hiexp_file(path)
        return cls(
            load_records(file, repair=repair), encoder=encoder, strategy_level=strategy_level, path=file
        )
