"""The whole warm start: the protocol stage of :mod:`.sft`, then the recall top-ups of :mod:`.topup`.

It sits above both modules, so that :mod:`.topup` builds on :mod:`.sft` without a cycle.
"""

from __future__ import annotations

from pathlib import Path

from .config import StudyRunConfig
from .sft import _protocol_folder, protocol_model
from .topup import recall_topup, topup_folder


def warm_start(config: StudyRunConfig, *, progress: bool = True) -> Path:
    """The warm-started model folder of ``config`` (built on the first call, then cached).

    Starts from :func:`~tiny_lm.sft.reading_model` (shared by all seeds), trains the protocol stage of
    :func:`~tiny_lm.sft.sft_examples` and, with ``sft.recall_target``, tops the known facts up to that
    recall level (:func:`~tiny_lm.topup.recall_topup`, a folder of its
    own on top of the protocol stage's) and, for a memory arm with
    ``sft.memory_recall_target``, once more behind the experience memory (a third folder,
    ``mem-<hash>``). Each folder's ``searchgym_sft.json`` records its
    examples, losses, the skills of :func:`~tiny_lm.sft.probe_skills` and :func:`~tiny_lm.sft.build_facts`; a warm start that copies the
    subject into fewer than half of its queries is logged as a warning, since the study's
    arms cannot learn to search without it.

    Torch runs on the threads of ``model.cpu_threads`` (see
    :func:`~tiny_lm.sft.model_settings`), the count the folders' keys hold.

    Args:
        config: A run config with ``sft.enabled``; its env must be SyntheticFacts and its
            model the tiny one or a local folder.

    Returns:
        ``{sft.dir}/sft-<hash>`` (or ``top-<hash>`` with a recall target), a
        ``save_pretrained`` folder with the tokenizer.
    """
    from searchgym.trainers.grpo.model import resolve_device, set_cpu_threads

    set_cpu_threads(config.model, resolve_device(config.model.device))  # the thread count its key holds
    model = protocol_model(config, progress=progress)
    if config.sft.recall_target:
        model = recall_topup(config, model, progress=progress)
    if _tops_up_behind_memory(config):
        model = recall_topup(config, model, behind_memory=True, progress=progress)
    return model


def warm_start_folder(config: StudyRunConfig) -> Path:
    """The folder :func:`warm_start` returns for ``config``, named without training anything."""
    folder = _protocol_folder(config)
    if config.sft.recall_target:
        folder = topup_folder(config, folder)
    if _tops_up_behind_memory(config):
        folder = topup_folder(config, folder, behind_memory=True)
    return folder


def _tops_up_behind_memory(config: StudyRunConfig) -> bool:
    return bool(config.sft.memory_recall_target) and config.memory.kind == "lightsearcher"
