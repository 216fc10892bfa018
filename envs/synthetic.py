"""SyntheticFacts: a seeded, generated world of people, cities, countries and companies.

The world is the data of the embedded default environment. It needs no files: a syllable
generator invents names, a seeded :class:`random.Random` wires them into facts, and each
fact becomes one passage and one or more questions. Every fact carries a ``known`` flag that
marks the "parametric" subset a policy could have memorised, so that a study of *when* to
search (SEM, docs/methods.md#sem) has questions that need no search (all facts known) and
questions that do.

Everything is a pure function of the arguments of :func:`generate_world`: the same
arguments give an equal world, and different seeds give worlds whose names rarely overlap
(shadow worlds for training a tokenizer or writing demonstrations on other seeds).
Independent sub-generators are used per stage (names, structure, known flags, questions),
so changing ``known_fraction`` keeps the facts and raising it only adds known facts, and
changing ``two_hop_fraction`` or ``num_questions`` keeps the facts and their flags.

``known_two_hop=False`` keeps every two-hop question out of the known split: a two-hop
question is drawn only from chains with at least one unknown fact, so "known" means a
single memorised fact, and answering it from memory needs no chaining.

``known_by`` sets what a flag is drawn for: each fact (default), or each subject, so that
all facts about an entity are known or none are, as a language model knows popular
entities and not obscure ones.
"""

from __future__ import annotations

import functools
import math
import random
import re
from dataclasses import dataclass, field
from types import MappingProxyType

from ..checks import check_choice, check_int, check_probability
from ..error import InvalidArgumentError, UnknownNameError, did_you_mean
from ..retrieval.records import Doc
from .records import Question
from .synthetic_names import MAX_COUNT, make_names

__all__ = [
    "Relation",
    "RELATIONS",
    "CHAINS",
    "KINDS",
    "Entity",
    "Fact",
    "SyntheticWorld",
    "generate_world",
    "two_hop_chains",
    "two_hop_question",
]

KINDS = ("person", "city", "country", "company")

# Regex of a name (or year) of each kind: people and companies are two capitalised words,
# places one; every generated name part is letters only.
_KIND_PATTERNS = {
    "person": r"[A-Z][a-z]+ [A-Z][a-z]+",
    "company": r"[A-Z][a-z]+ [A-Z][a-z]+",
    "city": r"[A-Z][a-z]+",
    "country": r"[A-Z][a-z]+",
    "year": r"\d{4}",
}


@dataclass(frozen=True)
class Relation:
    """One relation of the world, with the templates that put it into words.

    Attributes:
        name: Key in :data:`RELATIONS`.
        subject_kind: Kind of the subject ("person", "city", "country", "company").
        object_kind: Kind of the object (one of the above, or "year").
        passage: Passage template with ``{s}`` (subject) and ``{o}`` (object).
        questions: Question templates with ``{s}``; each must also read well when ``{s}`` is
            a noun phrase such as "the founder of Velora Systems" (two-hop questions).
        search: BM25 query template with ``{s}``: the subject plus the words only this
            relation's passage uses.
        phrase: Noun phrase for the object, with ``{s}`` ("the founder of {s}"), used as the
            subject of a second hop; empty when the object is a year.
    """

    name: str
    subject_kind: str
    object_kind: str
    passage: str
    questions: tuple[str, ...]
    search: str
    phrase: str = ""

    def passage_text(self, subject: str, obj: str) -> str:
        """The passage stating ``subject --relation--> obj``."""
        return self.passage.format(s=subject, o=obj)

    def question_text(self, subject: str, variant: int = 0) -> str:
        """Question ``variant`` (an index into :attr:`questions`) about ``subject``."""
        return self.questions[variant].format(s=subject)

    def query(self, subject: str) -> str:
        """A BM25 query that ranks this relation's passage about ``subject`` first."""
        return self.search.format(s=subject)

    def read(self, text: str, subject: str | None = None) -> str | None:
        """Extract the object from a passage written by :attr:`passage`.

        Args:
            text: A passage, or any text containing one (e.g. a rendered search result).
            subject: When given, only a passage about this subject counts.

        Returns:
            The object of the first matching passage, or None if ``text`` holds none.
        """
        if subject is None:
            pattern = _passage_pattern(self.passage, self.subject_kind, self.object_kind)
        else:
            pattern = re.compile(_pattern_source(self.passage, re.escape(subject), self.object_kind))
        match = pattern.search(text)
        return match.group("o") if match else None


def _pattern_source(template: str, subject_regex: str, object_kind: str) -> str:
    """Regex source for ``template``: named groups ``s`` and ``o``, back-references after."""
    parts, seen = [], set()
    regexes = {"s": subject_regex, "o": _KIND_PATTERNS[object_kind]}
    for piece in re.split(r"(\{[so]\})", template):
        key = piece[1:-1] if piece in ("{s}", "{o}") else None
        if key is None:
            parts.append(re.escape(piece))
        elif key in seen:
            parts.append(f"(?P={key})")
        else:
            seen.add(key)
            parts.append(rf"(?<![A-Za-z0-9])(?P<{key}>{regexes[key]})(?![A-Za-z0-9])")
    return "".join(parts)


@functools.cache
def _passage_pattern(template: str, subject_kind: str, object_kind: str) -> re.Pattern[str]:
    return re.compile(_pattern_source(template, _KIND_PATTERNS[subject_kind], object_kind))


# Each relation's passage holds one word that no other passage about the same subject
# holds ("city" vs "year", "founder" vs "founded", "capital"), and its query names it.
_RELATION_LIST = (
    Relation(
        "birthplace", "person", "city",
        passage="{s} was born in the city of {o}.",
        questions=("Where was {s} born?", "In which city was {s} born?"),
        search="{s} born city",
        phrase="the birthplace of {s}",
    ),
    Relation(
        "birth_year", "person", "year",
        passage="{s} was born in the year {o}.",
        questions=("In which year was {s} born?", "What is the birth year of {s}?"),
        search="{s} born year",
    ),
    Relation(
        "country", "city", "country",
        passage="The city of {s} lies in the country of {o}.",
        questions=("In which country is {s}?", "Which country is {s} located in?"),
        search="{s} city country",
        phrase="the country that {s} is in",
    ),
    Relation(
        "capital", "country", "city",
        passage="The capital of {s} is {o}.",
        questions=("What is the capital of {s}?", "Which city is the capital of {s}?"),
        search="{s} capital",
        phrase="the capital of {s}",
    ),
    Relation(
        "founder", "company", "person",
        passage="The founder of {s} is {o}.",
        questions=("Who founded {s}?", "Who is the founder of {s}?"),
        search="{s} founder",
        phrase="the founder of {s}",
    ),
    Relation(
        "founding_year", "company", "year",
        passage="{s} was founded in the year {o}.",
        questions=("In which year was {s} founded?", "When was {s} founded?"),
        search="{s} founded year",
    ),
    Relation(
        "headquarters", "company", "city",
        passage="{s} has its headquarters in the city of {o}.",
        questions=("Where is {s} headquartered?", "In which city is {s} headquartered?"),
        search="{s} headquarters city",
        phrase="the city where {s} has its headquarters",
    ),
)  # fmt: skip

RELATIONS: MappingProxyType[str, Relation] = MappingProxyType({r.name: r for r in _RELATION_LIST})
"""Every relation by name (read-only)."""

CHAINS: tuple[tuple[str, str], ...] = (
    ("founder", "birthplace"),
    ("founder", "birth_year"),
    ("headquarters", "country"),
    ("birthplace", "country"),
    ("country", "capital"),
)
"""Relation pairs composed into two-hop questions (first hop's object is the second's subject)."""


@dataclass(frozen=True)
class Entity:
    """A named thing of the world."""

    name: str
    kind: str


@dataclass(frozen=True)
class Fact:
    """One (subject, relation, object) triple; ``known`` marks the memorisable subset."""

    subject: str
    relation: str
    object: str
    known: bool


@dataclass(frozen=True)
class _Index:
    facts: dict[tuple[str, str], Fact]
    doc_ids: dict[Fact, str]
    chains: dict[str, tuple[Fact, ...]]
    by_text: dict[str, Question]


def _normalize_text(text: str) -> str:
    return " ".join(text.split()).casefold()


@dataclass(frozen=True)
class SyntheticWorld:
    """A generated world: entities, facts, one passage per fact, questions and their chains.

    Attributes:
        seed: Seed given to :func:`generate_world`.
        entities: Every named entity, grouped by kind in the order of ``KINDS``.
        facts: Every fact; ``docs[i]`` is the passage of ``facts[i]``.
        docs: The passage corpus (``Doc`` ids ``sf{seed}-p{n}``, title = the fact's subject).
        questions: The questions (ids ``sf{seed}-q{n}``, ``known`` and ``hops`` set).
        chains: ``chains[i]`` is the tuple of facts ``questions[i]`` chains, in hop order.
    """

    seed: int
    entities: tuple[Entity, ...]
    facts: tuple[Fact, ...]
    docs: tuple[Doc, ...]
    questions: tuple[Question, ...]
    chains: tuple[tuple[Fact, ...], ...]
    _index: _Index = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if len(self.facts) != len(self.docs) or len(self.questions) != len(self.chains):
            raise InvalidArgumentError(
                f"SyntheticWorld needs one doc per fact and one chain per question; got "
                f"{len(self.facts)} facts, {len(self.docs)} docs, {len(self.questions)} questions "
                f"and {len(self.chains)} chains. Build worlds with generate_world()."
            )
        index = _Index(
            facts={(f.subject, f.relation): f for f in self.facts},
            doc_ids={f: d.id for f, d in zip(self.facts, self.docs, strict=True)},
            chains={q.id: c for q, c in zip(self.questions, self.chains, strict=True)},
            by_text={_normalize_text(q.question): q for q in self.questions},
        )
        object.__setattr__(self, "_index", index)

    def names(self, kind: str) -> tuple[str, ...]:
        """Names of every entity of ``kind`` ("person", "city", "country" or "company")."""
        if kind not in KINDS:
            raise did_you_mean("entity kind", kind, KINDS)
        return tuple(e.name for e in self.entities if e.kind == kind)

    def lookup(self, subject: str, relation_name: str) -> Fact | None:
        """The fact ``subject --relation_name--> ?``, or None if the world has none."""
        if relation_name not in RELATIONS:
            raise did_you_mean("relation", relation_name, RELATIONS)
        return self._index.facts.get((subject, relation_name))

    def chain(self, question_id: str) -> list[Fact]:
        """The facts question ``question_id`` chains, in hop order."""
        try:
            return list(self._index.chains[question_id])
        except KeyError:
            raise UnknownNameError(
                f"Unknown question id {question_id!r} in the SyntheticFacts world of seed {self.seed}; "
                f"its ids run from 'sf{self.seed}-q0' to 'sf{self.seed}-q{len(self.questions) - 1}'."
            ) from None

    def question_by_text(self, text: str) -> Question | None:
        """The question whose text equals ``text`` (ignoring case and spacing), or None."""
        return self._index.by_text.get(_normalize_text(text))

    def doc_id(self, fact: Fact) -> str:
        """Id of the passage stating ``fact``."""
        try:
            return self._index.doc_ids[fact]
        except KeyError:
            raise InvalidArgumentError(
                f"Fact {fact!r} is not a fact of the world of seed {self.seed}."
            ) from None


# ---------------------------------------------------------------------------------------
# Facts and questions


def _make_triples(seed: int, names: dict[str, list[str]]) -> list[tuple[str, str, str]]:
    """(subject, relation, object) triples, ordered by relation then subject."""
    rng = random.Random(f"synthetic-facts/{seed}/structure")
    cities, countries = names["city"], names["country"]
    order = rng.sample(range(len(cities)), len(cities))
    capital = {countries[i]: cities[c] for i, c in enumerate(order[: len(countries)])}
    country_of = {cities[c]: countries[i] for i, c in enumerate(order[: len(countries)])}
    for c in order[len(countries) :]:
        country_of[cities[c]] = rng.choice(countries)
    born_in = {p: rng.choice(cities) for p in names["person"]}
    born_year = {p: rng.randint(1900, 1985) for p in names["person"]}
    founder = {c: rng.choice(names["person"]) for c in names["company"]}
    headquarters = {c: rng.choice(cities) for c in names["company"]}
    founded = {
        c: rng.randint(born_year[founder[c]] + 20, min(born_year[founder[c]] + 60, 2024)) for c in founder
    }
    tables = {
        "birthplace": born_in,
        "birth_year": {p: f"{y:04d}" for p, y in born_year.items()},
        "country": {c: country_of[c] for c in cities},
        "capital": capital,
        "founder": founder,
        "founding_year": {c: f"{y:04d}" for c, y in founded.items()},
        "headquarters": headquarters,
    }
    return [(s, rel, o) for rel in RELATIONS for s, o in tables[rel].items()]


def two_hop_chains(facts: tuple[Fact, ...]) -> list[tuple[Fact, Fact]]:
    """Every pair of ``facts`` that composes into a two-hop question (:data:`CHAINS`), in a
    fixed order; circular chains (the capital of X's country, X itself) are left out."""
    by_key = {(f.subject, f.relation): f for f in facts}
    chains = []
    for first_rel, second_rel in CHAINS:
        for f in facts:
            g = by_key.get((f.object, second_rel)) if f.relation == first_rel else None
            if g is not None and g.object != f.subject:
                chains.append((f, g))
    return chains


def two_hop_question(first: Fact, second: Fact, variant: int = 0) -> str:
    """Question ``variant`` of ``second``'s relation about ``first``'s object, named by
    ``first``'s phrase ("In which country is the birthplace of X?")."""
    subject_phrase = RELATIONS[first.relation].phrase.format(s=first.subject)
    return RELATIONS[second.relation].question_text(subject_phrase, variant)


def _question_mix(n_one: int, n_two: int, two_hop_fraction: float, cap: int | None) -> tuple[int, int]:
    """How many one-hop and two-hop questions to draw.

    The total is the largest one at which ``two_hop_fraction`` of it can be two-hop with the
    candidates available, capped by ``num_questions``; the two-hop count is rounded half up.
    """
    if two_hop_fraction == 0.0:
        total = n_one
    elif two_hop_fraction == 1.0:
        total = n_two
    else:
        total = math.floor(min(n_one / (1.0 - two_hop_fraction), n_two / two_hop_fraction))
    if cap is not None:
        total = min(total, cap)
    two = min(math.floor(two_hop_fraction * total + 0.5), n_two)
    return min(total - two, n_one), two


def _variant(rng: random.Random, relation: str) -> int:
    """A random question template index of ``relation``."""
    return rng.randrange(len(RELATIONS[relation].questions))


def _build_world(
    seed: int,
    counts: tuple[int, int, int, int],
    known_fraction: float,
    two_hop_fraction: float,
    cap: int | None,
    known_by: str = "fact",
    known_two_hop: bool = True,
) -> SyntheticWorld:
    names = make_names(seed, dict(zip(KINDS, counts, strict=True)))
    known_rng = random.Random(f"synthetic-facts/{seed}/known")
    triples = _make_triples(seed, names)
    if known_by == "subject":
        subject_known = {name: known_rng.random() < known_fraction for kind in KINDS for name in names[kind]}
        facts = tuple(Fact(s, rel, o, subject_known[s]) for s, rel, o in triples)
    else:
        facts = tuple(Fact(s, rel, o, known_rng.random() < known_fraction) for s, rel, o in triples)
    docs = tuple(
        Doc(
            id=f"sf{seed}-p{n}", title=f.subject, text=RELATIONS[f.relation].passage_text(f.subject, f.object)
        )
        for n, f in enumerate(facts)
    )
    rng = random.Random(f"synthetic-facts/{seed}/questions")
    one_hop = [
        (RELATIONS[f.relation].question_text(f.subject, _variant(rng, f.relation)), (f,)) for f in facts
    ]
    pairs = [(f, g) for f, g in two_hop_chains(facts) if known_two_hop or not (f.known and g.known)]
    two_hop = [(two_hop_question(f, g, _variant(rng, g.relation)), (f, g)) for f, g in pairs]
    n_one, n_two = _question_mix(len(one_hop), len(two_hop), two_hop_fraction, cap)
    picked = rng.sample(one_hop, n_one) + rng.sample(two_hop, n_two)
    rng.shuffle(picked)
    questions = tuple(
        Question(
            id=f"sf{seed}-q{n}",
            question=text,
            golden_answers=(chain[-1].object,),
            known=all(f.known for f in chain),
            hops=len(chain),
        )
        for n, (text, chain) in enumerate(picked)
    )
    entities = tuple(Entity(name, kind) for kind in KINDS for name in names[kind])
    return SyntheticWorld(seed, entities, facts, docs, questions, tuple(chain for _, chain in picked))


KNOWN_BY = ("fact", "subject")

_cached_world = functools.lru_cache(maxsize=32)(_build_world)


# ---------------------------------------------------------------------------------------
# Entry point


def generate_world(
    seed: int = 0,
    *,
    num_people: int = 80,
    num_cities: int = 40,
    num_countries: int = 10,
    num_companies: int = 40,
    known_fraction: float = 0.5,
    two_hop_fraction: float = 0.3,
    num_questions: int | None = None,
    known_by: str = "fact",
    known_two_hop: bool = True,
) -> SyntheticWorld:
    """Generate (or fetch from the cache) the SyntheticFacts world of ``seed``.

    The defaults give 330 facts (80 people x 2 + 40 cities + 10 countries + 40 companies x 3)
    and 471 questions (330 one-hop, 141 two-hop).

    Args:
        seed: Seed of every random choice (an int >= 0).
        num_people: People, each with a birthplace and a birth year.
        num_cities: Cities, each in one country; at least ``num_countries`` so that every
            country has a capital.
        num_countries: Countries, each with a capital among its cities.
        num_companies: Companies, each with a founder, a founding year and headquarters.
        known_fraction: Chance that a fact (or a subject, see ``known_by``) belongs to the
            known (memorisable) subset.
        known_by: ``"fact"`` (default): a flag drawn per fact, so one entity may have
            known and unknown facts. ``"subject"``: one flag per entity, shared by all its
            facts, as a language model knows popular entities and not obscure ones.
        two_hop_fraction: Share of two-hop questions among the questions.
        num_questions: Upper bound on the number of questions; None keeps the most the mix
            allows (every fact as a one-hop question when two-hop candidates suffice).
        known_two_hop: True (default): a two-hop question whose two facts are both known
            is in the known split, so answering it from memory needs the model to chain
            two recollections. False: such chains are not drawn, so every two-hop question
            is unknown (it has at least one unknown fact) and the known split holds
            one-hop questions only. The studies set it False, so that a known question is
            one a model can answer by recalling one fact.

    Returns:
        The world; equal arguments return the same cached, immutable object.

    Raises:
        InvalidArgumentError: An argument has the wrong type or is out of range.
    """
    seed = check_int("generate_world: seed", seed, 0)
    counts = tuple(
        check_int(f"generate_world: {name}", value, 1, MAX_COUNT)
        for name, value in (
            ("num_people", num_people),
            ("num_cities", num_cities),
            ("num_countries", num_countries),
            ("num_companies", num_companies),
        )
    )
    if num_cities < num_countries:
        raise InvalidArgumentError(
            f"generate_world: every country needs a capital city, so num_cities must be at least "
            f"num_countries; got num_cities={num_cities!r} and num_countries={num_countries!r}."
        )
    known = check_probability("generate_world: known_fraction", known_fraction)
    two_hop = check_probability("generate_world: two_hop_fraction", two_hop_fraction)
    cap = check_int("generate_world: num_questions", num_questions, 1, optional=True)
    check_choice("generate_world: known_by", known_by, KNOWN_BY)
    if not isinstance(known_two_hop, bool):
        raise InvalidArgumentError(
            f"generate_world: known_two_hop must be True or False; got {known_two_hop!r}."
        )
    return _cached_world(seed, counts, known, two_hop, cap, known_by, known_two_hop)
