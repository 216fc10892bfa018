"""Resuming the built-in GRPO trainer from damaged, old-style and hostile checkpoints."""

from __future__ import annotations

import json
import logging
import os
import pickle
import random
import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import numpy as np  # noqa: E402

from searchgym.envs.errors import DataFileError  # noqa: E402
from searchgym.envs.rewards import LightSearcherReward, MinToolCallStore  # noqa: E402
from searchgym.policies.tiny import build_tiny_lm  # noqa: E402
from searchgym.trainers.config import ConfigError, TrainConfig  # noqa: E402
from searchgym.trainers.grpo import GRPOTrainer, list_checkpoints  # noqa: E402

ENV_ID = "searchgym/SyntheticFacts-v0"
MINIMA = {"q-seen-once": 3, "q-seen-twice": 1}


@pytest.fixture(scope="module")
def tiny_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("tiny")
    build_tiny_lm(root, hidden_size=32, num_layers=1)
    return root


def make_config(tiny_root: Path, out: Path, reward: str = "lightsearcher", steps: int = 2) -> TrainConfig:
    return TrainConfig.from_dict(
        {
            "output_dir": str(out),
            "steps": steps,
            "seed": 0,
            "env": {"id": ENV_ID, "kwargs": {"reward": reward, "max_turns": 2}},
            "model": {"tiny": {"dir": str(tiny_root), "hidden_size": 32, "num_layers": 1}},
            "rollout": {
                "group_size": 2,
                "questions_per_step": 1,
                "max_new_tokens": 4,
                "max_context_tokens": 512,
            },
            "algo": {"lr": 1e-3, "kl_coef": 0.0, "micro_batch_size": 4},
            "checkpoint": {"every": 1, "keep_last": 5},
        }
    )


def train_run(tiny_root: Path, out: Path, reward: str) -> Path:
    trainer = GRPOTrainer(make_config(tiny_root, out, reward), progress=False)
    trainer.setup()
    if reward == "lightsearcher":
        for qid, n in MINIMA.items():  # what good answers would have taught it
            trainer.reward_scheme.store.update(qid, n)
    trainer.train()
    trainer.close()
    assert [s for s, _ in list_checkpoints(out)] == [1, 2]
    return out


@pytest.fixture(scope="module")
def lightsearcher_run(tiny_root, tmp_path_factory) -> Path:
    """A finished two-step LightSearcher run with checkpoints after steps 1 and 2."""
    return train_run(tiny_root, tmp_path_factory.mktemp("ls") / "run", "lightsearcher")


@pytest.fixture(scope="module")
def f1_run(tiny_root, tmp_path_factory) -> Path:
    """The same with the stateless F1 reward."""
    return train_run(tiny_root, tmp_path_factory.mktemp("f1") / "run", "f1")


def resume(
    tiny_root: Path, run: Path, tmp_path: Path, damage=None, reward: str = "lightsearcher"
) -> GRPOTrainer:
    """Copy ``run``, apply ``damage(newest checkpoint)``, and set up a trainer that resumes it."""
    copy = shutil.copytree(run, tmp_path / "run")
    newest = copy / "checkpoints" / "step_000002"
    if damage is not None:
        damage(newest)
    trainer = GRPOTrainer(make_config(tiny_root, copy, reward, steps=4), progress=False)
    trainer.setup()
    return trainer


def test_the_reward_state_is_json_and_comes_back_on_resume(tiny_root, lightsearcher_run, tmp_path):
    newest = lightsearcher_run / "checkpoints" / "step_000002"
    assert not (newest / "reward.pkl").exists()
    saved = json.loads((newest / "reward.json").read_text())
    assert saved["scheme"] == "lightsearcher"
    assert saved["state"]["min_tool_calls"].items() >= MINIMA.items()
    trainer = resume(tiny_root, lightsearcher_run, tmp_path)
    trainer.close()
    assert trainer.resumed_from is not None and trainer.resumed_from.name == "step_000002"
    assert trainer.state.step == 2
    assert trainer.reward_scheme.store.minima() == saved["state"]["min_tool_calls"]


def drop(name: str):
    return lambda folder: (folder / name).unlink()


def drop_reward(folder: Path) -> None:
    for name in ("reward.json", "reward.pkl"):  # reward.pkl: where searchgym kept it before
        (folder / name).unlink(missing_ok=True)


def truncate(name: str):
    def damage(folder: Path) -> None:
        data = (folder / name).read_bytes()
        (folder / name).write_bytes(data[: len(data) // 2])

    return damage


def garbage(name: str):
    return lambda folder: (folder / name).write_bytes(b"\x00\x17 not a checkpoint file {")


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (drop_reward, r"step_000002.*has no reward\.json.*'lightsearcher' reward keeps a state"),
        (
            drop("trainer_state.json"),
            r"newest checkpoint .*step_000002.* has no trainer_state\.json.*older one",
        ),
        (
            garbage("trainer_state.json"),
            r"step_000002.*not a complete checkpoint \(trainer_state\.json unreadable",
        ),
        (
            lambda f: (f / "trainer_state.json").write_text('{"step": 5, "history": []}'),
            r"trainer_state\.json' says step 5, but its folder is 'step_000002'",
        ),
        (drop("optimizer.pt"), r"step_000002.* has no optimizer\.pt"),
        (truncate("optimizer.pt"), r"step_000002/optimizer\.pt.* truncated or corrupt"),
        (drop("rng.pt"), r"step_000002.* has no rng\.pt"),
        (truncate("rng.pt"), r"step_000002/rng\.pt.* truncated or corrupt"),
        (garbage("scheduler.pt"), r"step_000002/scheduler\.pt.* truncated or corrupt"),
        (garbage("reward.json"), r"step_000002/reward\.json.* unreadable"),
        (lambda f: shutil.rmtree(f / "model"), r"step_000002.* has no model/ folder"),
    ],
    ids=[
        "no-reward",
        "no-state",
        "garbage-state",
        "wrong-step",
        "no-optimizer",
        "cut-optimizer",
        "no-rng",
        "cut-rng",
        "garbage-scheduler",
        "garbage-reward",
        "no-model",
    ],
)
def test_a_damaged_checkpoint_is_an_error_that_names_the_file(
    tiny_root, lightsearcher_run, tmp_path, damage, message
):
    with pytest.raises(DataFileError, match=message) as caught:
        resume(tiny_root, lightsearcher_run, tmp_path, damage)
    text = str(caught.value)
    assert "{output_dir}" not in text and len(text.splitlines()) == 1
    assert "move the damaged folder aside" in text.lower()
    # Nothing newer is lost: both checkpoints are still there for the user to repair.
    assert sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir()) == [
        "step_000001",
        "step_000002",
    ]


def test_moving_the_damaged_checkpoint_aside_resumes_from_the_one_before(
    tiny_root, lightsearcher_run, tmp_path
):
    def move_aside(folder: Path) -> None:
        (folder / "trainer_state.json").unlink()
        folder.rename(tmp_path / "aside")

    trainer = resume(tiny_root, lightsearcher_run, tmp_path, move_aside)
    trainer.close()
    assert trainer.resumed_from is not None and trainer.resumed_from.name == "step_000001"
    assert trainer.state.step == 1


def test_resuming_an_older_checkpoint_by_path_never_overwrites_newer_ones(
    tiny_root, lightsearcher_run, tmp_path
):
    copy = shutil.copytree(lightsearcher_run, tmp_path / "run")
    config = make_config(tiny_root, copy, steps=4)
    config.checkpoint.resume = str(copy / "checkpoints" / "step_000001")
    with pytest.raises(
        ConfigError, match=r"holds checkpoints newer than step 1 \(step_000002\), which this run would"
    ):
        GRPOTrainer(config, progress=False).setup()
    elsewhere = make_config(tiny_root, tmp_path / "branch", steps=4)
    elsewhere.checkpoint.resume = str(copy / "checkpoints" / "step_000001")
    trainer = GRPOTrainer(elsewhere, progress=False)  # another output_dir holds nothing newer
    trainer.setup()
    trainer.close()
    assert trainer.state.step == 1 and trainer.reward_scheme.store.minima().items() >= MINIMA.items()


def test_a_stateless_reward_resumes_without_its_file_and_says_so(tiny_root, f1_run, tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="searchgym"):
        trainer = resume(tiny_root, f1_run, tmp_path, drop_reward, reward="f1")
    trainer.close()
    assert trainer.state.step == 2
    assert any("has no reward.json; the 'f1' reward keeps no state" in r.getMessage() for r in caplog.records)


def test_a_checkpoint_of_another_reward_is_refused(tiny_root, lightsearcher_run, tmp_path):
    with pytest.raises(DataFileError, match=r"state of the 'lightsearcher' reward, but this run uses 'f1'"):
        resume(tiny_root, lightsearcher_run, tmp_path, reward="f1")


def test_a_stateless_rewards_checkpoint_resumes_under_another_reward(tiny_root, f1_run, tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="searchgym"):
        trainer = resume(tiny_root, f1_run, tmp_path, reward="lightsearcher")
    trainer.close()
    assert trainer.state.step == 2 and trainer.reward_scheme.store.minima() == {}
    assert any("the 'lightsearcher' reward starts afresh" in r.getMessage() for r in caplog.records)


# -- no code execution on resume ---------------------------------------------------------------


class Payload:
    """Unpickling this makes the folder ``marker``: proof that the checkpoint ran code."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (str(self.marker),))


def test_a_malicious_reward_pickle_is_not_executed(tiny_root, lightsearcher_run, tmp_path):
    marker = tmp_path / "pwned"

    def plant(folder: Path) -> None:  # an old-style checkpoint whose reward.pkl runs code
        drop_reward(folder)
        (folder / "reward.pkl").write_bytes(pickle.dumps(Payload(marker)))

    with pytest.raises(DataFileError, match=r"reward\.pkl.* refers to code outside .*convert_reward_pickle"):
        resume(tiny_root, lightsearcher_run, tmp_path, plant)
    assert not marker.exists()


def test_a_malicious_rng_file_is_not_executed(tiny_root, lightsearcher_run, tmp_path):
    marker = tmp_path / "pwned"

    def plant(folder: Path) -> None:
        torch.save(
            {"python": random.getstate(), "torch": torch.get_rng_state(), "x": Payload(marker)},
            folder / "rng.pt",
        )

    with pytest.raises(DataFileError, match=r"rng\.pt.* holds more than tensors and numbers"):
        resume(tiny_root, lightsearcher_run, tmp_path, plant)
    assert not marker.exists()


def test_a_malicious_model_weights_file_is_not_executed(tiny_root, lightsearcher_run, tmp_path):
    marker = tmp_path / "pwned"

    def plant(folder: Path) -> None:  # pickled weights instead of safetensors
        for weights in (folder / "model").glob("*.safetensors"):
            weights.unlink()
        torch.save({"model.embed_tokens.weight": Payload(marker)}, folder / "model" / "pytorch_model.bin")

    with pytest.raises(
        DataFileError, match=r"step_000002/model' cannot be loaded \(UnpicklingError: Weights only"
    ):
        resume(tiny_root, lightsearcher_run, tmp_path, plant)
    assert not marker.exists()


def make_old_style(folder: Path) -> None:
    """Rewrite a checkpoint as searchgym wrote it before reward.json: pickled reward and NumPy RNG state."""
    state = json.loads((folder / "reward.json").read_text())["state"]["min_tool_calls"]
    store = MinToolCallStore()
    for qid, n in state.items():
        store.update(qid, n)
    (folder / "reward.json").unlink()
    (folder / "reward.pkl").write_bytes(pickle.dumps(LightSearcherReward(store=store)))
    rng = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    torch.save(rng, folder / "rng.pt")


def test_an_old_style_checkpoint_of_searchgyms_own_reward_still_resumes(
    tiny_root, lightsearcher_run, tmp_path
):
    trainer = resume(tiny_root, lightsearcher_run, tmp_path, make_old_style)
    trainer.close()
    assert trainer.state.step == 2
    assert trainer.reward_scheme.store.minima().items() >= MINIMA.items()


def test_a_trusted_old_pickle_converts_to_json(lightsearcher_run, tmp_path):
    from searchgym.trainers.grpo.checkpoint import convert_reward_pickle, load_checkpoint

    folder = shutil.copytree(lightsearcher_run / "checkpoints" / "step_000002", tmp_path / "step_000002")
    make_old_style(folder)
    written = convert_reward_pickle(folder)
    assert not (folder / "reward.pkl").exists()
    assert json.loads(written.read_text())["state"]["min_tool_calls"].items() >= MINIMA.items()
    assert load_checkpoint(folder).reward == json.loads(written.read_text())
