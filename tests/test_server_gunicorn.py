"""The retrieval server's app under gunicorn's aiohttp worker (``server.gunicorn_app``): real
gunicorn, two worker processes, a BM25 index of real passages, on loopback."""

from __future__ import annotations

import itertools
import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("aiohttp", reason="the server needs aiohttp: pip install 'searchgym[serve]'")
pytest.importorskip("gunicorn", reason="pip install gunicorn")

from searchgym.envs.errors import InvalidArgumentError
from searchgym.envs.retrieval import make_retriever
from searchgym.envs.retrieval.server import gunicorn_app


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _post(url: str, payload: dict) -> tuple[int, dict]:
    request = urllib.request.Request(f"{url}/retrieve", json.dumps(payload).encode(), method="POST")
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as refusal:
        return refusal.code, json.loads(refusal.read())


def _stats_pid(url: str) -> int | None:
    try:
        with urllib.request.urlopen(f"{url}/stats", timeout=2) as answer:
            return int(json.loads(answer.read())["pid"])
    except OSError:
        return None


def test_gunicorn_serves_the_app_from_two_workers_with_its_caps(tmp_path: Path, shared_data: Path) -> None:
    corpus = tmp_path / "corpus.jsonl"
    with (shared_data / "corpus.jsonl").open(encoding="utf-8") as src:
        corpus.write_text("".join(line for line in itertools.islice(src, 500)), encoding="utf-8")
    retriever = make_retriever("bm25", corpus_path=corpus, index_dir=tmp_path / "idx")
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    app = f"searchgym.envs.retrieval.server:gunicorn_app({str(tmp_path / 'idx')!r}, limits={{'max_results': 10}})"
    command = [sys.executable, "-m", "gunicorn", "--worker-class", "aiohttp.GunicornWebWorker"]
    command += [
        "--workers",
        "2",
        "--bind",
        f"127.0.0.1:{port}",
        "--control-socket",
        str(tmp_path / "ctl"),
        app,
    ]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        pids: set[int] = set()
        deadline = time.monotonic() + 60
        while len(pids) < 2 and time.monotonic() < deadline:  # each new connection may reach either worker
            assert proc.poll() is None, "gunicorn exited"
            pid = _stats_pid(url)
            if pid is not None:
                pids.add(pid)
            else:
                time.sleep(0.1)
        assert len(pids) == 2
        queries = ["who wrote hamlet", "capital of france"]
        status, body = _post(url, {"queries": queries, "topk": 3})
        assert status == 200
        expected = retriever.search(queries, 3)
        assert [[doc["id"] for doc in docs] for docs in body["result"]] == [
            [d.id for d in ds] for ds in expected
        ]
        status, body = _post(url, {"queries": queries, "topk": 6})  # 12 documents > max_results=10
        assert status == 413 and body["cap"] == "max_results" and body["limit"] == 10
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_gunicorn_app_refuses_bad_settings_at_once() -> None:
    with pytest.raises(InvalidArgumentError, match="max_batch_size"):
        gunicorn_app("idx", max_batch_size=0)
    with pytest.raises(InvalidArgumentError, match="max_connections cannot apply under gunicorn"):
        gunicorn_app("idx", max_connections=8)
    with pytest.raises(TypeError):
        gunicorn_app("idx", no_such_setting=1)
