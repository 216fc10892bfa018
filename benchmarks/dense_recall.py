"""Recall of the supporting passages, dense (all-MiniLM-L6-v2 + FAISS flat) against BM25, on the shared corpus.

For every question of HotpotQA, NQ and PopQA that has supporting passages, both retrievers get
the question text as the query over the whole shared corpus (11,153 passages). Reported at
k = 3 and 5, as in ``bm25_recall.py``:

- ``recall@k``: the share of a question's supporting passages in the top k, averaged;
- ``all@k``: the share of questions with all their supporting passages in the top k.

Also reported: the encoding speed of the index build (passages/s; a cached index is reused, and
the speed recorded when it was built is shown), and the median latency per query, batched (64)
and one at a time, for both retrievers.

The dense index is built once under ``--cache`` (default ``benchmarks/.cache``) and reused.

Usage::

    python -m benchmarks.dense_recall --out dense_recall.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from benchmarks._common import (
    REPO,
    SHARED_DATA,
    search_latency_ms,
    support_shares,
    supported_records,
    write_report,
)
from searchgym.retrieval import BM25Retriever, Retriever
from searchgym.retrieval.corpus import load_corpus
from searchgym.retrieval.dense import DenseRetriever
from searchgym.retrieval.dense_build import build_dense_index

KS = (3, 5)
BATCH = 64
DATASETS = ("hotpotqa", "nq", "popqa")


def recall(retriever: Retriever, records: list[dict]) -> dict[str, float]:
    """recall@k and all@k of the supporting passages, for k in :data:`KS`."""
    out: dict[str, float] = {}
    for k, shares in support_shares(retriever, records, KS).items():
        out[f"recall@{k}"] = sum(shares) / len(shares)
        out[f"all@{k}"] = sum(s == 1.0 for s in shares) / len(shares)
    return out


def latencies(retriever: Retriever, queries: list[str], k: int) -> dict[str, float]:
    """Median milliseconds per query: in batches of :data:`BATCH`, and one query per call (first 200)."""
    batched, single = search_latency_ms(retriever, queries, k, BATCH, single=200)
    return {"ms_batched": batched, "ms_single": single}


def build(corpus: Path, cache: Path, batch_size: int) -> tuple[DenseRetriever, dict[str, Any]]:
    """Build (or reuse) the dense index in ``cache`` and load it; return it with its build stats."""
    index_dir = cache / "dense_minilm_flat"
    stats_path = index_dir / "build_stats.json"
    report = build_dense_index(corpus, index_dir, batch_size=batch_size, progress=True)
    if report.encoded_now == report.num_docs:  # encoded from scratch in this run: record the speed
        stats = {
            "encode_s": report.encode_seconds,
            "passages_per_s": report.passages_per_second,
            "batch_size": batch_size,
            "index_s": report.index_seconds,
        }
        stats_path.write_text(json.dumps(stats, indent=2), encoding="utf-8")
    elif stats_path.is_file():
        stats = {**json.loads(stats_path.read_text(encoding="utf-8")), "reused_cache": True}
    else:
        stats = {"reused_cache": True, "note": "resumed build: no single-run encoding speed"}
    t0 = time.perf_counter()
    retriever = DenseRetriever.load(index_dir)
    stats["load_s"] = time.perf_counter() - t0
    return retriever, stats


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, default=SHARED_DATA)
    parser.add_argument(
        "--cache", type=Path, default=REPO / "benchmarks" / ".cache", help="where the index is kept"
    )
    parser.add_argument(
        "--batch-size", type=int, default=64, help="encoder batch size (default: %(default)s)"
    )
    parser.add_argument("--out", type=Path, default=None, help="write the results to this JSON file")
    args = parser.parse_args(argv)

    corpus = args.data_dir / "corpus.jsonl"
    dense, stats = build(corpus, args.cache, args.batch_size)
    t0 = time.perf_counter()
    bm25 = BM25Retriever(load_corpus(corpus))
    bm25_build_s = time.perf_counter() - t0

    rows, queries = [], []
    for name in DATASETS:
        records = supported_records(args.data_dir / "questions" / f"{name}.jsonl")
        queries += [r["question"] for r in records]
        for label, retriever in (("bm25", bm25), ("dense", dense)):
            rows.append(
                {"dataset": name, "retriever": label, "questions": len(records), **recall(retriever, records)}
            )
    speed = {"bm25": latencies(bm25, queries, max(KS)), "dense": latencies(dense, queries, max(KS))}

    print("| dataset | retriever | questions | recall@3 | all@3 | recall@5 | all@5 |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['dataset']} | {r['retriever']} | {r['questions']} | {r['recall@3']:.3f} | {r['all@3']:.3f} "
            f"| {r['recall@5']:.3f} | {r['all@5']:.3f} |"
        )
    print()
    encode = stats.get("passages_per_s")
    print(
        f"dense index: {len(dense)} passages, dim {dense.encoder.dim}"
        + (f", encoded at {encode:.1f} passages/s (batch {stats['batch_size']})" if encode else "")
        + f", loaded in {stats['load_s']:.2f} s; bm25 built in {bm25_build_s:.2f} s"
    )
    for label, s in speed.items():
        print(
            f"{label}: median {s['ms_batched']:.2f} ms/query batched ({BATCH}), {s['ms_single']:.2f} ms one at a time"
        )
    write_report(
        args.out,
        {
            "corpus_passages": len(dense),
            "model": dense.encoder.name,
            "dense_build": stats,
            "bm25_build_s": bm25_build_s,
            "latency": speed,
            "rows": rows,
        },
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
