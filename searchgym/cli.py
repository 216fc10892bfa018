"""The ``searchgym`` command line; each subcommand lives in ``searchgym.commands``."""

from __future__ import annotations

import argparse
import importlib
import sys

from searchgym.commands import COMMANDS
from searchgym.commands.extras import missing_extra

__all__ = ["main"]


def _parser() -> tuple[argparse.ArgumentParser, dict]:
    parser = argparse.ArgumentParser(prog="searchgym", description="searchgym command line")
    subparsers = parser.add_subparsers(dest="command", required=True)
    modules = {}
    for name in COMMANDS:
        module = importlib.import_module(f"searchgym.commands.{name}")
        module.add_arguments(subparsers.add_parser(module.NAME, help=module.HELP, description=module.HELP))
        modules[module.NAME] = module
    return parser, modules


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``searchgym`` command; returns the exit code (2 on bad input or a
    missing extra, each reported in one line)."""
    from searchgym.error import SearchGymError

    parser, modules = _parser()
    args = parser.parse_args(argv)
    try:
        return int(modules[args.command].run(args))
    except SearchGymError as exc:
        print(f"searchgym: error: {exc}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:
        line = missing_extra(args.command, exc)
        if line is None:
            raise
        print(f"searchgym: error: {line}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
