"""Recall of the supporting passages under BM25 over the shared corpus, plus build and query speed.

For every question that has supporting passages in the corpus, query BM25 with the question
text and measure, at k = 3 and k = 5:

- ``recall@k``: the share of the question's supporting passages found in the top k,
  averaged over questions;
- ``all@k``: the share of questions whose supporting passages are all in the top k;
- ``any@k``: the share of questions with at least one supporting passage in the top k.

Also reported: the time to load the corpus, the time to build the index, and the median
query latency, both per query inside one batched call (batch time / batch size) and for
queries sent one at a time.

Usage::

    python -m benchmarks.bm25_recall --dataset hotpotqa --out bm25_hotpotqa.json
    python -m benchmarks.bm25_recall --dataset all
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from benchmarks._common import SHARED_DATA, search_latency_ms, support_shares, supported_records, write_report
from searchgym.retrieval import BM25Retriever
from searchgym.retrieval.bm25 import bm25s
from searchgym.retrieval.corpus import load_corpus

KS = (3, 5)
BATCH = 64


@dataclass
class DatasetResult:
    """Recall figures for one dataset."""

    dataset: str
    questions: int
    mean_support: float
    recall_at_3: float
    all_at_3: float
    any_at_3: float
    recall_at_5: float
    all_at_5: float
    any_at_5: float


def recall(retriever: BM25Retriever, name: str, records: list[dict]) -> DatasetResult:
    """Recall@3/5 and all@3/5 of the supporting passages for ``records``."""
    found = support_shares(retriever, records, KS)
    n = len(records)
    return DatasetResult(
        dataset=name,
        questions=n,
        mean_support=sum(len(set(r["supporting_passage_ids"])) for r in records) / n,
        recall_at_3=sum(found[3]) / n,
        all_at_3=sum(f == 1.0 for f in found[3]) / n,
        any_at_3=sum(f > 0 for f in found[3]) / n,
        recall_at_5=sum(found[5]) / n,
        all_at_5=sum(f == 1.0 for f in found[5]) / n,
        any_at_5=sum(f > 0 for f in found[5]) / n,
    )


def latencies(retriever: BM25Retriever, queries: list[str], k: int) -> dict[str, float]:
    """Median per-query latency in milliseconds, batched and one query at a time."""
    batched, single = search_latency_ms(retriever, queries, k, BATCH)
    return {"batch_size": BATCH, "median_ms_per_query_batched": batched, "median_ms_per_query_single": single}


def markdown(rows: list[DatasetResult]) -> str:
    lines = [
        "| dataset | questions | gold/q | recall@3 | all@3 | any@3 | recall@5 | all@5 | any@5 |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r.dataset} | {r.questions} | {r.mean_support:.2f} | {r.recall_at_3:.3f} | {r.all_at_3:.3f} "
            f"| {r.any_at_3:.3f} | {r.recall_at_5:.3f} | {r.all_at_5:.3f} | {r.any_at_5:.3f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=SHARED_DATA,
        help="holds corpus.jsonl and questions/",
    )
    parser.add_argument(
        "--dataset",
        default="hotpotqa",
        help="a file stem under questions/, or 'all' for every one with passages",
    )
    parser.add_argument("--out", type=Path, default=None, help="write the results to this JSON file")
    args = parser.parse_args(argv)

    t0 = time.perf_counter()
    docs = load_corpus(args.data_dir / "corpus.jsonl")
    load_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    retriever = BM25Retriever(docs)
    build_s = time.perf_counter() - t0

    known = sorted(p.stem for p in (args.data_dir / "questions").glob("*.jsonl"))
    if args.dataset != "all" and args.dataset not in known:
        parser.error(
            f"--dataset {args.dataset!r} is not in {args.data_dir / 'questions'}; choose from {known} or 'all'"
        )
    names = known if args.dataset == "all" else [args.dataset]
    rows: list[DatasetResult] = []
    queries: list[str] = []
    for name in names:
        records = supported_records(args.data_dir / "questions" / f"{name}.jsonl")
        if not records:
            print(f"skipping {name}: no question has supporting passages", file=sys.stderr)
            continue
        rows.append(recall(retriever, name, records))
        queries.extend(rec["question"] for rec in records)
    if not rows:
        parser.error(f"no question in {names} has supporting passages")
    speed = latencies(retriever, queries, max(KS))

    print(markdown(rows))
    print()
    print(
        f"corpus: {len(docs)} passages, loaded in {load_s:.3f} s; index built in {build_s:.3f} s; "
        f"median latency per query: {speed['median_ms_per_query_batched']:.2f} ms batched "
        f"(batches of {BATCH}), {speed['median_ms_per_query_single']:.2f} ms one at a time"
    )
    write_report(
        args.out,
        {
            "corpus_passages": len(docs),
            "corpus_load_s": load_s,
            "index_build_s": build_s,
            **speed,
            "datasets": [asdict(r) for r in rows],
            "bm25": {"k1": retriever.k1, "b": retriever.b, "stopwords": retriever.stopwords},
            "bm25s_version": bm25s.__version__,
        },
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
