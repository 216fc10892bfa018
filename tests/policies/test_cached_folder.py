"""build_once: a folder is built once, published whole, and a failed build leaves nothing."""

from __future__ import annotations

import json
import threading
import time

import pytest

from searchgym.policies.cached_folder import build_once


def test_a_folder_is_built_once_and_marked_done(tmp_path):
    calls = []

    def build(staging):
        calls.append(staging)
        (staging / "weights.bin").write_bytes(b"\x00" * 8)
        return {"lessons": 3}

    target = tmp_path / "cache" / "model-abc"
    assert build_once(target, "done.json", build) == target
    assert json.loads((target / "done.json").read_text()) == {"lessons": 3}
    assert (target / "weights.bin").stat().st_size == 8
    assert build_once(target, "done.json", build) == target
    assert len(calls) == 1
    assert sorted(p.name for p in target.parent.iterdir()) == [
        ".model-abc.lock",
        "model-abc",
    ]  # no staging left


def test_a_failed_build_leaves_nothing_behind(tmp_path):
    def build(staging):
        (staging / "half.bin").write_bytes(b"\x00")
        raise RuntimeError("out of memory")

    target = tmp_path / "model-abc"
    with pytest.raises(RuntimeError, match="out of memory"):
        build_once(target, "done.json", build)
    assert [p.name for p in tmp_path.iterdir()] == [".model-abc.lock"]


def test_a_second_caller_waits_for_the_running_build_instead_of_building_again(tmp_path):
    started, calls = threading.Event(), []

    def build(staging):
        calls.append(staging)
        started.set()
        time.sleep(0.3)
        (staging / "weights.bin").write_bytes(b"\x01")
        return {}

    target = tmp_path / "model-abc"
    first = threading.Thread(target=build_once, args=(target, "done.json", build))
    first.start()
    assert started.wait(5)
    assert build_once(target, "done.json", build) == target  # blocks until the first is done
    first.join()
    assert len(calls) == 1 and (target / "weights.bin").read_bytes() == b"\x01"


def test_a_killed_builds_staging_folder_is_removed_by_the_next_build(tmp_path):
    stale = tmp_path / ".model-abc.x1y2"
    stale.mkdir()
    (stale / "half.bin").write_bytes(b"\x00")
    other = tmp_path / ".model-xyz.x1y2"  # another folder's build: left alone
    other.mkdir()
    target = build_once(tmp_path / "model-abc", "done.json", lambda staging: {})
    assert not stale.exists() and other.exists() and (target / "done.json").is_file()


def test_a_folder_that_is_not_current_is_rebuilt_and_the_old_one_removed(tmp_path):
    target = build_once(tmp_path / "model-abc", "done.json", lambda staging: {"version": 1})
    (target / "old.bin").write_bytes(b"\x00")

    def build(staging):
        (staging / "new.bin").write_bytes(b"\x01")
        return {"version": 2}

    current = lambda report: report.get("version") == 2  # noqa: E731
    assert build_once(target, "done.json", build, current) == target
    assert sorted(p.name for p in target.iterdir()) == ["done.json", "new.bin"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [".model-abc.lock", "model-abc"]
    (target / "done.json").write_text("{not json")  # an unreadable report is not current either
    assert json.loads((build_once(target, "done.json", build, current) / "done.json").read_text()) == {
        "version": 2
    }
