"""An offline document generator for SyntheticFacts: passages written from the world itself."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence

from ..retrieval.simulated.retriever import read_doc_prompt
from .synthetic import RELATIONS, Fact, Relation, SyntheticWorld

__all__ = ["SyntheticDocGenerator"]

_WORD = re.compile(r"[a-z]+")
# Template words that say nothing about which relation is meant.
_FILLER = frozenset("s o the of in is was a an its has does did".split())


def _relation_words(relation: Relation) -> set[str]:
    texts = (relation.search, relation.passage, relation.phrase, *relation.questions)
    return {w for text in texts for w in _WORD.findall(text.lower())} - _FILLER


def _pick(key: str, count: int) -> int:
    """A deterministic index in ``range(count)`` from ``key``."""
    digest = hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % count


class SyntheticDocGenerator:
    """Writes SyntheticFacts passages for the prompts of a :class:`SimulatedRetriever`.

    A ``list[str] -> list[str]`` generator that needs no model: it reads each prompt back
    (:func:`read_doc_prompt`), finds the fact the query asks about, and answers in the
    ``Title:``/``Text:`` form an LLM is asked for. The fact is found by the entity names
    in the query (longest name first) and the relation words (those of the relation's
    search, passage and question templates, each weighted by one over the number of the
    entity's relations that use it: "born" hints at two relations, "city" at one). Result
    slot 0 is that fact; further slots are the subject's other facts, in relation order,
    cycling.

    A useful document is the world's own passage. A noisy one uses the same template with
    another object of the right kind (another city, person, country, or a year that
    another fact of that relation has), so it reads as plausibly as the true one but is
    wrong. A query naming no entity gets a "no result" document, or a noisy world passage.
    Choices are hashes of the prompt: deterministic.

    Args:
        world: The SyntheticFacts world (``env.unwrapped.world``).
    """

    def __init__(self, world: SyntheticWorld) -> None:
        self.world = world
        kinds = {e.name: e.kind for e in world.entities}
        names = sorted(kinds, key=len, reverse=True)
        self._kind = kinds
        self._names = re.compile(
            r"(?<![A-Za-z0-9])(" + "|".join(re.escape(n) for n in names) + r")(?![A-Za-z0-9])", re.I
        )
        self._canonical = {n.lower(): n for n in names}
        self._facts_of: dict[str, list[Fact]] = {}
        for fact in world.facts:
            self._facts_of.setdefault(fact.subject, []).append(fact)
        self._words = {name: _relation_words(r) for name, r in RELATIONS.items()}
        self._years = {
            r.name: sorted({f.object for f in world.facts if f.relation == r.name})
            for r in RELATIONS.values()
            if r.object_kind == "year"
        }

    def __call__(self, prompts: Sequence[str]) -> list[str]:
        """One ``Title: ...`` / ``Text: ...`` completion per prompt."""
        return [self._complete(prompt) for prompt in prompts]

    # Equal generators for the same world share one cached retriever (make_retriever's key).
    def __eq__(self, other: object) -> bool:
        return isinstance(other, SyntheticDocGenerator) and (
            other.world is self.world or other.world == self.world
        )

    def __hash__(self) -> int:
        return hash(
            ("SyntheticDocGenerator", self.world.seed, len(self.world.facts), len(self.world.questions))
        )

    def __repr__(self) -> str:
        return f"SyntheticDocGenerator(world_seed={self.world.seed})"

    def find_facts(self, query: str) -> list[Fact]:
        """The facts a query is about, best first: the asked fact, then its subject's others."""
        best: tuple[float, int, int] | None = None
        best_fact: Fact | None = None
        words = set(_WORD.findall(query.lower()))
        for position, match in enumerate(self._names.finditer(query)):
            subject = self._canonical[match.group(1).lower()]
            facts = self._facts_of.get(subject, [])
            for order, fact in enumerate(facts):
                score = 0.0
                for word in words & self._words[fact.relation]:
                    score += 1.0 / sum(word in self._words[f.relation] for f in facts)
                key = (score, -position, -order)
                if best is None or key > best:
                    best, best_fact = key, fact
        if best_fact is None:
            return []
        others = [f for f in self._facts_of[best_fact.subject] if f is not best_fact]
        return [best_fact, *others]

    def wrong_object(self, fact: Fact, key: str) -> str:
        """Another object of the kind ``fact.relation`` takes, chosen by ``key``."""
        relation = RELATIONS[fact.relation]
        if relation.object_kind == "year":
            pool = [y for y in self._years[fact.relation] if y != fact.object]
            if not pool:
                return f"{int(fact.object) + 1 + _pick(key, 15):04d}"
        else:
            pool = [n for n in self.world.names(relation.object_kind) if n not in (fact.object, fact.subject)]
            if not pool:  # a one-entity world: nothing else of that kind exists
                return fact.object + "a"
        return pool[_pick(key, len(pool))]

    def _complete(self, prompt: str) -> str:
        request = read_doc_prompt(prompt)
        if request is None:
            return "Title: No result\nText: This generator only answers searchgym document prompts."
        facts = self.find_facts(request.query)
        key = f"{prompt}\x1e{self.world.seed}"
        if not facts:
            if request.noisy:
                doc = self.world.docs[_pick(key, len(self.world.docs))]
                return f"Title: {doc.title}\nText: {doc.text}"
            return "Title: No result\nText: Nothing in this world matches the query."
        fact = facts[request.slot % len(facts)]
        obj = self.wrong_object(fact, key) if request.noisy else fact.object
        return f"Title: {fact.subject}\nText: {RELATIONS[fact.relation].passage_text(fact.subject, obj)}"
