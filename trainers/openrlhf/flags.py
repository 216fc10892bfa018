"""The ``openrlhf`` section of a run file as dotted flags of ``openrlhf.cli.train_ppo_ray``.

Since OpenRLHF 0.10.2 every flag is dotted (``--algo.advantage.estimator``), so a nested
YAML mapping maps onto them one to one::

    openrlhf:
      algo: {advantage: {estimator: group_norm}, kl: {use_loss: true}}

becomes ``--algo.advantage.estimator group_norm --algo.kl.use_loss``. A ``true`` switch is
written as the bare flag, ``false`` leaves it out (or writes its ``no_`` twin where OpenRLHF
has one), a list gives several values, and ``null`` leaves the flag out.

The flags are checked against the installed OpenRLHF itself: :func:`openrlhf_parser`
rebuilds ``train_ppo_ray``'s own argument parser from its source (without importing Ray,
DeepSpeed or vLLM), unknown keys get "did you mean", and :func:`check_flags` runs the
parser and the checks its ``__main__`` block makes before training.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import datetime
import difflib
import importlib.util
import io
import types
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ...error import InvalidArgumentError, UnknownNameError
from ..dotted_keys import flatten

__all__ = [
    "FlagError",
    "ParserInfo",
    "check_flags",
    "flatten",
    "nested",
    "openrlhf_parser",
    "parsed_value",
    "to_argv",
]

_MODULE = "openrlhf.cli.train_ppo_ray"


class FlagError(InvalidArgumentError):
    """An OpenRLHF flag or flag value is not accepted."""


class _RaisingParser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # argparse would print and exit
        raise FlagError(f"openrlhf.cli.train_ppo_ray rejects the flags: {message}")


@dataclass(frozen=True)
class ParserInfo:
    """OpenRLHF's parser and the source of its post-parse checks."""

    parser: argparse.ArgumentParser
    checks: types.CodeType | None
    source: str

    @property
    def options(self) -> dict[str, argparse.Action]:
        """``--flag`` → its argparse action."""
        return {o: a for a in self.parser._actions for o in a.option_strings if o.startswith("--")}


def _main_block(tree: ast.Module) -> ast.If:
    for node in tree.body:
        if (
            isinstance(node, ast.If)
            and isinstance(node.test, ast.Compare)
            and ast.unparse(node.test).replace("'", '"') == '__name__ == "__main__"'
        ):
            return node
    raise LookupError("no `if __name__ == '__main__':` block")


def openrlhf_parser() -> ParserInfo | None:
    """Rebuild ``train_ppo_ray``'s argument parser from the installed source; ``None`` if absent.

    The ``__main__`` block is split at ``args = parser.parse_args()``: the statements before
    build the parser; those after (up to ``train(args)``) are OpenRLHF's own checks.

    Raises:
        InvalidArgumentError: the installed file does not have the expected layout (an
            OpenRLHF version this plugin does not know).
    """
    try:
        spec = importlib.util.find_spec(_MODULE)
    except ImportError:
        return None
    if spec is None or not spec.origin:
        return None
    with open(spec.origin, encoding="utf-8") as handle:
        source = handle.read()
    try:
        block = _main_block(ast.parse(source))
        split = next(
            i
            for i, st in enumerate(block.body)
            if isinstance(st, ast.Assign) and ast.unparse(st.value) == "parser.parse_args()"
        )
    except (LookupError, StopIteration, SyntaxError) as exc:
        raise InvalidArgumentError(
            f"{spec.origin} does not have the layout of openrlhf 0.11.2 ({exc}); install openrlhf==0.11.2."
        ) from None
    shim = types.SimpleNamespace(**{**vars(argparse), "ArgumentParser": _RaisingParser})
    namespace: dict[str, Any] = {
        "argparse": shim,
        "datetime": datetime.datetime,
        "__name__": "openrlhf_flags",
    }
    exec(compile(ast.Module(body=block.body[:split], type_ignores=[]), spec.origin, "exec"), namespace)
    checks = []
    for st in block.body[split + 1 :]:
        text = ast.unparse(st)
        if isinstance(st, ast.ImportFrom) and st.module == "openrlhf.utils.config":
            continue  # hierarchize is given below, without importing torch
        if text.startswith(("train(", "if args.use_ms")):
            continue
        checks.append(st)
    code = compile(ast.Module(body=checks, type_ignores=[]), spec.origin, "exec") if checks else None
    return ParserInfo(parser=namespace["parser"], checks=code, source=spec.origin)


def parsed_value(args: Any, dotted: str, default: Any = None) -> Any:
    """The value at ``dotted`` (``"train.batch_size"``) in OpenRLHF's parsed arguments, or
    ``default`` where a part is missing or None."""
    node = args
    for part in dotted.split("."):
        node = getattr(node, part, None)
        if node is None:
            return default
    return node


def _format(value: Any) -> str:
    if isinstance(value, float):
        return repr(value)
    return str(value)


def to_argv(flat: Mapping[str, Any], info: ParserInfo | None) -> list[str]:
    """The argv of dotted ``flat`` keys, checked against ``info``'s options when given.

    Raises:
        UnknownNameError: a key that is no OpenRLHF flag (with close matches).
        FlagError: a value that does not fit its flag (a switch given a non-bool, a list
            for a single-value flag).
    """
    options = info.options if info is not None else {}
    argv: list[str] = []
    for name, value in flat.items():
        option = f"--{name}"
        if value is None:
            continue
        if info is not None and option not in options:
            raise _unknown_flag(name, options)
        action = options.get(option)
        if isinstance(value, bool) or (action is not None and action.nargs == 0):
            if not isinstance(value, bool):
                raise FlagError(f"openrlhf.{name} is a switch: give true or false, got {value!r}.")
            argv += _switch(option, value, action, info)
            continue
        if isinstance(value, (list, tuple)):
            if action is not None and action.nargs in (None, "?"):
                raise FlagError(f"openrlhf.{name} takes one value, got the list {value!r}.")
            argv.append(option)
            argv += [_format(v) for v in value]
            continue
        if isinstance(value, Mapping):  # flatten() never leaves one; a direct caller might
            raise FlagError(f"openrlhf.{name} must be a plain value, got a mapping.")
        argv += [option, _format(value)]
    return argv


def _unknown_flag(name: str, options: Mapping[str, argparse.Action]) -> UnknownNameError:
    known = sorted(o[2:] for o in options if o != "--help")
    close = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
    group = name.rsplit(".", 1)[0] + "." if "." in name else ""
    siblings = [k for k in known if group and k.startswith(group)]
    hint = f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
    listed = f" The {group}* flags are: {', '.join(siblings)}." if siblings else ""
    return UnknownNameError(
        f"Unknown OpenRLHF flag {name!r} (openrlhf.{name} in the config).{hint}{listed} "
        "`python -m openrlhf.cli.train_ppo_ray --help` lists them all."
    )


def _switch(option: str, value: bool, action: argparse.Action | None, info: ParserInfo | None) -> list[str]:
    if action is None or info is None:
        return [option] if value else []
    if getattr(action, "const", None) is value:
        return [option]
    twins = [a for a in info.parser._actions if a.dest == action.dest and getattr(a, "const", None) is value]
    if twins:
        return [twins[0].option_strings[0]]
    if action.default == value:
        return []
    raise FlagError(f"{option[2:]} cannot be set to {value!r} from the command line.")


def _hierarchize(flat: argparse.Namespace) -> types.SimpleNamespace:
    """OpenRLHF's ``hierarchize`` (dotted dests become nested namespaces), without its imports."""
    root: dict[str, Any] = {}
    for key, value in vars(flat).items():
        node = root
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value

    def build(x: Any) -> Any:
        return types.SimpleNamespace(**{k: build(v) for k, v in x.items()}) if isinstance(x, dict) else x

    return build(root)


def nested(flat: Mapping[str, Any]) -> types.SimpleNamespace:
    """Dotted flags as OpenRLHF's nested args (``args.rollout.batch_size``), without its defaults."""
    return _hierarchize(argparse.Namespace(**flat))


def check_flags(argv: list[str], info: ParserInfo) -> tuple[types.SimpleNamespace, list[str]]:
    """Parse ``argv`` with OpenRLHF's parser and run its pre-training checks.

    Returns:
        The parsed, nested args and the warnings OpenRLHF printed.

    Raises:
        FlagError: the parser or one of OpenRLHF's checks rejects the flags (its message).
    """
    flat = info.parser.parse_args(argv)
    namespace: dict[str, Any] = {"args": flat, "hierarchize": _hierarchize, "__name__": "openrlhf_checks"}
    printed = io.StringIO()
    if info.checks is not None:
        try:
            with contextlib.redirect_stdout(printed):
                exec(info.checks, namespace)
        except AssertionError as exc:
            raise FlagError(f"OpenRLHF's checks reject the flags: {exc}") from None
        except (AttributeError, TypeError, ValueError) as exc:
            raise FlagError(f"OpenRLHF's checks fail on the flags: {exc!r}") from None
    args = namespace["args"]
    if isinstance(args, argparse.Namespace):  # checks absent: nest it ourselves
        args = _hierarchize(args)
    warnings = [line for line in printed.getvalue().splitlines() if line.strip()]
    return args, warnings
