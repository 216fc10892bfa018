"""Vector env throughput: N sub-envs that all search, against the batched-retrieval limit.

For each backend (BM25; dense too with ``--dense`` when the dense backend is registered) and
N = ``--num-envs`` HotpotQA questions per step, three things are timed on the same queries:

* **bare**: one ``retriever.search(queries, k)`` call with the N queries (the limit);
* **vector**: one ``step`` of ``gym.make_vec(..., vectorization_mode="vector_entry_point")``
  whose N sub-envs all search (one batched retriever call inside);
* **single**: N single envs from ``gym.make``, stepped one after another (N retriever calls).

The three are interleaved step by step, so machine noise hits them alike. Each round resets
every env (untimed) and then times ``--steps`` steps; episodes are long enough
(``max_turns = steps + 1``) that no sub-env ends or resets inside a round. The script prints
medians per step of N, env steps per second, and the ratios: vector/bare throughput (target
>= 90%) and the speed-up of the vector env over the single envs.

    python -m benchmarks.vector_env [--data-dir ../shared/data] [--num-envs 64] [--rounds 20]
        [--steps 3] [--dense [--dense-index-dir DIR]] [--out vector_env.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import gymnasium as gym

import searchgym
from searchgym.envs.data import load_questions
from searchgym.retrieval import RETRIEVERS, Retriever

ROOT = Path(__file__).resolve().parents[1]
TOPK = 3


def run_backend(
    name: str, retriever: Retriever, data: Path, queries: list[str], args: argparse.Namespace
) -> dict[str, Any]:
    """Time bare / vector / single for one retriever; returns the figures as a dict."""
    n, steps = args.num_envs, args.steps
    env_kwargs = {"data_path": data, "retriever": retriever, "topk": TOPK, "max_turns": steps + 1}
    vector = gym.make_vec(
        "searchgym/HotpotQA-v1", num_envs=n, vectorization_mode="vector_entry_point", **env_kwargs
    )
    singles = [gym.make("searchgym/HotpotQA-v1", **env_kwargs) for _ in range(n)]
    if not all(env.unwrapped.retriever is retriever for env in vector.unwrapped.envs):
        raise RuntimeError("the vector env's sub-envs must share the one retriever")

    bare: list[float] = []
    stepped: list[float] = []
    single: list[float] = []
    batch_no = 0
    for round_no in range(args.rounds + 1):  # round 0 warms up and is not recorded
        vector.reset(seed=round_no)
        for i, env in enumerate(singles):
            env.reset(seed=round_no + i)
        for _ in range(steps):
            start = (batch_no * n) % len(queries)
            batch_no += 1
            batch = [queries[(start + i) % len(queries)] for i in range(n)]
            actions = tuple(f"<search>{q}</search>" for q in batch)

            t0 = time.perf_counter()
            retriever.search(batch, TOPK)
            t1 = time.perf_counter()
            _, _, terminated, truncated, _ = vector.step(actions)
            t2 = time.perf_counter()
            for env, action in zip(singles, actions, strict=True):
                env.step(action)
            t3 = time.perf_counter()
            if terminated.any() or truncated.any():
                raise RuntimeError("an episode ended inside a round; the timing would include a reset")
            if round_no:
                bare.append(t1 - t0)
                stepped.append(t2 - t1)
                single.append(t3 - t2)
    vector.close()

    med = {
        key: statistics.median(values)
        for key, values in (("bare", bare), ("vector", stepped), ("single", single))
    }
    return {
        "backend": name,
        "num_envs": n,
        "samples": len(bare),
        **{f"{key}_median_ms": 1e3 * value for key, value in med.items()},
        **{f"{key}_env_steps_per_s": n / value for key, value in med.items()},
        "vector_overhead_ms_paired_median": 1e3
        * statistics.median(v - b for v, b in zip(stepped, bare, strict=True)),
        "vector_over_bare": med["bare"] / med["vector"],
        "vector_speedup_over_single": med["single"] / med["vector"],
        "single_over_bare": med["bare"] / med["single"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data-dir", type=Path, default=ROOT.parent / "shared" / "data")
    parser.add_argument("--num-envs", type=int, default=64)
    parser.add_argument(
        "--rounds", type=int, default=20, help="timed rounds (each resets, then --steps steps)"
    )
    parser.add_argument("--steps", type=int, default=3, help="timed steps per round")
    parser.add_argument("--dense", action="store_true", help="also time the dense backend, if registered")
    parser.add_argument(
        "--dense-index-dir", type=Path, help="index_dir of the dense backend (built if absent)"
    )
    parser.add_argument("--out", type=Path, help="write the figures as JSON")
    args = parser.parse_args()

    corpus = args.data_dir / "corpus.jsonl"
    data = args.data_dir / "questions" / "hotpotqa.jsonl"
    queries = [q.question for q in load_questions(data)]
    # BM25 runs before the dense model loads: torch's worker threads, once started, keep
    # spinning for a while and would slow everything timed after them on a small machine.
    results = [run_backend("bm25", searchgym.make_retriever("bm25", corpus_path=corpus), data, queries, args)]
    if args.dense:
        if "dense" not in RETRIEVERS:
            print("--dense: the dense backend is not registered in this checkout; skipping it.")
        else:
            dense = searchgym.make_retriever("dense", corpus_path=corpus, index_dir=args.dense_index_dir)
            results.append(run_backend("dense", dense, data, queries, args))

    print(
        f"N = {args.num_envs} sub-envs, all searching (top-{TOPK}), HotpotQA questions; medians per step of N"
    )
    print()
    print(
        "| backend | bare batched call | vector env step | N single env steps "
        "| vector/bare | vector vs single | vector overhead (paired median) |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in results:
        print(
            f"| {r['backend']} | {r['bare_median_ms']:.2f} ms ({r['bare_env_steps_per_s']:.0f}/s) "
            f"| {r['vector_median_ms']:.2f} ms ({r['vector_env_steps_per_s']:.0f}/s) "
            f"| {r['single_median_ms']:.2f} ms ({r['single_env_steps_per_s']:.0f}/s) "
            f"| {100 * r['vector_over_bare']:.1f}% | {r['vector_speedup_over_single']:.2f}x "
            f"| {r['vector_overhead_ms_paired_median']:.2f} ms |"
        )
    if args.out:
        args.out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
