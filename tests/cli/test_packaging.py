"""Packaging: one import name, no bare top-level names, no heavy imports."""

from __future__ import annotations

import ast
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run_python(code: str, cwd: Path, **env) -> str:
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=cwd,
        capture_output=True,
        text=True,
        env={**__import__("os").environ, **env},
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_import_searchgym_pulls_in_no_torch_ray_or_faiss(tmp_path):
    out = run_python(
        "import sys, searchgym, gymnasium as gym; gym.make('searchgym/SyntheticFacts-v1');"
        "print(sorted(m for m in ('torch', 'ray', 'faiss', 'openrlhf', 'vllm') if m in sys.modules))",
        tmp_path,
    )
    assert out == "[]"


def test_bare_folder_names_are_not_importable(tmp_path):
    out = run_python(
        "import importlib.util, searchgym;"
        "print([n for n in ('envs', 'retrieval', 'storage', 'policies', 'trainers', 'memory', 'configs')"
        " if importlib.util.find_spec(n)])",
        tmp_path,
    )
    assert out == "[]"


def test_no_module_is_loaded_twice_under_two_names():
    import searchgym  # noqa: F401

    assert not [
        name
        for name in sys.modules
        if name.split(".")[0] in ("envs", "retrieval", "storage", "policies", "trainers", "memory")
    ]


@pytest.mark.parametrize("folder", ["envs", "retrieval", "retrieval/simulated", "storage", "memory"])
def test_each_top_level_folder_is_installed_under_searchgym(folder):
    """The checkout's folders are the installed subpackages (setup.py's package_dir)."""
    import importlib.util

    name = "searchgym." + folder.replace("/", ".")
    spec = importlib.util.find_spec(name)
    assert spec is not None, f"{name} is not installed; run pip install -e . again"
    assert Path(spec.origin).resolve() == ROOT / folder / "__init__.py"


@pytest.mark.slow
def test_plain_wheel_holds_every_subpackage_and_imports(tmp_path):
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(ROOT)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    wheel = next(tmp_path.glob("searchgym-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    for folder in (
        "commands",
        "envs",
        "envs/protocols",
        "envs/rewards",
        "retrieval",
        "retrieval/simulated",
        "storage",
        "policies",
        "trainers",
        "memory",
        "configs",
    ):
        assert f"searchgym/{folder}/__init__.py" in names, f"{folder} missing from the wheel"
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    out = run_python(
        "import searchgym, searchgym.policies, searchgym.retrieval.bm25, searchgym.storage.sqlite_log;"
        "print(searchgym.__file__)",
        tmp_path,
        PYTHONPATH=str(target),
    )
    assert out.startswith(str(target))


def _setup_subpackages() -> list[str]:
    """setup.py's SUBPACKAGES: the top-level folders installed under ``searchgym``."""
    for node in ast.walk(ast.parse((ROOT / "setup.py").read_text(encoding="utf-8"))):
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "SUBPACKAGES" for t in node.targets):
            return list(ast.literal_eval(node.value))
    raise AssertionError("setup.py has no SUBPACKAGES list")


def test_a_cluster_run_stages_every_installed_folder(tmp_path):
    """The package copy a Ray cluster run ships to its workers (``py_modules``) holds every folder
    setup.py installs, and imports from the copy alone."""
    from searchgym.trainers.openrlhf.cluster import stage_package

    package = Path(stage_package(str(tmp_path / "stage")))
    folders = _setup_subpackages()
    assert {"envs", "retrieval", "storage"} <= set(folders)
    missing = [f for f in folders if not (package / f / "__init__.py").is_file()]
    assert not missing, f"stage_package leaves out {missing}"
    out = run_python(
        "import searchgym.retrieval.bm25, searchgym.storage.sqlite_log, searchgym.envs.search_env;"
        "print(searchgym.retrieval.bm25.__file__, searchgym.storage.sqlite_log.__file__)",
        tmp_path,
        PYTHONPATH=str(package.parent),
    )
    assert all(path.startswith(str(package)) for path in out.split()), out
