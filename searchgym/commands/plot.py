"""``searchgym plot``: draw a training run's per-step figures (``metrics.jsonl``) into a PNG."""

from __future__ import annotations

import argparse
from pathlib import Path

NAME = "plot"
HELP = "plot a built-in GRPO run's per-step figures (RUN_DIR/metrics.jsonl) into a PNG"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", type=Path, help="the run's output_dir, or its metrics.jsonl")
    parser.add_argument("--out", type=Path, help="the PNG to write (default: RUN_DIR/metrics.png)")
    parser.add_argument(
        "--keys",
        help="comma-separated figures to draw, as in metrics.jsonl (default: rollout/reward, rollout/f1, "
        "rollout/st, rollout/format_ok, rollout/action_tokens, train/kl, train/loss, train/grad_norm)",
    )


def run(args: argparse.Namespace) -> int:
    from searchgym.commands.extras import require

    require("matplotlib")
    from searchgym.trainers.grpo.metrics_file import PLOT_KEYS, plot_metrics

    keys = [k.strip() for k in args.keys.split(",") if k.strip()] if args.keys else list(PLOT_KEYS)
    print(f"wrote {plot_metrics(args.run, args.out, keys)}")
    return 0
