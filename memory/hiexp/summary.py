"""HiExp's rule-based case summariser (the default; no model needed).

:class:`RuleCaseSummarizer` measures the two groups of rollouts of a question (how often
they searched, with which queries, what they answered, whether the gold answer was in the
documents they retrieved, format errors, names in queries that nothing earlier mentioned)
and writes the record from the differences it measured, so every number and quotation in
its text is true of the rollouts it was given.
"""

from __future__ import annotations

import dataclasses
import re
import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from ...envs.metrics import normalize_answer
from ...envs.records import Question, Trajectory
from ...error import InvalidArgumentError, did_you_mean
from .record import MAX_TAGS, MAX_WORDS, CaseSummarizer, ExperienceRecord

__all__ = [
    "RuleCaseSummarizer",
    "make_case_summarizer",
    "question_pattern",
    "question_topic",
    "EXPERIENCE_TYPES",
]

# ---------------------------------------------------------------------------------------
# Measurements

_NAME = re.compile(r"\b[A-Z][\w'’-]*(?:\s+[A-Z][\w'’-]*)*")
_ENTITY_TOKEN = re.compile(r"(?<=\s)(?:[A-Z0-9][\w'’.-]*)")
_RUNS_OF_X = re.compile(r"X(?:\s+X)+")


def question_pattern(question: str) -> str:
    """The question with its names and numbers replaced by ``X`` (every word after the first
    that starts with a capital letter or a digit); runs of ``X`` collapse into one.

    >>> question_pattern("In which year was the founder of Velora Systems born?")
    'In which year was the founder of X born?'
    """
    return _RUNS_OF_X.sub("X", _ENTITY_TOKEN.sub("X", " ".join(question.split())))


_STOPWORDS = frozenset(
    "a an the of in on at to for from by with and or is was were are be been do does did which what who "
    "whom whose where when why how that this these those it its x".split()
)
_ABOUT = " (questions about "


def question_topic(question: str, words: int = 6) -> str:
    """The content words of :func:`question_pattern` (no names, numbers or stopwords), in order.

    >>> question_topic("In which year was the founder of Velora Systems born?")
    'year founder born'
    """
    tokens = re.findall(r"[a-z]+", question_pattern(question).lower())
    return " ".join(list(dict.fromkeys(t for t in tokens if t not in _STOPWORDS))[:words])


def _quote(text: str, words: int = 8) -> str:
    parts = text.split()
    return '"' + " ".join(parts[:words]) + (' …"' if len(parts) > words else '"')


def _times(n: int) -> str:
    return "once" if n == 1 else f"{n} times"


@dataclass(frozen=True)
class _Rollout:
    searches: int
    queries: tuple[str, ...]
    answer: str | None
    f1: float
    format_ok: bool
    gold_seen: bool
    stray_names: tuple[str, ...]


def _measure(trajectory: Trajectory) -> _Rollout:
    golds = [g for g in (normalize_answer(a) for a in trajectory.question.golden_answers) if g]
    seen_text = trajectory.question.question
    gold_seen = False
    stray: list[str] = []
    for turn in trajectory.turns:
        query = turn.action.query if turn.action.kind == "search" else None
        if query:
            stray.extend(n for n in _NAME.findall(query) if n not in seen_text)
        docs = " ".join(f"{d.title} {d.text}" for d in turn.docs)
        seen_text += " " + docs
        if docs and not gold_seen:
            normalized = normalize_answer(docs)
            gold_seen = any(g in normalized for g in golds)
    return _Rollout(
        searches=trajectory.num_searches,
        queries=tuple(trajectory.queries),
        answer=trajectory.answer,
        f1=trajectory.f1,
        format_ok=trajectory.format_ok,
        gold_seen=gold_seen,
        stray_names=tuple(dict.fromkeys(stray)),
    )


@dataclass(frozen=True)
class _Group:
    label: str
    rollouts: tuple[_Rollout, ...]

    @property
    def n(self) -> int:
        return len(self.rollouts)

    @property
    def searches(self) -> list[int]:
        return [r.searches for r in self.rollouts]

    @property
    def mean_searches(self) -> float:
        return statistics.fmean(self.searches)

    def count(self, key: str) -> int:
        return sum(bool(getattr(r, key)) for r in self.rollouts)

    def sentence(self, show_f1: bool) -> str:
        """What the group did, in one sentence of measured facts."""
        lo, hi = min(self.searches), max(self.searches)
        if hi == 0:
            did = "never searched"
        elif lo == hi:
            did = f"searched {_times(lo)}"
        else:
            did = f"searched {lo} to {hi} times (mean {self.mean_searches:.1f})"
        queries = list(dict.fromkeys(q for r in self.rollouts for q in r.queries))[:2]
        if queries:
            did += ", with queries such as " + " and ".join(_quote(q) for q in queries)
        answers = Counter(r.answer for r in self.rollouts if r.answer is not None).most_common(2)
        said = " or ".join(f"{_quote(a)} ({c}x)" for a, c in answers) if answers else ""
        said = f"answered {said}" if said else "gave no answer"
        unanswered = sum(r.answer is None for r in self.rollouts)
        if answers and unanswered:
            said += f"; {unanswered} gave no answer"
        f1 = f" (mean F1 {statistics.fmean(r.f1 for r in self.rollouts):.2f})" if show_f1 else ""
        return f"{self.n} {self.label} rollout{'s' if self.n != 1 else ''} {did} and {said}{f1}."


# Diagnoses, tried in order: (key, type, lesson used as the title's head, tag).
_LESSONS = {
    "format": ("answer-format", "Keep every turn in the required tag format", "format"),
    "no-answer": ("answer-format", "Commit to a final answer before the turn budget runs out", "turn budget"),
    "search-needed": ("search-strategy", "Search for the needed fact before answering", "search first"),
    "memory-sufficed": ("search-strategy", "Answer directly when the fact is already known", "no search"),
    "more-hops": ("reasoning", "Run one search per missing fact and chain the results", "multi-hop"),
    "wrong-entity": (
        "query-formulation",
        "Search for the entity the question names, not another one",
        "entity",
    ),
    "evidence-missed": (
        "answer-extraction",
        "Take the answer from the retrieved passage about the asked entity",
        "evidence",
    ),
    "fewer-searches": ("search-strategy", "Stop searching once a passage answers the question", "stop early"),
    "different-answer": ("reasoning", "Check the final answer against what the question asks", "verify"),
}

EXPERIENCE_TYPES = tuple(dict.fromkeys(kind for kind, _, _ in _LESSONS.values()))
"""The ``type`` vocabulary of :class:`RuleCaseSummarizer` (other summarisers may use any)."""


def _diagnose(good: _Group, bad: _Group) -> tuple[str, str]:
    """The first measured difference that separates the groups, and why it is decisive."""
    if bad.count("format_ok") < bad.n and good.count("format_ok") == good.n:
        k = bad.n - bad.count("format_ok")
        return "format", f"{k} of {bad.n} failed rollouts had a malformed turn and no successful one did."
    unanswered = sum(r.answer is None for r in bad.rollouts)
    if 2 * unanswered >= bad.n and all(r.answer is not None for r in good.rollouts):
        return (
            "no-answer",
            f"{unanswered} of {bad.n} failed rollouts ended without an answer; every successful one answered.",
        )
    silent = sum(n == 0 for n in bad.searches)
    if min(good.searches) > 0 and 2 * silent >= bad.n:
        return "search-needed", (
            f"Every successful rollout searched; {silent} of {bad.n} failed rollouts answered without searching."
        )
    if max(good.searches) == 0 and min(bad.searches) > 0:
        return (
            "memory-sufficed",
            "The successful rollouts answered without searching; every failed one searched.",
        )
    means = (
        f"Successful rollouts searched {good.mean_searches:.1f} times on average, failed ones "
        f"{bad.mean_searches:.1f}."
    )
    if good.mean_searches > bad.mean_searches:
        if min(good.searches) >= 2:
            return "more-hops", f"{means} Every successful rollout searched at least twice."
        return "search-needed", means
    if bad.count("stray_names") and not good.count("stray_names"):
        names = list(dict.fromkeys(n for r in bad.rollouts for n in r.stray_names))[:2]
        return "wrong-entity", (
            f"Failed queries named {' and '.join(_quote(n) for n in names)}, which neither the "
            "question nor earlier results mention; no successful query did."
        )
    if bad.count("gold_seen"):
        k = bad.count("gold_seen")
        return (
            "evidence-missed",
            f"{k} of {bad.n} failed rollouts retrieved the gold answer but did not give it.",
        )
    if good.mean_searches < bad.mean_searches:
        return "fewer-searches", means
    return (
        "different-answer",
        f"Both groups searched {good.mean_searches:.1f} times on average; their answers differ.",
    )


def _fit(sentences: Sequence[str], budget: int = MAX_WORDS) -> str:
    """Join sentences in order, leaving out any that would exceed ``budget`` words."""
    kept, used = [], 0
    for s in sentences:
        n = len(s.split())
        if used + n <= budget:
            kept.append(s)
            used += n
    return " ".join(kept)


def _majority(values: Sequence[str]) -> str:
    counts = Counter(values)
    return min(counts, key=lambda v: (-counts[v], v))


def _medoid(titles: Sequence[str]) -> str:
    """The title sharing the most words with the others (Jaccard); the first one on ties."""
    bags = [set(normalize_answer(t).split()) for t in titles]

    def overlap(i: int) -> float:
        return sum(len(bags[i] & b) / max(1, len(bags[i] | b)) for j, b in enumerate(bags) if j != i)

    return titles[max(range(len(titles)), key=lambda i: (overlap(i), -i))]


class RuleCaseSummarizer:
    """The offline, deterministic case summariser (the default; no model needed).

    ``contrast`` measures both groups (see the module docstring), picks the first
    difference of a fixed list that separates them — malformed turns, no answer, no search
    against search, fewer searches, a query naming something unseen, the gold answer
    retrieved but not given, more searches, else different answers — and writes a record
    whose title is that lesson followed by the question's pattern (names replaced by X),
    whose description states what each group did, and whose thinking states the decisive
    difference with its numbers.

    ``merge`` is extractive. A single record moves up a level unchanged. Otherwise the
    title is the lesson the children share (with up to three of their question topics) or,
    when their lessons differ, the child title that shares most words with the others; the
    description counts the children by type and lists their distinct titles.
    """

    name = "rule"

    def contrast(
        self, question: Question, successes: Sequence[Trajectory], failures: Sequence[Trajectory]
    ) -> ExperienceRecord:
        if not successes or not failures:
            raise InvalidArgumentError(
                f"contrast needs at least one successful and one failed rollout of {question.id!r}; "
                f"got {len(successes)} and {len(failures)}."
            )
        good = _Group("successful", tuple(_measure(t) for t in successes))
        bad = _Group("failed", tuple(_measure(t) for t in failures))
        key, why = _diagnose(good, bad)
        kind, lesson, tag = _LESSONS[key]
        gold = question.golden_answers[0] if question.golden_answers else ""
        extras = []
        if key != "evidence-missed" and bad.count("gold_seen"):
            extras.append(
                f"{bad.count('gold_seen')} of {bad.n} failed rollouts had the gold answer in their documents."
            )
        description = _fit(
            [
                f"Question: {_quote(question.question, 20)} (gold answer {_quote(gold)}).",
                good.sentence(show_f1=False),
                bad.sentence(show_f1=True),
                *extras,
            ]
        )
        tags = [tag, "searched" if min(good.searches) > 0 else "answered directly"]
        if question.hops is not None:
            tags.append(f"{question.hops}-hop")
        return ExperienceRecord(
            level=1,
            type=kind,
            title=f"{lesson}{_ABOUT}{question_topic(question.question) or 'this question'})",
            tags=tuple(tags),
            description=description,
            thinking=_fit([f"Decisive difference: {why}", f"Lesson: {lesson.lower()}."]),
            sources=(question.id,),
        )

    def merge(self, records: Sequence[ExperienceRecord], level: int) -> ExperienceRecord:
        if not records:
            raise InvalidArgumentError(f"merge needs at least one record to generalise into level {level}.")
        if len(records) == 1:  # a cluster of one: the record moves up a level unchanged
            (only,) = records
            return dataclasses.replace(only, level=level, sources=(only.title,))
        titles = [r.title for r in records]
        split = [t[:-1].split(_ABOUT, 1) if t.endswith(")") and _ABOUT in t else [t] for t in titles]
        heads = {parts[0] for parts in split}
        topics = Counter(t for parts in split if len(parts) == 2 for t in parts[1].split("; ") if t != "…")
        if len(heads) == 1 and topics and all(len(parts) == 2 for parts in split):
            shown = [t for t, _ in sorted(topics.items(), key=lambda kv: -kv[1])][:3]
            more = "; …" if len(topics) > 3 else ""
            title = f"{heads.pop()}{_ABOUT}{'; '.join(shown)}{more})"
            kind = _majority([r.type for r in records])
        else:
            title = _medoid(titles)
            kind = next(r.type for r in records if r.title == title)
        kinds = Counter(r.type for r in records)
        tag_counts = Counter(t for r in records for t in r.tags)
        tags = sorted(tag_counts, key=lambda t: -tag_counts[t])[:MAX_TAGS]
        unique_titles = list(dict.fromkeys(titles))
        type_text = ", ".join(f"{k} {c}" for k, c in sorted(kinds.items(), key=lambda kv: (-kv[1], kv[0])))
        description = _fit(
            [
                f"Generalises {len(records)} level-{level - 1} record{'s' if len(records) != 1 else ''} "
                f"(types: {type_text}).",
                *(f"{i + 1}. {t}" for i, t in enumerate(unique_titles)),
            ]
        )
        thinking = _fit(
            [
                f"The cluster holds {len(unique_titles)} distinct title{'s' if len(unique_titles) != 1 else ''} "
                f"and {len(kinds)} type{'s' if len(kinds) != 1 else ''}.",
                f"Most frequent tags: {', '.join(tags)}." if tags else "",
            ]
        )
        return ExperienceRecord(
            level=level,
            type=kind,
            title=title,
            tags=tuple(tags),
            description=description,
            thinking=thinking,
            sources=tuple(unique_titles),
        )


def make_case_summarizer(summarizer: str | CaseSummarizer) -> CaseSummarizer:
    """``"rule"`` → :class:`RuleCaseSummarizer`; an object with ``contrast`` and ``merge`` as is."""
    if isinstance(summarizer, str):
        if summarizer == "rule":
            return RuleCaseSummarizer()
        raise did_you_mean("case summarizer", summarizer, ["rule"])
    if callable(getattr(summarizer, "contrast", None)) and callable(getattr(summarizer, "merge", None)):
        return summarizer
    raise InvalidArgumentError(
        f"summarizer must be 'rule' or an object with contrast(question, successes, failures) and "
        f"merge(records, level) methods; got {summarizer!r:.200}."
    )
