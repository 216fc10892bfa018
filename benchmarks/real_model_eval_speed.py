"""How much faster ``real_model_eval.py`` runs than a checkout named by ``--base``, on the same work.

    OMP_NUM_THREADS=1 python -m benchmarks.real_model_eval_speed --base dea8e1d --questions 16 \\
        --modes naive_rag,search_r1 --batch-size 8

Extracts ``--base`` (``git archive``) into a temporary folder, lays its packages out as
``searchgym`` with symlinks (as ``.ci/run`` does for mypy) and runs its
``benchmarks/real_model_eval.py`` and this checkout's on the same questions and settings,
one mode per process, alternating base and current. Each run's wall time and CPU time
(user + system of the child) go to ``benchmarks/results/real_model_eval_speed.json``,
with both runs' figures, so the file also shows whether the two measured the same thing.
CPU time is the fairer number on a shared machine: wall time moves with the load.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks._common import REPO, SHARED_DATA, write_report

PACKAGES = ("envs", "retrieval", "storage", "policies", "trainers", "memory", "configs")


def checkout(base: str, folder: Path) -> Path:
    """``base``'s tree in ``folder/tree`` and an importable ``searchgym`` in ``folder/path``."""
    tree, path = folder / "tree", folder / "path" / "searchgym"
    tree.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", base], check=True, capture_output=True)
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
    path.mkdir(parents=True)
    for item in (tree / "searchgym").iterdir():
        (path / item.name).symlink_to(item)
    for name in PACKAGES:
        if (tree / name).is_dir():  # a base commit may predate a folder
            (path / name).symlink_to(tree / name)
    return tree


def run(tree: Path, pythonpath: str | None, mode: str, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    command = [
        sys.executable,
        "-m",  # from the tree's root, the form in which either tree's script finds its siblings
        "benchmarks.real_model_eval",
        f"--questions={args.questions}",
        f"--datasets={args.dataset}",
        f"--modes={mode}",
        f"--max-new-tokens={args.max_new_tokens}",
        f"--batch-size={args.batch_size}",
        "--threads=1",
        f"--data-dir={args.data_dir}",
        f"--index-dir={args.index_dir}",
        f"--out={out}",
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(command, cwd=tree, env=env, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    row = json.loads(out.read_text())["results"][0]
    return {"wall_s": round(wall, 1), "cpu_s": round(cpu, 1), "result": row}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--base", default="dea8e1d", help="the commit to compare with")
    parser.add_argument("--dataset", default="nq")
    parser.add_argument("--modes", default="naive_rag,search_r1")
    parser.add_argument("--questions", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--data-dir", type=Path, default=SHARED_DATA)
    parser.add_argument("--index-dir", type=Path, default=REPO / "benchmarks" / ".cache" / "bm25_shared")
    parser.add_argument(
        "--out", type=Path, default=REPO / "benchmarks" / "results" / "real_model_eval_speed.json"
    )
    args = parser.parse_args()
    args.data_dir, args.index_dir = args.data_dir.resolve(), args.index_dir.resolve()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        base_tree = checkout(args.base, Path(tmp) / "base")
        for mode in args.modes.split(","):
            base = run(
                base_tree, str(Path(tmp) / "base" / "path"), mode, args, Path(tmp) / f"base_{mode}.json"
            )
            current = run(REPO, None, mode, args, Path(tmp) / f"current_{mode}.json")
            rows.append({"mode": mode, "base": base, "current": current})
            print(
                f"{mode}: CPU {base['cpu_s']:.0f} s -> {current['cpu_s']:.0f} s "
                f"({base['cpu_s'] / current['cpu_s']:.2f}x), wall {base['wall_s']:.0f} s -> {current['wall_s']:.0f} s",
                flush=True,
            )
    write_report(
        args.out,
        {
            "command": "OMP_NUM_THREADS=1 python -m benchmarks.real_model_eval_speed "
            + " ".join(sys.argv[1:]),
            "base": args.base,
            "settings": {k: v for k, v in vars(args).items() if k not in ("out", "data_dir", "index_dir")},
            "rows": rows,
        },
    )


if __name__ == "__main__":
    main()
