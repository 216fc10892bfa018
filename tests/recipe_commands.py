"""Run a recipe under ``examples/openrlhf/`` for real, with every program it calls recorded,
then check each call with the real parser of the program it names.

:func:`run_recipe` runs the script without ``DRY_RUN``, on a ``PATH`` that holds only shims:
each shim appends the call (program, arguments, folder) to a log. File plumbing (``bash``,
``dirname``, ``mkdir``, ``cat``, ``gzip``, ``cp``) then runs for real; ``hf download`` runs
huggingface_hub's own CLI with the transfer replaced by an offline hub (:data:`HUB`) that
writes the files the real selection picks; ``searchgym serve`` waits until it is stopped, as
a server does (or ``$RECIPE_SERVE_SECONDS``, for a recipe that runs it in the foreground);
every other program only returns 0. A program
without a shim is "command not found" there, so a new recipe line cannot slip by unchecked.

:func:`check_call` then parses each recorded call with the real thing:

- ``hf``: huggingface_hub's typer app, with ``snapshot_download``/``hf_hub_download``
  recording their arguments (warnings are errors: hf warns where it ignores a flag);
- ``huggingface-cli``: its real console-script entry point, which must exit 0;
- ``searchgym``: searchgym's own argparse parser; ``train`` also runs the real command with
  ``--dry-run`` and composes the OpenRLHF launch (OpenRLHF 0.11.2's parser and checks);
- ``python``/``python3``: the script's own ``build_parser()``;
- ``ray``: Ray's click CLI, parsed without invoking it;
- ``curl``: the request body through the retrieval server's own request parser.

Each shim calls :func:`shim_main` (``run_recipe`` writes the shims).
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import importlib
import importlib.metadata
import importlib.util
import io
import json
import os
import shutil
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parents[1]

PASSTHROUGH = ("bash", "dirname", "mkdir", "cat", "gzip", "cp")
"""Programs that run for real after they are recorded (they only move files in the run's folder)."""

HUB: dict[str, tuple[str, ...]] = {
    # Search-R1's published retrieval data (README: `cat part_* > e5_Flat.index`, `gzip -d wiki-18.jsonl.gz`).
    "PeterJinGo/wiki-18-corpus": ("wiki-18.jsonl.gz",),
    "PeterJinGo/wiki-18-e5-index": ("part_aa", "part_ab"),
    "PeterJinGo/nq_hotpotqa_train": ("train.parquet", "test.parquet"),
    # FlashRAG's benchmark files: one folder per dataset, one file per split.
    "RUC-NLPIR/FlashRAG_datasets": (
        "musique/train.jsonl",
        "musique/dev.jsonl",
        "2wikimultihopqa/train.jsonl",
        "2wikimultihopqa/dev.jsonl",
        "hotpotqa/train.jsonl",
        "hotpotqa/dev.jsonl",
        "nq/train.jsonl",
        "nq/test.jsonl",
    ),
}
"""The dataset repositories the recipes download and the files each holds (the offline hub)."""


class RecipeCallError(AssertionError):
    """A recipe calls a program in a way the program rejects."""


@dataclass(frozen=True)
class Call:
    """One program call a recipe made."""

    program: str
    args: tuple[str, ...]
    cwd: str

    def __str__(self) -> str:
        return " ".join([self.program, *self.args])


@dataclass(frozen=True)
class Checked:
    """A call and what the program's real parser made of it."""

    call: Call
    kind: str
    """The program and its subcommand: ``hf download``, ``searchgym train``, ``python evaluate.py``."""
    parsed: Any
    """The parsed arguments (an argparse namespace, the download function's keyword arguments, a
    launch plan)."""


# ----------------------------------------------------------------------------------------- running


def run_recipe(
    script: str, tmp_path: Path, cwd: Path = ROOT, recipes: str = "openrlhf", **env: str
) -> list[Call]:
    """Run ``examples/<recipes>/<script>`` from ``cwd`` (the repository root) with every program recorded.

    Args:
        script: The recipe's file name.
        recipes: The folder under ``examples/`` (``openrlhf``, ``verl``).
        tmp_path: A fresh folder for the shims and the call log (``DATA`` defaults under it).
        cwd: The folder the recipe is launched in.
        **env: Variables for the script (``ROLE``, ``HEAD``, ...).

    Returns:
        The calls in the order they were made.

    Raises:
        RecipeCallError: the script stopped with a non-zero status (its stderr in the message).
    """
    shims = tmp_path / "shims"
    shims.mkdir(parents=True)
    log = tmp_path / "calls.jsonl"
    for program in CHECKS:
        shim = shims / program
        shim.write_text(
            f"#!{sys.executable}\nimport sys\nsys.path.insert(0, {str(Path(__file__).parent)!r})\n"
            f"import recipe_commands\nsys.exit(recipe_commands.shim_main({program!r}))\n"
        )
        shim.chmod(0o755)
    variables = {
        "PATH": str(shims),
        "HOME": os.environ.get("HOME", str(tmp_path)),
        "LANG": "C.UTF-8",
        "DATA": str(tmp_path / "data"),
        "RECIPE_CALLS": str(log),
        "RECIPE_REAL_PATH": os.environ.get("PATH", os.defpath),
        **{name: os.environ[name] for name in ("PYTHONPATH",) if name in os.environ},
        **env,
    }
    done = subprocess.run(
        [shutil.which("bash") or "/bin/bash", str(ROOT / "examples" / recipes / script)],
        cwd=cwd,
        env=variables,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if done.returncode != 0:
        raise RecipeCallError(f"{script} stopped with status {done.returncode}:\n{done.stderr[-3000:]}")
    if not log.exists():
        return []
    return [
        Call(row["program"], tuple(row["args"]), row["cwd"])
        for row in map(json.loads, log.read_text(encoding="utf-8").splitlines())
    ]


def shim_main(program: str) -> int:
    """What the shim of ``program`` does: record the call, then pass it on, fetch from :data:`HUB`,
    or return 0."""
    call = Call(program, tuple(sys.argv[1:]), os.getcwd())
    with open(os.environ["RECIPE_CALLS"], "a", encoding="utf-8") as log:
        log.write(json.dumps({"program": program, "args": list(call.args), "cwd": call.cwd}) + "\n")
    if program in PASSTHROUGH:
        real = shutil.which(program, path=os.environ["RECIPE_REAL_PATH"])
        if real is None:
            print(f"{program}: not found on this machine", file=sys.stderr)
            return 127
        os.execv(real, [real, *call.args])
    try:
        if program == "hf":
            check_hf(call, fetch=True)
        elif program == "huggingface-cli":
            check_console_script(call)
        elif call.args[:1] == ("prepare",):  # writes its --out file, one row per question
            _write_prepared_rows(call.args)
        elif call.args[:1] == ("serve",):  # a server runs until it is stopped
            seconds = os.environ.get("RECIPE_SERVE_SECONDS")
            while seconds is None:
                time.sleep(3600)
            time.sleep(float(seconds))
    except RecipeCallError as exc:
        print(exc, file=sys.stderr)
        return 1
    return 0


def _write_prepared_rows(args: tuple[str, ...]) -> None:
    """What ``searchgym prepare`` leaves behind: its ``--out`` file with one row per question
    (``--dataset NAME:N`` asks for N; 100 where no N is given)."""
    out = args[args.index("--out") + 1]
    counts = [args[i + 1].partition(":")[2] for i, word in enumerate(args) if word == "--dataset"]
    rows = sum(int(n) if n else 100 for n in counts)
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", encoding="utf-8") as handle:
        for i in range(rows):
            handle.write(json.dumps({"prompt": f"Question {i}?", "label": json.dumps({"index": i})}) + "\n")


# ---------------------------------------------------------------------------------------- checking


def check_call(call: Call) -> Checked:
    """Parse ``call`` with the real parser of its program.

    Raises:
        RecipeCallError: the program rejects the call, or no check knows the program.
    """
    check = CHECKS.get(call.program)
    if check is None:
        raise RecipeCallError(f"no check for the program of `{call}`: add one to {__file__}.")
    return check(call)


def check_calls(calls: Iterable[Call]) -> list[Checked]:
    """:func:`check_call` of each call, in order."""
    return [check_call(call) for call in calls]


def _fetch(repo_id: str, repo_type: str, local_dir: str | None, patterns: dict[str, Any]) -> list[str]:
    """Write the files of :data:`HUB`'s ``repo_id`` that huggingface_hub's own filter selects."""
    from huggingface_hub.utils import filter_repo_objects

    if repo_type != "dataset" or repo_id not in HUB:
        raise RecipeCallError(f"hf download: no {repo_type} repository {repo_id!r} on the offline hub.")
    picked = list(filter_repo_objects(HUB[repo_id], **patterns))
    if local_dir is not None:
        for name in picked:
            path = Path(local_dir) / name
            path.parent.mkdir(parents=True, exist_ok=True)
            text = f'{{"id": "{name}", "question": "q", "golden_answers": ["a"]}}\n'.encode()
            path.write_bytes(gzip.compress(text) if name.endswith(".gz") else text)
    return picked


def check_hf(call: Call, fetch: bool = False) -> Checked:
    """Run huggingface_hub's ``hf`` app on the call, with the transfer recorded (``fetch``: and the
    :data:`HUB` files it selects written under ``--local-dir``).

    ``parsed`` is ``{"function": name, "kwargs": {...}, "files": [repo files selected]}``.
    """
    import click
    from huggingface_hub.cli import download as download_module
    from huggingface_hub.cli import hf as hf_cli
    from huggingface_hub.errors import CLIError

    if call.args[:1] != ("download",):
        raise RecipeCallError(f"`{call}`: only `hf download` has a check; add one for this subcommand.")
    recorded: list[dict[str, Any]] = []

    def snapshot_download(**kwargs: Any) -> str:
        patterns = {"allow_patterns": kwargs["allow_patterns"], "ignore_patterns": kwargs["ignore_patterns"]}
        files = _fetch(
            kwargs["repo_id"], kwargs["repo_type"], kwargs["local_dir"] if fetch else None, patterns
        )
        recorded.append({"function": "snapshot_download", "kwargs": kwargs, "files": files})
        return str(kwargs["local_dir"])

    def hf_hub_download(**kwargs: Any) -> str:
        name = kwargs["filename"]
        if name not in HUB.get(kwargs["repo_id"], ()):
            raise RecipeCallError(
                f"`{call}`: {kwargs['repo_id']} has no file {name!r} (hf would fail with 404)."
            )
        _fetch(
            kwargs["repo_id"],
            kwargs["repo_type"],
            kwargs["local_dir"] if fetch else None,
            {"allow_patterns": [name]},
        )
        recorded.append({"function": "hf_hub_download", "kwargs": kwargs, "files": [name]})
        return str(Path(kwargs["local_dir"] or ".") / name)

    printed = io.StringIO()
    try:
        with (
            mock.patch.object(download_module, "snapshot_download", snapshot_download),
            mock.patch.object(download_module, "hf_hub_download", hf_hub_download),
            warnings.catch_warnings(),
            contextlib.redirect_stdout(printed),
            contextlib.redirect_stderr(printed),
        ):
            warnings.simplefilter("error")
            hf_cli.app(args=list(call.args), prog_name="hf", standalone_mode=False)
    except click.ClickException as exc:
        raise RecipeCallError(f"`{call}`: hf rejects it: {exc.format_message()}") from None
    except (CLIError, Warning) as exc:
        raise RecipeCallError(f"`{call}`: hf says: {exc}") from None
    if len(recorded) != 1:
        raise RecipeCallError(f"`{call}` downloaded nothing:\n{printed.getvalue()}")
    return Checked(call, "hf download", recorded[0])


def check_console_script(call: Call) -> Checked:
    """Run the installed console script of ``call.program`` (from its package's entry points); it must exit 0."""
    (entry,) = importlib.metadata.entry_points(group="console_scripts", name=call.program)
    printed = io.StringIO()
    code: Any = 0
    with (
        mock.patch.object(sys, "argv", [call.program, *call.args]),
        contextlib.redirect_stdout(printed),
        contextlib.redirect_stderr(printed),
    ):
        try:
            entry.load()()
        except SystemExit as exc:
            code = exc.code
    if code not in (0, None):
        raise RecipeCallError(f"`{call}` exits with status {code}: {printed.getvalue().strip()}")
    return Checked(call, call.program, None)


def _argparse(parser: argparse.ArgumentParser, args: Iterable[str], call: Call) -> argparse.Namespace:
    """``parser.parse_args(args)``; its error, which argparse prints before exiting, becomes a RecipeCallError."""
    printed = io.StringIO()
    try:
        with contextlib.redirect_stderr(printed):
            return parser.parse_args(list(args))
    except SystemExit:
        raise RecipeCallError(f"`{call}`: {parser.prog} rejects it: {printed.getvalue().strip()}") from None


def check_searchgym(call: Call) -> Checked:
    """searchgym's own parser; ``train`` also runs the real command's dry run and composes the launch.

    ``parsed`` is the namespace, or for ``train`` ``(namespace, LaunchPlan)``.
    """
    from searchgym.cli import _parser
    from searchgym.error import SearchGymError

    parser, modules = _parser()
    args = _argparse(parser, call.args, call)
    if args.command != "train":
        return Checked(call, f"searchgym {args.command}", args)
    from searchgym.trainers.run_spec import file_backend

    printed = io.StringIO()
    with _chdir(call.cwd):
        try:
            with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
                code = modules["train"].run(argparse.Namespace(**{**vars(args), "dry_run": True}))
            if (args.backend or file_backend(args.config)) == "verl":
                from searchgym.trainers.run_spec import load_run
                from searchgym.trainers.verl.launch import compose as compose_verl

                plan = compose_verl(load_run(args.config))
            else:
                from searchgym.trainers.openrlhf import load_run_config
                from searchgym.trainers.openrlhf.launch import compose

                plan = compose(load_run_config(args.config))
        except SearchGymError as exc:
            raise RecipeCallError(f"`{call}`: searchgym train --dry-run refuses it: {exc}") from None
    if code != 0:
        raise RecipeCallError(f"`{call}`: searchgym train --dry-run exits {code}: {printed.getvalue()}")
    return Checked(call, "searchgym train", (args, plan))


@contextlib.contextmanager
def _chdir(folder: str) -> Iterator[None]:
    before = os.getcwd()
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(before)


def check_python(call: Call) -> Checked:
    """A script's own ``build_parser()`` (``python -m MODULE``: the module's ``parser()``); ``parsed``
    is its namespace."""
    if call.args[:1] == ("-m",) and len(call.args) > 1:
        module = importlib.import_module(call.args[1])
        if not callable(getattr(module, "parser", None)):
            raise RecipeCallError(f"`{call}`: {call.args[1]} has no parser() for the check to parse with.")
        return Checked(call, f"python -m {call.args[1]}", _argparse(module.parser(), call.args[2:], call))
    if not call.args or call.args[0].startswith("-"):
        raise RecipeCallError(f"`{call}`: only `python SCRIPT ARGS` has a check; add one for this form.")
    path = Path(call.cwd, call.args[0])
    spec = importlib.util.spec_from_file_location(f"recipe_script_{path.stem}", path)
    if spec is None or spec.loader is None or not path.is_file():
        raise RecipeCallError(f"`{call}`: no script at {path}.")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not callable(getattr(module, "build_parser", None)):
        raise RecipeCallError(f"`{call}`: {path} has no build_parser() for the check to parse with.")
    return Checked(call, f"python {path.name}", _argparse(module.build_parser(), call.args[1:], call))


def check_ray(call: Call) -> Checked:
    """Ray's click CLI, descended through its groups and parsed without invoking a command."""
    import click

    with warnings.catch_warnings():  # Ray's own deprecation warnings on import
        warnings.simplefilter("ignore")
        from ray.scripts.scripts import cli

    command: click.Command = cli
    names = ["ray"]
    rest = list(call.args)
    parent = None
    try:
        while True:
            context = command.make_context(names[-1], rest, parent=parent, resilient_parsing=False)
            if not isinstance(command, click.Group):
                break
            protected = (
                context._protected_args if hasattr(context, "_protected_args") else context.protected_args
            )
            unparsed = [*protected, *context.args]
            name, sub, rest = command.resolve_command(context, unparsed)
            if sub is None:
                raise RecipeCallError(f"`{call}`: ray has no command {name!r}.")
            names.append(str(name))
            command, parent = sub, context
    except click.ClickException as exc:
        raise RecipeCallError(f"`{call}`: ray rejects it: {exc.format_message()}") from None
    return Checked(call, " ".join(names), context.params)


def check_curl(call: Call) -> Checked:
    """The recipes' curl calls: ``-s``, ``-f``, ``-X``, ``-H``, ``-d`` and one URL; the body of a
    POST goes through the retrieval server's own request parser. ``parsed`` is
    ``{"method", "url", "request"}``."""
    from searchgym.retrieval.server_protocol import RequestError, RequestLimits, parse_retrieve_request

    method, body, urls = "GET", None, []
    args = list(call.args)
    while args:
        arg = args.pop(0)
        if arg in ("-s", "-f", "-sf", "-fs"):
            continue
        if arg in ("-X", "-H", "-d"):
            value = args.pop(0)
            if arg == "-X":
                method = value
            elif arg == "-d":
                body, method = value, ("POST" if method == "GET" else method)
            elif value.lower().replace(" ", "") != "content-type:application/json":
                raise RecipeCallError(f"`{call}`: the server reads JSON; header {value!r} has no check.")
            continue
        if arg.startswith("-"):
            raise RecipeCallError(f"`{call}`: curl flag {arg!r} has no check; add one to {__file__}.")
        urls.append(arg)
    if len(urls) != 1 or urlsplit(urls[0]).scheme != "http":
        raise RecipeCallError(f"`{call}`: expected one http:// URL, got {urls}.")
    path = urlsplit(urls[0]).path
    request = None
    if (method, path) == ("POST", "/retrieve"):
        try:
            request = parse_retrieve_request((body or "").encode(), RequestLimits(), default_topk=3)
        except RequestError as exc:
            raise RecipeCallError(f"`{call}`: the server answers {exc}") from None
    elif (method, path) not in (("GET", "/health"), ("GET", "/stats")):
        raise RecipeCallError(f"`{call}`: the retrieval server has no route {method} {path}.")
    return Checked(call, "curl", {"method": method, "url": urls[0], "request": request})


def check_sleep(call: Call) -> Checked:
    """One non-negative number of seconds."""
    try:
        (seconds,) = (float(a) for a in call.args)
    except ValueError:
        raise RecipeCallError(f"`{call}`: sleep takes one number of seconds.") from None
    return Checked(call, "sleep", seconds)


def check_plumbing(call: Call) -> Checked:
    """A file command that ran for real (the recipe would have stopped had it failed)."""
    return Checked(call, call.program, None)


CHECKS: dict[str, Callable[[Call], Checked]] = {
    "hf": check_hf,
    "huggingface-cli": check_console_script,
    "searchgym": check_searchgym,
    "python": check_python,
    "python3": check_python,
    "ray": check_ray,
    "curl": check_curl,
    "sleep": check_sleep,
    **{program: check_plumbing for program in PASSTHROUGH},
}
"""The programs a recipe may call (each gets a shim) and the check of each."""


def downloaded(checked: Iterable[Checked]) -> set[Path]:
    """The local files the checked ``hf download`` calls fetch (under their ``--local-dir``)."""
    files = set()
    for item in checked:
        if item.kind == "hf download" and item.parsed["kwargs"]["local_dir"] is not None:
            local = Path(item.call.cwd, item.parsed["kwargs"]["local_dir"])
            files |= {local / name for name in item.parsed["files"]}
    return files
