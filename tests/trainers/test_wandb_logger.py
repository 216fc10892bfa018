"""Weights & Biases logging, offline: the run files hold what was logged."""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path

import gymnasium as gym
import pytest

wandb = pytest.importorskip("wandb")

from searchgym.cli import main  # noqa: E402
from searchgym.memory import ExperienceBank  # noqa: E402
from searchgym.policies import DirectPolicy, evaluate  # noqa: E402
from searchgym.trainers.wandb_logger import WandbLogger, bank_rows  # noqa: E402


@pytest.fixture(autouse=True)
def offline(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    for name in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(name, str(tmp_path / "wandb-home" / name.lower()))


def read_records(run_file: Path) -> list:
    """The protobuf records of an offline ``run-*.wandb`` file (W&B's LevelDB-style log)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = run_file.read_bytes()
    ident, _magic, _version = struct.unpack("<4sHB", data[:7])
    assert ident == b":W&B"
    block, pos, buffer, records = 32768, 7, b"", []
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # the rest of a block too small for a header is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        pos += 7
        if pos + length > len(data):  # a record still being written
            break
        buffer += data[pos : pos + length]
        pos += length
        if kind in (1, 4):  # a full record, or the last piece of one
            record = pb.Record()
            record.ParseFromString(buffer)
            records.append(record)
            buffer = b""
    return records


def finished_records(run_file: Path) -> list:
    """The run file's records once W&B has written its closing ``exit`` record (up to 30 s):
    ``finish()`` can return before its writer has flushed the last history row."""
    deadline = time.monotonic() + 30.0
    while True:
        records = read_records(run_file)
        if any(r.WhichOneof("record_type") == "exit" for r in records) or time.monotonic() > deadline:
            return records
        time.sleep(0.2)


def history(run_file: Path) -> list[dict[str, object]]:
    """The run file's history rows."""
    return [
        {(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in record.history.item}
        for record in finished_records(run_file)
        if record.WhichOneof("record_type") == "history"
    ]


def run_config(run_file: Path) -> dict[str, object]:
    for record in finished_records(run_file):
        if record.WhichOneof("record_type") == "run":
            return {i.key: json.loads(i.value_json) for i in record.run.config.update}
    return {}


def only_run(folder: Path) -> Path:
    runs = sorted(folder.glob("wandb/offline-run-*"))
    assert len(runs) == 1, runs
    (run_file,) = runs[0].glob("run-*.wandb")
    return run_file


def tables(run_file: Path, key: str) -> list[dict]:
    folder = run_file.parent / "files" / "media" / "table" / Path(key).parent
    return [json.loads(p.read_text()) for p in sorted(folder.glob(f"{Path(key).name}_*.table.json"))]


BANK = ExperienceBank(
    success_strategies=("Search once per unknown fact.",),
    pitfalls=("Do not search for facts you know.", "Do not answer before reading."),
    step=5,
    version=2,
)


def test_the_logger_writes_steps_the_bank_and_eval_results_to_the_run_files(tmp_path):
    env_maker = lambda: gym.make("searchgym/SyntheticFacts-v1")  # noqa: E731
    result = evaluate(env_maker, DirectPolicy(), 6, progress=False)
    with WandbLogger("searchgym-test", config={"seed": 3, "algo": {"lr": 1e-6}}, dir=tmp_path) as logger:
        logger.log_step(
            1,
            {"reward": 0.5, "em": 0.25, "sr": 1.0, "retrieval_errors": 2},
            {"loss": -0.1, "kl": float("nan")},
        )
        logger.log_step(
            2, {"reward": 0.75, "em": 0.5, "sr": 0.5, "retrieval_errors": 0}, {"loss": -0.2, "kl": 0.01}
        )
        logger.log_experience(BANK, step=2)
        logger.log_eval([result], step=3)
        run_id = logger.run_id
    run_file = only_run(tmp_path)
    assert run_file.name == f"run-{run_id}.wandb"
    rows = history(run_file)
    steps = [r for r in rows if "rollout/reward" in r]
    assert [(r["_step"], r["rollout/reward"], r["rollout/em"], r["train/loss"]) for r in steps] == [
        (1, 0.5, 0.25, -0.1),
        (2, 0.75, 0.5, -0.2),
    ]
    assert "train/kl" not in steps[0] and steps[1]["train/kl"] == 0.01  # NaN is left out
    assert steps[0]["rollout/retrieval_errors"] == 2
    config = run_config(run_file)
    assert config["seed"] == 3 and config["algo"] == {"lr": 1e-6}
    (bank,) = tables(run_file, "memory/experience")
    assert bank["columns"] == ["version", "step", "group", "item"]
    assert (
        bank["data"]
        == bank_rows(BANK)
        == [
            [2, 5, "Success strategies", "Search once per unknown fact."],
            [2, 5, "Pitfalls to avoid", "Do not search for facts you know."],
            [2, 5, "Pitfalls to avoid", "Do not answer before reading."],
        ]
    )
    memory_row = next(r for r in rows if "memory/items" in r)
    assert memory_row["memory/items"] == 3 and memory_row["memory/version"] == 2
    (table,) = tables(run_file, "eval/results")
    assert table["columns"][:5] == ["policy", "split", "episodes", "em", "f1"]
    assert table["data"][0][:3] == ["direct", "all", 6] and table["data"][0][3] == result.em
    eval_row = next(r for r in rows if "eval/direct/em" in r)
    assert eval_row["eval/direct/em"] == result.em and eval_row["eval/direct/sr"] == 0.0


def test_searchgym_eval_with_wandb_logs_every_policy(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code = main(
        ["eval", "--policy", "direct,naive_rag", "--episodes", "8", "--no-progress", "--wandb", "sg-test"]
    )
    assert code == 0
    assert "logged to W&B project 'sg-test'" in capsys.readouterr().out
    run_file = only_run(tmp_path)
    rows = history(run_file)
    row = next(r for r in rows if "eval/naive_rag/sr" in r)
    assert row["eval/naive_rag/sr"] == 1.0 and row["eval/direct/sr"] == 0.0  # naive RAG always searches once
    assert run_config(run_file)["policies"] == ["direct", "naive_rag"]
    (table,) = tables(run_file, "eval/results")
    assert {r[0] for r in table["data"]} == {"direct", "naive_rag"}


def test_the_trainer_logs_the_figures_of_every_step(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from searchgym.trainers.config import TrainConfig
    from searchgym.trainers.grpo import train

    config = TrainConfig.from_dict(
        {
            "output_dir": str(tmp_path / "run"),
            "steps": 2,
            "env": {"kwargs": {"reward": "f1", "max_turns": 2}},
            "model": {
                "tiny": {"dir": str(tmp_path / "tiny"), "hidden_size": 32, "num_layers": 1, "vocab_size": 400}
            },
            "rollout": {"group_size": 2, "questions_per_step": 1, "max_new_tokens": 4},
            "wandb": {"enabled": True, "project": "sg-train", "tags": ["test"]},
        }
    )
    train(config, progress=False)
    run_file = only_run(tmp_path / "run")
    rows = [r for r in history(run_file) if "rollout/reward" in r]
    assert [r["_step"] for r in rows] == [1, 2]
    expected = {
        "reward",
        "em",
        "f1",
        "st",
        "sd",
        "sr",
        "format_ok",
        "action_tokens",
        "total_tokens",
        "retrieval_errors",
    }
    assert {f"rollout/{k}" for k in expected} <= set(rows[0])
    assert {"train/loss", "train/kl", "train/lr", "train/step_s"} <= set(rows[0])
    assert run_config(run_file)["rollout"]["group_size"] == 2
    assert (tmp_path / "run" / "wandb_run_id").read_text().strip() == run_file.stem[len("run-") :]
