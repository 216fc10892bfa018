"""``searchgym train`` writes each step's figures to ``metrics.jsonl``; ``searchgym plot`` draws them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("matplotlib")

from searchgym.cli import main  # noqa: E402
from searchgym.policies.tiny import build_tiny_lm  # noqa: E402
from searchgym.trainers.config import TrainConfig  # noqa: E402
from searchgym.trainers.grpo import GRPOTrainer  # noqa: E402
from searchgym.trainers.grpo.metrics_file import read_metrics  # noqa: E402


def config(tiny_root: Path, out: Path, steps: int) -> TrainConfig:
    return TrainConfig.from_dict(
        {
            "output_dir": str(out),
            "steps": steps,
            "env": {"id": "searchgym/SyntheticFacts-v1", "kwargs": {"reward": "f1", "max_turns": 2}},
            "model": {"tiny": {"dir": str(tiny_root), "hidden_size": 32, "num_layers": 1}},
            "rollout": {
                "group_size": 2,
                "questions_per_step": 1,
                "max_new_tokens": 4,
                "max_context_tokens": 512,
            },
            "algo": {"lr": 1e-3, "kl_coef": 0.0, "micro_batch_size": 4},
            "checkpoint": {"every": 2, "keep_last": 5},
        }
    )


@pytest.fixture(scope="module")
def tiny_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("tiny")
    build_tiny_lm(root, hidden_size=32, num_layers=1)
    return root


@pytest.fixture(scope="module")
def run_dir(tiny_root, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("run") / "run"
    trainer = GRPOTrainer(config(tiny_root, out, 2), progress=False)
    state = trainer.train()
    trainer.close()
    assert state.step == 2
    return out


def test_each_step_is_one_line_with_the_figures_of_the_history(run_dir):
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines]
    assert [r["step"] for r in rows] == [1, 2]
    history = json.loads((run_dir / "checkpoints" / "step_000002" / "trainer_state.json").read_text())[
        "history"
    ]
    for row, record in zip(rows, history, strict=True):
        assert row["rollout/reward"] == record["rollout"]["reward"]
        assert row["train/loss"] == record["train"]["loss"]
        assert 0.0 <= row["train/signal"] <= 1.0


def test_a_resume_keeps_each_step_once_and_redoes_the_lost_ones(tiny_root, run_dir, tmp_path):
    copy = shutil.copytree(run_dir, tmp_path / "run")
    with open(copy / "metrics.jsonl", "a") as handle:  # step 3 finished, then the run died before saving it
        handle.write(json.dumps({"step": 3, "rollout/reward": 123.0}) + "\n")
    trainer = GRPOTrainer(config(tiny_root, copy, 4), progress=False)
    state = trainer.train()
    trainer.close()
    rows = read_metrics(copy)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert rows[2]["rollout/reward"] == state.history[2]["rollout"]["reward"] != 123.0
    original = read_metrics(run_dir)
    assert rows[:2] == original  # the steps before the checkpoint, as the first run wrote them


def test_plot_writes_a_png_of_the_run(run_dir, tmp_path, capsys):
    import matplotlib.image

    out = tmp_path / "m.png"
    assert main(["plot", str(run_dir), "--out", str(out), "--keys", "rollout/reward,train/kl"]) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    image = matplotlib.image.imread(out)
    assert image.shape[0] > 100 and image.shape[1] > 2 * 100  # two panels side by side
    assert main(["plot", str(run_dir)]) == 0
    assert (run_dir / "metrics.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_of_a_folder_without_metrics_is_one_line(tmp_path, capsys):
    assert main(["plot", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "metrics.jsonl' does not exist" in err
