"""``searchgym train --backend verl``: the run file's ``verl`` section checked by verl 0.9.1's own
config schema (Hydra composing ``ppo_trainer.yaml``, verl's config dataclasses) on a CPU, and the
recipe under ``examples/verl/`` with every call it makes parsed by the real parser."""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import shlex
from pathlib import Path

import pytest
import yaml

pytest.importorskip("verl.trainer.main_ppo", reason="needs verl==0.9.1 (--no-deps), see .ci/run")

from recipe_commands import ROOT, check_calls, run_recipe  # noqa: E402

from searchgym.envs.config_base import ConfigError  # noqa: E402
from searchgym.trainers.run_spec import load_run  # noqa: E402
from searchgym.trainers.verl.launch import AGENT_LOOP_FILE, check_overrides, compose  # noqa: E402

SHIPPED = ROOT / "configs" / "verl" / "search_r1_lightsearcher.yaml"


def dry_run(config: Path, cwd: Path) -> tuple[int, str]:
    from searchgym.cli import _parser

    parser, modules = _parser()
    args = parser.parse_args(["train", "--backend", "verl", "--config", str(config), "--dry-run"])
    printed = io.StringIO()
    before = os.getcwd()
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(printed):
            code = modules["train"].run(args)
    finally:
        os.chdir(before)
    return code, printed.getvalue()


def run_file(tmp_path: Path, **sections) -> Path:
    data = {
        "backend": "verl",
        "env": {"id": "searchgym/SyntheticFacts-v1", "protocol": "search_r1"},
        "verl": {
            "actor_rollout_ref": {"model": {"path": "Qwen/Qwen2.5-3B-Instruct"}, "rollout": {"name": "vllm"}}
        },
    }
    for key, value in sections.items():
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key] = {**data[key], **value}
        else:
            data[key] = value
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_the_shipped_run_files_dry_run_is_a_command_verl_composes(tmp_path):
    code, out = dry_run(SHIPPED, ROOT)
    assert code == 0
    argv = shlex.split(out.strip().splitlines()[-1])
    assert argv[1:3] == ["-m", "searchgym.trainers.verl.main_ppo"]
    overrides = argv[3:]
    config = check_overrides(overrides)  # verl's own schema, again, on what the command says
    rollout = config.actor_rollout_ref.rollout
    assert (
        rollout.agent.default_agent_loop == "searchgym"
        and rollout.agent.agent_loop_config_path == AGENT_LOOP_FILE
    )
    assert rollout.n == 5 and config.trainer.n_gpus_per_node == 8 and config.algorithm.adv_estimator == "grpo"
    runtime = config.ray_kwargs.ray_init.runtime_env
    assert runtime.env_vars.SEARCHGYM_AGENT_CONFIG == str(SHIPPED)
    assert runtime.worker_process_setup_hook == "searchgym.trainers.verl.hook.setup"
    assert config.data.train_files == str(ROOT / "data" / "verl" / "nq_hotpotqa_train.parquet")  # absolute
    assert config.trainer.use_v1 is False  # the reward's store follows the legacy trainer's checkpoints
    # the packaged agent-loop file is what verl's worker loads: a loop named searchgym, our class
    loops = yaml.safe_load(Path(AGENT_LOOP_FILE).read_text())
    assert loops == [
        {"name": "searchgym", "_target_": "searchgym.trainers.verl.agent_loop.SearchGymAgentLoop"}
    ]


def test_tsas_names_its_registered_estimator_and_the_legacy_trainer(tmp_path):
    plan = compose(load_run(run_file(tmp_path, advantage={"estimator": "tsas"})), str(tmp_path))
    config = check_overrides(plan.overrides)
    assert config.algorithm.adv_estimator == "searchgym_tsas" and config.trainer.use_v1 is False
    plain = compose(load_run(run_file(tmp_path)), str(tmp_path))
    assert check_overrides(plain.overrides).trainer.use_v1 is True  # nothing of searchgym's needs it off


def test_a_reward_model_is_refused_because_verls_v1_trainer_would_overwrite_the_env_reward(tmp_path):
    """verl's own rule: with ``reward.reward_model.enable`` (and no separate pool) the reward
    manager hands the agent loops no reward workers, and the V1 trainer's ``_step_once`` then
    scores every batch with the model (``_compute_reward_colocate``), overwriting ``rm_scores``."""
    from types import SimpleNamespace

    from verl.experimental.reward_loop import RewardLoopManager

    plain = compose(load_run(run_file(tmp_path)), str(tmp_path))
    handles = RewardLoopManager.reward_loop_worker_handles.fget  # verl's property, on a composed config
    workers = ["reward worker"]
    assert (
        handles(SimpleNamespace(config=check_overrides(plain.overrides), reward_loop_workers=workers))
        == workers
    )
    with_model = check_overrides([*plain.overrides, "reward.reward_model.enable=true"])
    assert handles(SimpleNamespace(config=with_model, reward_loop_workers=workers)) is None  # V1 colocates it
    spec = load_run(run_file(tmp_path, verl={"reward": {"reward_model": {"enable": True}}}))
    with pytest.raises(ConfigError, match=r"verl\.reward\.reward_model\.enable.*env\.reward"):
        compose(spec, str(tmp_path))


@pytest.mark.parametrize(
    ("verl", "match"),
    [
        (
            {"trainer": {"n_gpu_per_node": 8}},
            r"verl\.trainer\.n_gpu_per_node.*Did you mean verl\.trainer\.n_gpus_per_node",
        ),
        (
            {"trainer": {"n_gpus_per_node": "eight"}},
            r"verl\.trainer\.n_gpus_per_node: got 'eight'; allowed: an integer",
        ),
        ({"actor_rollout_ref": {"rollout": {"n": 2.5}}}, r"rollout\.n: got 2\.5; allowed: an integer"),
        (
            {"algorithm": {"adv_estimator": "grpo"}},
            r"verl\.algorithm\.adv_estimator: got 'grpo'.*'searchgym_tsas'",
        ),
        ({"trainer": {"use_v1": True}}, r"verl\.trainer\.use_v1: got True.*legacy trainer"),
        ({"agent": {"max_turn_tokens": 0}}, r"verl\.agent\.max_turn_tokens"),
    ],
)
def test_verl_refuses_what_the_run_file_gets_wrong_with_the_key_named(tmp_path, verl, match):
    path = run_file(tmp_path, advantage={"estimator": "tsas"}, verl=verl)
    with pytest.raises(ConfigError, match=match):
        compose(load_run(path), str(tmp_path))


def test_a_run_file_for_another_backend_is_refused_with_how_to_fix(tmp_path):
    path = run_file(tmp_path, openrlhf={"actor": {}})
    with pytest.raises(ConfigError, match="no openrlhf section with backend: verl.*Set backend: openrlhf"):
        load_run(path)


@pytest.mark.slow
def test_the_one_node_recipe_calls_pass_their_parsers(tmp_path):
    checked = check_calls(run_recipe("one_node_8gpu.sh", tmp_path, recipes="verl"))
    kinds = [item.kind for item in checked]
    assert kinds.count("python -m searchgym.trainers.verl.data") == 2 and "searchgym train" in kinds
    prepared = {item.parsed.out: item for item in checked if item.kind == "searchgym prepare"}
    converted = [item for item in checked if item.kind == "python -m searchgym.trainers.verl.data"]
    for item in converted:  # each conversion reads a file `searchgym prepare` wrote
        assert item.parsed.input in prepared and Path(item.call.cwd, item.parsed.input).is_file()
    assert [item.parsed.eval for item in converted] == [False, True]
    ((args, plan),) = [item.parsed for item in checked if item.kind == "searchgym train"]
    config = check_overrides(plan.overrides)
    data = tmp_path / "data" / "verl"
    # the run file trains on what the recipe converts: the recipe's DATA is the run file's data/
    assert Path(config.data.train_files).name == converted[0].parsed.out.name == "nq_hotpotqa_train.parquet"
    assert Path(config.data.val_files).name == converted[1].parsed.out.name
    assert converted[0].parsed.out.parent == data
    assert isinstance(args, argparse.Namespace) and args.backend == "verl"


def test_the_converter_refuses_rows_that_are_not_searchgym_prepares_with_one_line(tmp_path, capsys):
    import json
    import subprocess
    import sys

    bad = tmp_path / "rows.jsonl"
    bad.write_text(json.dumps({"question": "q?"}) + "\n")
    done = subprocess.run(
        [sys.executable, "-m", "searchgym.trainers.verl.data", str(bad), str(tmp_path / "out.parquet")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2 and not (tmp_path / "out.parquet").exists()
    assert done.stderr.strip().splitlines() == [
        f"searchgym: error: {bad}:1 needs a string prompt and a JSON string label, as `searchgym prepare` writes them."
    ]


def test_the_entry_takes_the_run_file_from_its_overrides_and_installs_the_patches(tmp_path, monkeypatch):
    """``python -m searchgym.trainers.verl.main_ppo OVERRIDES`` as ``--dry-run`` prints it; verl's own
    ``main_ppo`` (Ray, GPUs) is replaced by a recorder."""
    import runpy
    import sys

    from verl.trainer.ppo import ray_trainer
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    from searchgym.trainers.verl import main_ppo

    path = run_file(tmp_path, advantage={"estimator": "tsas"})
    plan = compose(load_run(path), str(tmp_path))
    monkeypatch.delenv("SEARCHGYM_AGENT_CONFIG", raising=False)
    ran = []
    monkeypatch.setattr(runpy, "run_module", lambda name, **kw: ran.append((name, list(sys.argv))))
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    saved = ray_trainer.compute_advantage, RayPPOTrainer._save_checkpoint, RayPPOTrainer._load_checkpoint
    try:
        main_ppo.main(plan.command[3:])
        assert os.environ["SEARCHGYM_AGENT_CONFIG"] == str(path)
        assert ran == [("verl.trainer.main_ppo", ["verl.trainer.main_ppo", *plan.overrides])]
        assert hasattr(ray_trainer.compute_advantage, "__searchgym_original__")
        assert hasattr(RayPPOTrainer._save_checkpoint, "__searchgym_original__")
    finally:
        ray_trainer.compute_advantage, RayPPOTrainer._save_checkpoint, RayPPOTrainer._load_checkpoint = saved
        for name in ("SEARCHGYM_AGENT_CONFIG", "SEARCHGYM_AGENT_BASEDIR"):  # main sets both
            os.environ.pop(name, None)
