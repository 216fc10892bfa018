"""``searchgym train``: run the built-in GRPO trainer, or launch OpenRLHF or verl, from a YAML file."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from searchgym.commands import log_to_stderr

NAME = "train"
HELP = "train a policy with the built-in GRPO trainer, OpenRLHF or verl, from a YAML config"

BACKENDS = ("builtin", "openrlhf", "verl")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config", required=True, type=Path, help="YAML config (e.g. configs/grpo_synthetic.yaml)"
    )
    parser.add_argument(
        "--backend",
        choices=BACKENDS,
        help="trainer: builtin (GRPO in this process), openrlhf (openrlhf.cli.train_ppo_ray) or verl "
        "(verl.trainer.main_ppo); "
        "default: the file's 'backend' key, else builtin",
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="check the config and print what would run (the OpenRLHF or verl command, or the builtin plan after "
        "building its envs and checking its data, model, memory and output paths)",
    )
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")


def run(args: argparse.Namespace) -> int:
    from searchgym.error import InvalidArgumentError, SearchGymError
    from searchgym.trainers.run_spec import file_backend

    declared = file_backend(args.config)
    backend = args.backend or declared or "builtin"
    if declared is not None and declared not in BACKENDS:
        raise InvalidArgumentError(
            f"{args.config}: backend: got {declared!r}; allowed: one of {', '.join(BACKENDS)}."
        )
    if args.backend and declared and declared != args.backend:
        raise InvalidArgumentError(
            f"{args.config} says backend: {declared}, but --backend {args.backend} was given: drop --backend "
            "or use a config file written for that backend."
        )
    if backend == "openrlhf":
        from searchgym.trainers.openrlhf import launch

        return int(launch(str(args.config), args.dry_run))
    if backend == "verl":
        from searchgym.trainers.verl.launch import launch as launch_verl

        return int(launch_verl(str(args.config), args.dry_run))

    from searchgym.commands.extras import require
    from searchgym.trainers.run_spec import describe, load_config

    config = load_config(args.config)
    require("torch", "transformers", "tokenizers")
    if args.dry_run:
        from searchgym.trainers.dry_run import check_run, prefixed

        try:
            checks = check_run(config)
        except SearchGymError as exc:
            raise prefixed(exc, str(args.config)) from None
        print(describe(config, checks))
        return 0
    log_to_stderr("searchgym.trainers")  # one line per step, without other libraries' logs
    from searchgym.trainers.grpo import GRPOTrainer

    trainer = GRPOTrainer(config, progress=not args.no_progress)
    try:
        state = trainer.train()
    finally:
        trainer.close()
    if trainer.finished:
        return 0  # the trainer's log said so, and how to train further
    print(
        f"done: {state.step} steps; checkpoints in {Path(config.output_dir) / 'checkpoints'}", file=sys.stderr
    )
    return 0
