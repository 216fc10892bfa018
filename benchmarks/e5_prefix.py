"""What a missing query prefix costs: an E5-style index searched with and without ``"query: "``.

No E5 model can be downloaded on the machines this runs on, so the index is built the E5 way
with the packaged all-MiniLM-L6-v2: every passage encoded as ``"passage: " + title + "\\n" +
text``, like Search-R1's ``e5_Flat.index``. The same questions are then searched twice, encoded
as ``"query: " + question`` (what E5 expects) and as the bare question (what ``searchgym serve``
did for a FAISS file before it took ``--query-prefix``). MiniLM was not trained with these
prefixes, so the gap measured here shows the mechanism, not E5's own figure.

The corpus is a subsample of the shared corpus: every passage named by the questions
(supporting passages and their distractors) plus random others, up to ``--passages``.
Reported per dataset: ``recall@k`` (the share of a question's supporting passages in the top
k, averaged) at k = 1, 3, 5, and how often the top 5 differ between the two encodings.

Usage::

    OMP_NUM_THREADS=2 python -m benchmarks.e5_prefix --out benchmarks/results/e5_prefix.json
"""

from __future__ import annotations

import argparse
import random
import time
from pathlib import Path

import numpy as np

from benchmarks._common import SHARED_DATA, supported_records, write_report

KS = (1, 3, 5)
DATASETS = ("hotpotqa", "nq", "popqa")
PASSAGE_PREFIX, QUERY_PREFIX = "passage: ", "query: "


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, default=SHARED_DATA)
    parser.add_argument(
        "--questions", type=int, default=50, help="questions per dataset (default: %(default)s)"
    )
    parser.add_argument(
        "--passages", type=int, default=1200, help="corpus subsample size (default: %(default)s)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None, help="write the results to this JSON file")
    args = parser.parse_args(argv)

    import faiss
    import torch

    from searchgym.retrieval.corpus import load_corpus
    from searchgym.retrieval.encoders import load_encoder
    from searchgym.retrieval.passages import passage_text

    torch.manual_seed(args.seed)
    records = {
        name: supported_records(args.data_dir / "questions" / f"{name}.jsonl")[: args.questions]
        for name in DATASETS
    }
    corpus = load_corpus(args.data_dir / "corpus.jsonl")
    named = {
        pid
        for recs in records.values()
        for r in recs
        for pid in r.get("context_passage_ids") or r["supporting_passage_ids"]
    }
    named |= {pid for recs in records.values() for r in recs for pid in r["supporting_passage_ids"]}
    others = [d for d in corpus if d.id not in named]
    random.Random(args.seed).shuffle(others)
    docs = [d for d in corpus if d.id in named] + others[: max(0, args.passages - len(named))]

    encoder = load_encoder(None)
    started = time.perf_counter()
    vectors = encoder.encode([PASSAGE_PREFIX + passage_text(d) for d in docs])
    encode_s = time.perf_counter() - started
    index = faiss.IndexFlatIP(vectors.shape[1])
    index.add(vectors)
    ids = np.array([d.id for d in docs])

    rows = []
    for name, recs in records.items():
        questions = [r["question"] for r in recs]
        top: dict[str, np.ndarray] = {}
        for label, prefix in (("with", QUERY_PREFIX), ("without", "")):
            _, rows_found = index.search(encoder.encode([prefix + q for q in questions]), max(KS))
            top[label] = ids[rows_found]
        for label in ("with", "without"):
            row: dict[str, object] = {"dataset": name, "query_prefix": label, "questions": len(recs)}
            for k in KS:
                shares = [
                    len(set(r["supporting_passage_ids"]) & set(found[:k])) / len(r["supporting_passage_ids"])
                    for r, found in zip(recs, top[label], strict=True)
                ]
                row[f"recall@{k}"] = sum(shares) / len(shares)
            rows.append(row)
        rows[-2]["top5_differs"] = rows[-1]["top5_differs"] = float(
            np.mean([list(a) != list(b) for a, b in zip(top["with"], top["without"], strict=True)])
        )

    print("| dataset | query prefix | questions | recall@1 | recall@3 | recall@5 | top 5 differs |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['dataset']} | {r['query_prefix']} | {r['questions']} | {r['recall@1']:.3f} | {r['recall@3']:.3f} "
            f"| {r['recall@5']:.3f} | {r['top5_differs']:.0%} |"
        )
    print(f"{len(docs)} passages encoded in {encode_s:.1f} s")
    write_report(
        args.out,
        {
            "model": encoder.name,
            "passage_prefix": PASSAGE_PREFIX,
            "query_prefix": QUERY_PREFIX,
            "corpus_passages": len(docs),
            "seed": args.seed,
            "encode_s": encode_s,
            "torch_threads": torch.get_num_threads(),
            "rows": rows,
        },
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
