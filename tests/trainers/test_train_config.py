"""Trainer configs: checked on load, errors that name field/value/allowed, YAML round trips, the CLI."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from searchgym.cli import main
from searchgym.envs.config_base import field_help, read_yaml
from searchgym.trainers.config import (
    AlgoConfig,
    ConfigError,
    RolloutConfig,
    TrainConfig,
    save_config,
)
from searchgym.trainers.run_spec import load_config, run_spec_from_dict

ROOT = Path(__file__).resolve().parents[2]
BUILTIN_CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))


def test_defaults_are_valid_and_documented():
    config = TrainConfig()
    assert config.model.tiny is not None and config.model.path is None
    assert config.rollout.group_size == 5 and config.algo.clip_eps == 0.2 and config.algo.kl_coef == 0.001
    for cls in (TrainConfig, RolloutConfig, AlgoConfig):
        documented = field_help(cls)
        for name in cls.__dataclass_fields__:
            assert documented.get(name), f"{cls.__name__}.{name} is not documented"


def test_yaml_round_trip_is_exact(tmp_path):
    config = TrainConfig.from_dict(
        {
            "steps": 7,
            "env": {"id": "SyntheticFacts-v1", "kwargs": {"reward": "cost", "reward_kwargs": {"lam": 0.2}}},
            "model": {"path": "models/qwen", "dtype": "bfloat16", "device": "auto"},
            "algo": {"advantage": "tsas", "tsas_warmup_steps": 3, "lr": 2e-6},
            "wandb": {"enabled": True, "tags": ["a", "b"], "mode": "offline"},
        }
    )
    assert config.env.id == "searchgym/SyntheticFacts-v1"  # the short id is completed
    first = Path(save_config(config, tmp_path / "a.yaml"))
    again = TrainConfig.from_dict(read_yaml(first))
    assert again == config
    second = Path(save_config(again, tmp_path / "b.yaml"))
    assert first.read_text() == second.read_text()


@pytest.mark.parametrize("path", BUILTIN_CONFIGS, ids=[p.name for p in BUILTIN_CONFIGS])
def test_shipped_builtin_configs_load(path):
    config = load_config(path)
    assert config.backend == "builtin"
    assert TrainConfig.from_dict(config.to_dict()) == config


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"rollout": {"group_size": 1}}, "rollout.group_size: got 1; allowed: an int >= 2"),
        ({"rollout": {"group_size": "4"}}, "rollout.group_size: got '4'; allowed: an int"),
        ({"rollout": {"group_size": True}}, "rollout.group_size: got True; allowed: an int"),
        ({"rollout": {"top_p": 1.5}}, "rollout.top_p: got 1.5; allowed: a finite number in [1e-06, 1]"),
        ({"rollout": {"temperature": 0}}, "rollout.temperature: got 0.0; allowed: a finite number >= 1e-06"),
        (
            {"algo": {"advantage": "grpo"}},
            "algo.advantage: got 'grpo'; allowed: one of 'group_norm', 'dr_grpo', 'tsas'",
        ),
        ({"algo": {"lr": float("nan")}}, "algo.lr: got nan; allowed: a finite number >= 0"),
        ({"algo": {"tsas_variant": "eq3"}}, "algo.tsas_variant: got 'eq3'; allowed: one of 'eq4', 'eq2'"),
        (
            {"algo": {"advantage": "dr_grpoo"}},
            "algo.advantage: got 'dr_grpoo'; allowed: one of 'group_norm', 'dr_grpo', 'tsas'. Did you mean 'dr_grpo'?",
        ),
        ({"algo": {"loss_agg": "mean"}}, "algo.loss_agg: got 'mean'; allowed: one of 'auto', 'token_mean'"),
        (
            {"model": {"path": "m", "tiny": {}}},
            "model.path: got 'm'; allowed: a model directory when model.tiny is not set",
        ),
        (
            {"model": {"path": "m", "device": "gpu"}},
            "model.device: got 'gpu'; allowed: 'cpu', 'cuda', 'cuda:N' or 'auto'",
        ),
        (
            {"model": {"tiny": {"hidden_size": 48}}},
            "model.tiny.hidden_size: got 48; allowed: a multiple of 32",
        ),
        (
            {"env": {"id": "HotpotQA-v2"}},
            "env.id: got 'HotpotQA-v2'; allowed: one of searchgym/2WikiMultihopQA-v1",
        ),
        ({"env": {"kwargs": {"render_mode": "ansi"}}}, "env.kwargs: got {'render_mode': 'ansi'}"),
        ({"memory": {"kind": "hiexp"}}, "memory.path: got None; allowed: the HiExp store folder"),
        (
            {"wandb": {"mode": "on"}},
            "wandb.mode: got 'on'; allowed: one of 'online', 'offline', 'disabled' or null",
        ),
        ({"wandb": {"tags": "a"}}, "wandb.tags: got 'a'; allowed: a list of a string"),
        ({"checkpoint": {"every": -1}}, "checkpoint.every: got -1; allowed: an int >= 0"),
        ({"steps": 0}, "steps: got 0; allowed: an int >= 1"),
        ({"backend": "openrlhf"}, "backend: got 'openrlhf'; allowed: one of 'builtin'"),
        ({"rollout": [1, 2]}, "rollout: got [1, 2]; allowed: a mapping of RolloutConfig fields"),
    ],
)
def test_bad_values_name_the_field_the_value_and_what_is_allowed(data, message):
    with pytest.raises(ConfigError) as info:
        TrainConfig.from_dict(data)
    assert message in str(info.value)


def test_unknown_keys_are_errors_with_a_suggestion():
    with pytest.raises(ConfigError) as info:
        TrainConfig.from_dict({"rollout": {"group_sise": 4}})
    text = str(info.value)
    assert text.startswith("rollout.group_sise: got 4; allowed: the keys of RolloutConfig: group_size,")
    assert "Unknown key. Did you mean 'group_size'?" in text
    with pytest.raises(ConfigError, match=r"^stepz: got 3; .*Did you mean 'steps'"):
        TrainConfig.from_dict({"stepz": 3})
    with pytest.raises(ConfigError, match=r"^model\.tiny\.layers: got 2; .*Did you mean 'num_layers'\?"):
        TrainConfig.from_dict({"model": {"tiny": {"layers": 2}}})


def test_an_old_memory_kind_name_is_refused_with_the_new_name():
    with pytest.raises(ConfigError) as info:
        TrainConfig.from_dict({"memory": {"kind": "experience"}})
    assert str(info.value) == (
        "memory.kind: got 'experience'; allowed: one of 'none', 'lightsearcher', 'hiexp'. "
        "Did you mean 'lightsearcher'? The kind 'experience' is called 'lightsearcher'."
    )
    assert TrainConfig.from_dict({"memory": {"kind": "lightsearcher"}}).memory.kind == "lightsearcher"


@pytest.mark.parametrize(
    "memory",
    [
        "{kind: lightsearcher, path: m, update_evry: 5}",  # unknown field
        "{kind: lightsearch, path: m}",  # a misspelled kind
        "{kind: experience, path: m}",  # the old name
        "{kind: lightsearcher, path: m, update_every: 0}",  # out of range
        "{kind: lightsearcher, path: m, few_shot: 'yes'}",  # wrong type
        "{kind: hiexp}",  # a HiExp hierarchy needs its path
    ],
)
def test_the_builtin_and_openrlhf_configs_word_a_bad_memory_section_alike(tmp_path, memory):
    """One MemoryConfig: the same section gives the same message after the file and the field's section."""
    from searchgym.trainers.openrlhf.config import load_run_config

    builtin, openrlhf = tmp_path / "builtin.yaml", tmp_path / "openrlhf.yaml"
    builtin.write_text(f"env: {{id: SyntheticFacts-v1}}\nmemory: {memory}\n")
    openrlhf.write_text(
        f"backend: openrlhf\nenv: {{id: SyntheticFacts-v1}}\nmemory: {memory}\nopenrlhf: {{}}\n"
    )
    with pytest.raises(ConfigError) as built_in_error:
        load_config(builtin)
    with pytest.raises(ConfigError) as openrlhf_error:
        load_run_config(openrlhf)
    assert str(built_in_error.value).startswith(f"{builtin}: memory.")
    assert str(openrlhf_error.value).startswith(f"{openrlhf}: memory.")
    assert (
        str(built_in_error.value)[len(f"{builtin}: ") :] == str(openrlhf_error.value)[len(f"{openrlhf}: ") :]
    )


def test_the_library_config_has_no_eval_section(tmp_path, capsys):
    with pytest.raises(ConfigError, match=r"^eval: .*allowed: the keys of TrainConfig: .*Unknown key\."):
        TrainConfig.from_dict({"eval": {"enabled": True}})
    path = tmp_path / "run.yaml"
    path.write_text("builtin: {steps: 2, eval: {enabled: true}}\n")
    assert main(["train", "--config", str(path), "--dry-run"]) == 2
    assert (
        f"{path}: builtin.eval: got {{'enabled': True}}; allowed: the keys of BuiltinConfig"
        in capsys.readouterr().err
    )


def test_errors_from_a_file_name_the_file(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("builtin:\n  rollout:\n    group_size: 1\n")
    with pytest.raises(ConfigError, match=rf"^{path}: builtin.rollout.group_size: got 1"):
        load_config(path)
    path.write_text("builtin: [unclosed\n")
    with pytest.raises(ConfigError, match="allowed: a readable YAML run file. .*not readable YAML"):
        load_config(path)
    path.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="the top level must be a mapping, got list"):
        load_config(path)
    with pytest.raises(ConfigError, match="config: got .*missing.yaml'; .*does not exist"):
        load_config(tmp_path / "missing.yaml")


def test_an_empty_file_is_the_default_config(tmp_path):
    path = tmp_path / "empty.yaml"
    path.write_text("")
    assert load_config(path) == TrainConfig()


def test_sections_given_as_mappings_are_checked_too():
    config = TrainConfig(rollout={"group_size": 3})
    assert isinstance(config.rollout, RolloutConfig) and config.rollout.group_size == 3
    with pytest.raises(ConfigError, match="^rollout.group_size: got 0"):
        TrainConfig(rollout={"group_size": 0})
    assert config.replace(steps=9).steps == 9
    with pytest.raises(ConfigError, match="^steps: got -1"):
        config.replace(steps=-1)


def test_loss_aggregation_auto_follows_the_estimator():
    assert AlgoConfig(advantage="dr_grpo").resolved_loss_agg == "seq_mean_token_sum_norm"
    assert AlgoConfig(advantage="group_norm").resolved_loss_agg == "seq_mean_token_mean"
    assert AlgoConfig(advantage="tsas", loss_agg="token_mean").resolved_loss_agg == "token_mean"


# -- the command line --------------------------------------------------------------------------


def test_train_dry_run_prints_the_plan_without_importing_torch(tmp_path):
    config = ROOT / "configs" / "grpo_synthetic.yaml"
    code = (
        "import sys\nfrom searchgym.cli import main\n"
        f"rc = main(['train', '--config', {str(config)!r}, '--dry-run'])\n"
        "print('torch loaded:', 'torch' in sys.modules)\nsys.exit(rc)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=120
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert out.startswith("builtin GRPO: 40 steps on searchgym/SyntheticFacts-v1 (a fresh run)")
    assert "2 questions x 4 = 8 episodes per step" in out
    assert "torch loaded: False" in out
    printed = yaml.safe_load(out[out.index("backend: builtin") : out.index("torch loaded")])
    assert run_spec_from_dict(printed).train_config() == load_config(config)


def test_train_reports_a_bad_config_with_exit_code_2(tmp_path, capsys):
    path = tmp_path / "bad.yaml"
    path.write_text("advantage:\n  estimator: ppo\n")
    assert main(["train", "--config", str(path), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert f"{path}: advantage.estimator: got 'ppo'; allowed: one of 'group_norm', 'dr_grpo', 'tsas'" in err


def test_train_sends_openrlhf_files_to_the_plugin(tmp_path, monkeypatch, capsys):
    import searchgym.trainers.openrlhf as plugin

    calls = []
    monkeypatch.setattr(plugin, "launch", lambda path, dry_run: calls.append((path, dry_run)) or 0)
    path = tmp_path / "run.yaml"
    path.write_text("backend: openrlhf\nenv: {id: searchgym/SyntheticFacts-v1}\n")
    assert main(["train", "--config", str(path), "--dry-run"]) == 0  # the file's backend key decides
    assert main(["train", "--config", str(path), "--backend", "openrlhf"]) == 0
    assert calls == [(str(path), True), (str(path), False)]
    assert main(["train", "--config", str(path), "--backend", "builtin"]) == 2
    assert "says backend: openrlhf, but --backend builtin was given" in capsys.readouterr().err
