"""Loading the policy and the reference model a run trains from."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

from ...error import DataFileError, InvalidArgumentError, SearchGymError
from ...models import resolve_model
from ..config import ConfigError, ModelConfig

__all__ = [
    "model_source",
    "load_tokenizer_for",
    "load_model",
    "check_same_architecture",
    "resolve_device",
    "cpu_threads",
    "set_cpu_threads",
    "freeze_lower_layers",
    "transformer_blocks",
    "autocast",
    "autocast_warning",
    "cpu_has_bfloat16",
]

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(device: str) -> torch.device:
    """``"auto"`` → CUDA when available, else CPU; other names as they are."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise InvalidArgumentError(
            f"model.device is {device!r} but torch sees no CUDA device: use 'cpu' or 'auto' on this machine."
        )
    return torch.device(device)


def cpu_threads(config: ModelConfig) -> int | None:
    """The torch thread count of a CPU run of ``config``; None leaves torch's own default.

    ``model.cpu_threads`` when set; else ``OMP_NUM_THREADS`` (which torch already honours),
    1 for the tiny model, and torch's default for a real model.
    """
    if config.cpu_threads > 0:
        return config.cpu_threads
    if os.environ.get("OMP_NUM_THREADS") or config.tiny is None:
        return None
    return 1


def set_cpu_threads(config: ModelConfig, device: torch.device) -> None:
    """Apply :func:`cpu_threads` when the run is on the CPU."""
    threads = cpu_threads(config)
    if device.type == "cpu" and threads is not None:
        torch.set_num_threads(threads)


def model_source(config: ModelConfig) -> Path:
    """The folder the run starts from: ``model.path``, or the tiny model built (once) for ``model.tiny``."""
    if config.tiny is not None:
        from ...policies.tiny import build_tiny_lm

        tiny = config.tiny
        return build_tiny_lm(
            tiny.dir,
            vocab_size=tiny.vocab_size,
            hidden_size=tiny.hidden_size,
            num_layers=tiny.num_layers,
            seed=tiny.seed,
        )
    assert config.path is not None  # ModelConfig guarantees one of the two
    return Path(resolve_model(config.path))


def load_tokenizer_for(config: ModelConfig, folder: str | os.PathLike[str]) -> Any:
    """The tokenizer of ``folder`` as ``model.tokenizer`` asks; a missing pad token becomes EOS."""
    from ...policies.tiny import load_tokenizer

    if config.tokenizer == "fast" or config.tiny is not None:
        from transformers import PreTrainedTokenizerFast

        try:
            tokenizer = PreTrainedTokenizerFast.from_pretrained(folder)
        except (OSError, ValueError) as exc:
            raise InvalidArgumentError(f"Cannot load a fast tokenizer from {str(folder)!r}: {exc}") from exc
    else:
        tokenizer = load_tokenizer(folder)
    if tokenizer.pad_token_id is None:
        if tokenizer.eos_token_id is None:
            raise InvalidArgumentError(
                f"The tokenizer of {str(folder)!r} has neither a pad nor an EOS token: set one and save it again."
            )
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_model(config: ModelConfig, folder: str | os.PathLike[str], device: torch.device) -> Any:
    """A causal LM from ``folder`` in ``model.dtype`` on ``device``, with dropout off.

    Raises:
        InvalidArgumentError: the folder holds no loadable causal LM.
    """
    try:
        from transformers import AutoModelForCausalLM
    except ImportError as exc:  # pragma: no cover - the train extra is missing
        raise SearchGymError(
            f"The GRPO trainer needs transformers ({exc}): pip install 'searchgym[train]'."
        ) from exc
    if not (Path(folder) / "config.json").is_file() and os.path.isdir(folder):
        raise InvalidArgumentError(
            f"model.path {str(folder)!r} holds no config.json: give a save_pretrained folder."
        )
    try:
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=_DTYPES[config.dtype])
    except (OSError, ValueError) as exc:
        raise InvalidArgumentError(f"Cannot load a causal LM from {str(folder)!r}: {exc}") from exc
    model = model.to(device)  # type: ignore[arg-type]  # transformers' stubs miss torch.device
    if config.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    return model.eval()


def freeze_lower_layers(model: Any, train_layers: int) -> None:
    """Freeze ``model``'s input embeddings and every transformer block below its top
    ``train_layers`` (``model.train_layers``); 0 leaves every parameter trainable.

    Raises:
        ConfigError: the model has fewer blocks, or no list of blocks to find.
    """
    if not train_layers:
        return
    blocks = transformer_blocks(model)
    if not blocks or train_layers > len(blocks):
        found = f"{len(blocks)} transformer blocks" if blocks else "no list of transformer blocks"
        raise ConfigError("model.train_layers", train_layers, f"at most the model's block count ({found})")
    model.get_input_embeddings().requires_grad_(False)
    for block in blocks[: len(blocks) - train_layers]:
        block.requires_grad_(False)


def transformer_blocks(model: Any) -> list[Any]:
    """The stack of transformer blocks of a transformers causal LM (``model.model.layers`` in
    Llama, Qwen and SmolLM2, ``transformer.h`` in GPT-2): the module list under its base model
    with one entry per hidden layer. Empty when there is none."""
    count = getattr(model.config, "num_hidden_layers", None) or getattr(model.config, "n_layer", None)
    for module in model.base_model.modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) == count:
            return list(module)
    return []


_SHAPE_KEYS = (
    "model_type",
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "intermediate_size",
    "head_dim",
)
"""The ``config.json`` fields that set the shapes of a model's parameters."""
_CONFIG_LIMIT = 2**20


def _shape_config(folder: Path) -> dict[str, Any]:
    file = folder / "config.json"
    if file.is_symlink() or not file.is_file():
        raise DataFileError(f"{str(file)!r} is missing: {str(folder)!r} is not a save_pretrained folder.")
    if file.stat().st_size > _CONFIG_LIMIT:
        raise DataFileError(f"{str(file)!r} holds more than a model config can ({_CONFIG_LIMIT:,} bytes).")
    try:
        config = json.loads(file.read_bytes().decode("utf-8"))
    except ValueError as exc:
        raise DataFileError(f"{str(file)!r} is not a model config ({exc}).") from exc
    if not isinstance(config, dict):
        raise DataFileError(f"{str(file)!r} is not a model config (not a JSON object).")
    return {key: config[key] for key in _SHAPE_KEYS if key in config}


def check_same_architecture(saved: str | os.PathLike[str], source: str | os.PathLike[str]) -> None:
    """Check that the model in ``saved`` has the parameter shapes of the model in ``source``.

    Compares the shape-setting fields of both ``config.json`` files, before either model
    is loaded.

    Raises:
        DataFileError: a field differs (named, with both values), or a config is unreadable.
    """
    ours, theirs = _shape_config(Path(saved)), _shape_config(Path(source))
    for key in _SHAPE_KEYS:
        if key in ours and key in theirs and ours[key] != theirs[key]:
            raise DataFileError(
                f"{str(Path(saved))!r} holds a model with {key} {ours[key]!r}, but this run's model "
                f"({str(Path(source))!r}) has {theirs[key]!r}: the checkpoint is another model's. Resume "
                "with the model config the checkpoint was written with, or start a new output_dir."
            )


def cpu_has_bfloat16() -> bool:
    """Whether this CPU computes bfloat16 in hardware that oneDNN uses (AVX-512 or AMX).

    On an AVX2-only CPU torch emulates bfloat16, far slower than float32
    (``benchmarks/results/autocast_cpu_avx2.json``). True when torch cannot tell.
    """
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return True


def autocast_warning(config: ModelConfig, device: torch.device) -> str | None:
    """A warning for ``model.autocast: bfloat16`` on a CPU that only emulates bfloat16, else None."""
    if config.autocast != "bfloat16" or device.type != "cpu" or cpu_has_bfloat16():
        return None
    return (
        "builtin.model.autocast is bfloat16, but this CPU has no bfloat16 units (AVX2 only): torch "
        "emulates bfloat16 here, and the update runs many times slower than in float32 "
        "(docs/train-cli.md, Mixed precision). Leave builtin.model.autocast unset on this machine."
    )


def autocast(config: ModelConfig, device: torch.device) -> Any:
    """The mixed-precision context of ``model.autocast`` on ``device`` (disabled for ``off``)."""
    if config.autocast == "off":
        return torch.autocast(device.type, enabled=False)
    return torch.autocast(device.type, dtype=_DTYPES[config.autocast])
