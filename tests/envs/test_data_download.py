"""``searchgym data download`` against a local stand-in for the Hugging Face hub.

The stand-in answers the two requests ``hf_hub_download`` makes (huggingface_hub 1.x,
``file_download.get_hf_file_metadata`` and ``http_get``): ``HEAD`` and ``GET`` of
``/datasets/{repo}/resolve/{revision}/{path}``, with the headers the hub sends
(``X-Repo-Commit``, ``ETag``, ``Content-Length``; ``X-Error-Code: EntryNotFound`` on a 404).
The command runs in a subprocess with ``HF_ENDPOINT`` pointing at it, as a user's would.
"""

from __future__ import annotations

import gzip
import hashlib
import http.server
import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from urllib.parse import unquote

import numpy as np
import pytest

pytest.importorskip("huggingface_hub")

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def make_files() -> dict[tuple[str, str], bytes]:
    """Small files in the real repositories' layouts (FlashRAG's JSONL, Search-R1's gzip and index parts)."""
    faiss = pytest.importorskip("faiss")
    nq = [
        {"id": "test_0", "question": "who wrote hamlet", "golden_answers": ["William Shakespeare"]},
        {"id": "test_1", "question": "capital of france", "golden_answers": ["Paris"]},
    ]
    hotpot = [{"id": "dev_0", "question": "which is older", "golden_answers": ["the oak"], "metadata": {}}]
    corpus = [
        {"id": "0", "contents": '"Hamlet"\nHamlet is a tragedy written by William Shakespeare.'},
        {"id": "1", "contents": '"Paris"\nParis is the capital of France.'},
    ]
    index = faiss.IndexFlatIP(8)
    index.add(np.random.default_rng(0).standard_normal((2, 8)).astype("float32"))
    blob = faiss.serialize_index(index).tobytes()
    cut = len(blob) // 2
    return {
        ("RUC-NLPIR/FlashRAG_datasets", "nq/test.jsonl"): "".join(json.dumps(r) + "\n" for r in nq).encode(),
        ("RUC-NLPIR/FlashRAG_datasets", "hotpotqa/dev.jsonl"): "".join(
            json.dumps(r) + "\n" for r in hotpot
        ).encode(),
        ("PeterJinGo/wiki-18-corpus", "wiki-18.jsonl.gz"): gzip.compress(
            "".join(json.dumps(r) + "\n" for r in corpus).encode()
        ),
        ("PeterJinGo/wiki-18-e5-index", "part_aa"): blob[:cut],
        ("PeterJinGo/wiki-18-e5-index", "part_ab"): blob[cut:],
    }


class Hub(http.server.ThreadingHTTPServer):
    files: dict[tuple[str, str], bytes]
    requests: list[tuple[str, str]]


class Handler(http.server.BaseHTTPRequestHandler):
    server: Hub

    def log_message(self, *args) -> None:
        pass

    def _find(self) -> tuple[str, bytes | None]:
        path = unquote(self.path.split("?", 1)[0])
        self.server.requests.append((self.command, path))
        prefix = "/datasets/"
        if not path.startswith(prefix) or "/resolve/" not in path:
            return "RepoNotFound", None
        repo, rest = path[len(prefix) :].split("/resolve/", 1)
        _revision, _, name = rest.partition("/")
        if not any(r == repo for r, _ in self.server.files):
            return "RepoNotFound", None
        data = self.server.files.get((repo, name))
        return ("EntryNotFound", None) if data is None else ("", data)

    def _headers(self, data: bytes, length: int, status: int = 200) -> None:
        self.send_response(status)
        self.send_header("X-Repo-Commit", COMMIT)
        self.send_header("ETag", f'"{hashlib.sha256(data).hexdigest()}"')
        self.send_header("Content-Length", str(length))
        self.send_header("Content-Type", "application/octet-stream")
        self.end_headers()

    def _missing(self, code: str) -> None:
        self.send_response(404 if code == "EntryNotFound" else 401)
        self.send_header("X-Error-Code", code)
        self.send_header(
            "X-Error-Message", "Entry not found" if code == "EntryNotFound" else "Repository not found"
        )
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_HEAD(self) -> None:
        code, data = self._find()
        if data is None:
            self._missing(code)
        else:
            self._headers(data, len(data))

    def do_GET(self) -> None:
        code, data = self._find()
        if data is None:
            self._missing(code)
            return
        start = 0
        wanted = self.headers.get("Range")
        if wanted and wanted.startswith("bytes="):
            start = int(wanted[6:].split("-")[0] or 0)
        body = data[start:]
        self._headers(data, len(body), 206 if start else 200)
        self.wfile.write(body)


@pytest.fixture
def hub():
    server = Hub(("127.0.0.1", 0), Handler)
    server.files, server.requests = make_files(), []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def download(hub: Hub, tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "HF_ENDPOINT": f"http://127.0.0.1:{hub.server_address[1]}",
        "HF_HOME": str(tmp_path / "hf_home"),
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "HF_HUB_DISABLE_XET": "1",
        "NO_PROXY": "127.0.0.1",
        "no_proxy": "127.0.0.1",
    }
    env.pop("HF_HUB_OFFLINE", None)
    return subprocess.run(
        [sys.executable, "-m", "searchgym", "data", "download", *args, "--out", str(tmp_path / "data")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_flashrag_question_files_land_where_the_envs_read_them(hub, tmp_path):
    import gymnasium as gym

    import searchgym  # noqa: F401

    done = download(hub, tmp_path, "flashrag", "--dataset", "nq", "--dataset", "hotpotqa")
    assert done.returncode == 0, done.stderr
    questions = tmp_path / "data" / "questions"
    assert (questions / "nq.jsonl").read_bytes() == hub.files[
        ("RUC-NLPIR/FlashRAG_datasets", "nq/test.jsonl")
    ]
    assert (questions / "hotpotqa.jsonl").read_bytes() == hub.files[
        ("RUC-NLPIR/FlashRAG_datasets", "hotpotqa/dev.jsonl")
    ]  # hotpotqa's default split is dev
    assert ("GET", "/datasets/RUC-NLPIR/FlashRAG_datasets/resolve/main/nq/test.jsonl") in hub.requests
    assert "2 questions, test split" in done.stderr
    # the corpus comes down too and the NQ env runs on both
    done = download(hub, tmp_path, "wiki18-corpus")
    assert done.returncode == 0, done.stderr
    corpus = tmp_path / "data" / "wiki18" / "wiki-18.jsonl"
    assert done.stdout.strip() == str(corpus)
    assert not (corpus.parent / "wiki-18.jsonl.gz").exists()
    env = gym.make("searchgym/NQ-v1", data_path=str(questions / "nq.jsonl"), corpus_path=str(corpus))
    observation, _ = env.reset(seed=0, options={"index": 0})
    assert "who wrote hamlet" in observation
    _, _, _, _, info = env.step("<search>hamlet author</search>")
    env.close()
    assert info["retrieved_ids"][-1][0] == "0"  # the Hamlet passage, titled from FlashRAG's contents


def test_the_index_parts_are_joined_into_a_faiss_index(hub, tmp_path):
    faiss = pytest.importorskip("faiss")
    done = download(hub, tmp_path, "wiki18-index")
    assert done.returncode == 0, done.stderr
    target = tmp_path / "data" / "wiki18" / "e5_Flat.index"
    assert faiss.read_index(str(target)).ntotal == 2
    assert not (target.parent / "part_aa").exists() and not (target.parent / "part_ab").exists()


def test_a_missing_dataset_is_one_line_naming_the_file(hub, tmp_path):
    done = download(hub, tmp_path, "flashrag", "--dataset", "nq", "--split", "validation")
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert lines[-1].startswith(
        "searchgym: error: The hub's dataset RUC-NLPIR/FlashRAG_datasets has no file 'nq/validation.jsonl'"
    ), done.stderr
    assert "Traceback" not in done.stderr


def test_an_unknown_source_gets_a_did_you_mean(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "searchgym", "data", "download", "flashrg"], capture_output=True, text=True
    )
    assert done.returncode == 2 and "Did you mean 'flashrag'?" in done.stderr
