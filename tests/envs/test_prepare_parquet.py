"""``searchgym prepare`` reads Search-R1's parquet files (``nq_hotpotqa_train/train.parquet``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

from searchgym.commands.prepare import DatasetSpec, build_rows  # noqa: E402
from searchgym.envs.protocols import make_protocol  # noqa: E402
from searchgym.error import DataFileError  # noqa: E402

TEMPLATE = "Answer the given question. ... Question: {}\n"  # Search-R1's prompt wraps the question


def search_r1_row(i: int, source: str, question: str, answers: list[str]) -> dict:
    """One row as Search-R1's data_process/qa_search_train_merge.py writes it (FlashRAG's fields kept)."""
    return {
        "id": f"train_{i}",
        "question": question,
        "golden_answers": answers,
        "data_source": source,
        "prompt": [{"role": "user", "content": TEMPLATE.format(question)}],
        "ability": "fact-reasoning",
        "reward_model": {"style": "rule", "ground_truth": {"target": answers}},
        "extra_info": {"split": "train", "index": i},
    }


def write_parquet(path: Path, rows: list[dict]) -> Path:
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def test_search_r1_parquet_becomes_training_rows(tmp_path):
    rows = [
        search_r1_row(0, "nq", "who wrote the iliad", ["Homer"]),
        search_r1_row(1, "hotpotqa", "which river flows through both cities", ["the Rhine", "Rhine"]),
    ]
    path = write_parquet(tmp_path / "train.parquet", rows)
    out = build_rows([DatasetSpec("nq")], [path], protocol="search_r1", shuffle=False)
    assert [r["datasource"] for r in out] == ["nq", "hotpotqa"]  # each row keeps its own source
    labels = [json.loads(r["label"]) for r in out]
    assert labels == [
        {"id": "train_0", "question": "who wrote the iliad", "golden_answers": ["Homer"]},
        {
            "id": "train_1",
            "question": "which river flows through both cities",
            "golden_answers": ["the Rhine", "Rhine"],
        },
    ]
    assert out[0]["prompt"] == make_protocol("search_r1").render_prompt("who wrote the iliad")


def test_rows_without_flashrag_fields_use_search_r1s_own(tmp_path):
    row = search_r1_row(7, "nq", "capital of peru", ["Lima"])
    del row["id"], row["golden_answers"]
    out = build_rows([DatasetSpec("nq")], [write_parquet(tmp_path / "t.parquet", [row])], shuffle=False)
    assert json.loads(out[0]["label"]) == {
        "id": "nq_7",
        "question": "capital of peru",
        "golden_answers": ["Lima"],
    }


def test_bad_parquet_is_refused_with_the_file_named(tmp_path):
    broken = tmp_path / "broken.parquet"
    broken.write_bytes(b"not parquet")
    with pytest.raises(DataFileError, match="broken.parquet.*not readable parquet"):
        build_rows([DatasetSpec("nq")], [broken])
    row = search_r1_row(0, "nq", "", ["x"])
    with pytest.raises(DataFileError, match="question"):
        build_rows([DatasetSpec("nq")], [write_parquet(tmp_path / "empty_q.parquet", [row])])


def test_a_dataset_named_by_an_env_id_of_any_version_is_its_benchmark():
    from searchgym.commands.prepare import parse_dataset

    for text in ("searchgym/NQ-v1", "NQ-v1", "nq", "searchgym/HotpotQA-v1:5", "hotpotqa-v3"):
        spec = parse_dataset(text)
        assert spec.key == ("nq" if "nq" in text.lower() else "hotpotqa")
        assert spec.count == (5 if text.endswith(":5") else None)
