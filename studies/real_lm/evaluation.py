"""Held-out evaluation of the real-LM study: the known/unknown probe, episodes, baselines.

Every figure is computed on the same held-out questions. A question is *known* when the
warm-started model, asked in the agent's own prompt with its turn opened as
``<answer>``, writes a right answer greedily (no search possible): :func:`probe_known`.
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Callable, Sequence
from typing import Any

from searchgym.envs.metrics import exact_match, f1_score

from .data import StudyData, answer_prior
from .warm_start import fact_prompt

__all__ = [
    "FIGURES",
    "probe_known",
    "run_episodes",
    "figures",
    "interval",
    "no_search_answers",
    "heuristic_answers",
    "score_answers",
]

FIGURES = ("em", "f1", "st", "sr", "sr_known", "sr_unknown", "em_known", "em_unknown", "format_ok")
"""Percentages, except ``st`` (mean searches per question)."""


def _hf_policy(model: Any, tokenizer: Any, max_new_tokens: int, stops: Sequence[str] | None, system=None):
    from searchgym.policies.hf import HFPolicy

    return HFPolicy(
        model,
        tokenizer=tokenizer,
        max_new_tokens=max_new_tokens,
        temperature=0.0,
        batch_size=16,
        stop_strings=list(stops) if stops else None,
        system=system,
        name="probe",
    )


def _answer_text(text: str) -> str:
    """The answer in a completion: up to ``</answer>`` (or the end of the turn)."""
    return re.split(r"</answer>|<\|im_end\|>|\n", text)[0].strip()


def answer_prompts(tokenizer: Any, env_kwargs: dict[str, Any], data_path: str, count: int) -> list[str]:
    """The agent's prompt for each of the first ``count`` questions of ``data_path`` with its
    answer turn opened: the search_r1 env's first observation in the chat template, then
    ``<answer>`` (the probe's input, and the warm start's agent-prompt lessons)."""
    import gymnasium as gym

    import searchgym  # noqa: F401
    from searchgym.policies.chat import ChatFormatter

    env = gym.make("searchgym/PopQA-v1", **{**env_kwargs, "data_path": data_path, "protocol": "search_r1"})
    formatter = ChatFormatter(tokenizer)
    texts = []
    for index in range(count):
        obs, _ = env.reset(seed=0, options={"index": index})
        texts.append(formatter.prompt(obs) + "<answer>")
    env.close()
    return texts


def probe_known(
    model: Any,
    tokenizer: Any,
    env_kwargs: dict[str, Any],
    questions: Sequence[dict[str, Any]],
    data_path: str,
) -> list[dict[str, Any]]:
    """Per question: the greedy forced answer in the agent's prompt and whether it is right.

    The prompt is the search_r1 env's first observation for the question, rendered with the
    chat template, followed by ``<answer>``; the model writes up to 16 tokens.
    """
    texts = answer_prompts(tokenizer, env_kwargs, data_path, len(questions))
    completions = _hf_policy(model, tokenizer, 16, ["</answer>"]).complete(texts)
    out = []
    for q, completion in zip(questions, completions, strict=True):
        answer = _answer_text(completion.text)
        em = exact_match(answer, q["golden_answers"])
        out.append({"qid": q["id"], "answer": answer, "em": em, "known": em == 1.0})
    return out


def run_episodes(
    make_env: Callable[[], Any],
    model: Any,
    tokenizer: Any,
    *,
    count: int,
    temperature: float,
    seed: int,
    max_new_tokens: int,
    max_context_tokens: int,
    batch_size: int,
) -> list[dict[str, Any]]:
    """One episode per question (the first ``count``) through the trainer's rollout code."""
    from searchgym.policies.chat import ChatFormatter
    from searchgym.trainers.grpo.generation import SamplingSettings
    from searchgym.trainers.grpo.rollout import RolloutCollector

    collector = RolloutCollector(
        make_env,
        model,
        tokenizer,
        ChatFormatter(tokenizer),
        max_new_tokens=max_new_tokens,
        max_context_tokens=max_context_tokens,
        sampling=SamplingSettings(temperature, 1.0, batch_size),
    )
    try:
        episodes = collector.collect(list(range(count)), 1, seed=seed)
    finally:
        collector.close()
    return [
        {
            "qid": str(e.info.get("question_id", "")),
            "searches": int(e.info.get("num_searches", 0)),
            "answer": e.info.get("answer"),
            "em": float(e.info.get("em", 0.0)),
            "f1": float(e.info.get("f1", 0.0)),
            "format_ok": bool(e.info.get("format_ok", False)),
            "reward": float(e.reward),
        }
        for e in episodes
    ]


def figures(records: Sequence[dict[str, Any]], known: dict[str, bool]) -> dict[str, float]:
    """The :data:`FIGURES` of per-question records, split by the measured ``known`` flags."""

    def pct(rows: list[dict[str, Any]], test: Callable[[dict[str, Any]], float]) -> float:
        return 100.0 * sum(test(r) for r in rows) / len(rows) if rows else math.nan

    rows = list(records)
    k = [r for r in rows if known.get(r["qid"])]
    u = [r for r in rows if not known.get(r["qid"])]
    return {
        "em": pct(rows, lambda r: r["em"]),
        "f1": pct(rows, lambda r: r["f1"]),
        "st": sum(r["searches"] for r in rows) / len(rows) if rows else math.nan,
        "sr": pct(rows, lambda r: r["searches"] > 0),
        "sr_known": pct(k, lambda r: r["searches"] > 0),
        "sr_unknown": pct(u, lambda r: r["searches"] > 0),
        "em_known": pct(k, lambda r: r["em"]),
        "em_unknown": pct(u, lambda r: r["em"]),
        "format_ok": pct(rows, lambda r: r["format_ok"]),
    }


def interval(values: Sequence[float]) -> float:
    """Half-width of the 95% t interval of the mean of ``values`` (0 for one value)."""
    values = [v for v in values if not math.isnan(v)]
    if len(values) < 2:
        return 0.0
    t = {2: 12.706, 3: 4.303, 4: 3.182, 5: 2.776, 6: 2.571, 7: 2.447, 8: 2.365, 9: 2.306, 10: 2.262}
    return t.get(len(values), 1.96) * statistics.stdev(values) / math.sqrt(len(values))


def score_answers(questions: Sequence[dict[str, Any]], answers: Sequence[str], searches: int) -> list[dict]:
    """Per-question records of fixed answers (a baseline that makes ``searches`` searches each)."""
    return [
        {
            "qid": q["id"],
            "searches": searches,
            "answer": a,
            "em": exact_match(a, q["golden_answers"]),
            "f1": f1_score(a, q["golden_answers"]),
            "format_ok": True,
            "reward": f1_score(a, q["golden_answers"]),
        }
        for q, a in zip(questions, answers, strict=True)
    ]


def no_search_answers(
    model: Any, tokenizer: Any, questions: Sequence[dict[str, Any]], passages: Sequence[str] | None = None
) -> list[str]:
    """Greedy answers in the fact lessons' chat (no retrieval), or with one passage before the
    question (naive RAG)."""
    texts = []
    for i, q in enumerate(questions):
        question = q["question"] if passages is None else f"{passages[i]}\n\n{q['question']}"
        texts.append(fact_prompt(tokenizer, question))
    return [_answer_text(c.text) for c in _hf_policy(model, tokenizer, 16, None).complete(texts)]


def heuristic_answers(
    data: StudyData, questions: Sequence[dict[str, Any]], passages: Sequence[str]
) -> list[str]:
    """The strongest no-learning rule written for PopQA, given the BM25 top-1 passage.

    Place of birth: the place after "born in" (or "born ... in"), else a training answer of
    that relation named in the passage. Occupation: the training answer of that relation
    that occurs earliest in the passage. Otherwise the relation's most frequent training
    answer (the answer-type prior).
    """
    prior = answer_prior(data.train)
    vocab: dict[str, set[str]] = {}
    for q in data.train:
        vocab.setdefault(q["metadata"]["prop"], set()).update(q["golden_answers"])
    out = []
    for q, passage in zip(questions, passages, strict=True):
        prop = q["metadata"].get("prop", "")
        answer = None
        if prop == "place of birth":
            match = re.search(r"born(?:[^.]{0,60}?)\bin ([A-Z][\w\-]+(?: [A-Z][\w\-]+)?)", passage)
            if match:
                answer = match.group(1)
        if answer is None:
            lower = passage.lower()
            hits = [(lower.find(a.lower()), -len(a), a) for a in vocab.get(prop, ()) if len(a) > 2]
            hits = [h for h in hits if h[0] >= 0 and re.search(rf"\b{re.escape(h[2].lower())}\b", lower)]
            answer = min(hits)[2] if hits else prior.get(prop, "")
        out.append(answer)
    return out
