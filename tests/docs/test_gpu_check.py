"""``benchmarks/gpu_check.py`` on CPU (its CUDA parts skipped) and the page generated from its results."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytest.importorskip("torch")
pytest.importorskip("transformers")


@pytest.mark.slow
def test_gpu_check_runs_on_cpu_with_one_json_line_per_measurement(tmp_path):
    out = tmp_path / "check.jsonl"
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "gpu_check.py"),
            "--episodes",
            "8",
            "--steps",
            "1",
            "--max-turns",
            "2",
            "--max-new-tokens",
            "8",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    printed = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert printed == [json.loads(line) for line in out.read_text().splitlines()]
    by_check = {(r["check"], r.get("device")): r for r in printed}
    machine = by_check[("machine", None)]
    if not machine["cuda"]:
        assert (
            "skipped" in by_check[("builtin_trainer", "cuda")]
            and "skipped" in by_check[("dense_retrieval", None)]
        )
    cpu = by_check[("builtin_trainer", "cpu")]
    assert cpu["size"] == "tiny" and cpu["episodes_per_step"] == 8 and cpu["parameters_m"] > 0
    assert 0 < cpu["rollout_s"] < cpu["step_s"] and 0 < cpu["update_s"] < cpu["step_s"]
    jax = by_check[("jax_gpu_memory", None)]
    assert ("skipped" in jax) != machine["jax_installed"]
    if machine["jax_installed"]:
        assert jax["ok"], jax  # searchgym's retrieval must not start JAX on its account


def test_docs_gpu_page_matches_the_committed_results():
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu_doc.py"), "--check"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    page = (ROOT / "docs" / "openrlhf.md").read_text()
    assert (
        "NVIDIA H100 80GB: measured on one H100 (80 GB)" in page
        and "| qwen2.5-3b | cuda | bfloat16 | 13.4 |" in page
    )
