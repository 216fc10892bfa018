"""``launch`` (run file → train_ppo_ray command), the shipped configs, and ``searchgym prepare``."""

from __future__ import annotations

import io
import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from searchgym.envs.config_base import ConfigError
from searchgym.envs.protocols import make_protocol
from searchgym.error import InvalidArgumentError, SearchGymError, UnknownNameError
from searchgym.trainers.openrlhf import agent_file_path, compose, launch, load_run_config
from searchgym.trainers.openrlhf.advantage_hook import HOOK
from searchgym.trainers.openrlhf.flags import FlagError, check_flags, openrlhf_parser

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = sorted((ROOT / "configs" / "openrlhf").glob("*.yaml"))
needs_openrlhf = pytest.mark.skipif(openrlhf_parser() is None, reason="needs openrlhf==0.11.2 (--no-deps)")


def write_prompts(path: Path, rows: int = 7000) -> Path:
    """A prompt file of ``rows`` rows in `searchgym prepare`'s columns (the dry run counts them)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"prompt": f"q{i}", "label": "{}"}) + "\n" for i in range(rows)))
    return path


def shipped_data(folder: Path) -> Path:
    """The training rows the shipped configs read (``data/*_train.jsonl``), under ``folder``."""
    for name in ("lightsearcher", "light_search", "sem", "hiexp"):
        write_prompts(folder / "data" / f"{name}_train.jsonl")
    return folder


def dry_run(path: Path) -> list[str]:
    out = io.StringIO()
    assert launch(path, dry_run=True, out=out) == 0
    lines = out.getvalue().strip().splitlines()
    assert len(lines) == 1
    return shlex.split(lines[0])


def flag_values(argv: list[str]) -> dict[str, list[str]]:
    values: dict[str, list[str]] = {}
    key = None
    for part in argv:
        if part.startswith("--"):
            key = part[2:]
            values[key] = []
        elif key is not None:
            values[key].append(part)
    return values


# -- the shipped configs -------------------------------------------------------------------------


def test_every_scheme_ships_for_3b_and_7b():
    import yaml

    names = {p.stem for p in CONFIGS}
    for scheme in ("lightsearcher", "light_search", "sem", "hiexp"):
        assert scheme in names and f"{scheme}_7b" in names
    for path in CONFIGS:  # each file says its backend itself, so `searchgym train --config` finds it
        assert yaml.safe_load(path.read_text())["backend"] == "openrlhf"


@needs_openrlhf
def test_searchgym_train_dispatches_to_launch(tmp_path):
    shipped_data(tmp_path)
    done = cli(
        "train", "--config", str(ROOT / "configs" / "openrlhf" / "sem_7b.yaml"), "--dry-run", cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    assert (
        "searchgym.trainers.openrlhf.train_ppo" in done.stdout and "Qwen/Qwen2.5-7B-Instruct" in done.stdout
    )


def test_train_ppo_takes_the_runtime_env_from_launch(monkeypatch, tmp_path):
    from searchgym.trainers.openrlhf import train_ppo

    monkeypatch.setenv("SEARCHGYM_RAY_RUNTIME_ENV", json.dumps({"env_vars": {"A": "1"}}))
    assert train_ppo.runtime_env() == {"env_vars": {"A": "1"}}
    monkeypatch.delenv("SEARCHGYM_RAY_RUNTIME_ENV")
    config = write(tmp_path, BASE + "advantage: {estimator: tsas}\n")
    monkeypatch.setenv("SEARCHGYM_AGENT_CONFIG", str(config))
    env = train_ppo.runtime_env()  # built from the agent config when launched by hand
    assert env["worker_process_setup_hook"] == HOOK
    assert (
        env["env_vars"]["SEARCHGYM_AGENT_CONFIG"] == str(config) and env["env_vars"]["NCCL_DEBUG"] == "WARN"
    )
    monkeypatch.setenv("SEARCHGYM_RAY_RUNTIME_ENV", "[1]")
    with pytest.raises(InvalidArgumentError, match="JSON object"):
        train_ppo.runtime_env()


@needs_openrlhf
@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_dry_run_prints_a_command_openrlhf_accepts(path, monkeypatch, tmp_path):
    monkeypatch.chdir(shipped_data(tmp_path))
    words = dry_run(path)
    env, rest = [w for w in words if "=" in w and not w.startswith("-")][:1], words
    assert env and env[0].startswith("SEARCHGYM_RAY_RUNTIME_ENV=")
    runtime = json.loads(env[0].split("=", 1)[1])
    command = rest[1:]
    assert command[1:3] == ["-m", "searchgym.trainers.openrlhf.train_ppo"]
    flags = command[3:]
    args, _ = check_flags(flags, openrlhf_parser())  # OpenRLHF's parser and checks accept it
    assert args.train.agent_func_path == agent_file_path()
    assert args.data.input_key == "prompt" and args.data.label_key == "label"
    assert args.actor.model_name_or_path == (
        "Qwen/Qwen2.5-7B-Instruct" if "7b" in path.stem else "Qwen/Qwen2.5-3B-Instruct"
    )
    assert runtime["env_vars"]["SEARCHGYM_AGENT_CONFIG"] == str(path.resolve())
    assert runtime["env_vars"]["SEARCHGYM_AGENT_BASEDIR"] == str(tmp_path)
    config = load_run_config(path)
    store = (config.agent.env_kwargs.get("reward_kwargs") or {}).get("store")
    assert ("worker_process_setup_hook" in runtime) == (
        config.agent.advantage is not None
        or getattr(config.agent.memory, "kind", None) == "lightsearcher"
        or store is not None  # the minimum tool-call store follows the checkpoints
        or args.ckpt.save_hf  # the HF copies are rotated with the checkpoints
    )
    assert args.ckpt.path.startswith(str(tmp_path))  # relative output folders made absolute


@needs_openrlhf
def test_paper_settings_reach_the_flags(monkeypatch, tmp_path):
    monkeypatch.chdir(shipped_data(tmp_path))
    configs = {p.stem: p for p in CONFIGS}
    ls = flag_values(dry_run(configs["lightsearcher"]))
    # LightSearcher: GRPO, 192 questions x 12 rollouts, lr 1e-6, 10 epochs
    assert ls["rollout.batch_size"] == ["192"] and ls["rollout.n_samples_per_prompt"] == ["12"]
    assert ls["actor.adam.lr"] == ["1e-06"] and ls["train.num_episodes"] == ["10"]
    assert ls["algo.advantage.estimator"] == ["group_norm"]
    agent = load_run_config(configs["lightsearcher"]).agent
    assert agent.memory.kind == "lightsearcher" and agent.memory.update_every == 5
    assert agent.env_kwargs["reward"] == "lightsearcher" and agent.env_kwargs["protocol"] == "tool_call"
    # Light-Search: 5 rollouts, 4096 + 512 tokens, KL 0.001 k3 as a loss, TSAS from step 150
    lt = flag_values(dry_run(configs["light_search"]))
    assert lt["rollout.n_samples_per_prompt"] == ["5"] and lt["data.max_len"] == ["4608"]
    assert (
        lt["algo.kl.init_coef"] == ["0.001"]
        and lt["algo.kl.estimator"] == ["k3"]
        and "algo.kl.use_loss" in lt
    )
    agent = load_run_config(configs["light_search"]).agent
    assert agent.advantage.warmup_steps == 150 and agent.advantage.alpha == 0.01
    assert agent.env_kwargs["retriever"] == "simulated"
    # SEM: batch 8, 200 steps, SEM's protocol and reward
    sem = flag_values(dry_run(configs["sem"]))
    assert sem["rollout.batch_size"] == ["8"] and sem["data.max_samples"] == ["1600"]
    assert load_run_config(configs["sem"]).agent.env_kwargs["reward"] == "sem"
    # HiExp: batch 16, 8 rollouts, top-p 0.95, hierarchical memory
    hx = flag_values(dry_run(configs["hiexp"]))
    assert hx["rollout.batch_size"] == ["16"] and hx["rollout.n_samples_per_prompt"] == ["8"]
    assert hx["rollout.top_p"] == ["0.95"]
    assert load_run_config(configs["hiexp"]).agent.memory.kind == "hiexp"


def test_module_entry_point_dry_run(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "searchgym.trainers.openrlhf", "--dry-run", str(CONFIGS[0])],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=shipped_data(tmp_path),
    )
    assert out.returncode == 0, out.stderr
    assert "openrlhf" in out.stdout and "--train.agent_func_path" in out.stdout


# -- bad configs -----------------------------------------------------------------------------------


def write(tmp_path: Path, text: str) -> Path:
    """``run.yaml`` in ``tmp_path``; its ``prompt_dataset: train.jsonl`` becomes a 64-row file there."""
    prompts = write_prompts(tmp_path / "train.jsonl", 64)
    path = tmp_path / "run.yaml"
    path.write_text(text.replace("prompt_dataset: train.jsonl", f"prompt_dataset: {prompts}"))
    return path


BASE = """\
backend: openrlhf
env: {id: searchgym/SyntheticFacts-v1, protocol: tool_call}
openrlhf:
  actor: {model_name_or_path: m, num_gpus_per_node: 1}
  vllm: {num_engines: 1}
  train: {batch_size: 8}
  rollout: {n_samples_per_prompt: 4, batch_size: 2}
  algo: {advantage: {estimator: group_norm}}
  data: {prompt_dataset: train.jsonl}
"""


@needs_openrlhf
def test_a_minimal_run_file_composes(tmp_path):
    plan = compose(load_run_config(write(tmp_path, BASE)), basedir=str(tmp_path))
    assert plan.flags[:2] == ["--actor.model_name_or_path", "m"]
    assert "worker_process_setup_hook" not in plan.runtime_env


# -- registered offline model names ------------------------------------------------------------

SMOLLM2 = "smollm2-135m-instruct"
NAMED = BASE.replace("openrlhf:\n", f"openrlhf:\n  agent: {{tokenizer: {SMOLLM2}}}\n").replace(
    "model_name_or_path: m,", f"model_name_or_path: {SMOLLM2},"
)


def test_a_registered_model_name_runs_as_its_pulled_folder(tmp_path, smollm2_dir, monkeypatch, capsys):
    from searchgym.cli import main
    from searchgym.trainers.openrlhf.agent import _default_formatter

    monkeypatch.setenv("SEARCHGYM_HOME", str(smollm2_dir.parents[1]))
    path = write(tmp_path, NAMED + "  reward: {model_name_or_path: " + f"'{SMOLLM2},rm'" + "}\n")
    config = load_run_config(path)
    assert config.agent.tokenizer == str(smollm2_dir)
    flags = flag_values(compose(config, basedir=str(tmp_path)).flags)
    assert flags["actor.model_name_or_path"] == [str(smollm2_dir)]
    assert flags["reward.model_name_or_path"] == [f"{smollm2_dir},rm"]
    # the agent formats with the pulled tokenizer's ChatML template
    rendered = _default_formatter(config.agent).render(["Question: Who?"])
    assert rendered.startswith("<|im_start|>system") and rendered.endswith("<|im_start|>assistant\n")
    # searchgym train's dry run prints the folder as the pretrain flag
    assert main(["train", "--backend", "openrlhf", "--config", str(path), "--dry-run"]) == 0
    assert flag_values(shlex.split(capsys.readouterr().out))["actor.model_name_or_path"] == [str(smollm2_dir)]


@pytest.mark.parametrize("where", ["actor", "agent"])
def test_an_unpulled_model_name_gives_the_pull_command(tmp_path, monkeypatch, capsys, where):
    from searchgym.cli import main

    monkeypatch.setenv("SEARCHGYM_HOME", str(tmp_path / "empty"))
    text = NAMED if where == "agent" else NAMED.replace(f"  agent: {{tokenizer: {SMOLLM2}}}\n", "")
    path = write(tmp_path, text)
    assert main(["train", "--backend", "openrlhf", "--config", str(path), "--dry-run"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].endswith(f"Run: searchgym models pull {SMOLLM2}"), lines


@pytest.mark.parametrize(
    "text, match",
    [
        (BASE + "extra: 1\n", r"^\S+run.yaml: extra: got 1; allowed: the keys of RunSpec: "),
        (BASE.replace("env: {", "envs: {"), r"^\S+run.yaml: envs: .* Unknown key. Did you mean 'env'"),
        (
            BASE.replace("openrlhf:\n", "openrlhf:\n  launch: {adress: x}\n"),
            r"openrlhf.launch.adress: .* Did you mean 'ray_address'\?",
        ),
        (
            BASE.replace("id: searchgym/SyntheticFacts-v1", "id: SyntheticFact-v0"),
            r"env.id: got 'SyntheticFact-v0'; .* Did you mean 'searchgym/SyntheticFacts-v1'",
        ),
        (
            BASE + "memory: {kind: lightsearch, path: m}\n",
            r"memory.kind: got 'lightsearch'; allowed: one of 'none', 'lightsearcher', 'hiexp'. "
            r"Did you mean 'lightsearcher'\?",
        ),
        (
            BASE + "memory: {kind: experience, path: m}\n",
            r"memory.kind: got 'experience'; .* The kind 'experience' is called 'lightsearcher'",
        ),
        (
            BASE + "memory: {kind: lightsearcher}\n",
            r"memory.path: got None; allowed: the store folder every agent instance shares",
        ),
        (
            BASE + "memory: {kind: lightsearcher, path: m, backend: ray}\n",
            r"memory.backend: got 'ray'; allowed: 'file' \(leave it out\). It applies to the built-in",
        ),
        (
            BASE + "memory: {kind: lightsearcher, path: m, top_k: two}\n",
            r"memory.top_k: got 'two'; allowed: an int\.",
        ),
        (
            BASE + "advantage: {estimator: tsas, warmup_steps: -1}\n",
            r"advantage.warmup_steps: got -1; allowed: an int >= 0",
        ),
        (
            BASE.replace("openrlhf:\n", "openrlhf:\n  launch: {env: {A: [1]}}\n"),
            r"openrlhf.launch.env.A: got \[1\]; allowed: a string or number",
        ),
        ("env: {id: NQ-v1}\n", r"run.yaml: backend: got 'builtin'; allowed: 'openrlhf'"),
        (
            BASE.replace("backend: openrlhf", "backend: builtin"),
            r"run.yaml: openrlhf: .* no openrlhf section with backend: builtin",
        ),
        (
            "agent: {env_id: NQ-v1}\n",
            r"run.yaml: layout: got 'openrlhf'; .* Convert it with: searchgym config convert \S+run.yaml -o NEW.yaml$",
        ),
    ],
)
def test_bad_run_files_are_refused_with_the_file_and_dotted_field_named(tmp_path, text, match):
    with pytest.raises(ConfigError, match=match):
        load_run_config(write(tmp_path, text))


def test_a_run_file_that_is_not_a_mapping_is_refused(tmp_path):
    with pytest.raises(SearchGymError, match="mapping"):
        load_run_config(write(tmp_path, "- a list\n"))


@needs_openrlhf
@pytest.mark.parametrize(
    "change, error, match",
    [
        (("estimator: group_norm", "estimater: group_norm"), UnknownNameError, "algo.advantage.estimator"),
        (("batch_size: 2}", "batch_size: two}"), FlagError, "invalid int value"),
        (("estimator: group_norm", "estimator: grpo"), FlagError, "invalid choice"),
        (("n_samples_per_prompt: 4", "n_samples_per_prompt: 1"), FlagError, "n_samples_per_prompt > 1"),
        (("{prompt_dataset: train.jsonl}", "{max_len: 10}"), InvalidArgumentError, "searchgym prepare"),
    ],
)
def test_bad_flags_are_refused_by_openrlhfs_own_checks(tmp_path, change, error, match):
    config = load_run_config(write(tmp_path, BASE.replace(*change)))
    with pytest.raises(error, match=match):
        compose(config)


@needs_openrlhf
def test_tsas_needs_a_group_estimator_and_installs_the_hook(tmp_path):
    text = BASE + "advantage: {estimator: tsas}\n"
    with pytest.raises(InvalidArgumentError, match="dr_grpo"):
        compose(load_run_config(write(tmp_path, text.replace("group_norm", "gae"))))
    plan = compose(load_run_config(write(tmp_path, text.replace("group_norm", "dr_grpo"))))
    assert plan.runtime_env["worker_process_setup_hook"] == HOOK


def test_the_agent_memory_is_the_builtin_memory_section(tmp_path, monkeypatch):
    from searchgym.memory.config import MemoryConfig
    from searchgym.trainers import env_pool

    none = load_run_config(write(tmp_path, BASE + "memory: {kind: none}\n"))
    assert none.agent.memory is None
    text = BASE + "memory: {kind: lightsearcher, path: m, theta_r: 0.5, good_reward: 0.9}\n"
    memory = load_run_config(write(tmp_path, text), basedir=str(tmp_path)).agent.memory
    assert isinstance(memory, MemoryConfig) and memory.path == str(tmp_path / "m")
    monkeypatch.setattr(env_pool, "_MEMORIES", {})
    opened = env_pool.open_memory(memory)
    assert (opened.theta_r, opened.good_reward) == (0.5, 0.9)  # the agent's memory gets them too
    opened.close()


def test_extends_merges_key_by_key(tmp_path):
    (tmp_path / "base.yaml").write_text(BASE)
    child = tmp_path / "child.yaml"
    child.write_text("extends: base.yaml\nopenrlhf:\n  actor: {model_name_or_path: other}\n")
    config = load_run_config(child)
    assert config.openrlhf["actor"] == {"model_name_or_path": "other", "num_gpus_per_node": 1}
    assert config.openrlhf["rollout"]["n_samples_per_prompt"] == 4
    (tmp_path / "base.yaml").write_text("extends: child.yaml\n")
    with pytest.raises(SearchGymError, match="cycle"):
        load_run_config(child)


def test_job_submission_mode(tmp_path):
    path = write(
        tmp_path,
        BASE.replace(
            "openrlhf:\n",
            "openrlhf:\n  launch: {ray_address: 'http://head:8265', env: {SEARCHGYM_DATA_DIR: /data}}\n",
        ),
    )
    plan = compose(load_run_config(path))
    assert plan.command[:5] == ["ray", "job", "submit", "--address", "http://head:8265"]
    runtime = json.loads(plan.command[plan.command.index("--runtime-env-json") + 1])
    assert runtime["env_vars"]["SEARCHGYM_DATA_DIR"] == "/data"
    # OpenRLHF's ray.init sets these itself; Ray refuses a variable set in both places
    assert "NCCL_DEBUG" not in runtime["env_vars"]
    assert plan.command[plan.command.index("--") + 1 : plan.command.index("--") + 4] == [
        "python3",
        "-m",
        "openrlhf.cli.train_ppo_ray",
    ]


def test_a_real_run_without_vllm_says_how_to_install(tmp_path):
    pytest.importorskip("openrlhf")
    import importlib.util

    if importlib.util.find_spec("vllm") and importlib.util.find_spec("deepspeed"):
        pytest.skip("vLLM and DeepSpeed are installed: this machine could really run")
    with pytest.raises(SearchGymError, match="pip install"):
        launch(write(tmp_path, BASE))


# -- searchgym prepare -----------------------------------------------------------------------------


def cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "searchgym", *args], capture_output=True, text=True, timeout=120, cwd=cwd
    )


def read_rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_prepare_writes_prompt_and_json_label_rows(tmp_path):
    from searchgym.envs.synthetic import generate_world

    out = tmp_path / "train.jsonl"
    done = cli("prepare", "--dataset", "synthetic:7", "--protocol", "tool_call", "--out", str(out))
    assert done.returncode == 0, done.stderr
    rows = read_rows(out)
    assert len(rows) == 7
    world = {q.id: q for q in generate_world(0).questions}
    protocol = make_protocol("tool_call")
    for row in rows:
        assert set(row) == {"prompt", "label", "datasource"} and row["datasource"] == "synthetic"
        label = json.loads(row["label"])  # a JSON string, as --data.label_key hands it to the agent
        assert set(label) == {"id", "question", "golden_answers"}
        question = world[label["id"]]
        assert label["question"] == question.question and label["golden_answers"] == list(
            question.golden_answers
        )
        assert row["prompt"] == protocol.render_prompt(question.question)
    assert len({json.loads(r["label"])["id"] for r in rows}) == 7
    again = tmp_path / "again.jsonl"
    cli("prepare", "--dataset", "synthetic:7", "--protocol", "tool_call", "--out", str(again))
    assert again.read_text() == out.read_text()  # seeded


def test_prepare_sem_mix_is_balanced(tmp_path, shared_data):
    out = tmp_path / "sem.jsonl"
    questions = shared_data / "questions"
    done = cli(
        "prepare",
        "--mix",
        "sem",
        "--data-path",
        str(questions / "musique.jsonl"),
        "--data-path",
        str(questions / "mmlu.jsonl"),
        "--out",
        str(out),
    )
    assert done.returncode == 0, done.stderr
    rows = read_rows(out)
    # 100 MuSiQue questions in the shared sample, 500 MMLU: balanced at 100 each
    assert sum(r["datasource"] == "musique" for r in rows) == 100
    assert sum(r["datasource"] == "mmlu" for r in rows) == 100
    assert {r["datasource"] for r in rows[:20]} == {"musique", "mmlu"}  # shuffled together
    assert all("<search>" in r["prompt"] and "Question: " in r["prompt"] for r in rows)  # SEM's protocol


def test_prepare_rejects_bad_input_with_a_fix(tmp_path):
    done = cli("prepare", "--dataset", "hotpot", "--out", str(tmp_path / "x.jsonl"))
    assert done.returncode == 2 and "hotpotqa" in done.stderr
    done = cli(
        "prepare",
        "--dataset",
        "nq",
        "--dataset",
        "hotpotqa",
        "--data-path",
        "a.jsonl",
        "--out",
        str(tmp_path / "x.jsonl"),
    )
    assert done.returncode == 2 and "one per dataset" in done.stderr
    done = cli("prepare", "--mix", "sem", "--dataset", "nq", "--out", str(tmp_path / "x.jsonl"))
    assert done.returncode == 2 and "musique and mmlu" in done.stderr
    assert not (tmp_path / "x.jsonl").exists()


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_every_shipped_config_builds_its_reward_scheme(path):
    """``extends`` merges mappings key by key: a file must not inherit another scheme's kwargs."""
    from searchgym.envs.rewards import make_reward
    from searchgym.trainers.openrlhf.config import load_run_config

    kwargs = load_run_config(path).agent.env_kwargs
    options = {k: v for k, v in dict(kwargs.get("reward_kwargs") or {}).items() if k != "store"}  # no files
    make_reward(kwargs.get("reward", "f1"), **options)


def test_every_study_arm_ships_for_3b_and_7b():
    names = {p.stem for p in CONFIGS}
    for arm in (
        "f1_baseline",
        "otc",
        "naive_cost",
        "lightsearcher_no_memory",
        "lightsearcher_no_adaptive",
        "light_search_no_stage2",
    ):
        assert arm in names and f"{arm}_7b" in names
