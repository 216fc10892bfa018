"""The package's layers import one way: error <- storage, retrieval <- envs <- memory <- policies <- trainers.

Read from the source with ``ast`` (every ``import`` and ``from ... import``, at module level or
inside a function), so a lazy import that runs back up a layer fails here too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Repository folder -> its installed package (setup.py's package_dir).
FOLDERS = {
    "envs": "searchgym.envs",
    "retrieval": "searchgym.retrieval",
    "storage": "searchgym.storage",
    "memory": "searchgym.memory",
    "policies": "searchgym.policies",
    "trainers": "searchgym.trainers",
}
BASE = ("searchgym.error", "searchgym.checks", "searchgym.models")
"""The root package's modules that every layer may import (they import only each other)."""

ALLOWED = {
    "searchgym.error": (),
    "searchgym.checks": ("searchgym.error",),
    "searchgym.models": ("searchgym.error",),
    "searchgym.storage": ("searchgym.error", "searchgym.storage"),
    "searchgym.retrieval": (*BASE, "searchgym.retrieval"),
    "searchgym.envs": (*BASE, "searchgym.storage", "searchgym.retrieval", "searchgym.envs"),
    "searchgym.memory": (
        *BASE,
        "searchgym.storage",
        "searchgym.retrieval",
        "searchgym.envs",
        "searchgym.memory",
    ),
    "searchgym.policies": (
        *BASE,
        "searchgym.storage",
        "searchgym.retrieval",
        "searchgym.envs",
        "searchgym.memory",
        "searchgym.policies",
    ),
}


def _module_name(path: Path) -> tuple[str, bool]:
    """The installed name of a source file, and whether it is a package's ``__init__``."""
    relative = path.relative_to(ROOT).with_suffix("")
    folder, *rest = relative.parts
    parts = [*FOLDERS[folder].split("."), *rest] if folder in FOLDERS else ["searchgym", *rest]
    is_package = parts[-1] == "__init__"
    return ".".join(parts[:-1] if is_package else parts), is_package


def imported_modules(path: Path) -> set[str]:
    """Every searchgym module ``path`` imports, as absolute names (relative imports resolved)."""
    name, is_package = _module_name(path)
    package = name if is_package else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = parts[: len(parts) - node.level + 1]
                module = ".".join([*base, node.module] if node.module else base)
            else:
                module = node.module or ""
            found.add(module)
            # ``from searchgym import checks`` imports the module searchgym.checks
            found.update(f"{module}.{alias.name}" for alias in node.names if module == "searchgym")
    return {m for m in found if m == "searchgym" or m.startswith("searchgym.")}


def _files(layer: str) -> list[Path]:
    if layer in BASE:
        return [ROOT / "searchgym" / f"{layer.rpartition('.')[2]}.py"]
    folder = next(f for f, package in FOLDERS.items() if package == layer)
    return sorted((ROOT / folder).rglob("*.py"))


def _outside(module: str, allowed: tuple[str, ...]) -> bool:
    if module == "searchgym":  # ``from searchgym import checks`` is checked by its submodule name
        return False
    return not any(module == a or module.startswith(a + ".") for a in allowed)


@pytest.mark.parametrize("layer", sorted(ALLOWED))
def test_a_layer_imports_only_the_layers_below_it(layer):
    files = _files(layer)
    assert files and all(f.is_file() for f in files), f"no source files for {layer}"
    wrong = {
        f"{path.relative_to(ROOT)} imports {module}"
        for path in files
        for module in imported_modules(path)
        if _outside(module, ALLOWED[layer])
    }
    assert not wrong, (
        f"{layer} may import only {', '.join(ALLOWED[layer]) or 'nothing of searchgym'}; move the shared "
        "code down a layer (searchgym.error for errors, searchgym.retrieval for passages and corpora):\n"
        + "\n".join(sorted(wrong))
    )


def test_retrieval_and_storage_import_nothing_of_envs():
    """The headline rule, spelled out: a retrieval server or a store loads no environment code."""
    for layer in ("searchgym.retrieval", "searchgym.storage"):
        files = _files(layer)
        assert files, f"no source files for {layer}"
        for path in files:
            envs = sorted(m for m in imported_modules(path) if m.startswith("searchgym.envs"))
            assert not envs, f"{path.relative_to(ROOT)} imports {envs}"


def test_the_import_reader_resolves_relative_imports():
    """The reader itself: a relative import two levels up from a subpackage names the right module."""
    source = ROOT / "retrieval" / "simulated" / "retriever.py"
    found = imported_modules(source)
    assert "searchgym.error" in found  # ``from ...error import`` in searchgym.retrieval.simulated
    assert "searchgym.retrieval.records" in found  # ``from ..records import Doc``
    assert "searchgym.retrieval.base" in found  # ``from ..base import Retriever``
