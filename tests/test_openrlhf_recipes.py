"""The recipes under ``examples/openrlhf/`` run in their dry-run mode: every step printed, the run files checked."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from searchgym.trainers.openrlhf.flags import openrlhf_parser

ROOT = Path(__file__).resolve().parents[1]
RECIPES = ROOT / "examples" / "openrlhf"
pytestmark = [
    pytest.mark.skipif(openrlhf_parser() is None, reason="needs openrlhf==0.11.2 (--no-deps)"),
    pytest.mark.slow,  # each `searchgym train --dry-run` starts a Python process
]


def training_rows(folder: Path) -> Path:
    """LightSearcher's 7,000 training rows as `searchgym prepare` writes them (the dry run counts them)."""
    path = folder / "data" / "lightsearcher_train.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"prompt": f"q{i}", "label": "{}"}) + "\n" for i in range(7000)))
    return path


def dry_run(script: str, tmp_path: Path, cwd: Path = ROOT, **env: str) -> str:
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    done = subprocess.run(
        ["bash", str(RECIPES / script)],
        cwd=cwd,
        env={**os.environ, "PATH": path, "DRY_RUN": "1", "DATA": str(tmp_path / "data"), **env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_prepare_data_covers_parquet_and_flashrag(tmp_path):
    out = dry_run("prepare_data.sh", tmp_path)
    assert "searchgym prepare --dataset nq --data-path" in out and "train.parquet" in out
    assert "--dataset musique:3000 --dataset 2wikimultihopqa:4000 --protocol tool_call" in out
    assert not (tmp_path / "data").exists()  # a dry run changes nothing


def test_one_node_recipe_checks_its_run_file(tmp_path):
    # The recipe's own step 3 writes the rows; its dry run only prints that step.
    run = tmp_path / "lightsearcher.yaml"
    run.write_text(
        f"extends: {ROOT / 'configs' / 'openrlhf' / 'lightsearcher.yaml'}\n"
        f"openrlhf: {{data: {{prompt_dataset: {training_rows(tmp_path / 'rows')}}}}}\n"
    )
    out = dry_run("one_node_8gpu.sh", tmp_path, CONFIG=str(run))
    assert "searchgym serve --index" in out and "e5_Flat.index" in out
    # the train step really ran `searchgym train --dry-run`: the composed, checked command
    train = next(line for line in out.splitlines() if "searchgym.trainers.openrlhf.train_ppo" in line)
    assert "--actor.num_gpus_per_node 8" in train and "--ckpt.load_enable" in train
    assert '"policy": "vllm:runs/lightsearcher/model"' in out  # evaluate.py's plan


def test_multi_node_recipe_submits_a_job_with_the_runtime_env(tmp_path):
    training_rows(tmp_path)  # relative paths are taken from the launch directory
    out = dry_run(
        "multi_node.sh", tmp_path, cwd=tmp_path, ROLE="submit", SHARED=str(tmp_path), HEAD="10.0.0.1"
    )
    submit = next(line for line in out.splitlines() if line.startswith("ray job submit"))
    assert "--address http://10.0.0.1:8265" in submit and "worker_process_setup_hook" in submit
    assert "--actor.num_nodes 2" in submit and "--vllm.num_engines 16" in submit
    config = (tmp_path / "runs" / "lightsearcher_2nodes.yaml").read_text()
    assert "http://10.0.0.1:8000" in config  # retrieval on an address the other nodes reach
    head = dry_run("multi_node.sh", tmp_path, ROLE="head")
    assert "ray start --head" in head and "--host 0.0.0.0" in head
