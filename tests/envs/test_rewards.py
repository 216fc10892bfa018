"""Reward schemes: every expected value is worked out by hand in the comment beside it."""

from __future__ import annotations

import json
import math
import multiprocessing
import pickle
import sqlite3

import pytest

from searchgym.envs.records import Action, Question, Trajectory, Turn
from searchgym.envs.rewards import (
    REWARDS,
    CostReward,
    ExactMatchReward,
    F1Reward,
    LightSearcherReward,
    MinToolCallStore,
    OTCReward,
    OutcomeReward,
    RewardScheme,
    SEMReward,
    make_reward,
    otc_grpo_tool_rewards,
    register_reward,
    tsas_advantages,
    tsas_stage,
)
from searchgym.error import DataFileError, InvalidArgumentError, UnknownNameError

PARIS = Question(id="q1", question="Capital of France?", golden_answers=("Paris",))


# -- builders ---------------------------------------------------------------------------------


def search(
    query: str = "capital of france", answer: str | None = None, ok: bool = True, text: str = "s"
) -> Turn:
    action = Action(
        kind="search",
        query=query,
        answer=answer,
        format_ok=ok,
        think_blocks=1,
        answer_blocks=int(answer is not None),
    )
    return Turn(action_text=text, action=action)


def answer(
    text_answer: str | None, ok: bool = True, think: int = 1, answers: int = 1, text: str = "a"
) -> Turn:
    action = Action(
        kind="answer", answer=text_answer, format_ok=ok, think_blocks=think, answer_blocks=answers
    )
    return Turn(action_text=text, action=action)


def invalid(text: str = "?") -> Turn:
    return Turn(action_text=text, action=Action(kind="invalid", error="no tag", format_ok=False))


def traj(*turns: Turn, question: Question = PARIS, truncated: bool = False) -> Trajectory:
    return Trajectory(question=question, protocol="test", turns=list(turns), truncated=truncated)


# -- outcome ----------------------------------------------------------------------------------


def test_exact_match_reward():
    em = ExactMatchReward()
    # "The Paris." normalises to "paris" (article and dot dropped) = gold → 1.
    assert em(traj(search(), answer("The Paris."))) == 1.0
    # "Paris France" ≠ "paris" → 0.
    assert em(traj(answer("Paris France"))) == 0.0
    # Truncated on a search: no answer → 0.
    assert em(traj(search(), search(), truncated=True)) == 0.0


def test_f1_reward():
    f1 = F1Reward()
    # pred [paris, france] vs gold [paris]: overlap 1, P = 1/2, R = 1, F1 = 2·0.5·1/1.5 = 2/3.
    assert f1(traj(answer("Paris France"))) == pytest.approx(2 / 3)
    assert f1(traj(answer("Paris"))) == 1.0
    assert f1(traj(search(), truncated=True)) == 0.0


def test_outcome_format_penalty():
    malformed = traj(invalid(), answer("Paris"))
    # Off by default: the answer is scored as usual.
    assert ExactMatchReward()(malformed) == 1.0
    assert F1Reward()(malformed) == 1.0
    # Set: malformed → the penalty; well formed → unchanged.
    assert ExactMatchReward(format_penalty=-0.5)(malformed) == -0.5
    assert F1Reward(format_penalty=-1)(malformed) == -1.0
    assert F1Reward(format_penalty=-1)(traj(answer("Paris"))) == 1.0
    with pytest.raises(InvalidArgumentError, match="format_penalty"):
        F1Reward(format_penalty="high")


def test_format_credit_ranks_malformed_trajectories_by_their_well_formed_turns():
    f1 = F1Reward(format_penalty=-1, format_credit=0.5)
    # no well-formed turn: -1 + 0.5·0/2 = -1.
    assert f1(traj(invalid(), invalid())) == -1.0
    # 1 of 2 turns well formed: -1 + 0.5·1/2 = -0.75; 2 of 3: -1 + 0.5·2/3 = -2/3.
    assert f1(traj(invalid(), search(), truncated=True)) == pytest.approx(-0.75)
    assert f1(traj(invalid(), search(), answer("Paris"))) == pytest.approx(-2 / 3)
    # well formed: F1 as usual, so a wrong well-formed answer (0) beats every malformed one.
    assert f1(traj(search(), answer("Lyon"))) == 0.0
    assert f1(traj(search(), answer("Paris"))) == 1.0
    # EM takes the same shaping: -0.5 + 0.25·1/2 = -0.375.
    assert ExactMatchReward(format_penalty=-0.5, format_credit=0.25)(traj(invalid(), search())) == -0.375
    # the default (0) is the plain penalty
    assert F1Reward(format_penalty=-1)(traj(invalid(), search())) == -1.0
    assert make_reward("f1", format_penalty=-1, format_credit=1.0)(traj(search(), invalid())) == -0.5


def test_em_and_f1_are_one_outcome_reward_that_differs_only_in_its_metric():
    # by hand: "Paris France" vs gold "Paris": EM 0, F1 2/3 (P 1/2, R 1); malformed with a
    # penalty of -1 and credit 0.5, 1 of 2 turns well formed: -1 + 0.5·1/2 = -0.75 under both.
    wrong, malformed = traj(answer("Paris France")), traj(invalid(), answer("Paris"))
    em, f1 = (
        make_reward("em", format_penalty=-1, format_credit=0.5),
        make_reward("f1", format_penalty=-1, format_credit=0.5),
    )
    assert isinstance(em, OutcomeReward) and isinstance(f1, OutcomeReward)
    assert (em.outcome, f1.outcome) == ("em", "f1")
    assert (em(wrong), f1(wrong)) == (0.0, pytest.approx(2 / 3))
    assert em(malformed) == f1(malformed) == -0.75
    assert repr(f1) == "F1Reward(format_penalty=-1.0, format_credit=0.5)"
    with pytest.raises(InvalidArgumentError, match="does not accept outcome"):
        make_reward("em", outcome="f1")  # the metric is the scheme's, not a keyword


def test_an_outcome_reward_subclass_names_a_known_metric():
    class Recall(OutcomeReward):
        name = "recall"
        outcome = "recall"

    with pytest.raises(InvalidArgumentError, match="outcome must be one of 'em', 'f1', got 'recall'"):
        Recall()
    with pytest.raises(InvalidArgumentError, match="got ''"):
        OutcomeReward()  # the base class has no metric of its own


@pytest.mark.parametrize(
    "kwargs",
    [
        {"format_credit": 0.5},
        {"format_penalty": -1, "format_credit": 1.5},
        {"format_penalty": -1, "format_credit": -0.1},
    ],
)
def test_format_credit_that_could_beat_a_well_formed_trajectory_is_refused(kwargs):
    with pytest.raises(InvalidArgumentError, match="format_credit"):
        F1Reward(**kwargs)


# -- OTC --------------------------------------------------------------------------------------


def test_otc_ppo_form():
    otc = OTCReward()  # outcome em, c = 1
    # m = 0: cos(0) = 1; correct → 1.
    assert otc(traj(answer("Paris"))) == pytest.approx(1.0)
    # m = 1: cos(π/(2+1)) = cos(π/3) = 0.5.
    assert otc(traj(search(), answer("Paris"))) == pytest.approx(0.5)
    # m = 2: cos(2π/5) = 0.30902.
    assert otc(traj(search(), search(), answer("Paris"))) == pytest.approx(0.30902, abs=1e-5)
    # Wrong answer: EM = 0 → 0 whatever m.
    assert otc(traj(search(), answer("Lyon"))) == 0.0
    # c = 2, m = 1: cos(π/4) = 0.70711.
    assert OTCReward(c=2)(traj(search(), answer("Paris"))) == pytest.approx(0.70711, abs=1e-5)
    # outcome f1: F1 = 2/3, m = 1 → 2/3 · 0.5 = 1/3.
    assert OTCReward(outcome="f1")(traj(search(), answer("Paris France"))) == pytest.approx(1 / 3)
    # format penalty
    assert OTCReward(format_penalty=-1)(traj(invalid(), answer("Paris"))) == -1.0


def test_otc_grpo_form():
    # n = fewest searches among correct = min(3, 1, 4) = 1.
    # m=3: f = 2·1·3/4 = 1.5, sin(1.5π/2) = sin(3π/4) = 0.70711
    # m=1: f = 1, sin(π/2) = 1
    # m=2: f = 4/3, sin(2π/3) = 0.86603
    # m=0: f = 0, sin(0) = 0
    # m=4: f = 8/5, sin(0.8π) = 0.58779
    got = otc_grpo_tool_rewards([3, 1, 2, 0, 4], [True, True, False, False, True])
    assert got == pytest.approx([0.70711, 1.0, 0.86603, 0.0, 0.58779], abs=1e-5)
    # n = 0: m = 0 → 1 (f = n = 0); m = 2 → cos(2π/5) = 0.30902; m = 1 → cos(π/3) = 0.5.
    assert otc_grpo_tool_rewards([0, 2, 1], [True, True, False]) == pytest.approx(
        [1.0, 0.30902, 0.5], abs=1e-5
    )
    # No correct rollout: the PPO form, cos(π/3) = 0.5 and 1.
    assert otc_grpo_tool_rewards([1, 0], [False, False]) == pytest.approx([0.5, 1.0])


@pytest.mark.parametrize(
    "searches, correct, c",
    [
        ([1, 2], [True], 1.0),
        ([], [], 1.0),
        ([-1], [True], 1.0),
        ([True], [True], 1.0),
        ([1.5], [True], 1.0),
        ([1], [1], 1.0),
        ([1], [True], 0.0),
    ],
)
def test_otc_grpo_rejects_bad_input(searches, correct, c):
    with pytest.raises(InvalidArgumentError):
        otc_grpo_tool_rewards(searches, correct, c=c)


def test_otc_rejects_bad_kwargs():
    with pytest.raises(InvalidArgumentError, match="outcome"):
        OTCReward(outcome="acc")
    with pytest.raises(InvalidArgumentError, match="c must be"):
        OTCReward(c=-1)


# -- LightSearcher ----------------------------------------------------------------------------


def test_lightsearcher_hand_example():
    store = MinToolCallStore()
    store.update("q1", 1)
    scheme = LightSearcherReward(store=store)
    # m = 3, n = 1, F1 = 1: Tool = exp(-0.75·2) = 0.22313; R = 0.5·1 + 0.5·0.22313 = 0.61157.
    assert scheme(traj(search(), search(), search(), answer("Paris"))) == pytest.approx(0.61157, abs=1e-5)


def test_lightsearcher_store_sequence():
    scheme = LightSearcherReward()
    store = scheme.store
    three = traj(search(), search(), search(), answer("Paris"))
    one = traj(search(), answer("Paris"))
    # 1st: no n yet → n = m = 3, Tool = 1, R = 0.5 + 0.5 = 1; then n = 3.
    assert scheme(three) == pytest.approx(1.0)
    assert store.get("q1") == 3
    # 2nd: m = 1 < n = 3 → max(0, -2) = 0, Tool = 1, R = 1; n ← min(3, 1) = 1.
    assert scheme(one) == pytest.approx(1.0)
    assert store.get("q1") == 1
    # 3rd: m = 3, n = 1 → exp(-1.5) = 0.22313, R = 0.61157; n stays 1.
    assert scheme(three) == pytest.approx(0.61157, abs=1e-5)
    assert store.get("q1") == 1
    # Wrong answer with m = 0: F1 = 0 < 0.8 → Tool = 0, R = 0; n unchanged.
    assert scheme(traj(answer("Lyon"))) == 0.0
    # Partial answer, m = 0: F1 = 2/3 < 0.8 → R = 0.5·2/3 = 1/3; n unchanged.
    assert scheme(traj(answer("Paris France"))) == pytest.approx(1 / 3)
    # Malformed with a right answer and m = 0 → R = -1; n unchanged.
    assert scheme(traj(invalid(), answer("Paris"))) == -1.0
    # Truncated on a search: F1 = 0 → R = 0; n unchanged.
    assert scheme(traj(search(), truncated=True)) == 0.0
    assert store.get("q1") == 1
    assert len(store) == 1
    # Another question keeps its own n: first time, m = 2 → n = 2, R = 1.
    other = Question(id="q2", question="?", golden_answers=("Rome",))
    assert scheme(traj(search(), search(), answer("Rome"), question=other)) == pytest.approx(1.0)
    assert store.get("q2") == 2 and store.get("q1") == 1 and len(store) == 2


def test_lightsearcher_threshold_is_inclusive():
    # pred [x, y, z] vs gold [x, y]: P = 2/3, R = 1, F1 = (4/3)/(5/3) = 0.8 = θ_t → counts.
    q = Question(id="qx", question="?", golden_answers=("x y",))
    store = MinToolCallStore()
    store.update("qx", 0)
    # m = 2, n = 0: Tool = exp(-1.5) = 0.22313; R = 0.5·0.8 + 0.5·0.22313 = 0.51157.
    got = LightSearcherReward(store=store)(traj(search(), search(), answer("x y z"), question=q))
    assert got == pytest.approx(0.51157, abs=1e-5)


def test_lightsearcher_custom_weights():
    store = MinToolCallStore()
    store.update("q1", 0)
    scheme = LightSearcherReward(lam=1.0, theta_t=0.5, w_alpha=0.7, w_beta=0.3, store=store)
    # F1 = 2/3 >= 0.5, m = 1, n = 0: Tool = e^-1 = 0.36788; R = 0.7·2/3 + 0.3·0.36788 = 0.57703.
    assert scheme(traj(search(), answer("Paris France"))) == pytest.approx(0.57703, abs=1e-5)


def test_lightsearcher_rejects_bad_kwargs():
    with pytest.raises(InvalidArgumentError, match="theta_t"):
        LightSearcherReward(theta_t=1.5)
    with pytest.raises(InvalidArgumentError, match="lam"):
        LightSearcherReward(lam=-0.1)
    with pytest.raises(InvalidArgumentError, match="store"):
        LightSearcherReward(store={"q1": 1})


# -- MinToolCallStore -------------------------------------------------------------------------


def test_store_in_memory_keeps_min():
    store = MinToolCallStore()
    assert store.get("a") is None and len(store) == 0
    store.update("a", 3)
    store.update("a", 5)  # larger: ignored
    assert store.get("a") == 3
    store.update("a", 1)
    assert store.get("a") == 1 and len(store) == 1
    for bad in (-1, True, 1.0):
        with pytest.raises(InvalidArgumentError):
            store.update("a", bad)
    with pytest.raises(InvalidArgumentError):
        store.update(7, 1)


def _stored_rows(path) -> list[dict]:
    """The store's records in order, read with SQLite itself."""
    conn = sqlite3.connect(path)
    try:
        return [json.loads(body) for (body,) in conn.execute("SELECT body FROM records ORDER BY id")]
    finally:
        conn.close()


def test_store_persists_across_reload(tmp_path):
    path = tmp_path / "sub" / "mins.sqlite"
    store = MinToolCallStore(path)
    store.update("q1", 3)
    store.update("q1", 4)  # not lower: no record
    store.update("q1", 1)
    store.update("q2", 2)
    store.close()
    assert _stored_rows(path) == [{"id": "q1", "n": 3}, {"id": "q1", "n": 1}, {"id": "q2", "n": 2}]
    again = MinToolCallStore(str(path))
    assert again.get("q1") == 1 and again.get("q2") == 2 and len(again) == 2
    assert again.skipped_lines == 0


def test_store_imports_an_old_file_skipping_torn_and_corrupt_lines(tmp_path):
    path = tmp_path / "mins.jsonl"
    old = (
        b'{"id": "q1", "n": 2}\n'
        b"not json\n"
        b'{"id": 5, "n": 1}\n'  # id not a str
        b'{"id": "q4", "n": -1}\n'  # negative
        b'{"id": "q4", "n": true}\n'  # bool
        b"[1, 2]\n"  # not an object
        b"\xff\xfe\n"  # not UTF-8
        b"\n"  # blank: ignored, not counted
        b'{"id": "q1", "n": 1}\n'
        b'{"id": "q3", "n'  # torn last line
    )
    path.write_bytes(old)
    store = MinToolCallStore(path)
    assert store.get("q1") == 1 and store.get("q3") is None and store.get("q4") is None
    assert len(store) == 1 and store.skipped_lines == 0  # what does not read stays out of the database
    conn = sqlite3.connect(path)
    reasons = [r for (r,) in conn.execute("SELECT reason FROM rejected ORDER BY rowid")]
    conn.close()
    assert len(reasons) == 7 and "unfinished last line" in reasons[-1]  # 6 corrupt lines and the torn one
    store.update("q3", 4)
    store.close()
    again = MinToolCallStore(path)
    assert again.get("q3") == 4 and again.get("q1") == 1
    assert (tmp_path / "mins.jsonl.imported").read_bytes() == old


def test_a_corrupt_record_is_skipped_and_the_store_goes_on(tmp_path):
    path = tmp_path / "mins.sqlite"
    writer = MinToolCallStore(path)  # keeps its connection open, as a long-lived env worker does
    writer.update("q0", 5)
    conn = sqlite3.connect(path)
    with conn:  # a record no reader can use, written past the store's checks
        conn.execute("INSERT INTO records (body) VALUES (?)", ('{"id": "dead", "n',))
    conn.close()
    for i in range(1, 11):
        writer.update(f"q{i}", i)
    fresh = MinToolCallStore(path)
    assert fresh.minima() == {f"q{i}": (5 if i == 0 else i) for i in range(11)}
    assert fresh.skipped_lines == 1


def test_store_follow_and_refresh(tmp_path):
    path = tmp_path / "mins.sqlite"
    writer = MinToolCallStore(path)
    follower = MinToolCallStore(path)
    still = MinToolCallStore(path, follow=False)
    writer.update("q1", 2)
    assert follower.get("q1") == 2  # read on get
    assert still.get("q1") is None  # only on refresh
    still.refresh()
    assert still.get("q1") == 2
    # The follower's own lower value wins and is logged.
    follower.update("q1", 1)
    assert writer.get("q1") == 1


def test_store_rejects_folder(tmp_path):
    with pytest.raises(DataFileError, match="folder"):
        MinToolCallStore(tmp_path)


def test_store_pickles(tmp_path):
    path = tmp_path / "mins.sqlite"
    store = MinToolCallStore(path)
    store.update("q1", 2)
    clone = pickle.loads(pickle.dumps(store))
    assert clone.get("q1") == 2 and clone.path == str(path)
    clone.update("q2", 0)  # opens its own connection
    clone.close()
    store.close()
    assert MinToolCallStore(path).get("q2") == 0
    memory = pickle.loads(pickle.dumps(MinToolCallStore()))
    memory.update("a", 1)
    assert memory.get("a") == 1


def _append_many(path: str, n: int) -> None:
    store = MinToolCallStore(path)
    for i in range(200):
        store.update(f"q{i}", n)
    store.close()


def test_store_two_processes_append(tmp_path):
    path = str(tmp_path / "shared.sqlite")
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_append_many, args=(path, n)) for n in (5, 3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    rows = _stored_rows(path)
    # Each process stores a record per id unless it already sees a value <= its own (reading
    # and lowering is one transaction), so 200 to 400 records; min is 3.
    assert 200 <= len(rows) <= 400
    assert all(r["n"] in (3, 5) for r in rows)
    assert {r["id"] for r in rows if r["n"] == 3} == {f"q{i}" for i in range(200)}
    merged = MinToolCallStore(path)
    assert merged.skipped_lines == 0 and len(merged) == 200
    assert all(merged.get(f"q{i}") == 3 for i in range(200))


# -- SEM --------------------------------------------------------------------------------------


def test_sem_branches():
    sem = SEMReward()  # τ = 0.8
    # Confident and right, no search, one think/answer pair: R = F1(a1) = 1.
    assert sem(traj(answer("Paris"))) == 1.0
    # Same but two think blocks (t = 0): 0.
    assert sem(traj(answer("Paris", think=2))) == 0.0
    # ... or two answer blocks (t = 0): 0.
    assert sem(traj(answer("Paris", answers=2))) == 0.0
    # a1 right but it searched anyway (s = 1): 0, even with a right a2.
    assert sem(traj(search(answer="Paris"), answer("Paris"))) == 0.0
    # a1 wrong, one search, then a right a2 (u = 1): R = F1(a2) = 1.
    assert sem(traj(search(answer="Lyon"), answer("Paris"))) == 1.0
    # a1 wrong, one search, partial a2: F1 = 2/3.
    assert sem(traj(search(answer="Lyon"), answer("Paris France"))) == pytest.approx(2 / 3)
    # a1 wrong and it did not search (u = 0): 0.
    assert sem(traj(answer("Lyon"))) == 0.0
    # a1 partial below τ (F1 = 2/3 < 0.8), no search: 0.
    assert sem(traj(answer("Paris France"))) == 0.0
    # a1 wrong, two searches then a right answer: docs/methods.md#sem-protocol allows several searches, u = 1 → 1.
    assert sem(traj(search(answer="Lyon"), search(), answer("Paris"))) == 1.0
    # ... three searches, partial a2: F1(a2) = 2/3.
    assert sem(traj(search(answer="Lyon"), search(), search(), answer("Paris France"))) == pytest.approx(
        2 / 3
    )
    # a1 right, then two searches (s = 1): 0.
    assert sem(traj(search(answer="Paris"), search(), answer("Paris"))) == 0.0
    # A malformed search between the first and the final answer (f = 0, u = 0): 0.
    assert sem(traj(search(answer="Lyon"), search(ok=False), answer("Paris"))) == 0.0
    # An invalid turn between the searches and the answer: 0.
    assert sem(traj(search(answer="Lyon"), invalid(), answer("Paris"))) == 0.0
    # Malformed second turn (f = 0): 0.
    assert sem(traj(search(answer="Lyon"), answer("Paris", ok=False))) == 0.0
    # Truncated after the search: no final answer (f = 0) → 0.
    assert sem(traj(search(answer="Lyon"), truncated=True)) == 0.0
    assert sem(traj()) == 0.0


def test_sem_partial_first_answer_above_tau():
    q = Question(id="q5", question="?", golden_answers=("one two three four five",))
    # pred 4 of 5 tokens: P = 1, R = 0.8, F1 = 1.6/1.8 = 0.88889 >= 0.8 → R = 0.88889.
    assert SEMReward()(traj(answer("one two three four"), question=q)) == pytest.approx(0.88889, abs=1e-5)
    # τ = 0.9: F1(a1) < τ and no search → 0.
    assert SEMReward(tau=0.9)(traj(answer("one two three four"), question=q)) == 0.0
    with pytest.raises(InvalidArgumentError, match="tau"):
        SEMReward(tau=2)


# -- cost -------------------------------------------------------------------------------------


def test_cost_gates():
    right2 = traj(search(), search(), answer("Paris"))  # F1 = 1, m = 2
    wrong2 = traj(search(), search(), answer("Lyon"))  # F1 = 0, m = 2
    partial2 = traj(search(), search(), answer("Paris France"))  # F1 = 2/3, m = 2
    # none: always pay. R = 1 - 0.1·2 = 0.8; wrong: 0 - 0.2 = -0.2.
    none = CostReward(gate="none")
    assert none(right2) == pytest.approx(0.8)
    assert none(wrong2) == pytest.approx(-0.2)
    # hard: pay only when F1 >= 0.8. 0.8; wrong → 0; partial (2/3 < 0.8) → 2/3.
    hard = CostReward()
    assert hard(right2) == pytest.approx(0.8)
    assert hard(wrong2) == 0.0
    assert hard(partial2) == pytest.approx(2 / 3)
    # soft: g = sigmoid((F1 - 0.8)/0.1).
    # F1 = 1: sigmoid(2) = 0.880797, R = 1 - 0.1·0.880797·2 = 0.823841.
    # F1 = 2/3: sigmoid(-1.33333) = 1/(1 + e^1.33333) = 0.208609, R = 0.666667 - 0.1·0.208609·2 = 0.624945.
    soft = CostReward(gate="soft")
    assert soft(right2) == pytest.approx(0.823841, abs=1e-6)
    assert soft(partial2) == pytest.approx(0.624945, abs=1e-6)


def test_cost_chars_and_format():
    # Three turns of 500 characters: 1,500 chars. C = 1·2 + 0.2·1.5 = 2.3; R = 1 - 0.1·2.3 = 0.77.
    long = traj(search(text="x" * 500), search(text="y" * 500), answer("Paris", text="z" * 500))
    assert CostReward(price_per_kchar=0.2, gate="none")(long) == pytest.approx(0.77)
    # price_per_search 0, only characters: C = 0.3, λ = 1 → R = 0.7.
    assert CostReward(lam=1, price_per_search=0, price_per_kchar=0.2)(long) == pytest.approx(0.7)
    malformed = traj(invalid(), answer("Paris"))
    assert CostReward()(malformed) == -1.0
    # Penalty off: F1 = 1, m = 0 → 1.
    assert CostReward(format_penalty=None)(malformed) == 1.0
    # outcome em: "Paris France" has EM 0 → hard gate closed → 0.
    assert CostReward(outcome="em")(traj(search(), answer("Paris France"))) == 0.0


def test_cost_rejects_bad_kwargs():
    with pytest.raises(UnknownNameError, match="Did you mean 'hard'"):
        CostReward(gate="hrad")
    with pytest.raises(InvalidArgumentError, match="gate"):
        CostReward(gate=3)
    with pytest.raises(InvalidArgumentError, match="temperature"):
        CostReward(temperature=0)
    with pytest.raises(InvalidArgumentError, match="lam"):
        CostReward(lam=-1)
    with pytest.raises(InvalidArgumentError, match="lam"):
        CostReward(lam=math.inf)


# -- TSAS -------------------------------------------------------------------------------------

# Group: R = [1, 0, 0.5], S = [1, 0, 3], T = [2, 1, 0], α = 0.01. mean R = 0.5, so
# R - mean = [0.5, -0.5, 0].


def test_tsas_stage_one():
    # A1 = 0.5 + ln 2 + 0.01·ln 3 = 0.5 + 0.693147 + 0.010986 = 1.204133
    # A2 = -0.5 + ln 1 + 0.01·ln 2 = -0.5 + 0 + 0.006931 = -0.493069
    # A3 = 0 + ln 4 + 0.01·ln 1 = 1.386294
    got = tsas_advantages([1, 0, 0.5], [1, 0, 3], [2, 1, 0], stage=1)
    assert got == pytest.approx([1.204133, -0.493069, 1.386294], abs=1e-6)


def test_tsas_stage_two():
    # std(S): mean 4/3, squared deviations 1/9, 16/9, 25/9 → mean 14/9 = 1.555556, std = 1.247219.
    # i=1: σ = sigmoid(0.5) - 0.5 = 0.622459 - 0.5 = 0.122459;
    #      S+ = ln 2 - 1.247219 = -0.554072; T+ = ln 3 = 1.098612;
    #      A = 0.5 + 0.122459·(-0.554072 + 1.098612) = 0.5 + 0.066684 = 0.566684
    # i=2: σ = sigmoid(-0.5) - 0.5 = -0.122459; S+ = 0 - 1.247219; T+ = ln 2 = 0.693147;
    #      A = -0.5 + (-0.122459)·(-0.554072) = -0.5 + 0.067851 = -0.432149
    # i=3: σ = sigmoid(0) - 0.5 = 0 → A = 0.
    got = tsas_advantages([1, 0, 0.5], [1, 0, 3], [2, 1, 0], stage=2)
    assert got == pytest.approx([0.566684, -0.432149, 0.0], abs=1e-6)
    # α only enters stage 1.
    assert tsas_advantages([1, 0, 0.5], [1, 0, 3], [2, 1, 0], stage=2, alpha=5.0) == pytest.approx(got)


def test_tsas_eq2_variant_stage_two():
    # docs/methods.md#light-search-readings, Eq. 2 variant: σ+ = max(0, sigmoid(A+) - 0.5); A = A+ - σ+·(S+ + T+).
    # Same group as above. i=1: σ+ = 0.122459, S+ + T+ = -0.554072 + 1.098612 = 0.544540,
    #      A = 0.5 - 0.066684 = 0.433316.
    # i=2: σ+ = max(0, -0.122459) = 0 → A = A+ = -0.5.   i=3: σ+ = 0 → 0.
    got = tsas_advantages([1, 0, 0.5], [1, 0, 3], [2, 1, 0], stage=2, variant="eq2")
    assert got == pytest.approx([0.433316, -0.5, 0.0], abs=1e-6)
    # Stage 1 is the same in both readings.
    assert tsas_advantages([1, 0, 0.5], [1, 0, 3], [2, 1, 0], stage=1, variant="eq2") == pytest.approx(
        [1.204133, -0.493069, 1.386294], abs=1e-6
    )


def test_tsas_readings_disagree_on_a_right_search_against_a_right_direct_answer():
    # R = [1, 1, 0], S = [0, 1, 1], T = [1, 1, 1]: A+ = [1/3, 1/3, -2/3], std(S) = 0.471405,
    # σ(1/3) - 0.5 = 0.082570, S+ = [-0.471405, 0.221742, 0.221742], T+ = ln 2 = 0.693147.
    # Eq. 4: A1 = 1/3 + 0.082570·0.221742 = 0.351643; A2 = 1/3 + 0.082570·0.914889 = 0.408876;
    #        A3 = -2/3 + (0.339244 - 0.5)·0.914889 = -0.813741 → the search outranks.
    # Eq. 2: A1 = 1/3 - 0.018309 = 0.315024; A2 = 1/3 - 0.075543 = 0.257791; A3 = -2/3
    #        → the direct answer outranks.
    eq4 = tsas_advantages([1, 1, 0], [0, 1, 1], [1, 1, 1], stage=2)
    eq2 = tsas_advantages([1, 1, 0], [0, 1, 1], [1, 1, 1], stage=2, variant="eq2")
    assert eq4 == pytest.approx([0.351643, 0.408876, -0.813741], abs=1e-6)
    assert eq2 == pytest.approx([0.315024, 0.257791, -0.666667], abs=1e-6)
    with pytest.raises(InvalidArgumentError, match="variant"):
        tsas_advantages([1], [0], [0], stage=2, variant="eq3")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "rewards, searches, reasoning, stage",
    [
        ([], [], [], 1),
        ([1, 0], [1], [1, 1], 1),
        ([1], [-1], [0], 1),
        ([1], [0], [-2], 2),
        ([math.nan], [0], [0], 1),
        ([1], [math.inf], [0], 1),
        (["1"], [0], [0], 1),
        ([1], [0], [0], 3),
        ([1], [0], [0], True),
        ([1], [0], [0], 1.0),
    ],
)
def test_tsas_rejects_bad_input(rewards, searches, reasoning, stage):
    with pytest.raises(InvalidArgumentError):
        tsas_advantages(rewards, searches, reasoning, stage)


def test_tsas_stage_helper():
    # M1 = 150: steps 0..149 are stage 1, 150 onwards stage 2.
    assert tsas_stage(0) == 1 and tsas_stage(149) == 1 and tsas_stage(150) == 2
    assert tsas_stage(5, warmup_steps=5) == 2
    with pytest.raises(InvalidArgumentError):
        tsas_stage(-1)


# -- registry and pickling --------------------------------------------------------------------


def test_registry_names():
    assert set(REWARDS) == {"em", "f1", "otc", "lightsearcher", "sem", "cost"}
    for name, cls in REWARDS.items():
        assert cls.name == name and isinstance(make_reward(name), cls)


@pytest.mark.parametrize(
    "scheme",
    [
        ExactMatchReward(format_penalty=-1),
        F1Reward(),
        OTCReward(c=2, outcome="f1"),
        LightSearcherReward(lam=0.5),
        SEMReward(tau=0.7),
        CostReward(gate="soft", price_per_kchar=0.1),
    ],
    ids=lambda s: s.name,
)
def test_schemes_pickle(scheme):
    clone = pickle.loads(pickle.dumps(scheme))
    assert type(clone) is type(scheme)
    assert repr(clone) == repr(scheme)
    sample = traj(search(answer="Lyon"), answer("Paris France"))
    assert clone(sample) == scheme(sample)


def test_lightsearcher_pickles_with_file_store(tmp_path):
    path = tmp_path / "mins.sqlite"
    scheme = make_reward("lightsearcher", store=str(path))
    assert scheme(traj(search(), answer("Paris"))) == 1.0  # first: n = m = 1
    clone = pickle.loads(pickle.dumps(scheme))
    # m = 3, n = 1 (read back from the store) → 0.61157.
    assert clone(traj(search(), search(), search(), answer("Paris"))) == pytest.approx(0.61157, abs=1e-5)


def test_make_reward_errors():
    with pytest.raises(UnknownNameError, match="Did you mean 'lightsearcher'"):
        make_reward("lightsearch")
    with pytest.raises(InvalidArgumentError, match="'cost' does not accept lambda.*accepts: lam"):
        make_reward("cost", **{"lambda": 0.2})
    scheme = F1Reward()
    assert make_reward(scheme) is scheme
    with pytest.raises(InvalidArgumentError, match="already built"):
        make_reward(scheme, format_penalty=-1)
    with pytest.raises(InvalidArgumentError, match="registered name"):
        make_reward(3)
    with pytest.raises(InvalidArgumentError, match="registered name"):
        make_reward(F1Reward)
    # A bad value still reaches the scheme's own check.
    with pytest.raises(InvalidArgumentError, match="theta_t"):
        make_reward("lightsearcher", theta_t=-1)
    assert make_reward("cost", lam=0.2).lam == 0.2


def test_register_reward():
    class Constant(RewardScheme):
        name = "constant-test"

        def __call__(self, trajectory: Trajectory) -> float:
            return 0.25

    try:
        assert register_reward(Constant) is Constant
        assert register_reward(Constant) is Constant  # again: no-op
        assert make_reward("constant-test")(traj(answer("x"))) == 0.25

        class Clash(Constant):
            pass

        with pytest.raises(InvalidArgumentError, match="already taken"):
            register_reward(Clash)
    finally:
        REWARDS.pop("constant-test", None)

    class Nameless(RewardScheme):
        def __call__(self, trajectory: Trajectory) -> float:
            return 0.0

    with pytest.raises(InvalidArgumentError, match="no registry name"):
        register_reward(Nameless)
    with pytest.raises(InvalidArgumentError):
        register_reward(dict)


# -- state as data (checkpoints) ----------------------------------------------------------------


def test_lightsearchers_state_round_trips_through_json_and_scores_the_same():
    trained = LightSearcherReward()
    trained(traj(search(), search(), search(), answer("Paris")))  # q1 answered well with 3 searches
    trained(traj(search(), answer("Paris")))  # then with 1
    state = json.loads(json.dumps(trained.state_dict()))
    assert state == {"min_tool_calls": {"q1": 1}}
    restored = LightSearcherReward()
    restored.load_state_dict(state)
    three = traj(search(), search(), search(), answer("Paris"))
    # Eq. 16 with m = 3, n = 1: 0.5·1 + 0.5·exp(-0.75·2); a fresh scheme would give 1.0 (n = m).
    assert restored(three) == pytest.approx(0.5 + 0.5 * math.exp(-1.5))


@pytest.mark.parametrize(
    "state",
    [
        {"min_tool_calls": {"q1": -1}},
        {"min_tool_calls": {"q1": "2"}},
        {"min_tool_calls": []},
        {"other": {}},
        {},
    ],
)
def test_a_bad_lightsearcher_state_is_refused(state):
    with pytest.raises(InvalidArgumentError, match=r"LightSearcher state|must be an int >= 0"):
        LightSearcherReward().load_state_dict(state)


def test_a_stateless_scheme_has_an_empty_state_and_refuses_another():
    scheme = F1Reward()
    assert scheme.state_dict() == {}
    scheme.load_state_dict({})
    with pytest.raises(InvalidArgumentError, match="F1Reward keeps no state"):
        scheme.load_state_dict({"min_tool_calls": {}})
