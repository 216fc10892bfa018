"""searchgym's estimators inside verl 0.9.1's own ``compute_advantage``, against values worked out by hand.

The figures are those of tests/trainers/test_grpo_advantages.py: one group of two rollouts,
rewards (1, 0), searches (1, 0), reasoning steps (2, 0).
"""

from __future__ import annotations

import pytest

pytest.importorskip("verl.trainer.ppo.ray_trainer", reason="needs verl==0.9.1 (--no-deps), see .ci/run")
np = pytest.importorskip("numpy")
torch = pytest.importorskip("torch")

from verl.protocol import DataProto  # noqa: E402
from verl.trainer.ppo import ray_trainer  # noqa: E402

from searchgym.error import InvalidArgumentError  # noqa: E402
from searchgym.trainers.advantages import AdvantageConfig  # noqa: E402
from searchgym.trainers.verl import advantage  # noqa: E402


@pytest.fixture(autouse=True)
def unpatched():
    """Each test installs the patch itself; verl's compute_advantage is put back after it."""
    original = ray_trainer.compute_advantage
    yield
    ray_trainer.compute_advantage = getattr(original, "__searchgym_original__", original)


def batch(rewards, step=None, searches=(1, 0), reasoning=(2, 0), uids=("q", "q")):
    """verl's batch after the rollout: the reward on each response's last token (3 tokens, the last padded)."""
    mask = torch.tensor([[1, 1, 0]] * len(rewards), dtype=torch.int64)
    scores = torch.zeros(len(rewards), 3)
    scores[:, 1] = torch.tensor(rewards, dtype=torch.float32)
    data = DataProto.from_dict(tensors={"token_level_rewards": scores, "response_mask": mask})
    data.non_tensor_batch.update(
        uid=np.array(uids, dtype=object),
        num_searches=np.array(searches, dtype=object),
        reasoning_steps=np.array(reasoning, dtype=object),
    )
    if step is not None:
        data.meta_info["global_steps"] = step
    return data


def advantages_of(data, estimator):
    out = ray_trainer.compute_advantage(data, adv_estimator=estimator, config=None)
    return out.batch["advantages"][:, 0].tolist(), out.batch["advantages"][:, 2].tolist()


def test_tsas_in_verls_compute_advantage_by_hand():
    advantage.install(AdvantageConfig("tsas", warmup_steps=150))
    # stage 1: 0.5 + ln 2 + 0.01 ln 3 = 1.204133; -0.5 (test_grpo_advantages.py works them out)
    first, padding = advantages_of(batch([1.0, 0.0], step=0), "searchgym_tsas")
    assert first == pytest.approx([1.204133, -0.5], abs=1e-6) and padding == [0.0, 0.0]
    # stage 2 from step 150: 0.5 + 0.122459 * 1.291759 = 0.658188; -0.5 + 0.122459 * 0.5 = -0.438771
    assert advantages_of(batch([1.0, 0.0], step=150), "searchgym_tsas")[0] == pytest.approx(
        [0.658188, -0.438771], abs=1e-6
    )
    advantage.install(AdvantageConfig("tsas", warmup_steps=150, variant="eq2"))
    assert advantages_of(batch([1.0, 0.0], step=150), "searchgym_tsas")[0] == pytest.approx(
        [0.341812, -0.5], abs=1e-6
    )


def test_groups_follow_the_uids():
    advantage.install()
    # two interleaved groups, each (1, 0): ±0.5 / std (Bessel: sqrt(0.5) = 0.707107) = ±0.707107;
    # one group of all four would give ±0.5 / sqrt(1/3) = ±0.866025
    data = batch([1.0, 1.0, 0.0, 0.0], uids=("a", "b", "a", "b"), searches=(0,) * 4, reasoning=(0,) * 4)
    got = advantages_of(data, "searchgym_group_norm")[0]
    assert got == pytest.approx([0.707107, 0.707107, -0.707107, -0.707107], abs=1e-6)


def test_without_the_patch_tsas_says_how_to_get_its_figures():
    advantage.register()  # registered, but compute_advantage is verl's own: no non_tensor_batch
    with pytest.raises(InvalidArgumentError, match="trainer.use_v1=false"):
        advantages_of(batch([1.0, 0.0], step=0), "searchgym_tsas")


def test_the_memory_steps_to_the_training_step_under_any_estimator(tmp_path):
    from searchgym.memory import ExperienceMemory

    with ExperienceMemory(tmp_path / "memory", update_every=2) as memory:
        advantage.install(memory=memory)
        advantages_of(batch([1.0, 0.0], step=3), "grpo")  # verl's own estimator passes through
        assert memory.steps == 3
        out = ray_trainer.compute_advantage(batch([1.0, 0.0], step=3), adv_estimator="grpo", config=None)
        assert memory.steps == 3 and "advantages" in out.batch.keys()  # the same step again: no step


def test_the_worker_hook_installs_the_run_files_estimator_and_checkpoint_patches(tmp_path, monkeypatch):
    import yaml
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    from searchgym.trainers.verl import hook

    run = tmp_path / "run.yaml"
    run.write_text(
        yaml.safe_dump(
            {
                "backend": "verl",
                "env": {"id": "searchgym/SyntheticFacts-v1", "protocol": "search_r1"},
                "advantage": {"estimator": "tsas", "warmup_steps": 0},  # stage 2 from the start
                "verl": {},
            }
        )
    )
    monkeypatch.setenv("SEARCHGYM_AGENT_CONFIG", str(run))
    save, load = RayPPOTrainer._save_checkpoint, RayPPOTrainer._load_checkpoint
    try:
        hook.setup()
        # stage 2 at step 0 (warmup_steps 0): 0.658188, -0.438771 (worked out above)
        assert advantages_of(batch([1.0, 0.0], step=0), "searchgym_tsas")[0] == pytest.approx(
            [0.658188, -0.438771], abs=1e-6
        )
        assert RayPPOTrainer._save_checkpoint.__searchgym_original__ is save
    finally:
        RayPPOTrainer._save_checkpoint, RayPPOTrainer._load_checkpoint = save, load
