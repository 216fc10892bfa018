"""The rule-based summariser: offline, deterministic guidance from measured contrasts.

:class:`RuleBasedSummarizer` (the default summariser) measures the Good and Bad groups
(:func:`group_stats`) and writes a sentence only where they differ by more than a set
margin, quoting the measured figures. It never writes a number it did not measure, and a
contrast it does not find gives no sentence.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ...checks import check_number
from ...error import InvalidArgumentError
from .bank import ExperienceBank, TrajectorySummary

__all__ = ["GroupStats", "group_stats", "RuleBasedSummarizer"]


@dataclass(frozen=True)
class GroupStats:
    """Figures of one group of trajectories, as :class:`RuleBasedSummarizer` measures them."""

    n: int
    mean_searches: float
    no_search_share: float
    answer_in_docs_share: float
    format_error_share: float
    """Share with at least one malformed turn."""
    unanswered_share: float
    query_overlap: float | None
    """Mean of :attr:`TrajectorySummary.query_overlap` over trajectories with queries."""
    answer_words: float | None
    """Mean answer length in words over trajectories that answered."""


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def group_stats(summaries: Sequence[TrajectorySummary]) -> GroupStats:
    """Measure a non-empty group."""
    if not summaries:
        raise InvalidArgumentError("Cannot measure an empty group of trajectories.")
    n = len(summaries)
    return GroupStats(
        n=n,
        mean_searches=sum(s.num_searches for s in summaries) / n,
        no_search_share=sum(s.num_searches == 0 for s in summaries) / n,
        answer_in_docs_share=sum(s.answer_in_docs for s in summaries) / n,
        format_error_share=sum(s.format_errors > 0 for s in summaries) / n,
        unanswered_share=sum(not s.answered for s in summaries) / n,
        query_overlap=_mean([s.query_overlap for s in summaries if s.query_overlap is not None]),
        answer_words=_mean([s.answer_words for s in summaries if s.answered]),
    )


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


class RuleBasedSummarizer:
    """Offline, deterministic guidance from measured contrasts between Good and Bad.

    For each figure of :class:`GroupStats` it compares the groups; when the gap reaches
    the margin it writes one sentence quoting both figures (means with two decimals,
    answer lengths with one, shares as whole percentages), placed in the group that fits
    its direction. A figure missing in either group (no queries, no answers) gives no
    sentence. The rules, with Good's figure g and Bad's b:

    - mean searches, ``|g - b| >= search_gap``: Good searched less → a pitfall about
      extra searches; more → a strategy to search before answering.
    - share answering with no search, gap ``>= share_gap``: Good more often → a strategy
      to answer directly when sure; less → a pitfall about answering from memory.
    - share with the gold answer in a retrieved passage, gap ``>= share_gap``: higher in
      Good → a strategy to answer from the passages; higher in Bad → a pitfall about
      overlooking it.
    - share with a malformed turn, Bad higher by ``>= share_gap`` → a pitfall.
    - share without a final answer, Bad higher by ``>= share_gap`` → a pitfall.
    - query overlap with the question, gap ``>= share_gap``: higher in Good → a strategy
      to query with the question's key words; lower → a guideline to rewrite it.
    - answer length in words, gap ``>= words_gap``: a guideline towards Good's length.

    ``previous`` is not used: every bank restates only what the latest window shows, so
    no stale figure is carried over. No contrast at all gives an empty bank, which
    :class:`~searchgym.memory.ExperienceMemory` does not store.

    Args:
        search_gap: Margin on mean searches per trajectory.
        share_gap: Margin on shares and on query overlap (fractions in [0, 1]).
        words_gap: Margin on mean answer length, in words.
    """

    name = "rule"

    def __init__(self, search_gap: float = 0.25, share_gap: float = 0.10, words_gap: float = 1.0):
        for key, value in (("search_gap", search_gap), ("share_gap", share_gap), ("words_gap", words_gap)):
            check_number(key, value, above=0)
        self.search_gap, self.share_gap, self.words_gap = (
            float(search_gap),
            float(share_gap),
            float(words_gap),
        )

    def summarize(
        self,
        good: list[TrajectorySummary],
        bad: list[TrajectorySummary],
        previous: ExperienceBank | None = None,
    ) -> ExperienceBank:
        g, b = group_stats(good), group_stats(bad)
        out: dict[str, list[str]] = {name: [] for name, _ in ExperienceBank.GROUPS}
        share = self.share_gap

        d = g.mean_searches - b.mean_searches
        if d <= -self.search_gap:
            out["pitfalls"].append(
                "Do not keep searching once the passages hold the answer: failed trajectories averaged "
                f"{b.mean_searches:.2f} searches, successful ones {g.mean_searches:.2f}."
            )
        elif d >= self.search_gap:
            out["success_strategies"].append(
                "Search for the facts you are unsure of before answering: successful trajectories averaged "
                f"{g.mean_searches:.2f} searches, failed ones {b.mean_searches:.2f}."
            )
        d = g.no_search_share - b.no_search_share
        if d >= share:
            out["success_strategies"].append(
                "Answer at once when you already know the fact: "
                f"{_pct(g.no_search_share)} of successful trajectories answered without searching, "
                f"against {_pct(b.no_search_share)} of failed ones."
            )
        elif d <= -share:
            out["pitfalls"].append(
                "Do not answer from memory alone when unsure: "
                f"{_pct(b.no_search_share)} of failed trajectories made no search, "
                f"against {_pct(g.no_search_share)} of successful ones."
            )
        d = g.answer_in_docs_share - b.answer_in_docs_share
        if d >= share:
            out["success_strategies"].append(
                "Look for passages that contain the answer and take the answer from them: the gold answer "
                f"was in the retrieved passages of {_pct(g.answer_in_docs_share)} of successful "
                f"trajectories, against {_pct(b.answer_in_docs_share)} of failed ones."
            )
        elif d <= -share:
            out["pitfalls"].append(
                "Read the retrieved passages before answering: the gold answer was in them for "
                f"{_pct(b.answer_in_docs_share)} of failed trajectories (successful: "
                f"{_pct(g.answer_in_docs_share)}), yet they scored low."
            )
        if b.format_error_share - g.format_error_share >= share:
            out["pitfalls"].append(
                "Keep every reply in the required format: "
                f"{_pct(b.format_error_share)} of failed trajectories had a malformed turn, "
                f"against {_pct(g.format_error_share)} of successful ones."
            )
        if b.unanswered_share - g.unanswered_share >= share:
            out["pitfalls"].append(
                "Give a final answer before running out of turns: "
                f"{_pct(b.unanswered_share)} of failed trajectories ended without one, "
                f"against {_pct(g.unanswered_share)} of successful ones."
            )
        if g.query_overlap is not None and b.query_overlap is not None:
            d = g.query_overlap - b.query_overlap
            if d >= share:
                out["success_strategies"].append(
                    "Build each query from the key words of the question: successful queries shared "
                    f"{_pct(g.query_overlap)} of their words with the question, failed ones "
                    f"{_pct(b.query_overlap)}."
                )
            elif d <= -share:
                out["reasoning_guidelines"].append(
                    "Break the question into the fact you need and search for that fact, rather than "
                    f"copying the question: successful queries shared {_pct(g.query_overlap)} of their "
                    f"words with the question, failed ones {_pct(b.query_overlap)}."
                )
        if g.answer_words is not None and b.answer_words is not None:
            d = g.answer_words - b.answer_words
            if d <= -self.words_gap:
                out["reasoning_guidelines"].append(
                    "Answer with just the name or value asked for: successful answers averaged "
                    f"{g.answer_words:.1f} words, failed ones {b.answer_words:.1f}."
                )
            elif d >= self.words_gap:
                out["reasoning_guidelines"].append(
                    "Give the full name or phrase the question asks for: successful answers averaged "
                    f"{g.answer_words:.1f} words, failed ones {b.answer_words:.1f}."
                )
        return ExperienceBank.from_groups(out)

    def __repr__(self) -> str:
        return (
            f"RuleBasedSummarizer(search_gap={self.search_gap}, share_gap={self.share_gap}, "
            f"words_gap={self.words_gap})"
        )
