"""What a new user meets in the first hour: leftover temp folders, tracebacks, bare TypeErrors."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import gymnasium as gym
import pytest
from test_openrlhf_launch import BASE, write

import searchgym  # noqa: F401  (registers the ids)
from searchgym.error import SearchGymError, UnknownNameError
from searchgym.models import ModelNotPulledError, resolve_model
from searchgym.policies import make_policy
from searchgym.trainers.openrlhf import launch
from searchgym.trainers.openrlhf.flags import openrlhf_parser

ROOT = Path(__file__).resolve().parents[2]
SUBMIT_BASE = BASE.replace("openrlhf:\n", "openrlhf:\n  launch: {ray_address: 'http://10.0.0.1:8265'}\n")
needs_openrlhf = pytest.mark.skipif(openrlhf_parser() is None, reason="needs openrlhf==0.11.2 (--no-deps)")


@pytest.fixture
def temp_folder(tmp_path, monkeypatch) -> Path:
    """A fresh temporary folder for ``tempfile`` (what $TMPDIR sets)."""
    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


@needs_openrlhf
def test_a_cluster_dry_run_leaves_no_staging_folder(tmp_path, temp_folder, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    out = io.StringIO()
    assert launch(write(tmp_path, SUBMIT_BASE), dry_run=True, out=out) == 0
    assert "working_dir" in out.getvalue()  # the runtime env ships files ...
    assert list(temp_folder.iterdir()) == []  # ... staged for the check and removed after it
    assert "this dry run removed its copy" in capsys.readouterr().err


@needs_openrlhf
def test_a_submitted_run_without_the_ray_command_is_one_line(tmp_path, temp_folder, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # no `ray` on it
    with pytest.raises(SearchGymError, match=r"no 'ray' command: pip install 'ray\[default\]'") as caught:
        launch(write(tmp_path, SUBMIT_BASE), out=io.StringIO())
    assert len(str(caught.value).splitlines()) == 1
    assert list(temp_folder.iterdir()) == []  # a failed launch removes them too


def test_multi_node_without_ray_says_what_to_install(tmp_path):
    done = subprocess.run(
        ["/bin/bash", str(ROOT / "examples" / "openrlhf" / "multi_node.sh")],
        env={"PATH": "/usr/bin:/bin", "ROLE": "submit", "SHARED": str(tmp_path), "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "multi_node.sh: the 'ray' command is missing: pip install 'openrlhf[vllm]==0.11.2' 'ray[default]' on every "
        "node (DRY_RUN=1 prints the commands without it)"
    ]


def evaluate_py(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "examples" / "openrlhf" / "evaluate.py"), *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(ROOT / "tests")},
        timeout=300,
    )


def test_evaluate_without_vllm_is_one_line_naming_the_hf_flag(tmp_path):
    pytest.importorskip("openrlhf")
    import importlib.util

    if importlib.util.find_spec("vllm"):
        pytest.skip("vLLM is installed here")
    config = ROOT / "configs" / "openrlhf" / "lightsearcher.yaml"
    data = tmp_path / "q.jsonl"
    data.write_text('{"id": "q1", "question": "who?", "golden_answers": ["x"]}\n')
    done = evaluate_py("--config", str(config), "--model", str(tmp_path), "--data", str(data), cwd=ROOT)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("evaluate.py: error: The vllm policy needs vLLM") and "--policy hf" in line


def test_evaluate_runs_the_hf_policy_with_the_flag(tmp_path):
    pytest.importorskip("transformers")
    from searchgym.policies.tiny import build_tiny_lm

    model = build_tiny_lm(tmp_path / "tiny", hidden_size=32, num_layers=1)
    (tmp_path / "corpus.jsonl").write_text('{"id": "d1", "title": "Paris", "text": "Paris is in France."}\n')
    (tmp_path / "q.jsonl").write_text(
        '{"id": "q1", "question": "where is paris", "golden_answers": ["France"]}\n'
    )
    config = tmp_path / "run.yaml"
    config.write_text(
        "backend: openrlhf\n"
        "env: {id: searchgym/NQ-v1, corpus_path: corpus.jsonl, protocol: search_r1, max_turns: 2}\nopenrlhf: {}\n"
    )
    out = tmp_path / "eval.json"
    done = evaluate_py(
        "--config", str(config), "--model", str(model), "--data", "q.jsonl", "--retriever", "bm25",
        "--policy", f"hf:{model}?max_new_tokens=4", "--episodes", "2", "--out", str(out), cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert '"policy": "hf:' in done.stdout and out.is_file()


def test_a_misspelled_env_argument_gets_a_did_you_mean():
    with pytest.raises(
        UnknownNameError, match=r"Unknown argument 'top_k' of SyntheticFactsEnv\. Did you mean 'topk'\?"
    ):
        gym.make("searchgym/SyntheticFacts-v1", top_k=3)
    with pytest.raises(TypeError):  # still what Python raises for an unknown keyword
        gym.make("searchgym/SyntheticFacts-v1", max_turn=3)


def test_a_near_miss_of_a_registered_model_names_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ModelNotPulledError) as caught:
        make_policy("hf:smollm2-135m")
    message = str(caught.value)
    assert "Did you mean 'smollm2-135m-instruct'?" in message and "searchgym models list" in message
    assert resolve_model("Qwen/Qwen2.5-3B-Instruct") == "Qwen/Qwen2.5-3B-Instruct"  # hub names pass
    assert resolve_model("gpt2") == "gpt2"
