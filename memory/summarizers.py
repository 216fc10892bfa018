"""LightSearcher's experience bank and the summarisers that write it.

A summariser reads compact summaries of Good and Bad trajectories (PAPERS.md §1: each with
its F1, its reward and an explanation of that reward) and writes guidance in three groups:
success strategies, pitfalls to avoid, reasoning guidelines. Three backends share the
:class:`Summarizer` protocol:

- :class:`RuleBasedSummarizer` (the default): offline and deterministic. It measures the
  two groups and writes a sentence only where they differ by more than a set margin,
  quoting the measured figures. It never writes a number it did not measure, and a
  contrast it does not find gives no sentence.
- :class:`TransformersSummarizer`: a local causal language model (``transformers``,
  imported when first used).
- :class:`OpenAISummarizer`: any OpenAI-compatible chat-completions server (vLLM in the
  papers' setting), over HTTP with ``urllib``.

The two language-model backends share one prompt (:func:`build_prompt`) and one reader
(:func:`parse_bank`), which takes bullet points under the three headings and raises
:class:`SummarizerError` when the reply has none, so that junk never replaces a bank.
"""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, runtime_checkable

from ..envs.errors import InvalidArgumentError, SearchGymError, UnknownNameError
from ..envs.metrics import normalize_answer
from ..envs.records import Trajectory

__all__ = [
    "ExperienceBank",
    "TrajectorySummary",
    "GroupStats",
    "Summarizer",
    "SummarizerError",
    "RuleBasedSummarizer",
    "TransformersSummarizer",
    "OpenAISummarizer",
    "summarise_trajectory",
    "group_stats",
    "build_prompt",
    "parse_bank",
    "check_bank",
    "make_summarizer",
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
    def from_dict(cls, data: Mapping[str, Any]) -> ExperienceBank:
        """Read :meth:`to_dict`'s output; ``step`` and ``version`` default to 0.

        Raises:
            InvalidArgumentError: a group is missing or is not a list of strings.
        """
        if not isinstance(data, Mapping):
            raise InvalidArgumentError(f"An experience bank must be a dict, got {type(data).__name__}.")
        groups: dict[str, tuple[str, ...]] = {}
        for name, _ in cls.GROUPS:
            items = data.get(name)
            if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
                raise InvalidArgumentError(
                    f"Experience bank field {name!r} must be a list of strings, got {items!r}."
                )
            groups[name] = tuple(items)
        numbers = {}
        for key in ("step", "version"):
            value = data.get(key, 0)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise InvalidArgumentError(
                    f"Experience bank field {key!r} must be an int >= 0, got {value!r}."
                )
            numbers[key] = value
        return cls(
            success_strategies=groups["success_strategies"],
            pitfalls=groups["pitfalls"],
            reasoning_guidelines=groups["reasoning_guidelines"],
            step=numbers["step"],
            version=numbers["version"],
        )


def _bank(groups: Mapping[str, Sequence[str]], step: int = 0, version: int = 0) -> ExperienceBank:
    """An :class:`ExperienceBank` from ``{field: items}`` of the three groups."""
    return ExperienceBank(
        success_strategies=tuple(groups["success_strategies"]),
        pitfalls=tuple(groups["pitfalls"]),
        reasoning_guidelines=tuple(groups["reasoning_guidelines"]),
        step=step,
        version=version,
    )


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


# -- the protocol ------------------------------------------------------------------------------


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


# -- the rule-based summariser -------------------------------------------------------------------


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
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise InvalidArgumentError(f"{key} must be a number > 0, got {value!r}.")
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
        return _bank(out)

    def __repr__(self) -> str:
        return (
            f"RuleBasedSummarizer(search_gap={self.search_gap}, share_gap={self.share_gap}, "
            f"words_gap={self.words_gap})"
        )


# -- the language-model prompt and its reader ---------------------------------------------------

_SYSTEM = (
    "You coach a question-answering agent that can call a search tool. From records of its "
    "past episodes you write short, practical rules that would help it score well next time."
)


def _clip(text: str | None, limit: int = 200) -> str:
    text = "" if text is None else " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _lines(summaries: Sequence[TrajectorySummary], limit: int) -> str:
    if not summaries:
        return "(none)"
    rows = []
    for i, s in enumerate(summaries[:limit], start=1):
        rows.append(
            f"{i}. Question: {_clip(s.question)} | answer: {_clip(s.answer) or '(none)'} | gold: "
            f"{_clip(s.gold[0] if s.gold else '')} | F1 {s.f1:.2f} | reward {s.reward:.2f} | "
            f"{s.num_searches} searches | {_clip(s.explanation, 300)}"
        )
    if len(summaries) > limit:
        rows.append(f"({len(summaries) - limit} more not shown)")
    return "\n".join(rows)


def build_prompt(
    good: Sequence[TrajectorySummary],
    bad: Sequence[TrajectorySummary],
    previous: ExperienceBank | None,
    max_examples: int = 8,
) -> tuple[str, str]:
    """``(system, user)`` messages asking a language model for a revised bank.

    At most ``max_examples`` episodes of each group are listed (the first ones given).
    """
    current = previous.to_text() if previous is not None and len(previous) else "(no guidance yet)"
    user = (
        "Here are recent episodes of the agent. Each line gives the question, the agent's final "
        "answer, the expected answer, the F1 score, the reward, the number of searches, and why "
        "the episode got that reward.\n\n"
        f"Episodes that scored well:\n{_lines(good, max_examples)}\n\n"
        f"Episodes that scored poorly:\n{_lines(bad, max_examples)}\n\n"
        f"Current guidance:\n{current}\n\n"
        "Compare the two sets: what did the good episodes do that the poor ones did not? Rewrite the "
        "guidance, keeping what still holds and dropping what the episodes contradict. Reply with "
        "three lists of short imperative bullet points (a line starting with '- ') under exactly "
        "these headings, and nothing else:\n"
        "Success strategies:\n- ...\nPitfalls to avoid:\n- ...\nReasoning guidelines:\n- ..."
    )
    return _SYSTEM, user


_BULLET = re.compile(r"^\s*(?:[-*•+]|\d{1,2}[.)])\s+(.+?)\s*$")
_HEADINGS = (
    ("success_strategies", ("success strateg", "strateg")),
    ("pitfalls", ("pitfall",)),
    ("reasoning_guidelines", ("reasoning guideline", "guideline")),
)


def _heading(line: str) -> str | None:
    cleaned = re.sub(r"[#*_`>:\s]+", " ", line).strip().lower()
    if not cleaned or len(cleaned) > 40:
        return None
    for name, prefixes in _HEADINGS:
        if any(cleaned.startswith(p) for p in prefixes):
            return name
    return None


def parse_bank(text: str, *, max_items: int = 8, max_item_chars: int = 400) -> ExperienceBank:
    """Read bullet points under the three headings of a model's reply.

    Headings may carry markdown (``## Pitfalls to avoid``, ``**Success strategies:**``);
    items are lines starting with ``-``, ``*``, ``•`` or ``1.``; items outside a heading,
    duplicates, and items shorter than 3 or longer than ``max_item_chars`` characters are
    dropped, and each group keeps at most ``max_items``.

    Raises:
        SummarizerError: no item was found (the reply is not a bank).
    """
    if not isinstance(text, str):
        raise SummarizerError(f"The model's reply must be text, got {type(text).__name__}.")
    out: dict[str, list[str]] = {name: [] for name, _ in ExperienceBank.GROUPS}
    current: str | None = None
    for line in text.splitlines():
        bullet = _BULLET.match(line)
        if bullet is None:
            heading = _heading(line)
            if heading is not None:
                current = heading
            continue
        if current is None:
            continue
        item = bullet.group(1).strip().strip("*_`").strip()
        if 3 <= len(item) <= max_item_chars and item not in out[current] and len(out[current]) < max_items:
            out[current].append(item)
    bank = _bank(out)
    if not len(bank):
        raise SummarizerError(
            "The model's reply has no bullet points under the headings 'Success strategies', "
            f"'Pitfalls to avoid', 'Reasoning guidelines'; it began: {_clip(text, 200)!r}"
        )
    return bank


# -- a local transformers model ------------------------------------------------------------------


class TransformersSummarizer:
    """A local causal language model as the summariser (greedy decoding).

    ``transformers`` and ``torch`` are imported, and the model loaded, on the first call.
    The tokenizer's chat template is used when it has one; otherwise the system and user
    messages are joined as plain text.

    Args:
        model_path: A folder holding a model and tokenizer saved with ``save_pretrained``.
        max_new_tokens: Length limit of the reply.
        max_examples: Episodes of each group shown in the prompt.
        device: A torch device string (default ``"cpu"``).
    """

    def __init__(
        self, model_path: str, *, max_new_tokens: int = 384, max_examples: int = 8, device: str = "cpu"
    ):
        if not isinstance(model_path, str) or not model_path:
            raise InvalidArgumentError(f"model_path must be a non-empty folder path, got {model_path!r}.")
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise InvalidArgumentError(f"max_new_tokens must be an int >= 1, got {max_new_tokens!r}.")
        self.model_path = model_path
        self.max_new_tokens = max_new_tokens
        self.max_examples = max_examples
        self.device = device
        self.name = f"transformers:{model_path}"
        self._model: Any = None
        self._tokenizer: Any = None

    def _load(self) -> tuple[Any, Any]:
        if self._model is None:
            try:
                from transformers import AutoModelForCausalLM, AutoTokenizer
            except ImportError as exc:
                raise SummarizerError(
                    "TransformersSummarizer needs transformers and torch: pip install 'searchgym[train]'."
                ) from exc
            try:
                self._tokenizer = AutoTokenizer.from_pretrained(self.model_path)
                model: Any = AutoModelForCausalLM.from_pretrained(self.model_path)
                self._model = model.to(self.device).eval()
            except (OSError, ValueError) as exc:
                raise SummarizerError(f"Cannot load a causal LM from {self.model_path!r}: {exc}") from exc
        return self._tokenizer, self._model

    def generate(self, system: str, user: str) -> str:
        """The model's reply to the two messages."""
        import torch

        tokenizer, model = self._load()
        if getattr(tokenizer, "chat_template", None):
            messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
            text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        else:
            text = f"{system}\n\n{user}\n\n"
        ids = tokenizer(text, return_tensors="pt").input_ids.to(self.device)
        limit = getattr(model.config, "max_position_embeddings", None)
        if limit is not None and ids.shape[1] + self.max_new_tokens > limit:
            raise SummarizerError(
                f"The prompt has {ids.shape[1]} tokens and the reply may take {self.max_new_tokens}, beyond "
                f"the model's {limit}: lower max_examples or max_new_tokens."
            )
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        with torch.no_grad():
            out = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=self.max_new_tokens,
                do_sample=False,
                pad_token_id=pad,
            )
        return tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)

    def summarize(
        self,
        good: list[TrajectorySummary],
        bad: list[TrajectorySummary],
        previous: ExperienceBank | None = None,
    ) -> ExperienceBank:
        system, user = build_prompt(good, bad, previous, self.max_examples)
        return parse_bank(self.generate(system, user))

    def __repr__(self) -> str:
        return f"TransformersSummarizer({self.model_path!r})"


# -- an OpenAI-compatible server -----------------------------------------------------------------


class OpenAISummarizer:
    """An OpenAI-compatible chat-completions endpoint as the summariser (e.g. vLLM's server).

    Sends ``POST {base_url}/chat/completions`` with ``urllib``. Network errors, timeouts,
    HTTP 429 and 5xx are retried ``retries`` times with exponential back-off; any other
    HTTP error, or a body that is not a chat completion, fails at once. Every failure
    raises :class:`SummarizerError`, which leaves the current bank in place.

    Args:
        base_url: The API root, e.g. ``http://127.0.0.1:8000/v1``.
        model: The model name the server expects.
        timeout: Seconds to wait for one answer.
        retries: Extra attempts after a failed one.
        api_key: Sent as a bearer token when given.
        max_tokens, temperature: Generation settings sent with the request.
        backoff: Seconds before the first retry (doubled each time).
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        timeout: float = 60.0,
        retries: int = 2,
        api_key: str | None = None,
        max_tokens: int = 512,
        temperature: float = 0.0,
        max_examples: int = 8,
        backoff: float = 1.0,
    ):
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            raise InvalidArgumentError(
                f"base_url must be an http(s) URL such as http://127.0.0.1:8000/v1, got {base_url!r}."
            )
        if not isinstance(model, str) or not model:
            raise InvalidArgumentError(f"model must be a non-empty string, got {model!r}.")
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
            raise InvalidArgumentError(f"timeout must be a number of seconds > 0, got {timeout!r}.")
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise InvalidArgumentError(f"retries must be an int >= 0, got {retries!r}.")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.timeout = float(timeout)
        self.retries = retries
        self.api_key = api_key
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.max_examples = max_examples
        self.backoff = backoff
        self.name = f"openai:{model}@{self.base_url}"

    def _post(self, body: bytes) -> bytes:
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        request = urllib.request.Request(f"{self.base_url}/chat/completions", data=body, headers=headers)
        with urllib.request.urlopen(request, timeout=self.timeout) as response:
            return response.read()

    def generate(self, system: str, user: str) -> str:
        """The text of the server's reply to the two messages."""
        body = json.dumps(
            {
                "model": self.model,
                "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
                "max_tokens": self.max_tokens,
                "temperature": self.temperature,
            }
        ).encode("utf-8")
        last = ""
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self.backoff * 2 ** (attempt - 1))
            try:
                raw = self._post(body)
            except urllib.error.HTTPError as exc:
                last = f"HTTP {exc.code} {exc.reason}"
                if exc.code == 429 or exc.code >= 500:
                    continue
                raise SummarizerError(
                    f"{self.base_url}/chat/completions refused the request: {last}."
                ) from exc
            except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as exc:
                reason = getattr(exc, "reason", exc)
                last = f"no answer within {self.timeout:g} s" if "timed out" in str(reason) else str(reason)
                continue
            return self._content(raw)
        raise SummarizerError(
            f"{self.base_url}/chat/completions failed {self.retries + 1} times; last: {last}."
        )

    def _content(self, raw: bytes) -> str:
        try:
            data = json.loads(raw)
            content = data["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise SummarizerError(
                f"{self.base_url}/chat/completions sent something that is not a chat completion "
                f"({type(exc).__name__}: {exc}); it began: {raw[:200]!r}"
            ) from None
        if not isinstance(content, str):
            raise SummarizerError(f"The completion's message content is not text: {content!r}.")
        return content

    def summarize(
        self,
        good: list[TrajectorySummary],
        bad: list[TrajectorySummary],
        previous: ExperienceBank | None = None,
    ) -> ExperienceBank:
        system, user = build_prompt(good, bad, previous, self.max_examples)
        return parse_bank(self.generate(system, user))

    def __repr__(self) -> str:
        return f"OpenAISummarizer({self.base_url!r}, {self.model!r})"


def summarizer_name(summarizer: object) -> str:
    """The name the bank history records for ``summarizer``: its ``name``, else its class name."""
    name = getattr(summarizer, "name", None)
    return name if isinstance(name, str) and name else type(summarizer).__name__


# -- by name -----------------------------------------------------------------------------------

_FORMS = ("rule", "transformers:PATH", "openai:MODEL@URL")


def make_summarizer(spec: str | Summarizer) -> Summarizer:
    """A summariser from ``"rule"``, ``"transformers:PATH"``, ``"openai:MODEL@URL"`` or an object.

    An object with a ``summarize`` method is returned as it is; its ``name`` attribute,
    or else its class name, is what the bank history records (:func:`summarizer_name`).

    Raises:
        UnknownNameError: an unknown name (with the accepted forms).
        InvalidArgumentError: a malformed ``openai:`` or ``transformers:`` spec.
    """
    if not isinstance(spec, str):
        if callable(getattr(spec, "summarize", None)):
            return spec
        raise InvalidArgumentError(
            f"summarizer must be one of {', '.join(_FORMS)} or an object with summarize(); got {spec!r}."
        )
    if spec == "rule":
        return RuleBasedSummarizer()
    if spec.startswith("transformers:"):
        return TransformersSummarizer(spec[len("transformers:") :])
    if spec.startswith("openai:"):
        model, at, url = spec[len("openai:") :].rpartition("@")
        if not at or not model or not url:
            raise InvalidArgumentError(
                f"An OpenAI summariser is written openai:MODEL@URL, e.g. openai:Qwen2.5-7B@http://127.0.0.1:8000/v1; got {spec!r}."
            )
        return OpenAISummarizer(url, model)
    raise UnknownNameError(f"Unknown summarizer {spec!r}. Known forms: {', '.join(_FORMS)}.")
