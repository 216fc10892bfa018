"""Index files are checked on load against the sizes and SHA-256 digests recorded at build time."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest

from searchgym.error import DataFileError
from searchgym.retrieval import BM25Retriever
from searchgym.retrieval.checksums import file_checksums, verify_checksums
from searchgym.retrieval.records import Doc

DOCS = [
    Doc("d1", "Lima", "capital of peru"),
    Doc("d2", "Pabianice", "town in poland"),
    Doc("d3", "Quito", "capital of ecuador"),
    Doc("d4", "Bogota", "capital of colombia"),
]


@pytest.fixture()
def saved(tmp_path: Path) -> Path:
    BM25Retriever(DOCS).save(tmp_path / "idx")
    return tmp_path / "idx"


def flip_bytes(path: Path, at_end: int = 8) -> None:
    """Invert the last ``at_end`` bytes of ``path``, keeping its size."""
    data = bytearray(path.read_bytes())
    for i in range(len(data) - at_end, len(data)):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))


def test_save_records_the_size_and_sha256_of_every_index_file(saved):
    meta = json.loads((saved / "searchgym_bm25.json").read_text())
    names = sorted(p.name for p in saved.iterdir() if p.name != "searchgym_bm25.json")
    assert sorted(meta["files"]) == names and "docs.jsonl" in names and "data.csc.index.npy" in names
    data = (saved / "data.csc.index.npy").read_bytes()
    assert meta["files"]["data.csc.index.npy"] == {
        "bytes": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
    }


@pytest.mark.parametrize("name", ["data.csc.index.npy", "indices.csc.index.npy", "indptr.csc.index.npy"])
def test_flipped_bytes_in_an_array_are_reported_naming_the_file(saved, name):
    flip_bytes(saved / name)
    with pytest.raises(DataFileError, match=re.escape(name) + ".*SHA-256.*corrupt") as info:
        BM25Retriever.load(saved)
    assert str(saved / name) in str(info.value)
    BM25Retriever.load(saved, verify=False)  # sizes only: the same length passes


def test_a_truncated_file_is_reported_by_size_even_without_digests(saved):
    path = saved / "indices.csc.index.npy"
    path.write_bytes(path.read_bytes()[:-4])
    with pytest.raises(
        DataFileError, match=r"indices\.csc\.index\.npy.*holds \d+ bytes, not the \d+ recorded"
    ):
        BM25Retriever.load(saved, verify=False)


def test_a_corrupt_metadata_file_is_reported_as_itself_by_load_index(saved):
    pytest.importorskip("aiohttp")
    from searchgym.retrieval.service import load_index

    (saved / "searchgym_bm25.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(DataFileError, match=r"unreadable searchgym_bm25\.json") as info:
        load_index(saved)
    assert "searchgym_dense.json" not in str(info.value)


def test_an_index_saved_without_checksums_still_loads(saved):
    meta_path = saved / "searchgym_bm25.json"
    meta = json.loads(meta_path.read_text())
    del meta["files"]
    meta_path.write_text(json.dumps(meta))
    assert BM25Retriever.load(saved).search(["capital of peru"], 1)[0][0].id == "d1"


def test_verify_checksums_checks_sizes_always_and_digests_up_to_the_auto_limit(tmp_path, monkeypatch):
    from searchgym.retrieval import checksums

    (tmp_path / "a.bin").write_bytes(b"x" * 100)
    recorded = file_checksums(tmp_path, ["a.bin"])
    (tmp_path / "a.bin").write_bytes(b"y" * 100)
    monkeypatch.setattr(checksums, "VERIFY_AUTO_BYTES", 99)  # a "huge" index: digests on request only
    verify_checksums(tmp_path, recorded)
    with pytest.raises(DataFileError, match=r"a\.bin.*SHA-256"):
        verify_checksums(tmp_path, recorded, verify=True)
    monkeypatch.setattr(checksums, "VERIFY_AUTO_BYTES", 100)
    with pytest.raises(DataFileError, match=r"a\.bin.*SHA-256"):
        verify_checksums(tmp_path, recorded)
    (tmp_path / "a.bin").unlink()
    with pytest.raises(DataFileError, match=r"a\.bin' is missing"):
        verify_checksums(tmp_path, recorded, verify=False)
