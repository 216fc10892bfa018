"""A built-in GRPO run with no learning signal for several steps warns once, with the likely cause."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from searchgym.trainers.grpo.no_signal import NO_SIGNAL_STEPS, NoSignalWatch


def test_the_watch_counts_steps_in_a_row_and_warns_once():
    watch = NoSignalWatch(patience=3)
    zero, some = [0.0, 0.0, 0.0, 0.0], [0.5, -0.5, 0.0, 0.0]
    assert [watch.observe(s, zero, [1, 1, 0, 0]) for s in (1, 2)] == [None, None]
    assert watch.observe(3, some, [1, 0, 0, 0]) is None  # signal: the count starts again
    assert [watch.observe(s, zero, [0.2] * 4) for s in (4, 5)] == [None, None]
    message = watch.observe(6, zero, [0.2] * 4)
    assert message is not None and "steps 4-6" in message and "every rollout scored 0.2" in message
    assert watch.observe(7, zero, [0.2] * 4) is None


def test_groups_that_score_alike_but_differ_from_each_other_are_named_so():
    watch = NoSignalWatch(patience=1)
    message = watch.observe(1, [0.0] * 4, [1.0, 1.0, 0.0, 0.0])
    assert message is not None and "the rollouts of each group scored alike" in message


def test_a_run_where_every_rollout_scores_minus_one_warns_once(tmp_path: Path, caplog):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from searchgym.policies.tiny import build_tiny_lm
    from searchgym.trainers.config import TrainConfig
    from searchgym.trainers.grpo import GRPOTrainer

    build_tiny_lm(tmp_path / "tiny", hidden_size=32, num_layers=1)
    config = TrainConfig.from_dict(
        {
            "output_dir": str(tmp_path / "run"),
            "steps": NO_SIGNAL_STEPS + 1,
            # an untrained model never writes the protocol's tags: LightSearcher scores each answer -1
            "env": {
                "id": "searchgym/SyntheticFacts-v1",
                "kwargs": {"reward": "lightsearcher", "max_turns": 2},
            },
            "model": {"tiny": {"dir": str(tmp_path / "tiny"), "hidden_size": 32, "num_layers": 1}},
            "rollout": {
                "group_size": 2,
                "questions_per_step": 2,
                "max_new_tokens": 4,
                "max_context_tokens": 512,
            },
            "algo": {"lr": 1e-3, "kl_coef": 0.0, "micro_batch_size": 4},
            "checkpoint": {"every": 0},
        }
    )
    trainer = GRPOTrainer(config, progress=False)
    with caplog.at_level(logging.WARNING, logger="searchgym.trainers"):
        state = trainer.train()
    trainer.close()
    rewards = {e.reward for e in trainer.last_episodes}
    assert rewards == {-1.0}
    assert all(h["train"]["signal"] == 0.0 for h in state.history)
    warnings = [r.getMessage() for r in caplog.records if "No learning signal" in r.getMessage()]
    assert len(warnings) == 1
    assert f"steps 1-{NO_SIGNAL_STEPS}" in warnings[0] and "every rollout scored -1" in warnings[0]
