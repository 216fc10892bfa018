"""Resuming a built-in GRPO run under another config is refused; a finished run says so."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import yaml  # noqa: E402

from searchgym.cli import main  # noqa: E402
from searchgym.envs.config_base import dump_yaml  # noqa: E402
from searchgym.policies.tiny import build_tiny_lm  # noqa: E402
from searchgym.trainers.config import TrainConfig  # noqa: E402
from searchgym.trainers.grpo import GRPOTrainer, list_checkpoints  # noqa: E402
from searchgym.trainers.grpo.resume_check import (  # noqa: E402
    ABSENT,
    ResumeMismatchError,
    config_changes,
    saved_config,
)
from searchgym.trainers.run_spec import convert  # noqa: E402


@pytest.fixture(scope="module")
def tiny_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("tiny")
    build_tiny_lm(root, hidden_size=32, num_layers=1)
    return root


def run_data(tiny_root: Path, out: Path, **changes) -> dict:
    data = {
        "output_dir": str(out),
        "steps": 2,
        "env": {"id": "searchgym/SyntheticFacts-v1", "kwargs": {"reward": "f1", "max_turns": 2}},
        "model": {"tiny": {"dir": str(tiny_root), "hidden_size": 32, "num_layers": 1}},
        "rollout": {"group_size": 2, "questions_per_step": 1, "max_new_tokens": 4, "max_context_tokens": 512},
        "algo": {"lr": 1e-3, "kl_coef": 0.0, "micro_batch_size": 4},
        "checkpoint": {"every": 1, "keep_last": 5},
    }
    for dotted, value in changes.items():
        *parents, last = dotted.split("__")
        node = data
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    return data


@pytest.fixture(scope="module")
def finished_run(tiny_root, tmp_path_factory) -> Path:
    """A two-step F1 run, finished, with checkpoints after steps 1 and 2."""
    out = tmp_path_factory.mktemp("run") / "run"
    trainer = GRPOTrainer(TrainConfig.from_dict(run_data(tiny_root, out)), progress=False)
    trainer.train()
    trainer.close()
    assert [s for s, _ in list_checkpoints(out)] == [1, 2]
    return out


def cli_train(tmp_path: Path, data: dict) -> int:
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(convert(data)), encoding="utf-8")  # as a run file
    return main(["train", "--config", str(config), "--no-progress"])


def test_a_resume_with_another_reward_is_refused_naming_the_keys(tiny_root, finished_run, tmp_path, capsys):
    copy = shutil.copytree(finished_run, tmp_path / "run")
    data = run_data(tiny_root, copy, steps=4, env__kwargs__reward="lightsearcher", rollout__group_size=3)
    assert cli_train(tmp_path, data) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("searchgym: error:")]
    assert len(lines) == 1, err
    assert "env.reward: 'f1' → 'lightsearcher'" in lines[0]  # named by the run file's keys
    assert "builtin.rollout.group_size: 2 → 3" in lines[0]
    assert "steps" not in lines[0].split("(checkpoint")[1].split(". Resuming")[0]  # steps may change
    assert "choose another output_dir" in lines[0] and "builtin.checkpoint.allow_changes" in lines[0]
    assert "Resumed" not in err
    assert [s for s, _ in list_checkpoints(copy)] == [1, 2]  # nothing trained, nothing written


def test_a_finished_run_says_it_is_finished_and_how_to_extend_it(tiny_root, finished_run, tmp_path, capsys):
    copy = shutil.copytree(finished_run, tmp_path / "run")
    assert cli_train(tmp_path, run_data(tiny_root, copy)) == 0
    err = capsys.readouterr().err
    assert "is a finished run: it has 2 steps (checkpoint step_000002)" in err
    assert "raise steps above 2" in err
    assert "Resumed" not in err and "done:" not in err


def test_the_settings_that_may_change_resume_and_train_on(tiny_root, finished_run, tmp_path, caplog):
    copy = shutil.copytree(finished_run, tmp_path / "run")
    data = run_data(
        tiny_root,
        copy,
        steps=3,
        log_every=2,
        checkpoint__keep_last=1,
        wandb__tags=["resumed"],
        model__cpu_threads=1,
    )
    trainer = GRPOTrainer(TrainConfig.from_dict(data), progress=False)
    with caplog.at_level(logging.INFO, logger="searchgym"):
        state = trainer.train()
    trainer.close()
    assert state.step == 3 and not trainer.finished
    assert any(r.getMessage().startswith("Resumed from") for r in caplog.records)
    assert [s for s, _ in list_checkpoints(copy)] == [3]


def test_allow_changes_lets_a_named_key_change(tiny_root, finished_run, tmp_path):
    copy = shutil.copytree(finished_run, tmp_path / "run")
    data = run_data(tiny_root, copy, steps=3, env__kwargs__reward="em")
    with pytest.raises(ResumeMismatchError, match=r"env\.reward: 'f1' → 'em'"):
        GRPOTrainer(TrainConfig.from_dict(data), progress=False).setup()
    data["checkpoint"]["allow_changes"] = ["env.kwargs.reward"]
    trainer = GRPOTrainer(TrainConfig.from_dict(data), progress=False)
    state = trainer.train()
    trainer.close()
    assert state.step == 3


def test_a_setting_newer_than_the_checkpoint_counts_as_its_default(tiny_root, tmp_path):
    config = TrainConfig.from_dict(run_data(tiny_root, tmp_path / "run"))
    written = yaml.safe_load(dump_yaml(config))
    del written["algo"]["tsas_variant"]  # as a searchgym without that setting wrote it
    file = tmp_path / "config.yaml"
    file.write_text(yaml.safe_dump(written), encoding="utf-8")
    assert config_changes(saved_config(file, TrainConfig), yaml.safe_load(dump_yaml(config))) == {}


def test_an_env_option_added_or_dropped_is_a_change():
    saved = {"env": {"kwargs": {"reward": "f1"}}, "steps": 2}
    new = {"env": {"kwargs": {"reward": "f1", "topk": 3}}, "steps": 9}
    assert config_changes(saved, new) == {"env.kwargs.topk": (ABSENT, 3)}
    assert config_changes(new, saved) == {"env.kwargs.topk": (3, ABSENT)}
    assert config_changes(saved, new, allow=["env.kwargs"]) == {}
