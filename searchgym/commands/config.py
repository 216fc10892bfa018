"""``searchgym config``: check a run file, convert one from an older layout, print the reference."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

NAME = "config"
HELP = "check a run file, convert one written in an older layout, or print the config reference"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True)
    check = sub.add_parser("check", help="load a run file and print it as the backends read it")
    check.add_argument("config", type=Path, help="run file")
    convert = sub.add_parser("convert", help="rewrite a run file of an older layout in the run layout")
    convert.add_argument("config", type=Path, help="run file in an older layout")
    convert.add_argument("-o", "--out", type=Path, help="write here (default: print to standard output)")
    sub.add_parser("reference", help="print the config reference (docs/config.md)")


def run(args: argparse.Namespace) -> int:
    import yaml

    from searchgym.envs.config_base import read_yaml
    from searchgym.trainers.run_spec import convert, load_run, run_spec_from_dict

    if args.action == "reference":
        from searchgym.trainers.config_docs import render

        print(render(), end="")
        return 0
    if args.action == "check":
        spec = load_run(args.config)
        from searchgym.envs.config_base import to_dict

        print(
            yaml.safe_dump({k: v for k, v in to_dict(spec).items() if k != "path"}, sort_keys=False), end=""
        )
        return 0
    data = read_yaml(args.config, extends=False)
    new = convert(data)
    if "extends" not in new:
        run_spec_from_dict(new, str(args.config))  # the result loads
    text = yaml.safe_dump(new, sort_keys=False, default_flow_style=False)
    if args.out is None:
        sys.stdout.write(text)
    else:
        args.out.write_text(text, encoding="utf-8")
        print(f"wrote {args.out}", file=sys.stderr)
    return 0
