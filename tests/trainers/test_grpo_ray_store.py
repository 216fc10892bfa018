"""The built-in GRPO trainer with ``memory.backend: ray``: its stores served by a Ray actor.

One Ray session (``ray.init(num_cpus=2)``) serves the whole module; Ray starts slowly here.
"""

from __future__ import annotations

import logging
import os
import sqlite3
from pathlib import Path
from typing import Any

import pytest
import yaml

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
ray = pytest.importorskip("ray")

from searchgym.cli import main  # noqa: E402
from searchgym.envs.rewards.min_tool_calls import MinToolCallStore  # noqa: E402
from searchgym.memory.store import MemoryStore  # noqa: E402
from searchgym.policies.tiny import build_tiny_lm  # noqa: E402
from searchgym.trainers.config import ConfigError, TrainConfig  # noqa: E402
from searchgym.trainers.grpo import GRPOTrainer  # noqa: E402
from searchgym.trainers.grpo.checkpoint import checkpoint_path  # noqa: E402
from searchgym.trainers.grpo.envs import store_actor_name  # noqa: E402
from searchgym.trainers.ray_store import NAMESPACE, RemoteMemory, RemoteMinToolCalls  # noqa: E402

pytestmark = pytest.mark.slow  # Ray's start and two short runs

ENV_ID = "searchgym/SyntheticFacts-v1"
STEPS, QUESTIONS, GROUP = 2, 2, 3


@pytest.fixture(scope="module")
def ray_session() -> Any:
    context = ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield context
    ray.shutdown()


@pytest.fixture(scope="module")
def tiny_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("tiny")
    build_tiny_lm(root, hidden_size=64, num_layers=2)
    return root


def ray_config(tiny_root: Path, out: Path, steps: int) -> TrainConfig:
    return TrainConfig.from_dict(
        {
            "output_dir": str(out),
            "steps": steps,
            "env": {"id": ENV_ID, "kwargs": {"reward": "lightsearcher", "max_turns": 2}},
            "model": {"tiny": {"dir": str(tiny_root), "hidden_size": 64, "num_layers": 2}},
            "rollout": {
                "group_size": GROUP,
                "questions_per_step": QUESTIONS,
                "max_new_tokens": 8,
                "max_context_tokens": 1024,
            },
            "algo": {"lr": 1e-3, "kl_coef": 0.0, "micro_batch_size": 6},
            "memory": {"kind": "lightsearcher", "update_every": 1, "backend": "ray"},
            "checkpoint": {"every": 1},
        }
    )


def stored(memory_dir: Path) -> list[dict[str, Any]]:
    # left open on purpose: a reader beside a checkpoint's copy (its -shm) must not stop a resume
    return MemoryStore(memory_dir).log("trajectories").read()[0]


def test_a_run_writes_its_trajectories_through_the_actor_and_resumes(
    ray_session, tiny_root, tmp_path, caplog
):
    out = tmp_path / "run"
    caplog.set_level(logging.INFO, logger="searchgym")
    trainer = GRPOTrainer(ray_config(tiny_root, out, STEPS), progress=False)
    try:
        trainer.setup()
        trainer.reward_scheme.store.update("q-seen", 2)  # a minimum lowered through the reward's store
        trainer.train()
        name = store_actor_name(trainer.config.memory, out)
        assert isinstance(trainer.memory, RemoteMemory)
        assert isinstance(trainer.reward_scheme.store, RemoteMinToolCalls)
        assert trainer.store is not None and trainer.store.call("pid") != os.getpid()
        assert trainer.memory.steps == STEPS
    finally:
        trainer.close()
    assert f"Ray actor {name!r}" in caplog.text
    with pytest.raises(ValueError):  # close() ends the actor; its files stay
        ray.get_actor(name, namespace=NAMESPACE)
    records = stored(out / "memory")
    assert len(records) == STEPS * QUESTIONS * GROUP
    conn = sqlite3.connect(out / "memory" / "trajectories.sqlite")
    keys = [key for (key,) in conn.execute("SELECT key FROM records")]
    conn.close()
    assert len(keys) == len(records) and all(len(k) == 32 for k in keys)  # the actor's keyed appends
    assert MinToolCallStore(out / "min_tool_calls.sqlite").minima() == {"q-seen": 2}
    assert len(stored(checkpoint_path(out, STEPS) / "memory")) == len(records)

    # A longer run of the same config resumes at step 2 with a fresh actor on the same files.
    resumed = GRPOTrainer(ray_config(tiny_root, out, STEPS + 1), progress=False)
    try:
        resumed.train()
        assert resumed.resumed_from == checkpoint_path(out, STEPS)
        assert resumed.state.step == STEPS + 1 and resumed.memory.steps == STEPS + 1
        assert resumed.reward_scheme.store.minima() == {"q-seen": 2}
    finally:
        resumed.close()
    assert len(stored(out / "memory")) == (STEPS + 1) * QUESTIONS * GROUP


def test_the_dry_run_accepts_the_ray_backend_and_rejects_a_misspelt_one(tmp_path, capsys):
    data = {
        "env": {"id": ENV_ID, "reward": "lightsearcher"},
        "memory": {"kind": "lightsearcher", "backend": "ray", "ray_num_cpus": 2},
        "builtin": {"output_dir": str(tmp_path / "run")},
    }
    path = tmp_path / "ray.yaml"
    path.write_text(yaml.safe_dump(data))
    assert main(["train", "--config", str(path), "--dry-run"]) == 0
    assert "memory: lightsearcher (stores in a Ray actor)" in capsys.readouterr().out

    data["memory"]["backend"] = "rey"
    path.write_text(yaml.safe_dump(data))
    assert main(["train", "--config", str(path), "--dry-run"]) == 2
    assert (
        "memory.backend: got 'rey'; allowed: one of 'file', 'ray'. Did you mean 'ray'?"
        in capsys.readouterr().err
    )


@pytest.mark.parametrize(
    ("memory", "reward", "allowed"),
    [
        ({"kind": "hiexp", "path": "levels.jsonl"}, "f1", "'file' for memory.kind 'hiexp'"),
        ({"kind": "none"}, "f1", "'file' when the run keeps no store"),
    ],
)
def test_the_ray_backend_needs_a_store_to_serve(memory, reward, allowed):
    with pytest.raises(ConfigError, match=allowed):
        TrainConfig.from_dict(
            {"env": {"id": ENV_ID, "kwargs": {"reward": reward}}, "memory": {**memory, "backend": "ray"}}
        )
    TrainConfig.from_dict(
        {"env": {"id": ENV_ID, "kwargs": {"reward": "lightsearcher"}}, "memory": {"backend": "ray"}}
    )
