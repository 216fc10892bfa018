"""The memory store: JSON-lines logs shared by processes, crash safety, repair, serialisation."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import gymnasium as gym
import pytest

import searchgym  # noqa: F401  (registers the env ids)
from searchgym.envs.errors import DataFileError, InvalidArgumentError, UnknownNameError
from searchgym.envs.records import Action, Doc, Question, Trajectory, Turn
from searchgym.envs.rewards.lightsearcher import LightSearcherReward
from searchgym.memory import JsonlLog, MemoryStore, trajectory_from_dict, trajectory_to_dict
from searchgym.policies import make_policy

# -- JsonlLog basics ---------------------------------------------------------------------------


def test_append_and_incremental_read(tmp_path: Path) -> None:
    log = JsonlLog(tmp_path / "sub" / "a.jsonl")
    assert log.read() == ([], 0)  # a missing file reads as empty
    log.append({"x": 1})
    log.append({"x": "é"})
    records, offset = log.read()
    assert records == [{"x": 1, "schema": 1}, {"x": "é", "schema": 1}]
    # Each line is one JSON object: '{"x":1,"schema":1}\n' is 19 bytes, the second line 22
    # ('é' is two bytes in UTF-8), so the offset is 41.
    assert offset == 19 + 22 == os.path.getsize(log.path)
    log.append({"x": 3})
    more, offset2 = log.read(since=offset)
    assert more == [{"x": 3, "schema": 1}]
    assert log.read(since=offset2) == ([], offset2)


def test_bad_records_are_refused(tmp_path: Path) -> None:
    log = JsonlLog(tmp_path / "a.jsonl")
    with pytest.raises(InvalidArgumentError, match="JSON-serialisable"):
        log.append({"x": float("nan")})
    with pytest.raises(InvalidArgumentError, match="must be a dict"):
        log.append([1, 2])  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="since"):
        log.read(since=-1)
    assert not os.path.exists(log.path) or os.path.getsize(log.path) == 0


def test_torn_last_line_is_ignored_then_cut_by_the_next_writer(tmp_path: Path) -> None:
    log = JsonlLog(tmp_path / "a.jsonl")
    log.append({"i": 0})
    whole = os.path.getsize(log.path)
    with open(log.path, "ab") as handle:  # what a writer killed mid-write leaves behind
        handle.write(b'{"i": 1, "schema": 1, "pay')
    records, offset = log.read()
    assert records == [{"i": 0, "schema": 1}] and offset == whole  # not counted, not consumed
    JsonlLog(log.path).append({"i": 2})  # a fresh writer (a restarted process)
    assert [r["i"] for r in log.read()[0]] == [0, 2]
    assert Path(log.path + ".rejected").read_bytes() == b'{"i": 1, "schema": 1, "pay\n'


def test_corrupt_middle_line_is_skipped_quarantined_reported_then_repaired(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    log = JsonlLog(tmp_path / "a.jsonl")
    for i in range(3):
        log.append({"i": i})
    lines = Path(log.path).read_bytes().splitlines(keepends=True)
    lines.insert(1, b"garbage {\n")  # becomes line 2
    lines.insert(3, b"[1, 2]\n")  # line 4: valid JSON, not an object
    Path(log.path).write_bytes(b"".join(lines))
    with caplog.at_level("WARNING", logger="searchgym.memory"):
        records, _ = log.read()
    assert [r["i"] for r in records] == [0, 1, 2]  # reading goes on past them
    assert [n for n, _ in log.corrupt] == [2, 4]
    assert f"{log.path}, line 2" in caplog.text and "searchgym memory repair" in caplog.text
    rejected = Path(log.path + ".rejected")
    assert rejected.read_bytes() == b"garbage {\n[1, 2]\n"  # quarantined
    other = JsonlLog(log.path)  # another reader (process) quarantines nothing twice
    assert len(other.read()[0]) == 3 and rejected.read_bytes() == b"garbage {\n[1, 2]\n"
    log.read()
    assert len(log.corrupt) == 2  # reported once per reader
    report = log.repair()
    assert report.kept == 3 and [n for n, _ in report.dropped] == [2, 4]
    assert [r["i"] for r in log.read()[0]] == [0, 1, 2]
    assert rejected.read_bytes() == b"garbage {\n[1, 2]\n"  # repair copies nothing twice
    assert not log.repair().changed  # a second repair finds nothing


def test_newer_schema_asks_for_an_upgrade(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    path.write_text('{"schema": 99, "x": 1}\n')
    with pytest.raises(DataFileError, match="newer searchgym.*Upgrade"):
        JsonlLog(path).read()
    path.write_text('{"x": 1}\n')
    log = JsonlLog(path)
    assert log.read()[0] == [] and log.corrupt == [(1, "no integer 'schema' field (got None)")]


def test_writer_follows_a_repaired_file(tmp_path: Path) -> None:
    writer = JsonlLog(tmp_path / "a.jsonl")
    writer.append({"i": 0})  # the writer now holds a descriptor on the original file
    with open(writer.path, "ab") as handle:
        handle.write(b"not json\n")
    JsonlLog(writer.path).repair()  # another process replaces the file
    writer.append({"i": 1})  # must land in the new file, not the unlinked old one
    assert [r["i"] for r in JsonlLog(writer.path).read()[0]] == [0, 1]


# -- several processes ---------------------------------------------------------------------------


def _append_many(path: str, worker: int, count: int) -> None:
    log = JsonlLog(path)
    for i in range(count):
        # Payload sizes vary so that lines straddle page boundaries.
        log.append({"w": worker, "i": i, "pad": "x" * (50 + (i * 37 + worker * 101) % 3000)})


def test_four_processes_append_500_each_without_loss(tmp_path: Path) -> None:
    path = str(tmp_path / "shared.jsonl")
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_append_many, args=(path, w, 500)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    records, _ = JsonlLog(path).read()
    assert len(records) == 2000
    seen = {(r["w"], r["i"]) for r in records}
    assert seen == {(w, i) for w in range(4) for i in range(500)}
    for r in records:  # nothing garbled: every payload has the length its writer gave it
        assert r["pad"] == "x" * (50 + (r["i"] * 37 + r["w"] * 101) % 3000)
    # Each worker's records keep their order (appends of one process are sequential).
    for w in range(4):
        assert [r["i"] for r in records if r["w"] == w] == list(range(500))


_WRITER = """
import sys
from searchgym.memory import JsonlLog
log = JsonlLog(sys.argv[1])
i = 0
while True:
    log.append({"i": i, "pad": "y" * 4_000_000})
    print(i, flush=True)
    i += 1
"""


@pytest.mark.parametrize("delay", [0.0, 0.02, 0.05])
def test_kill_9_mid_burst_loses_at_most_the_record_in_flight(tmp_path: Path, delay: float) -> None:
    # Each append writes 4 MB, so a kill often lands inside a write (a torn tail); with
    # these delays it did in about half the runs on the development machine. The checks
    # below hold either way.
    path = str(tmp_path / "burst.jsonl")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-c", _WRITER, path], stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None
    acknowledged = -1
    for line in proc.stdout:  # let it finish a few appends, then kill it mid-burst
        acknowledged = int(line)
        if acknowledged >= 3:
            break
    time.sleep(delay)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(30)
    rest = proc.stdout.read().split()
    acknowledged = int(rest[-1]) if rest else acknowledged
    records, offset = JsonlLog(path).read()
    # Every acknowledged append is there; at most one more (written but not yet acknowledged).
    assert acknowledged + 1 <= len(records) <= acknowledged + 2
    assert [r["i"] for r in records] == list(range(len(records)))
    assert all(len(r["pad"]) == 4_000_000 for r in records)
    torn = os.path.getsize(path) - offset
    # A restarted writer appends on a fresh line and the store still reads.
    JsonlLog(path).append({"i": "after"})
    again, _ = JsonlLog(path).read()
    assert len(again) == len(records) + 1 and again[-1]["i"] == "after"
    assert os.path.exists(path + ".rejected") == (torn > 0)


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


def test_min_tool_call_store_lives_beside_the_bank(tmp_path: Path) -> None:
    store = MemoryStore(tmp_path)
    reward = LightSearcherReward(store=store.path_of("min_tool_calls"))
    reward.store.update("q1", 2)
    reward.store.close()
    assert store.kinds_present() == ["min_tool_calls"]
    assert store.log("min_tool_calls").read()[0] == [{"id": "q1", "n": 2}]  # schemaless format
    with open(store.path_of("min_tool_calls"), "ab") as handle:
        handle.write(b'{"id": "q2", "n": -1}\n{"id": "q3", "n": 1}\n{"id": "q4"')
    (report,) = store.repair()  # the same repair as every other file of the store
    assert report.kept == 2 and [n for n, _ in report.dropped] == [2] and report.torn_bytes == 11
    assert LightSearcherReward(store=store.path_of("min_tool_calls")).store.minima() == {"q1": 2, "q3": 1}


# -- serialisation ---------------------------------------------------------------------------------


def _episode(policy: str, seed: int) -> Trajectory:
    env = gym.make("searchgym/SyntheticFacts-v0", protocol="tool_call", reward="lightsearcher")
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
    for level, title in [(1, "Case title"), (2, "General title")]:
        store.log("hiexp_levels").append(
            {
                "level": level,
                "type": "strategy",
                "title": title,
                "tags": ["a"],
                "description": "Do it.",
                "thinking": "",
            }
        )
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

    with open(store.path_of("bank"), "a") as handle:
        handle.write("{oops\n")
    assert main(["memory", "show", str(tmp_path)]) == 0  # shows what it can read
    out = capsys.readouterr().out
    assert "Current bank (version 2" in out
    assert "bank.jsonl, line 3: not valid JSON" in out and f"searchgym memory repair {tmp_path}" in out
    assert main(["memory", "repair", str(tmp_path)]) == 0
    assert "kept 2 records, dropped 1 corrupt lines" in capsys.readouterr().out
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

    # A line the loader refuses (an unknown key) is named with its line, 4; repair drops exactly it.
    MemoryStore(tmp_path).log("hiexp_levels").append(
        {**record(1, "reasoning", "Case C").to_dict(), "note": "x"}
    )
    assert main(["memory", "show", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "hiexp_levels.jsonl, line 4" in err and "unknown ['note']" in err
    assert f"searchgym memory repair {tmp_path}" in err
    assert main(["memory", "repair", str(tmp_path)]) == 0
    assert "kept 3 records, dropped 1 corrupt lines" in capsys.readouterr().out
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
    mins = MinToolCallStore(tmp_path / "min_tool_calls.jsonl")
    for i in range(3):
        memory.add(_trajectory(f"q{i}"))
        mins.update(f"q{i}", i)
    memory.step()
    MemoryStore(tmp_path).snapshot(1)
    for i in range(3, 5):  # work after the checkpoint, lost by the crash that follows
        memory.add(_trajectory(f"q{i}"))
        mins.update("q1", 0)
    memory.step()
    assert MemoryStore(tmp_path).log("snapshots").read()[0][0]["counts"] == {
        "trajectories": 3,
        "bank": 0,
        "updates": 1,
        "min_tool_calls": 3,
    }
    moved = MemoryStore(tmp_path).restore(1)
    assert moved == {"trajectories": 2, "bank": 0, "updates": 1, "min_tool_calls": 1}
    again = ExperienceMemory(tmp_path, update_every=1)
    assert len(again) == 3 and again.steps == 1
    assert mins.minima() == {"q0": 0, "q1": 1, "q2": 2}  # a reader of the old file reads the new one
    assert MinToolCallStore(tmp_path / "min_tool_calls.jsonl").minima() == {"q0": 0, "q1": 1, "q2": 2}
    assert len((tmp_path / "trajectories.jsonl.after-step-1").read_text().splitlines()) == 2  # kept aside
    with pytest.raises(DataFileError, match=r"No snapshot of step 7 .*snapshots: \[1\]"):
        MemoryStore(tmp_path).restore(7)
