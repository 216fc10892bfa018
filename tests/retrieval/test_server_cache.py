"""The result cache per (query, topk): in the server (``--cache-size``, ``/stats``) and in-process."""

from __future__ import annotations

import http.client
import json
import random
import re
import subprocess
import sys
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

pytest.importorskip("aiohttp", reason="the server needs aiohttp: pip install 'searchgym[serve]'")

import searchgym  # noqa: E402
from searchgym.envs.records import Question  # noqa: E402
from searchgym.error import InvalidArgumentError, RetrievalError  # noqa: E402
from searchgym.retrieval import BM25Retriever, ResultCache, Retriever, clear_retriever_cache, make_retriever
from searchgym.retrieval.cache import cached_search  # noqa: E402
from searchgym.retrieval.records import Doc  # noqa: E402
from searchgym.retrieval.server import RetrievalServer  # noqa: E402
from searchgym.retrieval.service import ServerConfig  # noqa: E402

DOCS = [
    Doc("d1", "Paris", "capital of France"),
    Doc("d2", "Berlin", "capital of Germany"),
    Doc("d3", "Rome", "ancient city in Italy"),
]


class Counting(Retriever):
    """BM25 over DOCS that records every query it is asked to search."""

    name = "counting"

    def __init__(self) -> None:
        self.inner = BM25Retriever(DOCS)
        self.seen: list[str] = []
        self.lock = threading.Lock()

    def search(self, queries: Sequence[str], k: int) -> list[list[Doc]]:
        with self.lock:
            self.seen += list(queries)
        return self.inner.search(queries, k)

    def __len__(self) -> int:
        return len(DOCS)


def post(port: int, body: dict) -> tuple[int, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("POST", "/retrieve", body=json.dumps(body), headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    answer = response.status, json.loads(response.read())
    conn.close()
    return answer


def get(port: int, path: str) -> dict:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", path)
    answer = json.loads(conn.getresponse().read())
    conn.close()
    return answer


# -- the cache itself -------------------------------------------------------------------------------


def test_least_recently_used_entry_leaves_first():
    cache, backend = ResultCache(2), Counting()
    for queries in (["paris"], ["berlin"], ["paris"], ["rome"], ["berlin"], ["paris"]):
        cached_search(backend.search, cache, queries, 1)
    # paris, berlin miss; paris hits (now berlin is oldest); rome misses and evicts berlin;
    # berlin misses and evicts paris; paris misses.
    assert backend.seen == ["paris", "berlin", "rome", "berlin", "paris"]
    stats = cache.stats()
    assert (stats.hits, stats.misses, stats.entries, stats.capacity) == (1, 5, 2, 2)
    assert stats.hit_rate == pytest.approx(1 / 6)


def test_repeats_within_one_call_are_searched_once_and_answers_keep_their_order():
    cache, backend = ResultCache(16), Counting()
    queries = ["rome", "paris", "rome", "berlin", "paris", "rome"]
    assert cached_search(backend.search, cache, queries, 2) == BM25Retriever(DOCS).search(queries, 2)
    assert backend.seen == ["rome", "paris", "berlin"]
    assert (cache.stats().hits, cache.stats().misses) == (3, 3)
    one, two = (
        cached_search(backend.search, cache, ["capital"], 1),
        cached_search(backend.search, cache, ["capital"], 2),
    )
    assert (len(one[0]), len(two[0])) == (1, 2) and backend.seen[-2:] == [
        "capital",
        "capital",
    ]  # k is in the key


def test_a_hit_is_a_new_list_that_a_caller_cannot_spoil():
    cache, backend = ResultCache(4), Counting()
    first = cached_search(backend.search, cache, ["paris"], 1)
    first[0].clear()
    assert cached_search(backend.search, cache, ["paris"], 1) == [
        [BM25Retriever(DOCS).search(["paris"], 1)[0][0]]
    ]


def test_failures_are_not_stored_and_bad_input_is_refused():
    cache = ResultCache(4)

    def failing(queries: Sequence[str], k: int) -> list[list[Doc]]:
        raise RetrievalError("index gone")

    with pytest.raises(RetrievalError, match="index gone"):
        cached_search(failing, cache, ["paris"], 1)
    assert len(cache) == 0
    with pytest.raises(RetrievalError, match="returned 0 result lists for 1 queries"):
        cached_search(lambda q, k: [], cache, ["paris"], 1)
    with pytest.raises(InvalidArgumentError, match="list of strings"):
        cached_search(Counting().search, cache, "paris", 1)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="cache_size"):
        ResultCache(0)


def test_threads_sharing_a_small_cache_get_the_right_answers():
    cache, backend = ResultCache(3), Counting()
    vocabulary = ["paris", "berlin", "rome", "capital", "italy", "france", "germany", "ancient"]
    expected = {q: BM25Retriever(DOCS).search([q], 2)[0] for q in vocabulary}
    rng = random.Random(0)
    calls = [[rng.choice(vocabulary) for _ in range(rng.randint(1, 4))] for _ in range(800)]
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda qs: cached_search(backend.search, cache, qs, 2), calls))
    for queries, answer in zip(calls, answers, strict=True):
        assert answer == [expected[q] for q in queries]
    stats = cache.stats()
    assert stats.hits + stats.misses == sum(map(len, calls)) and stats.misses == len(backend.seen)
    assert stats.entries <= 3


# -- the server -------------------------------------------------------------------------------------


def test_a_grpo_group_first_search_reaches_the_retriever_once_and_stats_show_it():
    backend = Counting()
    question = "capital of france"
    with RetrievalServer(backend, ServerConfig(port=0, max_wait_ms=50)) as server:
        with ThreadPoolExecutor(12) as pool:  # 12 rollouts send the same first search at once
            answers = list(
                pool.map(lambda _: post(server.port, {"queries": [question], "topk": 2}), range(12))
            )
        follow_up = post(server.port, {"queries": [question, "rome"], "topk": 2})
        stats = get(server.port, "/stats")
    assert {json.dumps(a) for a in answers} == {json.dumps(answers[0])} and answers[0][0] == 200
    assert follow_up[0] == 200 and follow_up[1]["result"][0] == answers[0][1]["result"][0]
    assert backend.seen.count(question) == 1 and backend.seen.count("rome") == 1
    assert stats["cache"] == {
        "capacity": 4096,
        "entries": 2,
        "hits": 12,
        "misses": 2,
        "hit_rate": round(12 / 14, 6),
    }


def test_cache_size_zero_searches_every_query():
    backend = Counting()
    with RetrievalServer(backend, ServerConfig(port=0, cache_size=0)) as server:
        for _ in range(3):
            assert post(server.port, {"queries": ["paris"], "topk": 1})[0] == 200
        stats = get(server.port, "/stats")
    assert backend.seen == ["paris"] * 3 and stats["cache"] is None


def test_serve_cache_size_flag(tmp_path: Path):
    index = tmp_path / "bm25"
    BM25Retriever(DOCS).save(index)
    caches = {}
    for flags in ([], ["--cache-size", "0"], ["--cache-size", "7"]):
        proc = subprocess.Popen(
            [sys.executable, "-m", "searchgym", "serve", "--index", str(index), "--port", "0", *flags],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            match = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
            assert match, line + (proc.stderr.read() if proc.poll() is not None and proc.stderr else "")
            port = int(match.group(1))
            for _ in range(2):
                assert post(port, {"queries": ["paris"], "topk": 1})[0] == 200
            caches[tuple(flags)] = (get(port, "/stats")["cache"], line)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    default, off, seven = caches[()], caches[("--cache-size", "0")], caches[("--cache-size", "7")]
    assert default[0]["capacity"] == 4096 and (default[0]["hits"], default[0]["misses"]) == (1, 1)
    assert off[0] is None and "cache off" in off[1]
    assert seven[0]["capacity"] == 7 and "cache 7 results" in seven[1]
    bad = subprocess.run(
        [sys.executable, "-m", "searchgym", "serve", "--index", str(index), "--cache-size", "-1"],
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and "expected a non-negative integer, got '-1'" in bad.stderr


# -- in-process -------------------------------------------------------------------------------------


def test_make_retriever_caches_bm25_for_the_envs_and_says_its_hit_rate():
    clear_retriever_cache()
    retriever = make_retriever("bm25", docs=DOCS)
    assert retriever.result_cache is not None and retriever.result_cache.capacity == 4096
    seen: list[str] = []
    search = retriever.search

    def spy(queries: Sequence[str], k: int) -> list[list[Doc]]:
        seen.extend(queries)
        return search(queries, k)

    retriever.search = spy  # type: ignore[method-assign]
    try:
        question = Question("q1", "Capital of France?", ("Paris",))
        envs = [searchgym.SearchQAEnv([question], retriever) for _ in range(12)]  # one GRPO group
        for env in envs:
            env.reset(seed=0)
            env.step("<search>capital of france</search>")
    finally:
        del retriever.search
    assert seen == ["capital of france"]
    stats = retriever.result_cache.stats()
    assert (stats.hits, stats.misses) == (11, 1) and stats.hit_rate == pytest.approx(11 / 12)
    assert make_retriever("bm25", docs=DOCS, cache_size=0).result_cache is None
    simulated = make_retriever(
        "simulated", docs=DOCS, generator=lambda queries: ["a document"] * len(queries)
    )
    assert simulated.result_cache is None  # it draws noise per call
    with pytest.raises(InvalidArgumentError, match="cache_size must be a non-negative int"):
        make_retriever("bm25", docs=DOCS, cache_size=-1)
