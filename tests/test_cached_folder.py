"""build_once: a folder is built once, published whole, and a failed build leaves nothing."""

from __future__ import annotations

import json

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
    assert [p.name for p in target.parent.iterdir()] == ["model-abc"]  # no staging folder left


def test_a_failed_build_leaves_nothing_behind(tmp_path):
    def build(staging):
        (staging / "half.bin").write_bytes(b"\x00")
        raise RuntimeError("out of memory")

    target = tmp_path / "model-abc"
    with pytest.raises(RuntimeError, match="out of memory"):
        build_once(target, "done.json", build)
    assert list(tmp_path.iterdir()) == []
