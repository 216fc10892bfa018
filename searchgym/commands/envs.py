"""``searchgym envs``: list the registered env ids."""

from __future__ import annotations

import argparse

NAME = "envs"
HELP = "list the registered env ids"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """No options."""


def run(args: argparse.Namespace) -> int:
    from searchgym.envs import ENV_IDS

    print("\n".join(ENV_IDS))
    return 0
