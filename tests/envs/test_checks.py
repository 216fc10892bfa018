"""The one validator module (``searchgym.checks``): its messages, and that no other
module keeps its own copy of a "positive int / finite number / non-empty string" check."""

from __future__ import annotations

import ast
import math
import re
from pathlib import Path

import numpy as np
import pytest

from searchgym.checks import (
    ArgumentError,
    check_choice,
    check_int,
    check_number,
    check_probability,
    check_string,
)
from searchgym.envs.config_base import ConfigError
from searchgym.envs.config_base import check_finite as config_check_finite
from searchgym.envs.config_base import check_int as config_check_int
from searchgym.error import InvalidArgumentError

ROOT = Path(__file__).resolve().parents[2]
LIBRARY = ("envs", "retrieval", "storage", "memory", "policies", "trainers", "searchgym", "studies")

# A private helper whose name says it checks an int, a number or a string.
COPY_NAME = re.compile(
    r"^_*(check_)?(positive(_int)?|int|integer|number|finite|float|fraction|probability|"
    r"str|string|non_?empty(_str)?|non_?negative(_int)?|bool)$"
)


def _check_helpers() -> set[tuple[str, str]]:
    found = set()
    for folder in LIBRARY:
        for path in sorted((ROOT / folder).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for node in ast.walk(tree):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and COPY_NAME.match(node.name):
                    found.add((path.relative_to(ROOT).as_posix(), node.name))
    return found


def _calls(path: str, function: str) -> set[str]:
    tree = ast.parse((ROOT / path).read_text(encoding="utf-8"))
    (node,) = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == function]
    return {ast.unparse(c.func) for c in ast.walk(node) if isinstance(c, ast.Call)}


def test_no_module_keeps_its_own_copy_of_a_value_check():
    found = _check_helpers()
    found.discard(("searchgym/checks.py", "check_int"))
    found.discard(("searchgym/checks.py", "check_number"))
    found.discard(("searchgym/checks.py", "check_string"))
    found.discard(("searchgym/checks.py", "check_probability"))
    found.discard(("searchgym/checks.py", "_is_int"))
    # The configs' checks are adapters: the same check, a ConfigError with the dotted field.
    for name in ("check_int", "check_finite"):
        assert "_config_check" in _calls("envs/config_base.py", name)
        found.discard(("envs/config_base.py", name))
    assert found == set(), "use searchgym.checks instead of a private copy"


def test_the_finder_sees_a_copy(tmp_path):
    """The AST scan above would catch the helpers this module replaced."""
    names = ["_positive", "_check_int", "_number", "_int", "_str", "_bool", "_check_fraction", "check_finite"]
    assert all(COPY_NAME.match(n) for n in names)
    assert not any(COPY_NAME.match(n) for n in ["check_env_id", "_check_scheme", "check_bank", "_loggable"])


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: check_int("max_turns", 0, 1), "max_turns must be an int >= 1, got 0."),
        (lambda: check_int("topk", True, 1), "topk must be an int >= 1, got True."),
        (lambda: check_int("topk", 2.0, 1), "topk must be an int >= 1, got 2.0."),
        (lambda: check_int("n", 11, 1, 10), "n must be an int in [1, 10], got 11."),
        (lambda: check_int("seed", "1", 0, optional=True), "seed must be an int >= 0 or None, got '1'."),
        (
            lambda: check_int("group_size", 0, 1, note=" (rollouts per question)"),
            "group_size must be an int >= 1 (rollouts per question), got 0.",
        ),
        (lambda: check_number("lam", math.nan), "lam must be a finite number, got nan."),
        (lambda: check_number("lam", "1"), "lam must be a finite number, got '1'."),
        (lambda: check_number("c", -1, 0), "c must be a finite number >= 0, got -1."),
        (lambda: check_number("timeout", 0, above=0), "timeout must be a finite number > 0, got 0."),
        (
            lambda: check_number("top_p", 1.5, high=1, above=0),
            "top_p must be a finite number > 0 and <= 1, got 1.5.",
        ),
        (lambda: check_probability("p", 1.01), "p must be a finite number in [0, 1], got 1.01."),
        (lambda: check_string("model", " "), "model must be a non-empty string, got ' '."),
        (
            lambda: check_string("tokenizer", 3, optional=True),
            "tokenizer must be a non-empty string or None, got 3.",
        ),
        (
            lambda: check_choice("known_by", "fakt", ("fact", "subject")),
            "known_by must be one of 'fact', 'subject', got 'fakt'. Did you mean 'fact'?",
        ),
        (lambda: check_choice("k", [1], ("a",)), "k must be one of 'a', got [1]."),
    ],
)
def test_a_failed_check_names_the_argument_what_it_accepts_and_the_value(call, message):
    with pytest.raises(ArgumentError) as info:
        call()
    assert str(info.value) == message
    assert isinstance(info.value, InvalidArgumentError)


def test_accepted_values_come_back_as_plain_python_types():
    assert check_int("n", np.int64(3), 1) == 3 and type(check_int("n", np.int64(3), 1)) is int
    assert check_int("n", None, 1, optional=True) is None
    assert check_number("x", 2) == 2.0 and type(check_number("x", np.float32(0.5))) is float
    assert check_number("x", None, optional=True) is None
    assert check_probability("p", 0) == 0.0 and check_probability("p", 1) == 1.0
    assert check_string("s", "a") == "a" and check_string("s", None, optional=True) is None
    assert check_choice("c", "b", ("a", "b")) == "b"
    with pytest.raises(ArgumentError):
        check_int("n", np.bool_(True), 0)


def test_the_config_adapters_give_the_same_check_in_the_configs_words():
    with pytest.raises(ConfigError) as info:
        config_check_int("group_size", 1, 2, "GRPO compares the rollouts of one question.")
    assert str(info.value) == (
        "group_size: got 1; allowed: an int >= 2. GRPO compares the rollouts of one question."
    )
    with pytest.raises(ConfigError) as info:
        config_check_finite("top_p", 1.5, low=1e-6, high=1.0)
    assert str(info.value) == "top_p: got 1.5; allowed: a finite number in [1e-06, 1]."
