"""Env overhead: env steps that search, against bare retriever calls with the same queries.

Both sides run BM25 over the shared corpus with the HotpotQA questions as queries (top-3).
The two are interleaved query by query, each going first on every other query (the second
call of a query finds warm caches), so machine noise hits both alike; the script reports
medians and their ratio.

    python benchmarks/env_overhead.py [--data-dir ../shared/data] [--queries 300] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import gymnasium as gym

import searchgym
from searchgym.envs.data import load_questions

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data-dir", type=Path, default=ROOT.parent / "shared" / "data")
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    corpus = args.data_dir / "corpus.jsonl"
    data = args.data_dir / "questions" / "hotpotqa.jsonl"
    retriever = searchgym.make_retriever("bm25", corpus_path=corpus)
    env = gym.make("searchgym/HotpotQA-v0", data_path=data, corpus_path=corpus, topk=3).unwrapped
    assert env.retriever is retriever, "the env must share the process-wide BM25 index"
    queries = [q.question for q in load_questions(data)][: args.queries]
    actions = [f"<search>{q}</search>" for q in queries]

    bare, stepped = [], []
    for _ in range(args.rounds):
        for i, (query, action) in enumerate(zip(queries, actions, strict=True)):
            # Alternate which side runs first: the second call of a query finds warm caches.
            for side in (0, 1) if i % 2 == 0 else (1, 0):
                env.reset(options={"index": 0})  # the same untimed work before both sides
                if side == 0:
                    start = time.perf_counter()
                    retriever.search([query], 3)
                    bare.append(time.perf_counter() - start)
                else:
                    start = time.perf_counter()
                    env.step(action)
                    stepped.append(time.perf_counter() - start)

    result = {
        "queries": len(queries),
        "rounds": args.rounds,
        "bare_median_ms": 1e3 * statistics.median(bare),
        "env_step_median_ms": 1e3 * statistics.median(stepped),
        "overhead_median_pct": 100 * (statistics.median(stepped) / statistics.median(bare) - 1),
        "overhead_total_pct": 100 * (sum(stepped) / sum(bare) - 1),
    }
    print("| bare retriever (median ms) | env step (median ms) | overhead (medians) | overhead (totals) |")
    print("|---|---|---|---|")
    print(
        f"| {result['bare_median_ms']:.3f} | {result['env_step_median_ms']:.3f} | "
        f"{result['overhead_median_pct']:+.1f}% | {result['overhead_total_pct']:+.1f}% |"
    )
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
