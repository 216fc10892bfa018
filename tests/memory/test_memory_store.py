"""The memory store folder: its logs, repair, the command line, snapshots, serialisation (the log
itself, SQLite shared by processes, is tested in test_sqlite_log.py)."""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path

import gymnasium as gym
import pytest

import searchgym  # noqa: F401  (registers the env ids)
from searchgym.envs.records import Action, Question, Trajectory, Turn
from searchgym.envs.rewards.lightsearcher import LightSearcherReward
from searchgym.error import DataFileError, InvalidArgumentError, UnknownNameError
from searchgym.memory import MemoryStore, trajectory_from_dict, trajectory_to_dict
from searchgym.policies import make_policy
from searchgym.retrieval.records import Doc

# -- the store folder ------------------------------------------------------------------------------


def test_store_folder_rules(tmp_path: Path) -> None:
    with pytest.raises(DataFileError, match="does not exist"):
        MemoryStore(tmp_path / "none", create=False)
    (tmp_path / "file").write_text("x")
    with pytest.raises(DataFileError, match="is a file"):
        MemoryStore(tmp_path / "file")
    store = MemoryStore(tmp_path / "store")
    with pytest.raises(UnknownNameError, match="Did you mean 'bank'"):
        store.path_of("banks")
    assert store.kinds_present() == []


def test_bank_records_are_checked_and_repair_drops_invalid_ones(tmp_path: Path) -> None:
    store = MemoryStore(tmp_path)
    good = {
        "version": 1,
        "step": 5,
        "good": 2,
        "bad": 3,
        "summarizer": "rule",
        "window": [0, 8],
        "time": 0.0,
        "bank": {"success_strategies": ["a"], "pitfalls": [], "reasoning_guidelines": []},
    }
    store.log("bank").append(good)
    store.log("bank").append({**good, "bank": {"success_strategies": "not a list"}})
    assert store.log("bank").read()[0] == [{**good, "schema": 1}]
    assert "success_strategies" in store.log("bank").corrupt[0][1]
    reports = store.repair()
    assert [(r.kept, len(r.dropped)) for r in reports] == [(1, 1)]
    with pytest.raises(UnknownNameError, match="store log"):
        store.log("hiexp_levels")  # a file rewritten whole, not a log


def test_min_tool_call_store_lives_beside_the_bank(tmp_path: Path) -> None:
    store = MemoryStore(tmp_path)
    reward = LightSearcherReward(store=store.path_of("min_tool_calls"))
    reward.store.update("q1", 2)
    reward.store.close()
    assert store.kinds_present() == ["min_tool_calls"]
    assert store.log("min_tool_calls").read()[0] == [{"id": "q1", "n": 2}]  # schemaless format
    conn = sqlite3.connect(store.path_of("min_tool_calls"))
    with conn:  # a record that is not a minimum, then one that is
        conn.executemany(
            "INSERT INTO records (body) VALUES (?)", [('{"id": "q2", "n": -1}',), ('{"id": "q3", "n": 1}',)]
        )
    conn.close()
    (report,) = store.repair()  # the same repair as every other file of the store
    assert report.kept == 2 and [n for n, _ in report.dropped] == [2] and not report.problems
    assert LightSearcherReward(store=store.path_of("min_tool_calls")).store.minima() == {"q1": 2, "q3": 1}


# -- serialisation ---------------------------------------------------------------------------------


def _episode(policy: str, seed: int) -> Trajectory:
    env = gym.make("searchgym/SyntheticFacts-v1", protocol="tool_call", reward="lightsearcher")
    agent = make_policy(policy, protocol="tool_call", world=env.unwrapped.world)
    context, _ = env.reset(seed=seed)
    done = False
    while not done:
        action = agent.act([context])[0]
        obs, _, terminated, truncated, _ = env.step(action)
        context += action + obs
        done = terminated or truncated
    return env.unwrapped.trajectory


def test_trajectory_round_trip_is_exact() -> None:
    trajectory = _episode("naive_rag", seed=3)
    assert trajectory.num_searches == 1 and len(trajectory.turns[0].docs) == 3
    data = json.loads(json.dumps(trajectory_to_dict(trajectory)))
    back = trajectory_from_dict(data)
    assert back == trajectory  # dataclass equality: every field, every turn, every doc
    assert back.question.known is trajectory.question.known and back.question.hops == trajectory.question.hops
    assert back.reward == trajectory.reward and back.f1 == trajectory.f1


def test_hand_made_trajectory_round_trip() -> None:
    traj = Trajectory(
        question=Question("q", "Who?", ("A", "B"), known=None, hops=None),
        protocol="search_r1",
        turns=[
            Turn("bad", Action(kind="invalid", error="no tags", format_ok=False), [], "\n[format error] x\n"),
            Turn(
                "<search>who</search>",
                Action(kind="search", query="who", answer="guess", think_blocks=1),
                [Doc("d1", "T", "text", 1.5)],
                "<information>…</information>",
            ),
        ],
        truncated=True,
        reward=-1.0,
    )
    assert trajectory_from_dict(json.loads(json.dumps(trajectory_to_dict(traj)))) == traj


def test_missing_field_is_named() -> None:
    data = trajectory_to_dict(_episode("naive_rag", seed=3))
    del data["turns"][1]["action"]["kind"]
    with pytest.raises(InvalidArgumentError, match=r"'turns\[1\]\.action\.kind'"):
        trajectory_from_dict(data)
    data = trajectory_to_dict(_episode("direct", seed=1))
    data["question"]["golden_answers"] = []
    with pytest.raises(InvalidArgumentError, match="golden_answers"):
        trajectory_from_dict(data)
    with pytest.raises(InvalidArgumentError, match="Trajectory"):
        trajectory_to_dict({"question": "x"})  # type: ignore[arg-type]


# -- the command line --------------------------------------------------------------------------------


def test_cli_show_history_levels_and_repair(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from searchgym.cli import main
    from searchgym.memory import ExperienceRecord, HierarchicalExperience

    store = MemoryStore(tmp_path)
    for version, (step, item) in enumerate([(5, "Search once."), (10, "Search twice.")], start=1):
        store.log("bank").append(
            {
                "version": version,
                "step": step,
                "good": 3,
                "bad": 4,
                "summarizer": "rule",
                "window": [0, 7],
                "time": 0.0,
                "bank": {"success_strategies": [item], "pitfalls": [], "reasoning_guidelines": ["Be brief."]},
            }
        )
    HierarchicalExperience(
        [
            ExperienceRecord(
                level=level, type="strategy", title=title, tags=("a",), description="Do it.", thinking=""
            )
            for level, title in [(1, "Case title"), (2, "General title")]
        ]
    ).save(tmp_path)
    assert main(["memory", "show", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "Current bank (version 2, step 10: rule, 3 Good / 4 Bad of trajectories 0-7)" in out
    assert "- Search twice." in out and "Search once." not in out and "Pitfalls to avoid:\n    (none)" in out
    assert out.index("Level 2 (1 record)") < out.index("Level 1 (1 record)")
    assert "(strategy) General title [a]" in out
    assert main(["memory", "show", str(tmp_path), "--history"]) == 0
    out = capsys.readouterr().out
    assert (
        out.index("Bank version 1, step 5")
        < out.index("- Search once.")
        < out.index("Bank version 2, step 10")
    )

    conn = sqlite3.connect(store.path_of("bank"))
    with conn:
        conn.execute("INSERT INTO records (body) VALUES ('{oops')")
    conn.close()
    assert main(["memory", "show", str(tmp_path)]) == 0  # shows what it can read
    out = capsys.readouterr().out
    assert "Current bank (version 2" in out
    assert "bank.sqlite, record 3: not valid JSON" in out and f"searchgym memory repair {tmp_path}" in out
    assert main(["memory", "repair", str(tmp_path)]) == 0
    assert (
        "kept 2 records, moved out 1 corrupt ones (kept in its 'rejected' table)" in capsys.readouterr().out
    )
    assert main(["memory", "show", str(tmp_path)]) == 0
    assert main(["memory", "show", str(tmp_path / "missing")]) == 2
    assert "No memory store" in capsys.readouterr().err


def test_cli_show_lists_hiexp_levels_through_load(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from searchgym.cli import main
    from searchgym.memory import ExperienceRecord, HierarchicalExperience

    def record(level: int, kind: str, title: str) -> ExperienceRecord:
        return ExperienceRecord(
            level=level, type=kind, title=title, tags=("t",), description=f"About {title}.", thinking=""
        )

    hierarchy = HierarchicalExperience(
        [
            record(1, "search-strategy", "Case A"),
            record(1, "reasoning", "Case B"),
            record(2, "reasoning", "General"),
        ]
    )
    hierarchy.save(tmp_path)  # hiexp_levels.jsonl: 3 lines, level 1 first
    assert main(["memory", "show", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    expected = (
        "HiExp levels (3 records):\n"
        "  Level 2 (1 record):\n"
        "    - (reasoning) General [t]\n"
        "        About General.\n"
        "  Level 1 (2 records):\n"
        "    - (search-strategy) Case A [t]\n"
        "        About Case A.\n"
        "    - (reasoning) Case B [t]\n"
        "        About Case B.\n"
    )
    assert out.endswith(expected), out

    # A line the loader refuses (an unknown key) is skipped and named with its line, 4; repair drops exactly it.
    with open(tmp_path / "hiexp_levels.jsonl", "a") as handle:
        handle.write(
            json.dumps({"schema": 1, **record(1, "reasoning", "Case C").to_dict(), "note": "x"}) + "\n"
        )
    assert main(["memory", "show", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert (
        "hiexp_levels.jsonl, line 4" in out
        and "unknown ['note']" in out
        and "HiExp levels (3 records)" in out
    )
    assert f"searchgym memory repair {tmp_path}" in out
    assert main(["memory", "repair", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "kept 3 records, moved out 1 corrupt ones (kept in" in out and "hiexp_levels.jsonl.corrupt" in out
    assert main(["memory", "show", str(tmp_path)]) == 0
    assert capsys.readouterr().out.endswith(expected)


# -- snapshots for resume -------------------------------------------------------------------------


def _trajectory(qid: str, reward: float = 1.0) -> Trajectory:
    turn = Turn("a:x", Action(kind="answer", answer="x"))
    return Trajectory(Question(qid, f"question {qid}?", ("x",)), "search_r1", [turn], reward=reward)


def test_snapshot_and_restore_bring_the_store_back_to_a_step(tmp_path: Path) -> None:
    from searchgym.envs.rewards import MinToolCallStore
    from searchgym.memory import ExperienceMemory

    memory = ExperienceMemory(tmp_path, update_every=1)
    mins = MinToolCallStore(MemoryStore(tmp_path).path_of("min_tool_calls"))
    for i in range(3):
        memory.add(_trajectory(f"q{i}"))
        mins.update(f"q{i}", i)
    memory.step()
    assert MemoryStore(tmp_path).snapshot(1) == {
        "trajectories": 3,
        "bank": 0,
        "updates": 1,
        "steps": 1,  # the count, written once per step
        "min_tool_calls": 3,
    }
    for i in range(3, 5):  # work after the checkpoint, lost by the crash that follows
        memory.add(_trajectory(f"q{i}"))
        mins.update("q1", 0)
    memory.step()
    moved = MemoryStore(tmp_path).restore(1)
    assert moved == {"trajectories": 2, "bank": 0, "updates": 1, "steps": 1, "min_tool_calls": 1}
    again = ExperienceMemory(tmp_path, update_every=1)
    assert len(again) == 3 and again.steps == 1
    assert len(memory) == 3  # an open memory reads the cut store again
    assert mins.minima() == {"q0": 0, "q1": 1, "q2": 2}  # an open reader follows the cut
    assert MinToolCallStore(tmp_path / "min_tool_calls.sqlite").minima() == {"q0": 0, "q1": 1, "q2": 2}
    assert len((tmp_path / "trajectories.sqlite.cut-1.jsonl").read_text().splitlines()) == 2  # kept aside
    with pytest.raises(DataFileError, match=r"No snapshot of step 7 .*snapshots: \[1\]"):
        MemoryStore(tmp_path).restore(7)
    assert len(ExperienceMemory(tmp_path)) == 3  # a refused restore cuts nothing


def test_copy_to_copies_each_log_as_one_state(tmp_path: Path) -> None:
    from searchgym.memory import ExperienceMemory

    memory = ExperienceMemory(tmp_path / "live", update_every=1)
    for i in range(4):
        memory.add(_trajectory(f"q{i}", reward=float(i % 2)))
    memory.step()
    memory.add(_trajectory("q-uncommitted-in-wal"))  # lives in the WAL file until a checkpoint
    MemoryStore(tmp_path / "live").copy_to(tmp_path / "copy")  # the live store keeps its connections open
    assert sorted(os.listdir(tmp_path / "copy")) == [
        "bank.sqlite",
        "steps.sqlite",  # the step count
        "trajectories.sqlite",
        "updates.sqlite",
    ]
    copy = ExperienceMemory(tmp_path / "copy", update_every=1)
    assert len(copy) == 5 and copy.steps == 1 and copy.history_records() == memory.history_records()
