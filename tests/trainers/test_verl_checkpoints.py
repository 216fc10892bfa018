"""The stores follow verl 0.9.1's own ``RayPPOTrainer._save_checkpoint`` / ``_load_checkpoint``.

The trainer's methods are verl's; only the GPU worker group behind them is a stand-in (its
``save_checkpoint`` / ``load_checkpoint`` write and read a marker file), and the dataloader is
torchdata's real ``StatefulDataLoader``.
"""

from __future__ import annotations

import pytest

pytest.importorskip("verl.trainer.ppo.ray_trainer", reason="needs verl==0.9.1 (--no-deps), see .ci/run")

from omegaconf import OmegaConf  # noqa: E402
from torchdata.stateful_dataloader import StatefulDataLoader  # noqa: E402
from verl.trainer.ppo.ray_trainer import RayPPOTrainer  # noqa: E402

from searchgym.envs.rewards.min_tool_calls import MinToolCallStore  # noqa: E402
from searchgym.trainers.agent_config import AgentConfig  # noqa: E402
from searchgym.trainers.store_snapshots import StoreStateError, run_stores  # noqa: E402
from searchgym.trainers.verl import checkpoints  # noqa: E402


class WorkerGroup:
    """The actor worker group's checkpoint calls, as files (the real one saves FSDP shards)."""

    def save_checkpoint(self, local_path, hdfs_path=None, global_step=0, max_ckpt_to_keep=None):
        import os

        os.makedirs(local_path, exist_ok=True)
        with open(os.path.join(local_path, "weights"), "w") as f:
            f.write(str(global_step))

    def load_checkpoint(self, local_path, del_local_after_load=False):
        with open(f"{local_path}/weights") as f:
            self.loaded = int(f.read())


@pytest.fixture(autouse=True)
def restore_trainer():
    save, load = RayPPOTrainer._save_checkpoint, RayPPOTrainer._load_checkpoint
    yield
    RayPPOTrainer._save_checkpoint, RayPPOTrainer._load_checkpoint = save, load


def trainer(folder, resume_mode="auto", step=0):
    t = object.__new__(RayPPOTrainer)  # the methods under test need only these attributes
    t.config = OmegaConf.create(
        {
            "trainer": {
                "default_local_dir": str(folder),
                "default_hdfs_dir": None,
                "resume_mode": resume_mode,
                "del_local_ckpt_after_load": False,
            },
            "actor_rollout_ref": {"actor": {"checkpoint": {"async_save": False}}},
        }
    )
    t.actor_rollout_wg, t.use_critic, t.global_steps = WorkerGroup(), False, step
    t.train_dataloader = StatefulDataLoader(list(range(8)), batch_size=2)
    return t


def test_a_resumed_run_finds_its_stores_at_the_checkpoints_step(tmp_path):
    store_path = tmp_path / "min_tool_calls.sqlite"
    config = AgentConfig(
        "searchgym/SyntheticFacts-v1",
        {"protocol": "tool_call", "reward": "lightsearcher", "reward_kwargs": {"store": str(store_path)}},
    )
    checkpoints.install(run_stores(config))
    store = MinToolCallStore(store_path)
    first = trainer(tmp_path / "ckpt", step=0)
    first._load_checkpoint()  # a fresh run on empty stores: fine
    store.update("q1", 3)  # written by the rollouts of steps 1 and 2
    first.global_steps = 2
    first._save_checkpoint()  # global_step_2
    store.update("q1", 1)  # step 3's rollouts, then the run dies before its checkpoint
    assert MinToolCallStore(store_path).get("q1") == 1

    resumed = trainer(tmp_path / "ckpt", step=0)
    resumed._load_checkpoint()
    assert resumed.global_steps == 2 and resumed.actor_rollout_wg.loaded == 2
    assert MinToolCallStore(store_path).get("q1") == 3  # back to the checkpoint's step

    fresh = trainer(tmp_path / "ckpt", resume_mode="disable")
    with pytest.raises(StoreStateError, match="verl.trainer.resume_mode: auto"):
        fresh._load_checkpoint()  # a fresh run would inherit the earlier run's minima
