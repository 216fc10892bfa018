"""Env overhead: env steps that search, against bare retriever calls with the same queries.

Both sides run BM25 over the shared corpus with the HotpotQA questions as queries (top-3).
The two are interleaved query by query, each going first on every other query (the second
call of a query finds warm caches), so machine noise hits both alike; the script reports
medians and their ratio.

The episode-length axis (``--lengths``, default 4 32 300) runs the env side as episodes of
that many searches: the env is reset (untimed) only when an episode is full, so the steps of
a long episode run with hundreds of turns behind them. A step whose own cost grew with the
turns so far shows up as an overhead that grows with the length.

    python -m benchmarks.env_overhead [--data-dir ../shared/data] [--queries 300] [--rounds 3]
        [--runs 5] [--lengths 4 32 300] [--out RESULT.json] [--docs docs/benchmarks-env.md]
    python -m benchmarks.env_overhead --render RESULT.json [RESULT.json ...] --docs docs/benchmarks-env.md

``--render`` writes the docs page from committed result files without measuring anything.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_var, "1")  # pinned before NumPy loads

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
COMMAND = (
    "python -m benchmarks.env_overhead --data-dir ../shared/data --out benchmarks/results/env_overhead.json"
)


def measure(env, retriever, queries: list[str], length: int, rounds: int) -> dict[str, float]:
    """One run at one episode length: medians and totals of both sides."""
    actions = [f"<search>{q}</search>" for q in queries]
    bare, stepped = [], []
    step_in_episode = length  # start with a reset
    for _ in range(rounds):
        for i, (query, action) in enumerate(zip(queries, actions, strict=True)):
            if step_in_episode == length:
                env.reset(options={"index": 0})  # untimed
                step_in_episode = 0
            # Alternate which side runs first: the second call of a query finds warm caches.
            for side in (0, 1) if i % 2 == 0 else (1, 0):
                start = time.perf_counter()
                if side == 0:
                    retriever.search([query], 3)
                    bare.append(time.perf_counter() - start)
                else:
                    env.step(action)
                    stepped.append(time.perf_counter() - start)
            step_in_episode += 1
    return {
        "bare_median_ms": 1e3 * statistics.median(bare),
        "env_step_median_ms": 1e3 * statistics.median(stepped),
        "overhead_median_pct": 100 * (statistics.median(stepped) / statistics.median(bare) - 1),
        "overhead_total_pct": 100 * (sum(stepped) / sum(bare) - 1),
    }


def git_code() -> dict[str, object]:
    """The commit measured, and the files under envs/ and retrieval/ that differ from it."""

    def git(*argv: str) -> str:
        try:
            return subprocess.run(
                ["git", "-C", str(ROOT), *argv], capture_output=True, text=True
            ).stdout.strip()
        except OSError:
            return ""

    changed = [line[3:] for line in git("status", "--porcelain", "--", "envs", "retrieval").splitlines()]
    return {"commit": git("rev-parse", "--short", "HEAD"), "envs_changed_from_commit": changed}


def run(args: argparse.Namespace) -> dict:
    import gymnasium as gym

    import searchgym
    from searchgym.envs.data import load_questions

    corpus = args.data_dir / "corpus.jsonl"
    data = args.data_dir / "questions" / "hotpotqa.jsonl"
    retriever = searchgym.make_retriever("bm25", corpus_path=corpus)
    queries = [q.question for q in load_questions(data)][: args.queries]
    load_before = os.getloadavg()[0]
    results = []
    for length in args.lengths:
        env = gym.make(
            "searchgym/HotpotQA-v1", data_path=data, corpus_path=corpus, topk=3, max_turns=length + 1
        ).unwrapped
        assert env.retriever is retriever, "the env must share the process-wide BM25 index"
        runs = [measure(env, retriever, queries, length, args.rounds) for _ in range(args.runs)]
        row = {"episode_length": length, "runs": runs}
        for key in runs[0]:
            row[key] = statistics.median(r[key] for r in runs)
        results.append(row)
        print(
            f"length {length:>4}: bare {row['bare_median_ms']:.3f} ms, env step {row['env_step_median_ms']:.3f} ms, "
            f"overhead {row['overhead_median_pct']:+.1f}% (medians) {row['overhead_total_pct']:+.1f}% (totals)"
        )
    return {
        "command": COMMAND,
        "label": args.label,
        "note": args.note,
        "code": git_code(),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
        "threads": os.environ["OMP_NUM_THREADS"],
        "load_average_1min": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "queries": len(queries),
        "rounds": args.rounds,
        "runs_per_length": args.runs,
        "results": results,
    }


def render(results: list[dict]) -> str:
    """The docs page, from result files (one row group per file)."""
    lines = [
        "# Env step overhead by episode length",
        "",
        "<!-- Generated by benchmarks/env_overhead.py --render from benchmarks/results/; do not edit. -->",
        "",
        "An env step that searches, against a bare BM25 call with the same query (11,153-passage",
        "shared corpus, HotpotQA questions, top-3), interleaved query by query. The env side runs",
        "episodes of the given number of searches, so a step at the end of a 300-search episode has",
        "299 turns behind it. Each figure is the median over runs of the per-run overhead; the",
        "per-run figures are in the result file.",
        "",
        "<!-- docs-test: skip rewrites the committed result file and this page (about a minute) -->",
        "```bash",
        COMMAND,
        "python -m benchmarks.env_overhead --render benchmarks/results/env_overhead.json --docs docs/benchmarks-env.md",
        "```",
        "",
        "| code | episode length | bare BM25 (median ms) | env step (median ms) | overhead of medians (range over runs) | overhead of totals |",
        "|---|---|---|---|---|---|",
    ]
    for result in results:
        for row in result["results"]:
            spread = [r["overhead_median_pct"] for r in row["runs"]]
            lines.append(
                f"| {result['label']} | {row['episode_length']} | {row['bare_median_ms']:.3f} | "
                f"{row['env_step_median_ms']:.3f} | {row['overhead_median_pct']:+.1f}% "
                f"({min(spread):+.1f} … {max(spread):+.1f}%) | {row['overhead_total_pct']:+.1f}% |"
            )
    lines.append("")
    for result in results:
        lines.append(
            f"- {result['label']}: {result['note'] + '; ' if result.get('note') else ''}commit {result['code']['commit']}"
            + (
                f" with {', '.join(result['code']['envs_changed_from_commit'])} changed"
                if result["code"]["envs_changed_from_commit"]
                else ""
            )
            + f"; {result['machine']}, {result['threads']} thread(s), {result['queries']} queries × "
            f"{result['rounds']} rounds, {result['runs_per_length']} runs per length, 1-minute load average "
            f"{result['load_average_1min'][0]} → {result['load_average_1min'][1]} (a shared machine)."
        )
    lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data-dir", type=Path, default=ROOT.parent / "shared" / "data")
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--lengths", type=int, nargs="+", default=[4, 32, 300])
    parser.add_argument("--label", default="this code", help="what the result file calls the measured code")
    parser.add_argument("--note", default="", help="how the measured code was set up, shown under the table")
    parser.add_argument("--out", type=Path, help="write the result JSON here")
    parser.add_argument("--render", type=Path, nargs="+", help="result files to render instead of measuring")
    parser.add_argument("--docs", type=Path, help="write the docs page here")
    args = parser.parse_args()

    if args.render:
        results = [json.loads(path.read_text()) for path in args.render]
    else:
        result = run(args)
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(result, indent=1) + "\n")
        results = [result]
    page = render(results)
    if args.docs:
        args.docs.write_text(page)
    else:
        print(page)


if __name__ == "__main__":
    main()
