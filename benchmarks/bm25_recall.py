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

    python benchmarks/bm25_recall.py --dataset hotpotqa --out bm25_hotpotqa.json
    python benchmarks/bm25_recall.py --dataset all
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import bm25s

from searchgym.envs.data import load_corpus, read_jsonl
from searchgym.envs.retrieval import BM25Retriever

REPO = Path(__file__).resolve().parents[1]
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


def supported_records(path: Path) -> list[dict]:
    """Question records that name at least one supporting passage."""
    return [rec for _, rec in read_jsonl(path, "question file") if rec.get("supporting_passage_ids")]


def recall(retriever: BM25Retriever, name: str, records: list[dict]) -> DatasetResult:
    """Recall@3/5 and all@3/5 of the supporting passages for ``records``."""
    results = retriever.search([rec["question"] for rec in records], max(KS))
    found: dict[int, list[float]] = {k: [] for k in KS}
    for rec, docs in zip(records, results, strict=True):
        gold = set(rec["supporting_passage_ids"])
        for k in KS:
            top = {d.id for d in docs[:k]}
            found[k].append(len(gold & top) / len(gold))
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
    batched = []
    for start in range(0, len(queries), BATCH):
        chunk = queries[start : start + BATCH]
        t0 = time.perf_counter()
        retriever.search(chunk, k)
        batched.append((time.perf_counter() - t0) / len(chunk))
    single = []
    for query in queries:
        t0 = time.perf_counter()
        retriever.search([query], k)
        single.append(time.perf_counter() - t0)
    return {
        "batch_size": BATCH,
        "median_ms_per_query_batched": 1000 * statistics.median(batched),
        "median_ms_per_query_single": 1000 * statistics.median(single),
    }


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
        default=REPO.parent / "shared" / "data",
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
    if args.out is not None:
        report = {
            "corpus_passages": len(docs),
            "corpus_load_s": load_s,
            "index_build_s": build_s,
            **speed,
            "datasets": [asdict(r) for r in rows],
            "bm25": {"k1": retriever.k1, "b": retriever.b, "stopwords": retriever.stopwords},
            "bm25s_version": bm25s.__version__,
            "python": platform.python_version(),
            "machine": platform.processor() or platform.machine(),
        }
        args.out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
