"""HiExp's construction (docs/methods.md#hiexp; HiExp's Algorithm 1).

1. :func:`distill`: group finished trajectories by question id and split each group by
   outcome reward: successful when ``reward >= success_threshold`` (default 0.5), failed
   otherwise. Every question with both gets one level-1 record from the case summariser's
   ``contrast``.
2. :func:`build_levels`: for l = 2 … ``max_levels``, embed the titles of level l-1
   (L2-normalised), cluster them with Ward linkage at distance threshold τ_l, and
   ``merge`` each cluster into one record of level l. Stop after a level with at most one
   record. A level with one record forms one cluster (HiExp's algorithm then stops).

:meth:`HierarchicalExperience.build <searchgym.memory.HierarchicalExperience.build>` runs
both and wraps the result for retrieval.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
from tqdm.auto import tqdm

from ...checks import check_int
from ...envs.records import Trajectory
from ...error import InvalidArgumentError
from .encode import DEFAULT_THRESHOLDS, Encoder, check_thresholds, cluster, embed
from .record import CaseSummarizer, ExperienceRecord
from .summary import RuleCaseSummarizer, make_case_summarizer

__all__ = ["BuildReport", "distill", "build_levels"]

logger = logging.getLogger(__name__)


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


def build_levels(
    cases: Iterable[ExperienceRecord],
    encoder: Encoder,
    *,
    summarizer: str | CaseSummarizer = "rule",
    thresholds: float | Sequence[float] = DEFAULT_THRESHOLDS,
    max_levels: int = 4,
    progress: bool = True,
) -> tuple[list[ExperienceRecord], dict[int, np.ndarray], BuildReport]:
    """Levels 2 … ``max_levels`` over level-1 records (step 2 of the module docstring).

    Ward runs on the *distinct* titles of a level: records with identical titles share a
    cluster, and repeating a title does not inflate Ward's cost of merging its cluster
    (rule-based titles repeat across questions of the same shape).

    Returns:
        Every record (``cases`` first, then each level in turn), the title vectors of each
        level that was clustered (one row per record), and the report.
    """
    check_int("max_levels", max_levels, 1)
    taus = check_thresholds(thresholds)
    case_summarizer = make_case_summarizer(summarizer)
    level = list(cases)
    if any(not isinstance(r, ExperienceRecord) or r.level != 1 for r in level):
        bad = next(r for r in level if not isinstance(r, ExperienceRecord) or r.level != 1)
        raise InvalidArgumentError(f"build_levels takes level-1 ExperienceRecords, got {bad!r:.200}.")
    report = BuildReport(records={1: len(level)})
    vectors_by_level: dict[int, np.ndarray] = {}
    all_records = list(level)
    for lv in range(2, max_levels + 1):
        if not level:
            break
        tau = taus[min(lv - 2, len(taus) - 1)]
        start = time.perf_counter()
        distinct = list(dict.fromkeys(r.title for r in level))
        vectors = embed(encoder, distinct)
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
    return all_records, vectors_by_level, report


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
