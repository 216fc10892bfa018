"""ExperienceMemory: Good/Bad split, update cadence, few-shot pool, failures, sharing (docs/methods.md#lightsearcher-memory)."""

from __future__ import annotations

import logging
import multiprocessing as mp
import random
import sqlite3
import time
from pathlib import Path

import numpy as np
import pytest

from searchgym.envs.records import Action, Question, Trajectory, Turn
from searchgym.error import InvalidArgumentError
from searchgym.memory import ExperienceBank, ExperienceMemory, SummarizerError
from searchgym.retrieval.records import Doc


def make_trajectory(qid: str, reward: float, searches: int = 0, answer: str | None = "x") -> Trajectory:
    """A finished trajectory with ``searches`` search turns, then an answer (if any)."""
    turns = [
        Turn(f"s{i}", Action(kind="search", query=f"q{i}"), [Doc(f"d{i}", "T", "t")], "obs")
        for i in range(searches)
    ]
    if answer is not None:
        turns.append(Turn(f"a:{answer}", Action(kind="answer", answer=answer)))
    return Trajectory(Question(qid, f"question {qid}?", ("x",)), "search_r1", turns, reward=reward)


class FixedSummarizer:
    """Records what it was given; returns a bank naming the call number."""

    name = "fixed"

    def __init__(self) -> None:
        self.calls: list[tuple[int, int, ExperienceBank | None]] = []

    def summarize(self, good, bad, previous):
        self.calls.append((len(good), len(bad), previous))
        return ExperienceBank(success_strategies=(f"call {len(self.calls)}",))


class BrokenSummarizer:
    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.name = f"broken-{mode}"

    def summarize(self, good, bad, previous):
        if self.mode == "raise":
            raise SummarizerError("the model server is down")
        if self.mode == "slow":
            time.sleep(2)
        if self.mode == "empty":
            return ExperienceBank()
        return "junk text"


# -- the split and the cadence -----------------------------------------------------------------------


def test_good_bad_split_follows_the_paper() -> None:
    # Good: R = 1 (the maximum). Bad: R < θ_r = 0.3. 0.3 itself and 0.61 are neither.
    rewards = [1.0, 1.0, 0.61157, 0.5, 0.3, 0.29, 0.0, -1.0]
    summarizer = FixedSummarizer()
    memory = ExperienceMemory(update_every=5, summarizer=summarizer)
    for i, r in enumerate(rewards):
        memory.add(make_trajectory(f"q{i}", r))
    results = [memory.step() for _ in range(5)]
    assert results[:4] == [None] * 4
    result = results[4]
    assert result is not None and result.outcome == "written"
    assert (result.good, result.bad, result.window) == (2, 3, (0, 8))
    assert summarizer.calls == [(2, 3, None)]
    assert memory.experience.success_strategies == ("call 1",)
    assert (memory.experience.step, memory.experience.version) == (5, 1)
    # Few-shot pool: R >= θ_r, i.e. 1.0, 1.0, 0.61157, 0.5, 0.3 → 5 of 8.
    assert memory.pool_size == 5 and len(memory) == 8


def test_updates_run_every_update_every_steps_on_the_new_window() -> None:
    summarizer = FixedSummarizer()
    memory = ExperienceMemory(update_every=3, summarizer=summarizer)
    updated_at = []
    for step in range(1, 10):
        memory.add(make_trajectory(f"g{step}", 1.0))
        memory.add(make_trajectory(f"b{step}", 0.0))
        if memory.step() is not None:
            updated_at.append(step)
    assert updated_at == [3, 6, 9]
    # Each update saw only the 3 steps since the previous one: 3 Good and 3 Bad.
    assert [c[:2] for c in summarizer.calls] == [(3, 3)] * 3
    # The previous bank is handed to the summariser from the second update on.
    assert summarizer.calls[0][2] is None and summarizer.calls[1][2].success_strategies == ("call 1",)
    assert [b.version for b in memory.history()] == [1, 2, 3]
    assert [b.step for b in memory.history()] == [3, 6, 9]
    assert memory.history_records()[1].window == (6, 12)


def test_skip_when_a_group_is_empty_says_why(caplog: pytest.LogCaptureFixture) -> None:
    memory = ExperienceMemory(update_every=1, summarizer=FixedSummarizer())
    for i in range(3):
        memory.add(make_trajectory(f"q{i}", 1.0))
    with caplog.at_level(logging.INFO, logger="searchgym.memory"):
        result = memory.step()
    assert result is not None and result.outcome == "skipped"
    assert "no Bad trajectory (reward < 0.3) among the 3" in result.reason
    assert "skipped" in caplog.text and "no Bad trajectory" in caplog.text
    assert len(memory.experience) == 0 and memory.history() == []
    result = memory.step()  # nothing new at all
    assert (
        result is not None and "no Good trajectory" in result.reason and "no Bad trajectory" in result.reason
    )


@pytest.mark.parametrize("mode", ["raise", "junk", "empty", "slow"])
def test_a_failing_summariser_keeps_the_previous_bank(mode: str, caplog: pytest.LogCaptureFixture) -> None:
    memory = ExperienceMemory(update_every=1, summarizer=FixedSummarizer(), summarize_timeout=0.5)
    memory.add(make_trajectory("g", 1.0))
    memory.add(make_trajectory("b", 0.0))
    assert memory.step().outcome == "written"  # type: ignore[union-attr]
    before = memory.experience
    memory.summarizer = BrokenSummarizer(mode)
    memory.add(make_trajectory("g2", 1.0))
    memory.add(make_trajectory("b2", 0.0))
    with caplog.at_level(logging.WARNING, logger="searchgym.memory"):
        result = memory.step()
    assert result is not None and result.outcome == "failed"
    expected = {
        "raise": "server is down",
        "junk": "not an ExperienceBank",
        "empty": "empty bank",
        "slow": "no bank within 0.5 s",
    }
    assert expected[mode] in result.reason
    assert "the bank stays at version 1" in caplog.text
    assert memory.experience == before and len(memory.history()) == 1


# -- the few-shot pool ---------------------------------------------------------------------------


def test_few_shot_draws_uniformly_from_the_pool() -> None:
    memory = ExperienceMemory(seed=0)
    assert memory.sample_few_shot() is None  # empty pool
    for qid, r in [("a", 1.0), ("low", 0.29), ("b", 0.3), ("bad", -1.0), ("c", 0.7)]:
        memory.add(make_trajectory(qid, r))
    rng = np.random.default_rng(123)
    counts = {"a": 0, "b": 0, "c": 0}
    for _ in range(3000):
        counts[memory.sample_few_shot(rng).question.id] += 1  # type: ignore[union-attr]
    # Uniform over 3: each count ~ Binomial(3000, 1/3), sd ≈ 25.8; ±5 sd is 129.
    assert all(abs(n - 1000) < 129 for n in counts.values()), counts
    # random.Random works too and never yields a trajectory below θ_r.
    drawn = {memory.sample_few_shot(random.Random(s)).question.id for s in range(200)}  # type: ignore[union-attr]
    assert drawn == {"a", "b", "c"}
    with pytest.raises(InvalidArgumentError, match="rng"):
        memory.sample_few_shot("seed")  # type: ignore[arg-type]


def test_pool_keeps_the_latest_max_pool() -> None:
    memory = ExperienceMemory(max_pool=2)
    for i in range(5):
        memory.add(make_trajectory(f"q{i}", 1.0))
    assert len(memory) == 5 and memory.pool_size == 2
    assert {memory.sample_few_shot(random.Random(s)).question.id for s in range(50)} == {"q3", "q4"}  # type: ignore[union-attr]


def test_bad_arguments() -> None:
    with pytest.raises(InvalidArgumentError, match="update_every"):
        ExperienceMemory(update_every=0)
    with pytest.raises(InvalidArgumentError, match="theta_r"):
        ExperienceMemory(theta_r=float("nan"))
    memory = ExperienceMemory()
    with pytest.raises(InvalidArgumentError, match="Trajectory"):
        memory.add({"question": "x"})  # type: ignore[arg-type]
    unfinished = make_trajectory("q", 1.0)
    unfinished.reward = None
    with pytest.raises(InvalidArgumentError, match="no reward yet"):
        memory.add(unfinished)
    assert len(memory) == 0


# -- the store ---------------------------------------------------------------------------------


def test_store_survives_a_restart(tmp_path: Path) -> None:
    memory = ExperienceMemory(tmp_path, update_every=2, summarizer=FixedSummarizer())
    for i in range(4):
        memory.add(make_trajectory(f"g{i}", 1.0, searches=1))
        memory.add(make_trajectory(f"b{i}", 0.0))
    memory.step()
    memory.step()  # update 1: window [0, 8)
    memory.add(make_trajectory("late", 1.0))
    memory.close()

    again = ExperienceMemory(tmp_path, update_every=2, summarizer=FixedSummarizer())
    assert len(again) == 9 and again.pool_size == 5 and again.steps == 2
    assert again.experience.success_strategies == ("call 1",) and again.experience.version == 1
    again.add(make_trajectory("late-bad", 0.1))
    again.step()
    result = again.step()  # the window continues after the first update: [8, 10)
    assert result is not None and result.window == (8, 10) and (result.good, result.bad) == (1, 1)
    assert [b.version for b in again.history()] == [1, 2]
    record = again.history_records()[1]
    assert (record.summarizer, record.good, record.bad) == ("fixed", 1, 1)
    restored = again.sample_few_shot(random.Random(0))
    assert restored is not None and restored.turns[0].docs == [Doc("d0", "T", "t")]


def _insert_raw(database: Path, body: str) -> None:
    """A record written past the log's checks (another tool, a bit flip): SQLite itself, directly."""
    with sqlite3.connect(database) as conn:
        conn.execute("INSERT INTO records (body) VALUES (?)", (body,))
    conn.close()


def test_corrupt_records_are_skipped_and_training_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    memory = ExperienceMemory(tmp_path, update_every=2, summarizer=FixedSummarizer())
    memory.add(make_trajectory("a", 1.0))
    _insert_raw(tmp_path / "trajectories.sqlite", '{"schema": 1, "trajectory": {"question": 3}}')
    memory.add(make_trajectory("b", 0.0))
    _insert_raw(tmp_path / "updates.sqlite", "{garbage")
    with caplog.at_level("WARNING", logger="searchgym.memory"):
        again = ExperienceMemory(tmp_path, update_every=2, summarizer=FixedSummarizer())  # reopens
        assert len(again) == 2 and len(memory) == 2
        assert again.step() is None
        result = again.step()  # the update sees both readable trajectories
    assert result is not None and result.outcome == "written" and (result.good, result.bad) == (1, 1)
    assert "trajectories.sqlite, record 2" in caplog.text and "updates.sqlite, record 1" in caplog.text
    from searchgym.memory import MemoryStore

    reports = {Path(r.path).name: r for r in MemoryStore(tmp_path).repair()}
    assert reports["trajectories.sqlite"].dropped[0][0] == 2 and reports["updates.sqlite"].dropped[0][0] == 1
    assert len(ExperienceMemory(tmp_path)) == 2
    with sqlite3.connect(tmp_path / "trajectories.sqlite") as conn:  # moved out, not deleted
        assert conn.execute("SELECT id, body FROM rejected").fetchall() == [
            (2, '{"schema": 1, "trajectory": {"question": 3}}')
        ]
    conn.close()


def _worker_add(path: str, worker: int, count: int) -> None:
    memory = ExperienceMemory(path)
    for i in range(count):
        good = i % 2 == 1
        memory.add(make_trajectory(f"w{worker}-{i}", 1.0 if good else 0.0, searches=1 if good else 0))


def _worker_read_bank(path: str, queue: mp.Queue) -> None:
    memory = ExperienceMemory(path)
    queue.put((len(memory), memory.experience.to_text(), memory.experience.version))


def test_processes_share_one_store(tmp_path: Path) -> None:
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_worker_add, args=(str(tmp_path), w, 50)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    trainer = ExperienceMemory(tmp_path, update_every=1)
    assert len(trainer) == 200 and trainer.pool_size == 100
    result = trainer.step()
    assert result is not None and (result.good, result.bad) == (100, 100) and result.outcome == "written"
    queue = ctx.Queue()
    reader = ctx.Process(target=_worker_read_bank, args=(str(tmp_path), queue))
    reader.start()
    count, text, version = queue.get(timeout=120)
    reader.join(60)
    assert (count, version) == (200, 1)
    assert text == trainer.experience.to_text() and "searches" in text


def test_a_pickled_memory_shares_the_store(tmp_path: Path) -> None:
    import pickle

    memory = ExperienceMemory(tmp_path, seed=0)
    memory.add(make_trajectory("a", 1.0))
    copy = pickle.loads(pickle.dumps(memory))  # what a Ray actor or a spawned worker receives
    copy.add(make_trajectory("b", 0.0))
    assert len(memory) == 2 and len(copy) == 2
    in_memory = ExperienceMemory()
    in_memory.add(make_trajectory("a", 1.0))
    clone = pickle.loads(pickle.dumps(in_memory))
    clone.add(make_trajectory("b", 1.0))
    assert (len(in_memory), len(clone)) == (1, 2)  # without a path a copy is a copy


def test_pool_item_maps_a_fraction_to_one_pool_trajectory(tmp_path: Path) -> None:
    memory = ExperienceMemory(tmp_path)
    assert memory.pool_item(0.5) is None
    for qid, reward in (("a", 1.0), ("low", 0.1), ("b", 0.5), ("c", 1.0)):
        memory.add(make_trajectory(qid, reward))
    # pool = [a, b, c] (reward >= 0.3): floor(u * 3) picks a, b, c
    assert [memory.pool_item(u).question.id for u in (0.0, 0.34, 0.67, 0.999)] == ["a", "b", "c", "c"]
    for bad in (1.0, -0.1, True, "0.5"):
        with pytest.raises(InvalidArgumentError):
            memory.pool_item(bad)
