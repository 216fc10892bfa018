"""The command line's first-hour edges: missing extras, the train dry run, CPU threads, data flags, outputs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from searchgym.cli import main
from searchgym.envs.benchmarks import DATA_DIR_VARIABLE

REPO = Path(__file__).resolve().parents[2]
SYNTHETIC = REPO / "configs" / "grpo_synthetic.yaml"

# A sitecustomize that hides modules the way an absent package looks: importing it raises
# ModuleNotFoundError (sys.modules[name] = None), and find_spec cannot see it either.
HIDER = """
import os, sys
for name in os.environ.get("SEARCHGYM_TEST_HIDE", "").split(","):
    if name:
        sys.modules[name] = None
"""


def _run_without(module: str, argv: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    shim = tmp_path / "shim"
    shim.mkdir(exist_ok=True)
    (shim / "sitecustomize.py").write_text(HIDER, encoding="utf-8")
    env = dict(os.environ, PYTHONPATH=str(shim), SEARCHGYM_TEST_HIDE=module, OMP_NUM_THREADS="1")
    code = "import sys; from searchgym.cli import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run(
        [sys.executable, "-c", code, *argv],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _config(tmp_path: Path, **changes: object) -> Path:
    """The shipped CPU config with its outputs in ``tmp_path`` and ``changes`` (dotted keys) applied."""
    data = yaml.safe_load(SYNTHETIC.read_text(encoding="utf-8"))
    data["builtin"]["output_dir"] = str(tmp_path / "run")
    data["builtin"]["model"]["tiny"]["dir"] = str(tmp_path / "tiny")
    for dotted, value in changes.items():
        *parents, last = dotted.split(".")
        node = data
        for key in parents:
            node = node[key]
        if value is None:
            del node[last]
        else:
            node[last] = value
    path = tmp_path / "train.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("module", "argv", "extra"),
    [
        ("torch", ["train", "--config", str(SYNTHETIC)], "train"),
        ("torch", ["train", "--config", str(SYNTHETIC), "--dry-run"], "train"),
        ("transformers", ["train", "--config", str(SYNTHETIC), "--dry-run"], "train"),
        ("faiss", ["index", "--corpus", "{corpus}", "--out", "idx"], "retrieval"),
        ("sentence_transformers", ["index", "--corpus", "{corpus}", "--out", "idx"], "embed"),
        ("aiohttp", ["serve", "--index", "idx"], "serve"),
        ("wandb", ["eval", "--episodes", "2", "--no-progress", "--wandb"], "wandb"),
        ("torch", ["eval", "--episodes", "2", "--no-progress", "--policy", "hf:model"], "train"),
    ],
)
def test_a_missing_extra_is_one_line_with_its_pip_install(module, argv, extra, shared_data, tmp_path):
    argv = [a.format(corpus=shared_data / "corpus.jsonl") for a in argv]
    done = _run_without(module, argv, tmp_path)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("searchgym: error: ")
    assert f"pip install 'searchgym[{extra}]'" in lines[0] or f"searchgym[retrieval,{extra}]" in lines[0]
    assert "Traceback" not in done.stderr and not done.stdout
    assert not (tmp_path / "idx").exists()  # it stopped before writing anything


def test_dry_run_builds_the_env_and_suggests_the_reward(tmp_path, capsys):
    config = _config(tmp_path, **{"env.reward": "lightsearchr"})
    assert main(["train", "--config", str(config), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "Did you mean 'lightsearcher'?" in err and str(config) in err
    assert not (tmp_path / "run").exists()


def test_dry_run_suggests_a_misspelled_env_keyword(tmp_path, capsys):
    config = _config(tmp_path, **{"env.max_turn": 3})
    assert main(["train", "--config", str(config), "--dry-run"]) == 2
    assert "Did you mean 'max_turns'" in capsys.readouterr().err


def test_dry_run_fails_on_a_missing_model_folder(tmp_path, capsys):
    missing = tmp_path / "models" / "Qwen2.5-0.5B-Instruct"
    config = _config(tmp_path, **{"builtin.model.tiny": None, "builtin.model.path": str(missing)})
    assert main(["train", "--config", str(config), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert f"builtin.model.path: '{missing}' is not a folder" in err


def test_dry_run_takes_a_registered_model_name(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("SEARCHGYM_HOME", str(tmp_path / "home"))
    config = _config(tmp_path, **{"builtin.model.tiny": None, "builtin.model.path": "smollm2-135m-instruct"})
    assert main(["train", "--config", str(config), "--dry-run"]) == 2  # not pulled into this home
    assert "searchgym models pull smollm2-135m-instruct" in capsys.readouterr().err
    folder = tmp_path / "home" / "models" / "smollm2-135m-instruct"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    from searchgym.models import CONVERSION, DONE_FILE

    (folder / DONE_FILE).write_text(json.dumps({"conversion": CONVERSION}))
    assert main(["train", "--config", str(config), "--dry-run"]) == 0
    assert "offline model smollm2-135m-instruct" in capsys.readouterr().out


def test_dry_run_fails_on_a_folder_that_is_not_a_model(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    config = _config(tmp_path, **{"builtin.model.tiny": None, "builtin.model.path": str(tmp_path / "empty")})
    assert main(["train", "--config", str(config), "--dry-run"]) == 2
    assert "holds no config.json" in capsys.readouterr().err


def test_dry_run_checks_benchmark_files(tmp_path, capsys):
    config = _config(
        tmp_path,
        **{
            "env": {
                "id": "searchgym/HotpotQA-v1",
                "data_path": str(tmp_path / "nope.jsonl"),
                "corpus_path": str(tmp_path / "c.jsonl"),
            },
        },
    )
    assert main(["train", "--config", str(config), "--dry-run"]) == 2
    assert "nope.jsonl" in capsys.readouterr().err


def test_dry_run_plans_the_shipped_config_and_writes_nothing(tmp_path, capsys):
    config = _config(tmp_path)
    assert main(["train", "--config", str(config), "--dry-run"]) == 0
    out = capsys.readouterr().out
    # 40 steps x 2 questions x 4 rollouts = 320 episodes; x 3 turns x 24 tokens = 23,040 tokens
    assert "expected work: 320 episodes of up to 3 turns, at most 23,040 generated tokens" in out
    assert "expected time:" in out
    assert not (tmp_path / "run").exists()


def test_dry_run_fails_on_an_output_dir_under_a_file(tmp_path, capsys):
    (tmp_path / "file").write_text("x", encoding="utf-8")
    config = _config(tmp_path, **{"builtin.output_dir": str(tmp_path / "file" / "run")})
    assert main(["train", "--config", str(config), "--dry-run"]) == 2
    assert "output_dir" in capsys.readouterr().err


def test_cpu_threads_default_is_one_for_the_tiny_model(monkeypatch):
    torch = pytest.importorskip("torch")
    from searchgym.trainers.config import ModelConfig, TinyModelConfig
    from searchgym.trainers.grpo.model import cpu_threads, set_cpu_threads

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    tiny = ModelConfig(tiny=TinyModelConfig())
    assert cpu_threads(tiny) == 1
    assert cpu_threads(ModelConfig(path="some/model")) is None  # torch's own default
    assert cpu_threads(ModelConfig(tiny=TinyModelConfig(), cpu_threads=3)) == 3
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert cpu_threads(tiny) is None  # torch already honours the variable
    before = torch.get_num_threads()
    try:
        set_cpu_threads(ModelConfig(tiny=TinyModelConfig(), cpu_threads=before + 1), torch.device("cpu"))
        assert torch.get_num_threads() == before + 1
    finally:
        torch.set_num_threads(before)


def test_eval_asks_for_the_data_flags(monkeypatch, capsys):
    monkeypatch.delenv(DATA_DIR_VARIABLE, raising=False)
    assert main(["eval", "--env", "searchgym/HotpotQA-v1", "--episodes", "2", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "--data-path" in err and "--corpus-path" in err and "gym.make" not in err


@pytest.mark.parametrize(
    "output",
    [
        "bm25_index/params.index.json",
        "dense_idx/index.faiss",
        "hotpot.json",
        "data/lightsearcher_train.jsonl",
    ],
)
def test_the_readme_outputs_are_ignored(output):
    pages = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    assert any(output.split("/")[0] in page.read_text(encoding="utf-8") for page in pages)
    done = subprocess.run(["git", "check-ignore", "-q", output], cwd=REPO, capture_output=True)
    assert done.returncode == 0, f"{output} is not covered by .gitignore"


def test_dry_run_estimates_the_time_from_an_earlier_runs_steps(tmp_path, capsys):
    import json

    config = _config(tmp_path)
    # the state file a run's checkpoint after 10 of its 40 steps holds (TrainerState as JSON)
    state = {"step": 10, "history": [{"step": i + 1, "train": {"step_s": 1.5 + (i % 2)}} for i in range(10)]}
    folder = tmp_path / "run" / "checkpoints" / "step_000010"
    folder.mkdir(parents=True)
    (folder / "trainer_state.json").write_text(json.dumps(state), encoding="utf-8")
    assert main(["train", "--config", str(config), "--dry-run"]) == 0
    # median of five 1.5 s and five 2.5 s steps = 2.0 s; 30 steps remain: 60 s
    assert (
        "expected time: about 60 s for the 30 remaining steps (median 2.00 s per step"
        in capsys.readouterr().out
    )


def test_dry_run_builds_the_experience_memory_without_writing(tmp_path, capsys):
    config = _config(tmp_path, memory={"kind": "lightsearcher"})
    assert main(["train", "--config", str(config), "--dry-run"]) == 0
    assert "memory: lightsearcher" in capsys.readouterr().out
    assert not (tmp_path / "run").exists()


def test_dry_run_fails_on_a_missing_hiexp_store(tmp_path, capsys):
    config = _config(tmp_path, memory={"kind": "hiexp", "path": str(tmp_path / "levels")})
    assert main(["train", "--config", str(config), "--dry-run"]) == 2
    assert "memory.path:" in capsys.readouterr().err
