"""``searchgym study``: run every arm of a study file for every seed; write the table and plot."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

NAME = "study"
HELP = "run a study (several GRPO arms x seeds, each warm-started and evaluated) from a YAML file"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config", required=True, type=Path, help="study file (e.g. configs/synthetic/study.yaml)"
    )
    parser.add_argument("--seeds", type=int, nargs="+", help="run only these seeds (default: the file's)")
    parser.add_argument("--arms", nargs="+", help="run only these arms (default: all of the file's)")
    parser.add_argument("--output-dir", help="write here instead of the file's output_dir")
    parser.add_argument(
        "--collect", action="store_true", help="run nothing: write the table from the runs already finished"
    )
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bars")


def run(args: argparse.Namespace) -> int:
    import logging

    from searchgym.trainers.study.study import format_results, load_study, run_study

    study = load_study(args.config)
    if args.output_dir:
        study["output_dir"] = args.output_dir
    progress = logging.getLogger("searchgym.trainers")
    if not progress.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
        progress.addHandler(handler)
    progress.setLevel(logging.INFO)
    results = run_study(
        study, arms=args.arms, seeds=args.seeds, progress=not args.no_progress, collect=args.collect
    )
    print(format_results(results["arms"]))
    print(f"results: {Path(study['output_dir'])} (results.md, results.json, frontier.png)", file=sys.stderr)
    return 0
