"""Resuming the built-in GRPO trainer from damaged, old-style and hostile checkpoints."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import pickle
import random
import re
import shutil
import tracemalloc
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import numpy as np  # noqa: E402

from searchgym.envs.rewards import LightSearcherReward, MinToolCallStore  # noqa: E402
from searchgym.error import DataFileError  # noqa: E402
from searchgym.policies.tiny import build_tiny_lm  # noqa: E402
from searchgym.trainers.config import ConfigError, TrainConfig  # noqa: E402
from searchgym.trainers.grpo import GRPOTrainer, list_checkpoints  # noqa: E402

ENV_ID = "searchgym/SyntheticFacts-v1"
MINIMA = {"q-seen-once": 3, "q-seen-twice": 1}


@pytest.fixture(scope="module")
def tiny_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("tiny")
    build_tiny_lm(root, hidden_size=32, num_layers=1)
    return root


def make_config(
    tiny_root: Path, out: Path, reward: str = "lightsearcher", steps: int = 2, seed: int = 0
) -> TrainConfig:
    return TrainConfig.from_dict(
        {
            "output_dir": str(out),
            "steps": steps,
            "seed": seed,
            "memory": {"kind": "lightsearcher", "update_every": 100},  # a store in {output_dir}/memory
            "env": {"id": ENV_ID, "kwargs": {"reward": reward, "max_turns": 2}},
            "model": {"tiny": {"dir": str(tiny_root), "hidden_size": 32, "num_layers": 1, "seed": seed}},
            "rollout": {
                "group_size": 2,
                "questions_per_step": 1,
                "max_new_tokens": 4,
                "max_context_tokens": 512,
            },
            "algo": {"lr": 1e-3 * (1 + seed), "kl_coef": 0.0, "micro_batch_size": 4},
            "checkpoint": {"every": 1, "keep_last": 5},
        }
    )


def train_run(tiny_root: Path, out: Path, reward: str, seed: int = 0) -> Path:
    trainer = GRPOTrainer(make_config(tiny_root, out, reward, seed=seed), progress=False)
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
def other_run(tiny_root, tmp_path_factory) -> Path:
    """Another LightSearcher run: another seed, initial weights and learning rate, so every file differs
    (in two steps the tiny model's updates can all be zero, so its init and learning rate are what
    set its weights and AdamW's state apart)."""
    return train_run(tiny_root, tmp_path_factory.mktemp("other") / "run", "lightsearcher", seed=1)


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
    config = make_config(tiny_root, copy, reward, steps=4)
    config.checkpoint.allow_changes = ["env.kwargs.reward"]  # some tests resume under another reward
    trainer = GRPOTrainer(config, progress=False)
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


def make_legacy(folder: Path) -> None:
    """Rewrite a checkpoint as searchgym wrote it before manifests: no manifest.json, no run id."""
    (folder / "manifest.json").unlink(missing_ok=True)
    state = json.loads((folder / "trainer_state.json").read_text())
    state.pop("run_id", None)
    (folder / "trainer_state.json").write_text(json.dumps(state, indent=1) + "\n")


def both(*damages):
    def damage(folder: Path) -> None:
        for one in damages:
            one(folder)

    return damage


SIZE_DIFFERS = (
    r"' holds [\d,]+ bytes where manifest\.json records [\d,]+: it is another run's file or a damaged one"
)


# (damage, message with a manifest, message without one: a checkpoint written by an older searchgym)
DAMAGES = {
    "no-reward": (
        drop_reward,
        r"step_000002.*has no reward\.json \(listed in manifest\.json\)",
        r"step_000002.*has no reward\.json.*'lightsearcher' reward keeps a state",
    ),
    "no-state": (
        drop("trainer_state.json"),
        r"newest checkpoint .*step_000002.* has no trainer_state\.json.*older one",
        r"newest checkpoint .*step_000002.* has no trainer_state\.json.*older one",
    ),
    "garbage-state": (
        garbage("trainer_state.json"),
        r"step_000002.*not a complete checkpoint \(trainer_state\.json unreadable",
        r"step_000002.*not a complete checkpoint \(trainer_state\.json unreadable",
    ),
    "wrong-step": (
        lambda f: (f / "trainer_state.json").write_text('{"step": 5, "history": []}'),
        r"trainer_state\.json' says step 5, but its folder is 'step_000002'",
        r"trainer_state\.json' says step 5, but its folder is 'step_000002'",
    ),
    "no-optimizer": (
        drop("optimizer.pt"),
        r"step_000002.* has no optimizer\.pt",
        r"step_000002.* has no optimizer\.pt",
    ),
    "cut-optimizer": (
        truncate("optimizer.pt"),
        r"step_000002/optimizer\.pt" + SIZE_DIFFERS,
        r"step_000002/optimizer\.pt' is truncated or corrupt",
    ),
    "no-rng": (drop("rng.pt"), r"step_000002.* has no rng\.pt", r"step_000002.* has no rng\.pt"),
    "cut-rng": (
        truncate("rng.pt"),
        r"step_000002/rng\.pt" + SIZE_DIFFERS,
        r"step_000002/rng\.pt' is truncated or corrupt",
    ),
    "garbage-scheduler": (
        garbage("scheduler.pt"),
        r"step_000002/scheduler\.pt" + SIZE_DIFFERS,
        r"step_000002/scheduler\.pt' is truncated or corrupt: it is not a file torch\.save writes",
    ),
    "garbage-reward": (
        garbage("reward.json"),
        r"step_000002/reward\.json" + SIZE_DIFFERS,
        r"step_000002/reward\.json' is unreadable",
    ),
    "no-model": (
        lambda f: shutil.rmtree(f / "model"),
        r"step_000002.* has no model/[\w.]+ \(listed in manifest\.json\)",
        r"step_000002.* has no model/ folder",
    ),
}


@pytest.mark.parametrize("legacy", [False, True], ids=["manifest", "no-manifest"])
@pytest.mark.parametrize("name", list(DAMAGES))
def test_a_damaged_checkpoint_is_an_error_that_names_the_file(
    tiny_root, lightsearcher_run, tmp_path, name, legacy
):
    damage, with_manifest, without = DAMAGES[name]
    with pytest.raises(DataFileError, match=without if legacy else with_manifest) as caught:
        resume(tiny_root, lightsearcher_run, tmp_path, both(make_legacy, damage) if legacy else damage)
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
        trainer = resume(tiny_root, f1_run, tmp_path, both(make_legacy, drop_reward), reward="f1")
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
        make_legacy(folder)
        drop_reward(folder)
        (folder / "reward.pkl").write_bytes(pickle.dumps(Payload(marker)))

    with pytest.raises(DataFileError, match=r"reward\.pkl.* refers to code outside .*convert_reward_pickle"):
        resume(tiny_root, lightsearcher_run, tmp_path, plant)
    assert not marker.exists()


def test_a_malicious_rng_file_is_not_executed(tiny_root, lightsearcher_run, tmp_path):
    marker = tmp_path / "pwned"

    def plant(folder: Path) -> None:
        make_legacy(folder)  # with a manifest, the changed file is refused before it is read
        torch.save(
            {"python": random.getstate(), "torch": torch.get_rng_state(), "x": Payload(marker)},
            folder / "rng.pt",
        )

    with pytest.raises(DataFileError, match=r"rng\.pt' holds a [\w.]+ object, not only tensors and numbers"):
        resume(tiny_root, lightsearcher_run, tmp_path, plant)
    assert not marker.exists()


def test_a_malicious_model_weights_file_is_not_executed(tiny_root, lightsearcher_run, tmp_path):
    marker = tmp_path / "pwned"

    def plant(folder: Path) -> None:  # pickled weights instead of safetensors
        make_legacy(folder)
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
    make_legacy(folder)
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


# -- what belongs together: the manifest --------------------------------------------------------


def tree_digest(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` with its SHA-256 (links listed as such, never followed)."""
    found = {}
    for path in sorted(folder.rglob("*")):
        if path.is_symlink():
            found[str(path.relative_to(folder))] = "link"
        elif path.is_file():
            found[str(path.relative_to(folder))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found


def test_every_checkpoint_lists_its_files_and_its_runs_id(tiny_root, lightsearcher_run, tmp_path):
    ids = set()
    for _, folder in list_checkpoints(lightsearcher_run):
        manifest = json.loads((folder / "manifest.json").read_text())
        files = {
            str(p.relative_to(folder)): p
            for p in folder.rglob("*")
            if p.is_file() and p.name != "manifest.json"
        }
        assert set(manifest["files"]) == set(files) and "memory/trajectories.sqlite" in files
        for name, path in files.items():
            data = path.read_bytes()
            assert manifest["files"][name] == {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        assert json.loads((folder / "trainer_state.json").read_text())["run_id"] == manifest["run_id"]
        ids.add(manifest["run_id"])
    assert len(ids) == 1  # one run, one id
    # A resumed run keeps its id in the checkpoints it writes next.
    trainer = resume(tiny_root, lightsearcher_run, tmp_path)
    trainer.train(1)
    trainer.close()
    third = tmp_path / "run" / "checkpoints" / "step_000003" / "manifest.json"
    assert json.loads(third.read_text())["run_id"] == ids.pop()


def copy_from(other: Path, name: str):
    """Damage: replace file or folder ``name`` of the checkpoint by the other run's."""

    def damage(folder: Path) -> None:
        source = other / "checkpoints" / folder.name / name
        if source.is_dir():
            shutil.rmtree(folder / name)
            shutil.copytree(source, folder / name)
        else:
            shutil.copy2(source, folder / name)

    return damage


@pytest.mark.parametrize(
    ("name", "named"),
    [
        ("optimizer.pt", "optimizer.pt"),
        ("rng.pt", "rng.pt"),
        ("trainer_state.json", "trainer_state.json"),
        ("model", "model/model.safetensors"),
        ("memory", "memory/"),  # its first file that differs (each store file has its database id)
    ],
)
def test_another_runs_file_in_the_checkpoint_is_refused_and_named(
    tiny_root, lightsearcher_run, other_run, tmp_path, caplog, name, named
):
    live = tmp_path / "run" / "memory"
    with caplog.at_level(logging.INFO, logger="searchgym"), pytest.raises(DataFileError) as caught:
        resume(tiny_root, lightsearcher_run, tmp_path, copy_from(other_run, name))
    text = str(caught.value)
    assert f"step_000002/{named}" in text and "another run's file" in text, text
    assert len(text.splitlines()) == 1
    assert not any(r.getMessage().startswith("Resumed") for r in caplog.records)
    assert tree_digest(live) == tree_digest(lightsearcher_run / "memory")  # the live store is untouched


def test_a_file_the_manifest_does_not_list_is_refused(tiny_root, lightsearcher_run, tmp_path):
    def add(folder: Path) -> None:  # weights that from_pretrained would read too
        shutil.copy2(folder / "model" / "model.safetensors", folder / "model" / "pytorch_model.bin")

    with pytest.raises(DataFileError, match=r"model/pytorch_model\.bin' is not part of this checkpoint"):
        resume(tiny_root, lightsearcher_run, tmp_path, add)


def test_a_checkpoint_without_a_manifest_resumes_with_one_warning(
    tiny_root, lightsearcher_run, tmp_path, caplog
):
    with caplog.at_level(logging.WARNING, logger="searchgym"):
        trainer = resume(tiny_root, lightsearcher_run, tmp_path, make_legacy)
    trainer.close()
    assert trainer.state.step == 2 and trainer.reward_scheme.store.minima().items() >= MINIMA.items()
    warned = [r.getMessage() for r in caplog.records if "manifest.json" in r.getMessage()]
    assert len(warned) == 1 and len(warned[0].splitlines()) == 1
    assert "cannot check that its files all belong to one run" in warned[0]


def test_a_deleted_manifest_is_refused(tiny_root, lightsearcher_run, tmp_path):
    with pytest.raises(
        DataFileError, match=r"has no manifest\.json although its trainer_state\.json was written"
    ):
        resume(tiny_root, lightsearcher_run, tmp_path, drop("manifest.json"))


# -- another architecture -------------------------------------------------------------------------


def wide_model(tmp_path: Path) -> Path:
    return build_tiny_lm(tmp_path / "wide", hidden_size=64, num_layers=1)


def foreign_optimizer(tmp_path: Path):
    """Damage: AdamW's state of a wider model (one real step, so its moments exist)."""

    def damage(folder: Path) -> None:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(wide_model(tmp_path))
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        model(torch.tensor([[1, 2, 3]]), labels=torch.tensor([[1, 2, 3]])).loss.backward()
        optimizer.step()
        torch.save(optimizer.state_dict(), folder / "optimizer.pt")

    return damage


def foreign_model(tmp_path: Path):
    def damage(folder: Path) -> None:
        shutil.rmtree(folder / "model")
        shutil.copytree(wide_model(tmp_path), folder / "model")

    return damage


@pytest.mark.parametrize("legacy", [False, True], ids=["manifest", "no-manifest"])
@pytest.mark.parametrize(
    ("make_damage", "without_manifest"),
    [
        (
            foreign_optimizer,
            r"optimizer\.pt' holds exp_avg of shape \[\d+, 64\] for parameter 0, but that parameter of the model "
            r"in .*step_000002/model has shape \[\d+, 32\]: the two come from different models",
        ),
        (
            foreign_model,
            r"step_000002/model' holds a model with hidden_size 64, but this run's model .* has 32",
        ),
    ],
    ids=["optimizer", "model"],
)
def test_another_architecture_is_refused_before_anything_is_restored(
    tiny_root, lightsearcher_run, tmp_path, caplog, make_damage, without_manifest, legacy
):
    damage = make_damage(tmp_path)
    # With a manifest the foreign file is named before its contents are looked at.
    message = (
        r"step_000002/(optimizer\.pt|model/[\w.]+)' "
        r"(holds [\d,]+ bytes where|has another SHA-256|is not part of this checkpoint)"
    )
    if legacy:
        damage = both(make_legacy, damage)
    with caplog.at_level(logging.INFO, logger="searchgym"), pytest.raises(DataFileError) as caught:
        resume(tiny_root, lightsearcher_run, tmp_path, damage)
    assert re.search(without_manifest if legacy else message, str(caught.value)), str(caught.value)
    assert len(str(caught.value).splitlines()) == 1
    assert not any(r.getMessage().startswith("Resumed") for r in caplog.records)
    assert tree_digest(tmp_path / "run" / "memory") == tree_digest(lightsearcher_run / "memory")


# -- the memory copy ------------------------------------------------------------------------------


def cut_memory(folder: Path) -> None:
    truncate("memory/trajectories.sqlite")(folder)


def memory_loop(folder: Path) -> None:
    (folder / "memory" / "loop").symlink_to(folder / "memory", target_is_directory=True)


def sparse_memory(folder: Path) -> None:
    file = folder / "memory" / "trajectories.sqlite"
    file.unlink()
    with open(file, "wb") as handle:
        handle.truncate(2 * 2**30)  # 2 GB of nothing, on no disk


@pytest.mark.parametrize("legacy", [False, True], ids=["manifest", "no-manifest"])
@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (
            cut_memory,
            r"memory/trajectories\.sqlite' holds [\d,]+ bytes where (manifest\.json records|its SQLite header)",
        ),
        (memory_loop, r"memory/loop' is a symbolic link"),
        (
            sparse_memory,
            r"memory/trajectories\.sqlite' (holds 2,147,483,648 bytes where|is not a SQLite database)",
        ),
    ],
    ids=["truncated", "symlink-loop", "sparse-2GB"],
)
def test_a_bad_memory_copy_is_refused_and_the_live_store_is_untouched(
    tiny_root, lightsearcher_run, tmp_path, damage, message, legacy
):
    live = tmp_path / "run" / "memory"
    with pytest.raises(DataFileError, match=message) as caught:
        resume(tiny_root, lightsearcher_run, tmp_path, both(make_legacy, damage) if legacy else damage)
    text = str(caught.value)
    assert len(text.splitlines()) == 1 and str(live) + "'" not in text  # names the checkpoint's file
    assert tree_digest(live) == tree_digest(lightsearcher_run / "memory")
    assert not [p.name for p in live.parent.iterdir() if p.name.startswith(".memory")]  # no staged copy left


def test_a_memory_copy_that_fails_the_integrity_check_is_refused(tiny_root, lightsearcher_run, tmp_path):
    def scramble(folder: Path) -> None:  # the size and header stay; a page in the middle is garbage
        make_legacy(folder)
        file = folder / "memory" / "trajectories.sqlite"
        data = bytearray(file.read_bytes())
        page = int.from_bytes(data[16:18], "big")
        assert len(data) >= 3 * page
        data[page : 2 * page] = bytes(range(256)) * (page // 256)
        file.write_bytes(bytes(data))

    live = tmp_path / "run" / "memory"
    with pytest.raises(DataFileError, match=r"memory/trajectories\.sqlite' fails SQLite's integrity check"):
        resume(tiny_root, lightsearcher_run, tmp_path, scramble)
    assert tree_digest(live) == tree_digest(lightsearcher_run / "memory")


def test_resuming_puts_the_checkpoints_memory_in_place_of_the_live_store(
    tiny_root, lightsearcher_run, tmp_path
):
    newest = lightsearcher_run / "checkpoints" / "step_000002" / "memory"
    trainer = resume(tiny_root, lightsearcher_run, tmp_path)
    trainer.close()
    live = tmp_path / "run" / "memory"
    assert {k: v for k, v in tree_digest(live).items() if k.endswith(".sqlite")} == tree_digest(newest)
    assert not [p.name for p in live.parent.iterdir() if p.name.startswith(".memory")]


# -- bounded reads and plain messages ------------------------------------------------------------


def sparse(name: str):
    def damage(folder: Path) -> None:
        with open(folder / name, "r+b") as handle:
            handle.truncate(2 * 2**30)

    return damage


@pytest.mark.parametrize("legacy", [False, True], ids=["manifest", "no-manifest"])
@pytest.mark.parametrize("name", ["trainer_state.json", "reward.json"])
def test_a_huge_json_file_is_refused_without_reading_it(tiny_root, lightsearcher_run, tmp_path, name, legacy):
    damage = sparse(name)
    tracemalloc.start()
    try:
        with pytest.raises(
            DataFileError, match=rf"{re.escape(name)}' holds 2,147,483,648 bytes(, more than| where)"
        ):
            resume(tiny_root, lightsearcher_run, tmp_path, both(make_legacy, damage) if legacy else damage)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 256 * 2**20  # the 2 GB were never read into memory


def numpy_step(folder: Path) -> None:
    """An AdamW state whose step counters are NumPy scalars (as some code writes them)."""
    state = torch.load(folder / "optimizer.pt", weights_only=True)
    for entry in state["state"].values():
        entry["step"] = np.float64(float(entry["step"]))
    torch.save(state, folder / "optimizer.pt")


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (garbage("optimizer.pt"), r"is truncated or corrupt: it is not a file torch\.save writes"),
        (truncate("optimizer.pt"), r"is truncated or corrupt: its zip archive is incomplete or damaged"),
        (numpy_step, r"holds a numpy\.[\w.]+ object, not only tensors and numbers"),
    ],
    ids=["garbage", "cut", "numpy-scalar"],
)
def test_a_bad_optimizer_file_says_what_is_wrong_not_how_to_load_it_unsafely(
    tiny_root, lightsearcher_run, tmp_path, damage, message
):
    with pytest.raises(DataFileError, match=r"optimizer\.pt' " + message) as caught:
        resume(tiny_root, lightsearcher_run, tmp_path, both(make_legacy, damage))
    text = str(caught.value)
    for advice in ("weights_only", "safe_globals", "allowlist", "if you trust", "miniz"):
        assert advice not in text, text


@pytest.mark.parametrize("legacy", [False, True], ids=["manifest", "no-manifest"])
def test_a_damaged_tokenizer_is_refused(tiny_root, lightsearcher_run, tmp_path, legacy):
    damage = truncate("model/tokenizer.json")
    with pytest.raises(
        DataFileError,
        match=r"step_000002/model(/tokenizer\.json' holds [\d,]+ bytes where|' cannot be loaded)",
    ):
        resume(tiny_root, lightsearcher_run, tmp_path, both(make_legacy, damage) if legacy else damage)


@pytest.mark.parametrize("swap", [True, False], ids=["exchange", "two-renames"])
def test_the_memory_copy_replaces_the_whole_store_and_leaves_nothing_beside_it(tmp_path, monkeypatch, swap):
    from searchgym.trainers.grpo import memory_restore

    if not swap:  # a file system that cannot swap two folders in one step
        monkeypatch.setattr(memory_restore, "_exchange", lambda a, b: False)
    live = tmp_path / "memory"
    live.mkdir()
    (live / "trajectories.sqlite").write_bytes(b"old")
    (live / "trajectories.sqlite-wal").write_bytes(b"old frames")  # must not survive next to the new file
    staged = tmp_path / ".memory.restore-1"
    staged.mkdir()
    (staged / "trajectories.sqlite").write_bytes(b"new")
    memory_restore.commit_memory(staged, live)
    assert tree_digest(live) == {"trajectories.sqlite": hashlib.sha256(b"new").hexdigest()}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["memory"]
