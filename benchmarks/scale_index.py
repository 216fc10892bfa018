"""Scale: build and query FAISS indexes over 1M generated passages, and extrapolate to 21M (wiki-18).

Encoding a million passages with all-MiniLM-L6-v2 would take most of a day on 2 CPU cores, so
the embedding side is a stand-in: random unit vectors of MiniLM's dimension (384), written into
the index directory's ``embeddings.f32`` as an encoder would, and marked encoded. Everything
else is the real path: a generated 1M-line corpus, its line offsets, ``build_dense_index`` for
each index kind (from the memory-mapped embeddings), ``DenseRetriever.load`` (memory-mapped), FAISS
search and passage read-back by offset. Query encoding is timed separately with the real model.

Each build and each query run happens in a child process, so its peak memory (max RSS) is its
own. Queries are noisy copies of stored vectors (cosine about 0.9 to their source, against at most
about 0.3 to any other random vector), so the source row is the true nearest neighbour and
``recall@10`` is the share of queries whose source is in the top 10. Random vectors have no
cluster structure, which is the hardest case for IVF-PQ and HNSW; real embeddings do better.

HNSW at 1M can take long on 2 cores: ``--hnsw-n`` builds it over the first rows only, and the
21M figures extrapolate from there (n log n for the build time, log n for the latency).

Usage::

    python -m benchmarks.scale_index --n 1000000 --hnsw-n 250000 --passages-per-second 48 --out scale.json
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks._common import REPO, median_ms_per_query, write_report

DIM = 384
WIKI18 = 21_015_324  # passages in FlashRAG's / Search-R1's wiki-18 corpus
E5_DIM = 768
QUERIES = 1000
BATCH = 64
_WORDS = "river castle engine violin harbor senate comet glacier orchard lantern market prairie".split()


def peak_rss_gb() -> float:
    """This process's peak resident memory in GiB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def generate_corpus(path: Path, n: int) -> None:
    """``n`` generated passages, one JSON object per line, about 150 bytes each."""
    if path.is_file() and sum(1 for _ in path.open("rb")) == n:
        return
    tmp = path.with_suffix(".tmp")
    with tmp.open("w", encoding="utf-8") as handle:
        for start in range(0, n, 100_000):
            lines = []
            for i in range(start, min(n, start + 100_000)):
                a, b, c = _WORDS[i % 12], _WORDS[(i // 12) % 12], _WORDS[(i // 144) % 12]
                text = (
                    f"Passage {i} tells of the {a} near the {b}, founded in {1000 + i % 1000} beside a {c}."
                )
                lines.append(json.dumps({"id": f"g{i}", "title": f"Generated {i}", "text": text}) + "\n")
            handle.write("".join(lines))
    tmp.replace(path)


def prepare(work: Path, n: int) -> dict[str, Any]:
    """The corpus, the index directory's metadata and offsets, and random unit embeddings."""
    from searchgym.retrieval import dense_build
    from searchgym.retrieval.encoders import load_encoder

    index_dir, corpus = work / "index", work / "corpus.jsonl"
    meta = dense_build.find_dense_meta(index_dir) if index_dir.is_dir() else None
    if meta is not None and meta["corpus"]["num_docs"] == n and meta.get("complete"):
        return {"reused": True}
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    generate_corpus(corpus, n)
    generate_s = time.perf_counter() - t0
    index_dir.mkdir(parents=True, exist_ok=True)
    encoder = load_encoder(None)
    t0 = time.perf_counter()
    # The start of a real build (scan offsets, size the embedding file, write the metadata) ...
    meta = dense_build._start(index_dir, corpus, encoder, ("", ""), 64, 65_536, progress=False)
    start_s = time.perf_counter() - t0
    # ... then random unit vectors where the encoder's output would go, and all chunks marked done.
    t0 = time.perf_counter()
    vectors = np.memmap(index_dir / dense_build.EMBEDDINGS_FILE, dtype=np.float32, mode="r+", shape=(n, DIM))
    for start in range(0, n, 65_536):
        block = np.random.default_rng(start).standard_normal((min(65_536, n - start), DIM), dtype=np.float32)
        vectors[start : start + len(block)] = block / np.linalg.norm(block, axis=1, keepdims=True)
    vectors.flush()
    del vectors
    chunks = math.ceil(n / meta["chunk_size"])
    (index_dir / dense_build.PROGRESS_FILE).write_text(json.dumps({"chunks_done": chunks}), encoding="utf-8")
    return {
        "generate_corpus_s": generate_s,
        "scan_offsets_and_meta_s": start_s,
        "random_embeddings_s": time.perf_counter() - t0,
        "corpus_bytes": corpus.stat().st_size,
    }


def child_build(work: Path, kind: str, n_rows: int) -> dict[str, Any]:
    """Build one index kind; over the whole index directory, or (HNSW) over the first ``n_rows`` rows."""
    from searchgym.retrieval.dense_build import build_dense_index, index_file, read_dense_meta
    from searchgym.retrieval.faiss_index import IndexSpec, build_index, write_index

    index_dir = work / "index"
    n = int(read_dense_meta(index_dir)["corpus"]["num_docs"])
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    if n_rows >= n:
        report = build_dense_index(work / "corpus.jsonl", index_dir, index_type=kind, progress=False)
        path, spec = index_file(index_dir, kind), read_dense_meta(index_dir)["indexes"][kind]
        timings = {**report.index_timings, "index_s": report.index_seconds}
    else:
        vectors = np.memmap(index_dir / "embeddings.f32", dtype=np.float32, mode="r", shape=(n, DIM))[:n_rows]
        spec_obj = IndexSpec(kind=kind).resolve(n_rows, DIM)
        path, spec = work / f"partial_{kind}_{n_rows}.faiss", spec_obj.to_dict()
        write_index(build_index(vectors, spec_obj, progress=False, timings=timings), path)
    call_s = time.perf_counter() - t0
    if kind == "ivfpq":  # the coarse k-means alone: it and PQ training scale differently with n
        timings["coarse_train_s"] = coarse_kmeans_seconds(index_dir, n, spec)
    return {
        "kind": kind,
        "rows": min(n_rows, n),
        "build_s": timings.get("index_s", call_s),  # FAISS build and write, not the model load and checks
        "call_s": call_s,
        **timings,
        "file": str(path),
        "file_bytes": path.stat().st_size,
        "spec": spec,
        "peak_rss_gb": peak_rss_gb(),
    }


def coarse_kmeans_seconds(index_dir: Path, n: int, spec: dict[str, Any]) -> float:
    """Seconds to train IVF-PQ's coarse quantizer alone (an IVF-Flat of the same nlist, same sample)."""
    import faiss

    vectors = np.memmap(index_dir / "embeddings.f32", dtype=np.float32, mode="r", shape=(n, DIM))
    rows = np.sort(np.random.default_rng(spec["seed"]).choice(n, size=spec["train_size"], replace=False))
    sample = np.ascontiguousarray(vectors[rows])
    ivf = faiss.IndexIVFFlat(faiss.IndexFlatIP(DIM), DIM, spec["nlist"], faiss.METRIC_INNER_PRODUCT)
    ivf.cp.seed = spec["seed"]
    t0 = time.perf_counter()
    ivf.train(sample)
    return time.perf_counter() - t0


def child_query(work: Path, kind: str, n_rows: int, file: str) -> dict[str, Any]:
    """Search latency (batched, single, single on one thread), passage read-back, recall@10 of the source row."""
    import faiss

    from searchgym.retrieval.dense_build import read_dense_meta
    from searchgym.retrieval.faiss_index import configure_search, read_index
    from searchgym.retrieval.passages import JsonlPassages

    index_dir = work / "index"
    n = int(read_dense_meta(index_dir)["corpus"]["num_docs"])
    t0 = time.perf_counter()
    index = read_index(file, mmap=True)
    load_s = time.perf_counter() - t0
    configure_search(index, None, 10)  # the defaults: nprobe 32, efSearch 64
    offsets = np.memmap(index_dir / "offsets.i64", dtype=np.int64, mode="r")
    passages = JsonlPassages(work / "corpus.jsonl", offsets)
    vectors = np.memmap(index_dir / "embeddings.f32", dtype=np.float32, mode="r", shape=(n, DIM))
    rng = np.random.default_rng(7)
    sources = np.sort(rng.choice(min(n_rows, n), size=QUERIES, replace=False))
    noise = rng.standard_normal((QUERIES, DIM), dtype=np.float32)
    noise *= 0.48 / np.linalg.norm(
        noise, axis=1, keepdims=True
    )  # cos(q, source) about 1/sqrt(1 + 0.48^2) = 0.90
    queries = np.asarray(vectors[sources]) + noise
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    batched, found = [], 0
    for start in range(0, QUERIES, BATCH):
        t0 = time.perf_counter()
        _, rows = index.search(queries[start : start + BATCH], 10)
        batched.append((time.perf_counter() - t0) / len(rows))
        found += sum(
            int(s in set(r.tolist())) for s, r in zip(sources[start : start + BATCH], rows, strict=True)
        )
    single, reads = [], []
    for q in queries[:200]:
        t0 = time.perf_counter()
        _, rows = index.search(q[None, :], 10)
        single.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        passages.get_many([r for r in rows[0].tolist() if r >= 0][:5])
        reads.append(time.perf_counter() - t0)
    threads = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)  # one query per call on one thread: no OpenMP hand-off, no contention
    single_1t = []
    for q in queries[:200]:
        t0 = time.perf_counter()
        index.search(q[None, :], 10)
        single_1t.append(time.perf_counter() - t0)
    faiss.omp_set_num_threads(threads)
    return {
        "kind": kind,
        "rows": min(n_rows, n),
        "load_s": load_s,
        "recall@10": found / QUERIES,
        "ms_per_query_batched": 1000 * statistics.median(batched),
        "ms_per_query_single": 1000 * statistics.median(single),
        "ms_per_query_single_1thread": 1000 * statistics.median(single_1t),
        "ms_read_5_passages": 1000 * statistics.median(reads),
        "peak_rss_gb": peak_rss_gb(),
    }


def query_encoding() -> dict[str, float]:
    """MiniLM query encoding time per query, batched and single, on 256 generated questions."""
    from searchgym.retrieval.encoders import load_encoder

    encoder = load_encoder(None)
    questions = [
        f"Who founded the {_WORDS[i % 12]} company of {_WORDS[i // 12 % 12]} in {1900 + i}?"
        for i in range(256)
    ]
    encoder.encode(questions[:8])  # warm up
    return {
        "ms_batched": median_ms_per_query(
            lambda chunk: encoder.encode(chunk, batch_size=BATCH), questions, BATCH
        ),
        "ms_single": median_ms_per_query(encoder.encode, questions[:64], 1),
    }


def run_child(*args: str) -> dict[str, Any]:
    """Run this script as a child with ``args``; its last stdout line is JSON."""
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.scale_index", *args],
        capture_output=True,
        text=True,
        check=False,
        cwd=REPO,
    )
    if done.returncode != 0:
        raise SystemExit(f"child {args} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def extrapolate(
    n: int, builds: dict[str, dict], queries: dict[str, dict], pps: float | None
) -> dict[str, Any]:
    """Disk, memory, build time and latency for the 21M-passage wiki-18 index, from the measurements."""
    out: dict[str, Any] = {"passages": WIKI18, "offsets_bytes": 8 * (WIKI18 + 1)}
    for dim in (DIM, E5_DIM):
        out[f"embeddings_bytes_dim{dim}"] = WIKI18 * dim * 4
    if "flat" in builds:
        b, q, scale = builds["flat"], queries["flat"], WIKI18 / builds["flat"]["rows"]
        out["flat"] = {
            "disk_and_ram_bytes_dim384": WIKI18 * DIM * 4,
            "disk_and_ram_bytes_dim768": WIKI18 * E5_DIM * 4,
            "build_s": b["build_s"] * scale,
            "ms_per_query_batched": q["ms_per_query_batched"] * scale,
            "ms_per_query_single_1thread": q["ms_per_query_single_1thread"] * scale,
            "note": "the build holds the whole index in RAM; every search scans every vector",
        }
    if "ivfpq" in builds:
        b, q, spec = builds["ivfpq"], queries["ivfpq"], builds["ivfpq"]["spec"]
        fixed = spec["nlist"] * DIM * 4 + (2 ** spec["nbits"]) * DIM * 4  # centroids + PQ codebooks
        per_vector = (b["file_bytes"] - fixed) / b["rows"]
        nlist = 2 ** round(math.log2(4 * math.sqrt(WIKI18)))  # IndexSpec.resolve's default rule
        train = min(WIKI18, max(64 * nlist, 256 * 39))
        # Coarse k-means costs sample points x centroids (faiss caps the sample at 256 per centroid);
        # PQ training caps each sub-quantizer's sample at 256 x 2^nbits points, so it costs the same at any n.
        used, used_here = min(train, 256 * nlist), min(spec["train_size"], 256 * spec["nlist"])
        coarse = b["coarse_train_s"] * (used * nlist) / (used_here * spec["nlist"])
        pq = max(0.0, b["train_s"] - b["coarse_train_s"])
        add = b["add_s"] * (WIKI18 * nlist) / (b["rows"] * spec["nlist"])  # assignment: points x centroids
        scanned = (WIKI18 / nlist) / (b["rows"] / spec["nlist"])  # longer lists, same nprobe
        out["ivfpq"] = {
            "nlist": nlist,
            "train_size": train,
            "bytes_per_vector": per_vector,
            "disk_bytes": per_vector * WIKI18 + nlist * DIM * 4,
            "build_ram_bytes": train * DIM * 4 + per_vector * WIKI18 + nlist * DIM * 4,
            "coarse_train_s": coarse,
            "pq_train_s": pq,
            "add_s": add,
            "build_s": coarse + pq + add,
            "ms_per_query_batched": q["ms_per_query_batched"] * scanned,
            "ms_per_query_single_1thread": q["ms_per_query_single_1thread"] * scanned,
            "note": "add_s is an upper bound (its PQ-encoding part grows with n only); latency scaled by list length",
        }
    if "hnsw" in builds:
        b, q = builds["hnsw"], queries["hnsw"]
        per_vector = b["file_bytes"] / b["rows"]
        log_ratio = math.log(WIKI18) / math.log(b["rows"])
        out["hnsw"] = {
            "bytes_per_vector_dim384": per_vector,
            "disk_and_ram_bytes_dim384": per_vector * WIKI18,
            "build_s": b["build_s"] * WIKI18 / b["rows"] * log_ratio,
            "ms_per_query_single_1thread": q["ms_per_query_single_1thread"] * log_ratio,
            "note": "build time scaled by n log n, latency by log n",
        }
    if pps:
        out["encode_passages_per_s"] = pps
        out["encode_s_at_measured_rate"] = WIKI18 / pps
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1_000_000, help="passages (default: %(default)s)")
    parser.add_argument(
        "--hnsw-n", type=int, default=250_000, help="rows for the HNSW build (default: %(default)s)"
    )
    parser.add_argument("--kinds", default="flat,ivfpq,hnsw", help="index kinds (default: %(default)s)")
    parser.add_argument("--work", type=Path, default=REPO / "benchmarks" / ".cache" / "scale")
    parser.add_argument(
        "--passages-per-second", type=float, help="measured encoding speed, for the 21M estimate"
    )
    parser.add_argument("--out", type=Path, help="write the results to this JSON file")
    parser.add_argument(
        "--reuse-builds", action="store_true", help="reuse the indexes and build figures of an earlier run"
    )
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        role, kind, rows, *rest = args.child
        result = (
            child_build(args.work, kind, int(rows))
            if role == "build"
            else child_query(args.work, kind, int(rows), *rest)
        )
        print(json.dumps(result))
        return 0

    prep = prepare(args.work, args.n)
    print(f"prepared {args.n} passages in {args.work}: {prep}", flush=True)
    builds, queries = {}, {}
    for kind in args.kinds.split(","):
        rows = args.hnsw_n if kind == "hnsw" else args.n
        saved = args.work / f"build_{kind}_{rows}.json"
        if args.reuse_builds and saved.is_file():
            builds[kind] = json.loads(saved.read_text(encoding="utf-8"))
        else:
            builds[kind] = run_child("--work", str(args.work), "--child", "build", kind, str(rows))
            saved.write_text(json.dumps(builds[kind]), encoding="utf-8")
        print(f"build {kind}: {builds[kind]}", flush=True)
        queries[kind] = run_child(
            "--work", str(args.work), "--child", "query", kind, str(rows), builds[kind]["file"]
        )
        print(f"query {kind}: {queries[kind]}", flush=True)
    encoding = query_encoding()
    wiki = extrapolate(args.n, builds, queries, args.passages_per_second)

    print(
        "\n| index | rows | build s | on disk | peak RSS (build) | recall@10 | ms/query, batches of 64 "
        "| ms/query, one per call | same, 1 thread | read 5 passages ms | load s |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for kind, b in builds.items():
        q = queries[kind]
        print(
            f"| {kind} | {b['rows']:,} | {b['build_s']:.1f} | {b['file_bytes'] / 2**30:.2f} GiB | "
            f"{b['peak_rss_gb']:.2f} GiB | {q['recall@10']:.3f} | {q['ms_per_query_batched']:.3f} | "
            f"{q['ms_per_query_single']:.3f} | {q['ms_per_query_single_1thread']:.3f} | "
            f"{q['ms_read_5_passages']:.3f} | {q['load_s']:.2f} |"
        )
    print(
        f"\nquery encoding (MiniLM): {encoding['ms_batched']:.2f} ms/query batched, {encoding['ms_single']:.2f} ms single"
    )
    print(f"\n21M-passage wiki-18 estimate:\n{json.dumps(wiki, indent=1)}")
    write_report(
        args.out,
        {
            "n": args.n,
            "dim": DIM,
            "prepare": prep,
            "builds": builds,
            "queries": queries,
            "query_encoding": encoding,
            "wiki18_estimate": wiki,
        },
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
