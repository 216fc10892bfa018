"""Which ``pip install`` brings an optional package, for the command line's one-line errors.

A command calls :func:`require` before it starts work that needs an extra, so a missing
package fails at once; :func:`searchgym.cli.main` turns any ``ModuleNotFoundError`` for a
package listed in :data:`EXTRAS` into one line naming the ``pip install`` that fixes it.
"""

from __future__ import annotations

import importlib.util

__all__ = ["EXTRAS", "missing_extra", "require"]

EXTRAS = {
    "torch": "train",
    "transformers": "train",
    "tokenizers": "train",
    "matplotlib": "train",
    "faiss": "retrieval",
    "sentence_transformers": "embed",
    "sklearn": "memory",
    "aiohttp": "serve",
    "gunicorn": "serve",
    "pettingzoo": "group",
    "ray": "ray",
    "wandb": "wandb",
    "openrlhf": "openrlhf",
}
"""The extra of ``setup.py`` that brings each optional top-level package."""

_NOTES = {
    "train": " (on a CPU machine, pip install torch==2.13.0 first)",
    "retrieval": " (faiss-cpu; faiss-gpu on a GPU machine)",
    "openrlhf": " and pip install --no-deps openrlhf==0.11.2 (on a GPU machine: pip install 'openrlhf[vllm]==0.11.2')",
}


def missing_extra(command: str, exc: ModuleNotFoundError) -> str | None:
    """One line naming the ``pip install`` that brings the package ``exc`` missed, or None."""
    package = (exc.name or "").split(".")[0]
    extra = EXTRAS.get(package)
    if extra is None:
        return None
    return (
        f"searchgym {command} needs {package}, which is not installed: "
        f"pip install 'searchgym[{extra}]'{_NOTES.get(extra, '')}"
    )


def _importable(package: str) -> bool:
    try:
        return importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):  # ValueError: a module set to None in sys.modules
        return False


def require(*packages: str) -> None:
    """Raise ``ModuleNotFoundError`` for the first of ``packages`` that cannot be imported."""
    for package in packages:
        if not _importable(package):
            raise ModuleNotFoundError(f"No module named {package!r}", name=package)
