"""``python -m searchgym.trainers.openrlhf``: the agent file's path, or a run's command.

python -m searchgym.trainers.openrlhf --print-agent-path
python -m searchgym.trainers.openrlhf --dry-run configs/openrlhf/lightsearcher.yaml
"""

from __future__ import annotations

import argparse
import sys

from ...error import SearchGymError
from .launch import agent_file_path, launch

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit code (2 on a bad config)."""
    parser = argparse.ArgumentParser(
        prog="python -m searchgym.trainers.openrlhf",
        description="The searchgym agent for OpenRLHF (openrlhf 0.11.2).",
    )
    parser.add_argument(
        "--print-agent-path",
        action="store_true",
        help="print the file to pass to --train.agent_func_path",
    )
    parser.add_argument("--dry-run", metavar="CONFIG", help="print the train_ppo_ray command of a run file")
    parser.add_argument("--run", metavar="CONFIG", help="launch the run of a run file")
    args = parser.parse_args(argv)
    if not (args.print_agent_path or args.dry_run or args.run):
        parser.print_help()
        return 2
    if args.print_agent_path:
        print(agent_file_path())
    try:
        if args.dry_run:
            return launch(args.dry_run, dry_run=True)
        if args.run:
            return launch(args.run)
    except SearchGymError as exc:
        print(f"searchgym: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
