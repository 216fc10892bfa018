"""``searchgym study``: run every arm of a study file for every seed; write the table and plot.

A study file names its folder's script with a ``runner:`` key (``studies/frugal``): the
command loads that script from the file's folder and calls its ``run(config, output_dir,
arms, seeds)`` (plus ``collect=`` and ``progress=`` where ``run`` takes them), so the
study's code lives with the study, not in the library.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

NAME = "study"
HELP = "run a study from a YAML file: a study folder's runner (studies/frugal)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        required=True,
        type=Path,
        help="a study file whose runner: key names its folder's script (e.g. studies/frugal/incentive.yaml)",
    )
    parser.add_argument("--seeds", type=int, nargs="+", help="run only these seeds (default: the file's)")
    parser.add_argument("--arms", nargs="+", help="run only these arms (default: all of the file's)")
    parser.add_argument("--output-dir", help="write here instead of the file's output_dir")
    parser.add_argument(
        "--collect", action="store_true", help="run nothing: write the table from the runs already finished"
    )
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bars")


def _package_module(script: Path) -> tuple[Path, str] | None:
    """Where ``script`` sits in a package: (the folder above its outermost package, its dotted
    module name), or None when its folder is no package (has no ``__init__.py``)."""
    parts, folder = [script.stem], script.parent
    while (folder / "__init__.py").is_file():
        parts.insert(0, folder.name)
        folder = folder.parent
    return (folder, ".".join(parts)) if len(parts) > 1 else None


def _folder_runner(config: Path):
    """The ``run`` function of the study folder's script named by ``runner:``, or None.

    A script inside a package (``studies/frugal/incentive.py``, with ``studies/__init__.py``
    and ``studies/frugal/__init__.py``) is imported by its module name, as ``python -m``
    would, with the folder above the package on ``sys.path``: its own imports of the
    package's modules resolve, and worker processes it starts import it by name. A lone
    script is loaded from its file.
    """
    import importlib
    import importlib.util

    from searchgym.envs.config_base import read_yaml

    data = read_yaml(config, extends=False)
    runner = data.get("runner") if isinstance(data, dict) else None
    if runner is None:
        return None
    script = config.resolve().parent / str(runner)
    if not script.is_file():
        raise SystemExit(f"{config}: runner {runner!r} is not a file next to the study file ({script}).")
    found = _package_module(script)
    if found is not None:
        root, name = found
        if str(root) not in sys.path:
            sys.path.insert(0, str(root))
        module = importlib.import_module(name)
        loaded = Path(getattr(module, "__file__", "") or "").resolve()
        if loaded != script:
            raise SystemExit(
                f"{config}: runner {runner!r} is the module {name}, but {name} imports from {loaded}; "
                f"run from a folder where {name.split('.')[0]} is {root / name.split('.')[0]}."
            )
        return module.run
    spec = importlib.util.spec_from_file_location(script.stem, script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[script.stem] = module  # so that worker processes can unpickle its functions
    spec.loader.exec_module(module)
    return module.run


def run(args: argparse.Namespace) -> int:
    import inspect

    folder_run = _folder_runner(args.config)
    if folder_run is None:
        raise SystemExit(f"{args.config}: no runner: key naming the study folder's script (studies/frugal).")
    accepted = inspect.signature(folder_run).parameters
    options: dict[str, bool] = {}
    if args.collect:
        if "collect" not in accepted:
            raise SystemExit(
                f"{args.config}: its runner takes no collect argument, so --collect does not apply; "
                "run without it."
            )
        options["collect"] = True
    if "progress" in accepted:
        options["progress"] = not args.no_progress
    return int(folder_run(args.config, args.output_dir, args.arms, args.seeds, **options))
