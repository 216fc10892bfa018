"""The run file: one layout and one loader for every backend; old layouts convert, never misread.

The shipped configs were moved to the run layout; ``tests/fixtures/old_configs`` holds them
as they were. Each pair must give the same runs: the same trainer config (built-in), or the
same env, memory, advantage, launch options and OpenRLHF flags (OpenRLHF), read from the old
file's raw data here, independently of the converter.
"""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from searchgym.envs.benchmarks import BenchmarkQAEnv
from searchgym.envs.config import EnvConfig
from searchgym.envs.config_base import ConfigError, read_yaml, to_dict
from searchgym.memory.config import MemoryConfig
from searchgym.trainers.agent_config import AgentConfig, load_agent_config
from searchgym.trainers.config import TrainConfig
from searchgym.trainers.openrlhf.config import load_run_config
from searchgym.trainers.run_spec import OldLayoutError, convert, load_config, load_run

ROOT = Path(__file__).resolve().parents[2]
OLD = ROOT / "tests" / "fixtures" / "old_configs"
BUILTIN = sorted(p.name for p in (ROOT / "configs").glob("*.yaml"))
OPENRLHF = sorted(p.name for p in (ROOT / "configs" / "openrlhf").glob("*.yaml"))


def test_every_shipped_config_has_its_old_form():
    assert BUILTIN and OPENRLHF
    assert sorted(p.name for p in OLD.glob("*.yaml")) == BUILTIN
    assert sorted(p.name for p in (OLD / "openrlhf").glob("*.yaml")) == OPENRLHF


@pytest.mark.parametrize("name", BUILTIN)
def test_builtin_configs_in_the_new_layout_give_the_same_runs(name):
    old = TrainConfig.from_dict(read_yaml(OLD / name))  # as the trainer read the old file
    new = load_config(ROOT / "configs" / name)
    assert to_dict(new) == to_dict(old)


def _old_agent(data: dict) -> tuple[dict, dict | None]:
    agent = dict(data["agent"])
    advantage = agent.pop("advantage", None)
    return agent, advantage


@pytest.mark.parametrize("name", OPENRLHF)
def test_openrlhf_configs_in_the_new_layout_give_the_same_runs(name, tmp_path):
    old = read_yaml(OLD / "openrlhf" / name)
    new = load_run_config(ROOT / "configs" / "openrlhf" / name, basedir=str(tmp_path))
    agent, advantage = _old_agent(old)
    memory = agent.pop("memory", None)
    # The old agent section, its paths resolved against the same folder.
    expected = AgentConfig.from_dict({k: v for k, v in agent.items()}, basedir=str(tmp_path))
    assert new.agent.env_id == expected.env_id
    # An option written as null is the constructor's default when that default is None.
    defaults = inspect.signature(BenchmarkQAEnv.__init__).parameters
    written = {
        k: v for k, v in expected.env_kwargs.items() if not (v is None and defaults[k].default is None)
    }
    assert new.agent.env_kwargs == written
    assert new.agent.tokenizer == expected.tokenizer and new.agent.max_pool == expected.max_pool
    if memory is None or memory.get("kind") == "none":
        assert new.agent.memory is None
    else:
        path = str(tmp_path / memory["path"])
        assert to_dict(new.agent.memory) == to_dict(MemoryConfig(**{**memory, "path": path}))
    if advantage is None:
        assert new.agent.advantage is None
    else:
        got = new.agent.advantage
        assert (got.estimator, got.warmup_steps, got.alpha, got.variant) == (
            advantage["scheme"],
            advantage.get("warmup_steps", 150),
            advantage.get("alpha", 0.01),
            "eq4",
        )
    assert new.openrlhf == old["openrlhf"]
    assert to_dict(new.launch) == {"ray_address": None, "python": None, "env": {}, **old.get("launch", {})}


@pytest.mark.parametrize("folder,name", [("", n) for n in BUILTIN] + [("openrlhf", n) for n in OPENRLHF])
def test_a_file_in_an_old_layout_fails_with_one_line_saying_how_to_convert(folder, name):
    path = OLD / folder / name
    with pytest.raises(OldLayoutError) as caught:
        load_run(path)
    message = str(caught.value)
    assert "\n" not in message
    assert str(path) in message and f"searchgym config convert {path}" in message


@pytest.mark.parametrize("folder,name", [("", n) for n in BUILTIN] + [("openrlhf", n) for n in OPENRLHF])
def test_convert_turns_each_old_file_into_its_new_form(folder, name, tmp_path):
    out = tmp_path / folder / name
    out.parent.mkdir(parents=True, exist_ok=True)
    for base in (OLD / folder).glob("*.yaml"):  # the extends chain, converted beside it
        (out.parent / base.name).write_text(yaml.safe_dump(convert(read_yaml(base, extends=False))))
    converted = load_run(out)
    shipped = load_run(ROOT / "configs" / folder / name)
    assert converted == shipped  # every field but the file's path


def test_convert_command_writes_a_file_that_loads(tmp_path):
    out = tmp_path / "new.yaml"
    done = subprocess.run(
        [sys.executable, "-m", "searchgym", "config", "convert", str(OLD / "grpo_tsas.yaml"), "-o", str(out)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert to_dict(load_config(out)) == to_dict(load_config(ROOT / "configs" / "grpo_tsas.yaml"))


def _write(tmp_path: Path, data: dict, name: str = "run.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def _error(path: Path) -> ConfigError:
    with pytest.raises(ConfigError) as caught:
        load_run(path)
    return caught.value


def test_unknown_key_names_file_dotted_key_and_close_match(tmp_path):
    path = _write(tmp_path, {"env": {"id": "SyntheticFacts-v1", "max_turn": 3}})
    error = _error(path)
    assert error.source == str(path) and error.field == "env.max_turn"
    assert "max_turns" in str(error)


def test_wrong_type_is_refused_at_load(tmp_path):
    error = _error(
        _write(tmp_path, {"env": {"id": "SyntheticFacts-v1"}, "builtin": {"rollout": {"group_size": "4"}}})
    )
    assert error.field == "builtin.rollout.group_size" and "an int" in str(error)


def test_a_reward_parameter_the_scheme_lacks_fails_at_load(tmp_path):
    path = _write(
        tmp_path,
        {"env": {"id": "SyntheticFacts-v1", "reward": "lightsearcher", "reward_kwargs": {"lamda": 1}}},
    )
    error = _error(path)
    assert error.field == "env.reward_kwargs" and "'lam'" in str(error)


def test_an_env_option_the_env_does_not_take_fails_at_load(tmp_path):
    error = _error(_write(tmp_path, {"env": {"id": "SyntheticFacts-v1", "data_path": "q.jsonl"}}))
    assert error.field == "env.data_path" and "world_seed" in str(error)


def test_an_unknown_tsas_variant_fails_at_load(tmp_path):
    error = _error(
        _write(
            tmp_path,
            {"env": {"id": "SyntheticFacts-v1"}, "advantage": {"estimator": "tsas", "variant": "eq3"}},
        )
    )
    assert error.field == "advantage.variant" and "eq2" in str(error)


def test_an_unknown_estimator_gets_did_you_mean(tmp_path):
    error = _error(_write(tmp_path, {"env": {"id": "SyntheticFacts-v1"}, "advantage": {"estimator": "tsa"}}))
    assert error.field == "advantage.estimator" and "'tsas'" in str(error)


def test_memory_without_a_store_under_openrlhf_fails_at_load(tmp_path):
    path = _write(
        tmp_path,
        {"backend": "openrlhf", "env": {"id": "NQ-v1"}, "memory": {"kind": "lightsearcher"}, "openrlhf": {}},
    )
    error = _error(path)
    assert error.field == "memory.path" and error.source == str(path)


def test_a_section_of_the_other_backend_fails_at_load(tmp_path):
    error = _error(_write(tmp_path, {"env": {"id": "NQ-v1"}, "openrlhf": {"actor": {}}}))
    assert error.field == "openrlhf" and "backend: openrlhf" in str(error)
    error = _error(_write(tmp_path, {"backend": "openrlhf", "env": {"id": "NQ-v1"}, "builtin": {}}))
    assert error.field == "builtin"


def test_token_reasoning_is_refused_under_openrlhf(tmp_path):
    path = _write(
        tmp_path,
        {
            "backend": "openrlhf",
            "env": {"id": "NQ-v1"},
            "advantage": {"estimator": "tsas", "reasoning": "tokens"},
        },
    )
    assert _error(path).field == "advantage.reasoning"


def test_extends_merges_the_base_key_by_key(tmp_path):
    _write(
        tmp_path,
        {"env": {"id": "SyntheticFacts-v1", "max_turns": 3, "topk": 2}, "builtin": {"steps": 5}},
        "base.yaml",
    )
    path = _write(tmp_path, {"extends": "base.yaml", "env": {"max_turns": 5}, "builtin": {"seed": 3}})
    spec = load_run(path)
    assert (spec.env.max_turns, spec.env.topk) == (5, 2)
    assert spec.builtin is not None and (spec.builtin.steps, spec.builtin.seed) == (5, 3)


def test_env_kwargs_are_the_fields_that_are_set():
    config = EnvConfig(id="SyntheticFacts-v1", reward="cost", max_turns=2)
    assert config.id == "searchgym/SyntheticFacts-v1"
    assert config.kwargs() == {"reward": "cost", "max_turns": 2}
    assert EnvConfig.from_kwargs(config.id, config.kwargs()) == config


def test_an_agent_only_file_in_the_run_layout_is_what_the_agent_reads(tmp_path):
    path = _write(
        tmp_path,
        {"env": {"id": "NQ-v1", "reward": "em"}, "advantage": {"estimator": "tsas", "variant": "eq2"}},
    )
    agent = load_agent_config(path)
    assert agent.env_id == "searchgym/NQ-v1" and agent.env_kwargs == {"reward": "em"}
    assert agent.advantage is not None and agent.advantage.variant == "eq2"


def test_a_group_norm_advantage_under_openrlhf_sets_its_estimator_flag(tmp_path):
    path = _write(
        tmp_path,
        {
            "backend": "openrlhf",
            "env": {"id": "NQ-v1"},
            "advantage": {"estimator": "dr_grpo"},
            "openrlhf": {"actor": {"x": 1}},
        },
    )
    config = load_run_config(path)
    assert config.agent.advantage is None  # OpenRLHF computes it itself
    assert config.openrlhf == {"actor": {"x": 1}, "algo": {"advantage": {"estimator": "dr_grpo"}}}
    clash = _write(
        tmp_path,
        {
            "backend": "openrlhf",
            "env": {"id": "NQ-v1"},
            "advantage": {"estimator": "dr_grpo"},
            "openrlhf": {"algo": {"advantage": {"estimator": "group_norm"}}},
        },
        "clash.yaml",
    )
    assert _error(clash).field == "openrlhf.algo.advantage.estimator"


def test_allow_changes_take_run_file_keys(tmp_path):
    path = _write(
        tmp_path,
        {
            "env": {"id": "SyntheticFacts-v1"},
            "builtin": {
                "checkpoint": {
                    "allow_changes": ["env.reward", "advantage.alpha", "builtin.rollout", "advantage"]
                }
            },
        },
    )
    assert load_config(path).checkpoint.allow_changes == [
        "env.kwargs.reward",
        "algo.tsas_alpha",
        "rollout",
        "algo.advantage",
        "algo.tsas_warmup_steps",
        "algo.tsas_alpha",
        "algo.tsas_variant",
        "algo.tsas_reasoning",
    ]


def test_eval_runs_on_the_env_of_a_run_file(tmp_path, capsys):
    from searchgym.cli import main

    path = _write(
        tmp_path,
        {
            "env": {
                "id": "SyntheticFacts-v1",
                "reward": "cost",
                "reward_kwargs": {
                    "lam": 1.0,
                    "price_per_search": 0.5,
                    "gate": "none",
                    "format_penalty": None,
                },
                "max_turns": 3,
            },
            "builtin": {"steps": 3},
        },
    )
    out = tmp_path / "figures.json"
    argv = [
        "eval",
        "--config",
        str(path),
        "--policy",
        "naive_rag",
        "--episodes",
        "20",
        "--no-progress",
        "--out",
        str(out),
    ]
    assert main(argv) == 0
    result = json.loads(out.read_text(encoding="utf-8"))
    assert (
        result["settings"]["reward"] == "cost"
        and result["settings"]["reward_kwargs"]["price_per_search"] == 0.5
    )
    # naive_rag searches once per episode and, with no gate, always pays 1.0 x 0.5 for it
    assert result["st"] == 1.0 and result["reward"] == pytest.approx(result["f1"] - 0.5)


def test_eval_on_a_run_file_writes_no_training_store(tmp_path):
    from searchgym.cli import main

    store = tmp_path / "min_tool_calls.sqlite"
    path = _write(
        tmp_path,
        {
            "env": {
                "id": "SyntheticFacts-v1",
                "reward": "lightsearcher",
                "reward_kwargs": {"store": str(store)},
            }
        },
    )
    assert (
        main(["eval", "--config", str(path), "--policy", "naive_rag", "--episodes", "5", "--no-progress"])
        == 0
    )
    assert not store.exists()


@pytest.mark.parametrize("name", BUILTIN)
def test_a_checkpoint_saved_by_the_old_trainer_resumes_under_the_new_file(name, tmp_path):
    """A checkpoint's config.yaml is the trainer's own record, in the layout the old trainer
    wrote it; the run file in the new layout differs from it in nothing a resume checks."""
    from searchgym.envs.config_base import plain
    from searchgym.trainers.grpo.resume_check import config_changes, saved_config

    saved = tmp_path / "config.yaml"
    saved.write_text((OLD / name).read_text(encoding="utf-8"), encoding="utf-8")  # as the old trainer read it
    new = load_config(ROOT / "configs" / name)
    assert config_changes(saved_config(saved, TrainConfig), plain(new)) == {}
    changed = plain(new.replace(rollout={**to_dict(new.rollout), "group_size": 7}))
    assert list(config_changes(saved_config(saved, TrainConfig), changed)) == ["rollout.group_size"]


def test_config_check_prints_the_file_as_the_backends_read_it(tmp_path):
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "searchgym",
            "config",
            "check",
            str(ROOT / "configs/openrlhf/lightsearcher_7b.yaml"),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    printed = yaml.safe_load(done.stdout)
    assert printed["env"]["protocol"] == "tool_call"  # from the base file
    assert (
        printed["env"]["reward_kwargs"]["store"] == "runs/lightsearcher-7b/min_tool_calls.sqlite"
    )  # its own
    assert printed["openrlhf"]["actor"]["model_name_or_path"] == "Qwen/Qwen2.5-7B-Instruct"
    old = subprocess.run(
        [sys.executable, "-m", "searchgym", "config", "check", str(OLD / "grpo_synthetic.yaml")],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert old.returncode == 2 and len(old.stderr.strip().splitlines()) == 1
    assert "searchgym config convert" in old.stderr
