"""The Hugging Face copies of ``ckpt.save_hf`` follow ``ckpt.max_num``, and the disk a run needs.

OpenRLHF 0.11.2's ``PolicyModelActor.save_checkpoint`` writes each checkpoint twice: the
DeepSpeed state under ``{ckpt.path}/_actor/{tag}``, which ``DeepspeedStrategy.save_ckpt``
rotates (the ``ckpt.max_num`` newest regular tags, ranked by their eval metric, plus one
``best_*``; ``ckpt.max_mem`` caps their size), and with ``ckpt.save_hf`` a Hugging Face copy
under ``{ckpt.path}/{tag}_hf``, which nothing removes. The worker hook wraps
``save_checkpoint`` (:func:`wrap_save_checkpoint`): after OpenRLHF's own barrier, rank 0
removes every ``{tag}_hf`` whose DeepSpeed checkpoint the rotation removed, so the copies
kept are those of the checkpoints kept. With ``ckpt.disable_ds`` (no DeepSpeed state to
follow) it keeps the ``ckpt.max_num`` newest ``global_step*_hf`` and the newest ``best_*_hf``.

:func:`disk_lines` says, before the run, what the checkpoints will take.
"""

from __future__ import annotations

import functools
import logging
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = [
    "DS_BYTES_PER_PARAMETER",
    "HF_BYTES_PER_PARAMETER",
    "disk_lines",
    "prune_hf_copies",
    "wrap_save_checkpoint",
]

logger = logging.getLogger("searchgym.trainers.openrlhf")

DS_BYTES_PER_PARAMETER = 14
"""A DeepSpeed checkpoint with Adam: fp32 master weights and two moments (12 bytes) and the
16-bit weights (2 bytes) per parameter, over all ZeRO partitions."""
HF_BYTES_PER_PARAMETER = 2
"""A Hugging Face copy: the 16-bit weights (``save_model`` gathers them in bf16/fp16)."""

_HF = re.compile(r"^(?P<tag>(?:best_)?global_step(?P<step>\d+))_hf$")


def prune_hf_copies(ckpt_path: str, max_num: int, follow_deepspeed: bool = True) -> list[str]:
    """Remove the ``{tag}_hf`` folders of ``ckpt_path`` that the checkpoint rotation no longer keeps.

    Args:
        ckpt_path: ``ckpt.path``.
        max_num: ``ckpt.max_num``.
        follow_deepspeed: Keep a copy exactly when ``_actor/{tag}`` exists (DeepSpeed
            checkpoints on); else keep the ``max_num`` newest regular copies and the newest best.

    Returns:
        The folders removed.
    """
    root = Path(ckpt_path)
    if not root.is_dir():
        return []
    copies = [(p, _HF.match(p.name)) for p in root.iterdir() if p.is_dir()]
    found = [(p, int(m["step"]), m["tag"]) for p, m in copies if m is not None]
    if follow_deepspeed:
        doomed = [p for p, _, tag in found if not (root / "_actor" / tag).is_dir()]
    else:
        regular = sorted((s, p) for p, s, tag in found if not tag.startswith("best_"))
        best = sorted((s, p) for p, s, tag in found if tag.startswith("best_"))
        doomed = [p for _, p in regular[: max(len(regular) - max_num, 0)]] + [p for _, p in best[:-1]]
    for path in doomed:
        shutil.rmtree(path, ignore_errors=True)
        logger.info("searchgym: removed %s (its checkpoint is rotated out)", path)
    return [str(p) for p in doomed]


def wrap_save_checkpoint(original: Callable[..., Any]) -> Callable[..., Any]:
    """``PolicyModelActor.save_checkpoint`` that then rotates the Hugging Face copies on rank 0."""

    @functools.wraps(original)
    def save_checkpoint(self: Any, tag: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, tag, *args, **kwargs)  # ends with OpenRLHF's barrier: every rank wrote
        ckpt = self.strategy.args.ckpt
        if getattr(ckpt, "save_hf", False) and self.strategy.is_rank_0():
            prune_hf_copies(
                ckpt.path, int(ckpt.max_num), follow_deepspeed=not getattr(ckpt, "disable_ds", False)
            )
        return result

    return save_checkpoint


def parameter_count(model: str) -> int | None:
    """The parameters of the model whose ``config.json`` is in the folder ``model`` or the local
    Hugging Face cache (built on PyTorch's meta device: exact, no weights read); else ``None``."""
    config_path = Path(model) / "config.json"
    if not config_path.is_file():
        try:
            from huggingface_hub import try_to_load_from_cache

            cached = try_to_load_from_cache(model, "config.json")
        except Exception:  # noqa: BLE001 - not a hub id
            return None
        if not isinstance(cached, str):
            return None
        config_path = Path(cached)
    try:
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM

        config = AutoConfig.from_pretrained(str(config_path.parent))
        with torch.device("meta"):
            built = AutoModelForCausalLM.from_config(config)
        return sum(p.numel() for p in built.parameters())
    except Exception:  # noqa: BLE001 - an architecture this transformers cannot build
        return None


def _gb(n: float) -> str:
    return f"{n / 1e9:,.1f} GB"


def disk_lines(args: Any, steps: int | None, params: int | None = None) -> list[str]:
    """What the run's checkpoints take on disk, for the dry run.

    Args:
        args: OpenRLHF's parsed, nested args.
        steps: Training steps of the run (``None`` when the rows were not counted).
        params: The actor's parameter count (default: read from its ``config.json``).
    """
    ckpt = args.ckpt
    model = args.actor.model_name_or_path
    saves = (steps // ckpt.save_steps) if steps is not None and ckpt.save_steps > 0 else None
    if ckpt.save_steps <= 0:
        return [
            "searchgym: disk: no checkpoint is saved (ckpt.save_steps is -1); the final model is one HF copy."
        ]
    params = parameter_count(model) if params is None else params
    kept = ckpt.max_num if saves is None else min(ckpt.max_num, saves)
    best = 1 if getattr(args.eval, "dataset", None) else 0
    copies = kept + best
    if params is None:
        return [
            f"searchgym: disk: the size of {model} is not known here (no config.json in a folder or the local "
            f"Hugging Face cache); each checkpoint takes about {DS_BYTES_PER_PARAMETER} bytes per parameter"
            + (f" and each HF copy {HF_BYTES_PER_PARAMETER} more" if ckpt.save_hf else "")
            + f", {copies} kept at a time."
        ]
    ds = 0 if getattr(ckpt, "disable_ds", False) else params * DS_BYTES_PER_PARAMETER
    hf = params * HF_BYTES_PER_PARAMETER if ckpt.save_hf else 0
    total = copies * (ds + hf) + params * HF_BYTES_PER_PARAMETER  # + the final model in ckpt.output_dir
    written = f"{saves} checkpoints saved over {steps} steps, " if saves is not None else ""
    return [
        f"searchgym: disk: {model} has {params / 1e9:.2f}B parameters; {written}{copies} kept at a time "
        f"(ckpt.max_num = {ckpt.max_num}"
        + (" + the best" if best else "")
        + f"), each {_gb(ds)} of DeepSpeed state"
        + (f" + a {_gb(hf)} HF copy (ckpt.save_hf, rotated with it)" if hf else "")
        + f"; with the final model ({_gb(params * HF_BYTES_PER_PARAMETER)}) about {_gb(total)} in "
        f"{ckpt.path} and {ckpt.output_dir}."
    ]
