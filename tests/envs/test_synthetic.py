"""Tests of the SyntheticFacts world generator (envs/synthetic.py)."""

from __future__ import annotations

import hashlib
import itertools
import os
import re
import subprocess
import sys

import pytest

from searchgym.envs import synthetic
from searchgym.envs.synthetic import CHAINS, RELATIONS, Fact, generate_world
from searchgym.error import InvalidArgumentError, UnknownNameError


@pytest.fixture(scope="module")
def world():
    return generate_world(0)


# --- determinism -----------------------------------------------------------------------


def test_same_arguments_give_equal_worlds():
    first = generate_world(3, num_questions=50)
    assert generate_world(3, num_questions=50) is first  # cached
    synthetic._cached_world.cache_clear()
    rebuilt = generate_world(3, num_questions=50)
    assert rebuilt is not first and rebuilt == first


_DIGEST = (
    "import hashlib; from searchgym.envs.synthetic import generate_world; "
    "print(hashlib.sha256(repr(generate_world(5)).encode()).hexdigest())"
)


def test_world_does_not_depend_on_the_process_hash_seed():
    digests = set()
    for hash_seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        out = subprocess.run(
            [sys.executable, "-c", _DIGEST], env=env, capture_output=True, text=True, check=True
        )
        digests.add(out.stdout.strip())
    assert digests == {hashlib.sha256(repr(generate_world(5)).encode()).hexdigest()}


def test_different_seeds_give_different_worlds_with_few_shared_names():
    worlds = [generate_world(seed) for seed in range(10)]
    names = [{e.name for e in w.entities} for w in worlds]
    for (i, a), (j, b) in itertools.combinations(enumerate(names), 2):
        assert worlds[i] != worlds[j]
        # Single-word city names are the likeliest to repeat: about 20 per world have two
        # syllables, drawn from 26*7*18*7*10 ~ 2.3e5 spellings (first onset, vowel, onset,
        # vowel, coda); even with uneven letter odds (say 5e4 effective) a pair of worlds
        # expects 20*20/5e4 ~ 0.01 shared names, so one shared name is already rare.
        assert len(a & b) <= 1, (i, j, sorted(a & b))


# --- sizes and the question mix ----------------------------------------------------------


def test_default_sizes(world):
    # 80 people x 2 + 40 cities + 10 countries + 40 companies x 3 = 330 facts.
    assert len(world.facts) == len(world.docs) == 330
    # Total = floor(min(330 / 0.7, 230 / 0.3)) = floor(min(471.4, 766.7)) = 471;
    # two-hop = round(0.3 * 471 = 141.3) = 141; one-hop = 471 - 141 = 330.
    assert len(world.questions) == 471
    assert sum(q.hops == 2 for q in world.questions) == 141
    assert sum(q.hops == 1 for q in world.questions) == 330


def test_all_two_hop_uses_every_chain():
    # founder->birthplace 40, founder->birth_year 40, headquarters->country 40,
    # birthplace->country 80, country->capital 40 - 10 (a capital's own country) = 30: 230.
    w = generate_world(0, two_hop_fraction=1.0)
    assert len(w.questions) == 230 and all(q.hops == 2 for q in w.questions)
    pairs = [(c[0].relation, c[1].relation) for c in w.chains]
    assert {p: pairs.count(p) for p in CHAINS} == {
        ("founder", "birthplace"): 40,
        ("founder", "birth_year"): 40,
        ("headquarters", "country"): 40,
        ("birthplace", "country"): 80,
        ("country", "capital"): 30,
    }


def test_num_questions_caps_the_total_and_keeps_the_mix():
    w = generate_world(0, num_questions=100)
    # two-hop = round(0.3 * 100) = 30, one-hop = 70.
    assert len(w.questions) == 100 and sum(q.hops == 2 for q in w.questions) == 30
    one_hop_only = generate_world(0, two_hop_fraction=0.0)
    assert len(one_hop_only.questions) == 330 and all(q.hops == 1 for q in one_hop_only.questions)
    # The mix does not touch the facts.
    assert w.facts == one_hop_only.facts == generate_world(0).facts


def test_ids_and_titles(world):
    assert [d.id for d in world.docs] == [f"sf0-p{n}" for n in range(330)]
    assert [q.id for q in world.questions] == [f"sf0-q{n}" for n in range(471)]
    assert all(d.title == f.subject for d, f in zip(world.docs, world.facts, strict=True))
    assert generate_world(12, num_questions=5).questions[4].id == "sf12-q4"


# --- entities and facts --------------------------------------------------------------------


def test_names_are_unique_letters_and_spaces(world):
    names = [e.name for e in world.entities]
    assert len(set(names)) == len(names) == 80 + 40 + 10 + 40
    assert all(re.fullmatch(r"[A-Z][a-z]+( [A-Z][a-z]+)?", n) for n in names)
    assert all(len(n.split()) == 2 for n in world.names("person") + world.names("company"))
    with pytest.raises(UnknownNameError, match="'citty'.*'city'"):
        world.names("citty")


def test_each_subject_relation_has_one_object(world):
    keys = [(f.subject, f.relation) for f in world.facts]
    assert len(set(keys)) == len(keys)
    for f in world.facts:
        rel = RELATIONS[f.relation]
        assert f.subject in world.names(rel.subject_kind)
        if rel.object_kind == "year":
            assert re.fullmatch(r"\d{4}", f.object)
        else:
            assert f.object in world.names(rel.object_kind)


def test_world_structure_is_coherent(world):
    for country in world.names("country"):
        capital = world.lookup(country, "capital").object
        assert world.lookup(capital, "country").object == country
    for company in world.names("company"):
        founder = world.lookup(company, "founder").object
        age = int(world.lookup(company, "founding_year").object) - int(
            world.lookup(founder, "birth_year").object
        )
        assert 20 <= age <= 60


# --- the known flag --------------------------------------------------------------------------


def test_known_flag_is_the_and_of_the_chain(world):
    for q, chain in zip(world.questions, world.chains, strict=True):
        assert q.known == all(f.known for f in chain)
    two_hop = [c for c in world.chains if len(c) == 2]
    mixed = [c for c in two_hop if c[0].known != c[1].known]
    assert mixed, "some two-hop chains must mix a known and an unknown fact"


def test_known_fraction_extremes_and_nesting():
    assert not any(f.known for f in generate_world(1, known_fraction=0.0).facts)
    assert all(q.known for q in generate_world(1, known_fraction=1.0).questions)
    low, high = generate_world(1, known_fraction=0.3), generate_world(1, known_fraction=0.7)
    assert [(f.subject, f.relation, f.object) for f in low.facts] == [
        (f.subject, f.relation, f.object) for f in high.facts
    ]
    assert all(h.known for lo, h in zip(low.facts, high.facts, strict=True) if lo.known)
    # Binomial(330, 0.5): mean 165, sd sqrt(330 / 4) ~ 9.1; 120..210 is about 5 sd.
    assert 120 <= sum(f.known for f in generate_world(1).facts) <= 210


# --- corpus, reading, lookup and chains --------------------------------------------------------


def test_every_answer_is_in_the_corpus(world):
    docs = {d.id: d for d in world.docs}
    for q, chain in zip(world.questions, world.chains, strict=True):
        assert q.golden_answers == (chain[-1].object,)
        for f in chain:
            text = docs[world.doc_id(f)].text
            assert f.subject in text and f.object in text
        if len(chain) == 2:
            assert chain[0].object == chain[1].subject


def test_read_recovers_the_object_of_every_passage(world):
    for f, d in zip(world.facts, world.docs, strict=True):
        rel = RELATIONS[f.relation]
        assert rel.read(d.text) == f.object
        assert rel.read(d.text, subject=f.subject) == f.object
        assert rel.read(f"Doc 2 (Title: {d.title}) {d.text} Doc 3 ...") == f.object


def test_read_rejects_other_passages_and_subjects():
    birthplace, birth_year = RELATIONS["birthplace"], RELATIONS["birth_year"]
    text = "Zorvan Kell was born in the city of Mirath."
    assert birthplace.read(text) == "Mirath"
    assert birthplace.read(text, subject="Ana Vel") is None
    assert birth_year.read(text) is None
    assert birthplace.read("Zorvan Kell was born in the year 1957.") is None
    assert birth_year.read("Zorvan Kell was born in the year 1957.") == "1957"
    assert RELATIONS["founder"].read("The founder of Velora Labs is Ana Vel.") == "Ana Vel"


def test_lookup_and_chain_agree_with_the_questions(world):
    for q in world.questions:
        chain = world.chain(q.id)
        assert len(chain) == q.hops
        assert all(world.lookup(f.subject, f.relation) == f for f in chain)
        assert chain[-1].object == q.golden_answers[0]
    assert world.lookup("Nobody Here", "birthplace") is None
    with pytest.raises(UnknownNameError, match="'birthplac'.*'birthplace'"):
        world.lookup("Nobody Here", "birthplac")
    with pytest.raises(UnknownNameError, match="'sf0-q9999'.*'sf0-q470'"):
        world.chain("sf0-q9999")
    with pytest.raises(InvalidArgumentError, match="not a fact"):
        world.doc_id(Fact("Nobody Here", "birthplace", "Nowhere", True))


def test_question_texts_are_unique_and_found(world):
    texts = [q.question for q in world.questions]
    assert len(set(texts)) == len(texts)
    for q in world.questions:
        assert world.question_by_text(q.question) is q
    q = world.questions[0]
    assert world.question_by_text("  " + q.question.upper().replace(" ", "   ")) is q
    assert world.question_by_text("Who founded Nothing Labs?") is None


def test_two_hop_question_wording():
    w = generate_world(0, two_hop_fraction=1.0)
    for q, (first, second) in zip(w.questions, w.chains, strict=True):
        phrase = RELATIONS[first.relation].phrase.format(s=first.subject)
        assert phrase in q.question
        assert first.object not in q.question and second.object not in q.question


# --- BM25 --------------------------------------------------------------------------------------


def _bm25(world):
    from searchgym.retrieval.bm25 import bm25s

    retriever = bm25s.BM25()
    corpus = [f"{d.title} {d.text}" for d in world.docs]
    retriever.index(bm25s.tokenize(corpus, stopwords="en", show_progress=False), show_progress=False)

    def search(queries, k=3):
        tokens = bm25s.tokenize(queries, stopwords="en", return_ids=False, show_progress=False)
        ids, _ = retriever.retrieve(tokens, k=k, show_progress=False)
        return [[world.docs[int(i)] for i in row] for row in ids]

    return search


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_relation_query_ranks_the_passage_in_the_top_3(seed):
    world = generate_world(seed)
    search = _bm25(world)
    results = search([RELATIONS[f.relation].query(f.subject) for f in world.facts])
    ranks = [
        [d.id for d in docs].index(world.doc_id(f)) if world.doc_id(f) in {d.id for d in docs} else None
        for f, docs in zip(world.facts, results, strict=True)
    ]
    top3 = sum(r is not None for r in ranks) / len(ranks)
    top1 = sum(r == 0 for r in ranks) / len(ranks)
    print(f"seed {seed}: top-1 rate {top1:.3f}, top-3 rate {top3:.3f} over {len(ranks)} facts")
    assert top3 >= 0.9
    # A subject owns up to three passages, so top-3 alone barely tests the relation words;
    # top-1 does (the bare subject as query puts the right passage first far less often).
    assert top1 >= 0.9


def test_oracle_walk_with_bm25_answers_the_questions(world):
    """Search each hop with Relation.query, read the object, and feed it to the next hop."""
    search = _bm25(world)
    correct = 0
    for q in world.questions:
        subject = world.chain(q.id)[0].subject
        for f in world.chain(q.id):
            rel = RELATIONS[f.relation]
            found = [rel.read(d.text, subject=subject) for d in search([rel.query(subject)])[0]]
            subject = next((x for x in found if x is not None), None)
            if subject is None:
                break
        correct += subject == q.golden_answers[0]
    assert correct / len(world.questions) >= 0.9


# --- argument validation -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"seed": -1}, "seed must be an int >= 0, got -1"),
        ({"seed": "0"}, "seed must be an int >= 0, got '0'"),
        ({"seed": True}, "seed must be an int >= 0, got True"),
        ({"num_people": 0}, r"num_people must be an int in \[1, 5000\], got 0"),
        ({"num_cities": 2.5}, r"num_cities must be an int in \[1, 5000\], got 2.5"),
        ({"num_companies": 5001}, r"num_companies must be an int in \[1, 5000\], got 5001"),
        ({"num_cities": 3, "num_countries": 4}, "num_cities=3 and num_countries=4"),
        ({"known_fraction": 1.5}, r"known_fraction must be a finite number in \[0, 1\], got 1.5"),
        ({"known_fraction": float("nan")}, "known_fraction .* got nan"),
        ({"two_hop_fraction": -0.1}, r"two_hop_fraction must be a finite number in \[0, 1\], got -0.1"),
        ({"two_hop_fraction": "0.3"}, "two_hop_fraction .* got '0.3'"),
        ({"num_questions": 0}, "num_questions must be an int >= 1 or None, got 0"),
        ({"num_questions": [5]}, r"num_questions .* got \[5\]"),
    ],
)
def test_argument_validation(kwargs, message):
    with pytest.raises(InvalidArgumentError, match=message):
        generate_world(**kwargs)


def test_smallest_world():
    # 1 person x 2 + 1 city + 1 country + 1 company x 3 = 7 facts; chains: founder->birthplace,
    # founder->birth_year, headquarters->country, birthplace->country = 4 (the only city is
    # the capital, so country->capital is circular). Total = floor(min(7 / 0.7, 4 / 0.3)) = 10.
    w = generate_world(0, num_people=1, num_cities=1, num_countries=1, num_companies=1)
    assert len(w.facts) == 7 and len(w.questions) == 10


def test_world_pickles_with_its_indexes(world):
    import pickle

    copy = pickle.loads(pickle.dumps(world))
    assert copy == world
    assert copy.chain("sf0-q7") == world.chain("sf0-q7")
    assert copy.question_by_text(world.questions[7].question) == world.questions[7]


def test_known_by_subject_flags_every_fact_of_an_entity_alike():
    world = generate_world(3, known_by="subject")
    by_subject: dict[str, set[bool]] = {}
    for fact in world.facts:
        by_subject.setdefault(fact.subject, set()).add(fact.known)
    assert all(len(flags) == 1 for flags in by_subject.values())
    known_subjects = sum(flags == {True} for flags in by_subject.values())
    assert 0.3 < known_subjects / len(by_subject) < 0.7
    # the facts and questions are the same as per-fact flags give; only the flags differ
    per_fact = generate_world(3)
    assert [(f.subject, f.relation, f.object) for f in world.facts] == [
        (f.subject, f.relation, f.object) for f in per_fact.facts
    ]
    assert [q.question for q in world.questions] == [q.question for q in per_fact.questions]
    assert [f.known for f in world.facts] != [f.known for f in per_fact.facts]


def test_known_by_rejects_unknown_names():
    with pytest.raises(InvalidArgumentError, match="known_by must be one of 'fact', 'subject', got 'entity'"):
        generate_world(0, known_by="entity")


# --- the study knobs: known two-hop questions, the held-out split by fact --------------------


def test_known_two_hop_false_keeps_two_hop_questions_out_of_the_known_split():
    default = generate_world(0)
    assert any(q.known and q.hops == 2 for q in default.questions)  # the default keeps them
    world = generate_world(0, known_two_hop=False)
    assert world.facts == default.facts  # the facts and their flags do not change
    two_hop = [(q, c) for q, c in zip(world.questions, world.chains, strict=True) if q.hops == 2]
    assert two_hop and all(not q.known and not all(f.known for f in chain) for q, chain in two_hop)
    assert any(q.known for q in world.questions)  # the known one-hop questions stay
    with pytest.raises(InvalidArgumentError, match="known_two_hop"):
        generate_world(0, known_two_hop="no")


def test_split_by_fact_shares_no_fact_between_train_and_eval():
    from searchgym.envs.synthetic_env import split_questions

    world = generate_world(0, known_two_hop=False)
    chains = dict(zip((q.id for q in world.questions), world.chains, strict=True))

    def facts_of(questions):
        return {fact for q in questions for fact in chains[q.id]}

    by_question = split_questions(world, "train"), split_questions(world, "eval")
    by_fact = (
        split_questions(world, "train", split_by="fact"),
        split_questions(world, "eval", split_by="fact"),
    )
    assert by_fact[1] == by_question[1]  # the same held-out questions
    assert facts_of(by_question[0]) & facts_of(by_question[1])  # a split by question leaks facts
    assert not facts_of(by_fact[0]) & facts_of(by_fact[1])
    assert set(by_fact[0]) < set(by_question[0]) and len(by_fact[0]) > len(world.questions) // 3
    with pytest.raises(InvalidArgumentError, match="split_by"):
        split_questions(world, "train", split_by="entity")
    from searchgym.envs.synthetic_env import SyntheticFactsEnv

    env = SyntheticFactsEnv(world_kwargs={"known_two_hop": False}, split="train", split_by="fact")
    assert env.questions == list(by_fact[0])
