"""Scripted baseline policies: direct answer, naive RAG, and the SyntheticFacts oracle."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from ..checks import check_int
from ..envs.protocols import Protocol, make_protocol
from ..envs.records import Trajectory
from ..envs.synthetic import RELATIONS, SyntheticWorld
from ..error import InvalidArgumentError
from .base import Policy, extract_doc_lines, split_context
from .reader import read_answer

__all__ = [
    "DirectPolicy",
    "NaiveRAGPolicy",
    "OracleSyntheticPolicy",
    "synthetic_knowledge",
    "good_and_bad_trajectories",
]

_CHOICE = re.compile(r"^\s*([A-D])\.\s", re.M)
UNKNOWN = "unknown"


def _guess(question: str) -> str:
    """A knowledge-free guess: the first option of a multiple-choice question, else 'unknown'."""
    choice = _CHOICE.search(question)
    return choice.group(1) if choice else UNKNOWN


def synthetic_knowledge(world: SyntheticWorld) -> dict[str, str]:
    """Question text → answer for every SyntheticFacts question whose facts are all known."""
    return {q.question: q.golden_answers[0] for q in world.questions if q.known}


class _ScriptedPolicy(Policy):
    def __init__(self, protocol: str | Protocol = "search_r1"):
        self.protocol = make_protocol(protocol)

    def act(self, observations: Sequence[str]) -> list[str]:
        return [self._act_one(*split_context(context)) for context in observations]

    def _act_one(self, question: str, history: str) -> str:
        raise NotImplementedError

    def _answer(self, answer: str, reason: str) -> str:
        return self.protocol.write_action(answer=answer, think=reason)

    def _search(self, query: str, guess: str, reason: str, history: str) -> str:
        if self.protocol.name != "sem":
            return self.protocol.write_action(query=query, think=reason)
        # SEM's template: a first answer before the first search; later searches carry none.
        if history.strip():
            return self.protocol.write_action(query=query, think=reason, first=False)  # type: ignore[call-arg]
        return self.protocol.write_action(query=query, answer=guess, think=reason)


class DirectPolicy(_ScriptedPolicy):
    """Answers at once, never searches: from ``knowledge`` (question → answer) when the
    question is in it, otherwise with a knowledge-free guess."""

    name = "direct"

    def __init__(self, protocol: str | Protocol = "search_r1", knowledge: Mapping[str, str] | None = None):
        super().__init__(protocol)
        self.knowledge = dict(knowledge or {})

    def _act_one(self, question: str, history: str) -> str:
        answer = self.knowledge.get(question)
        if answer is None:
            return self._answer(_guess(question), "I do not know this; I will guess.")
        return self._answer(answer, "I remember this fact.")


class NaiveRAGPolicy(_ScriptedPolicy):
    """Searches once with the question, then answers with a span read from the top document."""

    name = "naive_rag"

    def _act_one(self, question: str, history: str) -> str:
        if not history.strip():
            return self._search(question, _guess(question), "I will look this up.", history)
        docs = extract_doc_lines(history)
        if not docs:
            return self._answer(_guess(question), "The search found nothing; I will guess.")
        title, text = docs[0]
        return self._answer(read_answer(question, text, fallback=title), "The top document says so.")


class OracleSyntheticPolicy(_ScriptedPolicy):
    """On SyntheticFacts: answers known facts from memory and searches only for unknown ones.

    For each hop of the question's chain it uses memory when the fact is known, otherwise
    the fact passage found by its own search (read with the relation's template). This is
    the frugal behaviour the RL study aims at; it knows which facts are "memorised" but
    reads unknown ones from the retrieved text, so retrieval misses still cost it.
    """

    name = "oracle_synthetic"

    def __init__(self, world: SyntheticWorld, protocol: str | Protocol = "search_r1"):
        super().__init__(protocol)
        self.world = world

    def _act_one(self, question: str, history: str) -> str:
        record = self.world.question_by_text(question)
        if record is None:
            return self._answer(UNKNOWN, "This question is not from my world.")
        value: str | None = None
        for fact in self.world.chain(record.id):
            subject = fact.subject if value is None else value
            relation = RELATIONS[fact.relation]
            remembered = self.world.lookup(subject, fact.relation)
            if remembered is not None and remembered.known:
                value = remembered.object
                continue
            found = next(
                (v for _, text in extract_doc_lines(history) if (v := relation.read(text, subject))), None
            )
            if found is not None:
                value = found
                continue
            query = relation.query(subject)
            if query in history:
                return self._answer(UNKNOWN, "My search did not find the fact.")
            return self._search(query, UNKNOWN, f"I do not know the {relation.name} of {subject}.", history)
        return self._answer(value or UNKNOWN, "I have every fact I need.")


def good_and_bad_trajectories(env: Any, count: int) -> list[Trajectory]:
    """Scripted right and wrong episodes on the first ``count`` unknown questions of ``env``.

    The oracle (:class:`OracleSyntheticPolicy`, which searches for every fact it does not
    know and answers right) plays each question, then the direct policy
    (:class:`DirectPolicy` with the world's known facts, which never searches and so
    answers these wrong) plays each again: ``count`` Good trajectories followed by
    ``count`` Bad ones. Add them to an :class:`~searchgym.memory.ExperienceMemory` to get
    an experience bank without a model.

    Args:
        env: A SyntheticFacts env (``gym.make("searchgym/SyntheticFacts-v1", ...)``); its
            protocol is the one the policies write.
        count: How many unknown questions to play, at least 1.

    Raises:
        InvalidArgumentError: ``env`` is not a SyntheticFacts env, or it has fewer than
            ``count`` unknown questions.
    """
    count = check_int("count", count, 1)
    inner = getattr(env, "unwrapped", env)
    world = getattr(inner, "world", None)
    if not isinstance(world, SyntheticWorld):
        raise InvalidArgumentError(
            f"good_and_bad_trajectories needs a SyntheticFacts env, got {type(inner).__name__}; "
            'build one with gym.make("searchgym/SyntheticFacts-v1").'
        )
    unknown = [i for i, q in enumerate(inner.questions) if not q.known][:count]
    if len(unknown) < count:
        raise InvalidArgumentError(
            f"The env has {len(unknown)} unknown questions, fewer than count={count}; "
            "ask for fewer or build a larger world (num_people=...)."
        )
    protocol = inner.protocol
    trajectories = []
    for policy in (
        OracleSyntheticPolicy(world, protocol=protocol),
        DirectPolicy(protocol=protocol, knowledge=synthetic_knowledge(world)),
    ):
        for index in unknown:
            context, _ = env.reset(options={"index": index})
            while True:
                action = policy.act([context])[0]
                observation, _, terminated, truncated, _ = env.step(action)
                context += action + observation
                if terminated or truncated:
                    break
            trajectories.append(inner.trajectory)
    return trajectories
