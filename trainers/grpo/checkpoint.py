"""Checkpoints of a GRPO run: everything needed to continue it as if it had not stopped.

A checkpoint is a folder ``{output_dir}/checkpoints/step_{N:06d}`` holding:

======================  =========================================================
``model/``              the policy (``save_pretrained``) and its tokenizer: loadable
                        on its own, e.g. ``searchgym eval --policy hf:…/model``
``optimizer.pt``        AdamW's state
``scheduler.pt``        the learning-rate schedule's state
``rng.pt``              Python, NumPy and torch (CPU and CUDA) generator states
``reward.json``         the shared reward scheme's state (LightSearcher's per-question
                        minima), from ``RewardScheme.state_dict()``
``memory/``             a copy of the experience-memory store, when there is one
``config.yaml``         the run's config
``trainer_state.json``  the run id, the step and the metrics of every step so far
``manifest.json``       the run id and the size and SHA-256 of every other file
                        (:mod:`.manifest`), written last
======================  =========================================================

A checkpoint is written into a hidden temporary folder, synced, and renamed into place, so
a run killed while saving leaves the previous checkpoint intact and never a partial one.

Resuming checks the folder against its manifest before it reads anything for use, so a
file from another run or a damaged one is an error naming it, and no file is read beyond
the size the checkpoint wrote. A checkpoint without a manifest (written by an older
searchgym) still resumes, with a warning that its files cannot be checked against each
other; its JSON files are then read up to :data:`LEGACY_JSON_LIMIT` bytes.

Resuming runs no code from the folder: the ``.pt`` files are read with
``torch.load(weights_only=True)`` and the reward state is JSON. A damaged checkpoint (a file
missing, truncated or garbage) is an error that names the file; resuming never falls back
to an older checkpoint on its own, since the run would later overwrite the newer one. The
one fallback: a checkpoint without a manifest and without its reward file resumes when the
run's reward scheme keeps no state (nothing is lost), with a warning in the log.

Checkpoints written before ``reward.json`` hold ``reward.pkl`` instead. Resuming reads it
only when it holds nothing but searchgym's own reward classes; for anything else the error
says how to convert a pickle you trust (:func:`convert_reward_pickle`).
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import random
import re
import shutil
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ...envs.rewards import REWARDS, MinToolCallStore, RewardScheme
from ...error import DataFileError, InvalidArgumentError
from ...memory.store import MemoryStore
from ...storage.atomic import fsync_folder
from .manifest import (
    DAMAGED_ADVICE,
    MANIFEST,
    Manifest,
    checkpoint_files,
    new_run_id,
    open_regular,
    read_bounded,
    read_manifest,
    verify_files,
    write_manifest,
)

__all__ = [
    "TrainerState",
    "Checkpoint",
    "checkpoint_path",
    "list_checkpoints",
    "latest_checkpoint",
    "step_folders",
    "damaged_file",
    "save_checkpoint",
    "read_state",
    "load_checkpoint",
    "check_optimizer_fits",
    "LEGACY_JSON_LIMIT",
    "restore_reward",
    "rng_state",
    "set_rng_state",
    "prune_checkpoints",
    "convert_reward_pickle",
]

logger = logging.getLogger(__name__)

_STATE = "trainer_state.json"
_REWARD = "reward.json"
_LEGACY_REWARD = "reward.pkl"
_DAMAGED = DAMAGED_ADVICE
LEGACY_JSON_LIMIT = 256 * 2**20
"""Bytes read at most from ``trainer_state.json`` or ``reward.json`` of a checkpoint without a
manifest (with one, the manifest's size of the file is the bound)."""


@dataclass
class TrainerState:
    """Progress of a run.

    Attributes:
        step: Training steps completed.
        history: The metrics of each completed step, in order.
        run_id: The run's id, the same in every checkpoint of the run and of its resumes
            ("" in a checkpoint written without one).
    """

    step: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)
    run_id: str = ""


def checkpoint_path(output_dir: str | os.PathLike[str], step: int) -> Path:
    """The folder of the checkpoint after ``step`` completed steps."""
    return Path(output_dir) / "checkpoints" / f"step_{step:06d}"


def list_checkpoints(output_dir: str | os.PathLike[str]) -> list[tuple[int, Path]]:
    """Complete checkpoints in ``output_dir``, ``(step, folder)``, oldest first."""
    root = Path(output_dir) / "checkpoints"
    found = []
    if root.is_dir():
        for child in root.iterdir():
            if child.name.startswith("step_") and child.name[5:].isdigit() and (child / _STATE).is_file():
                found.append((int(child.name[5:]), child))
    return sorted(found)


def damaged_file(path: Path, what: str) -> DataFileError:
    """The error for a damaged file of a checkpoint: ``'{path}' {what}.`` and how to go on.

    Only the first line of ``what`` is kept, so the message stays one line.
    """
    first = what.strip().splitlines()[0] if what.strip() else what
    return DataFileError(f"{str(path)!r} {first.rstrip('.')}. {_DAMAGED}")


def step_folders(output_dir: str | os.PathLike[str]) -> list[tuple[int, Path]]:
    """Every ``step_*`` folder in ``output_dir``, complete or not, ``(step, folder)``, oldest first."""
    root = Path(output_dir) / "checkpoints"
    if not root.is_dir():
        return []
    return sorted(
        (int(child.name[5:]), child)
        for child in root.iterdir()
        if child.name.startswith("step_") and child.name[5:].isdigit() and child.is_dir()
    )


def latest_checkpoint(output_dir: str | os.PathLike[str]) -> Path | None:
    """The newest checkpoint, or None when there is none.

    Raises:
        DataFileError: the newest ``step_*`` folder lacks its ``trainer_state.json`` (it was
            damaged after it was written; resuming from an older one would later overwrite it).
    """
    steps = step_folders(output_dir)
    if not steps:
        return None
    step, newest = steps[-1]
    if not (newest / _STATE).is_file():
        raise DataFileError(
            f"The newest checkpoint {str(newest)!r} has no {_STATE} (checkpoints are renamed into place "
            f"complete, so it was damaged afterwards); refusing to resume from an older one, which would "
            f"later overwrite step {step}. {_DAMAGED}"
        )
    return newest


def rng_state() -> dict[str, Any]:
    """The states of Python's, NumPy's and torch's global generators, as tensors and numbers.

    Everything in it loads with ``torch.load(weights_only=True)``.
    """
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": (kind, torch.from_numpy(np.asarray(keys, dtype=np.int64)), pos, has_gauss, gauss),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`rng_state` returned."""
    random.setstate(_as_tuples(state["python"]))
    kind, keys, pos, has_gauss, gauss = state["numpy"]
    keys = keys.numpy() if isinstance(keys, torch.Tensor) else np.asarray(keys)
    np.random.set_state((kind, keys.astype(np.uint32), pos, has_gauss, gauss))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _as_tuples(value: Any) -> Any:
    """Lists back to the tuples ``random.setstate`` wants."""
    return tuple(_as_tuples(v) for v in value) if isinstance(value, (list, tuple)) else value


def save_checkpoint(
    output_dir: str | os.PathLike[str],
    state: TrainerState,
    *,
    model: Any,
    tokenizer: Any,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    config_yaml: str,
    reward_scheme: Any = None,
    memory_dir: str | os.PathLike[str] | None = None,
) -> Path:
    """Write the checkpoint of ``state.step`` atomically and return its folder.

    Every file is synced to disk, then ``manifest.json`` is written last, with
    ``state.run_id`` (a new id is given to a state without one).
    """
    if not state.run_id:
        state.run_id = new_run_id()
    target = checkpoint_path(output_dir, state.step)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        model.save_pretrained(staging / "model")
        tokenizer.save_pretrained(staging / "model")
        torch.save(optimizer.state_dict(), staging / "optimizer.pt")
        torch.save(scheduler.state_dict(), staging / "scheduler.pt")
        torch.save(rng_state(), staging / "rng.pt")
        if reward_scheme is not None:
            reward = {"scheme": reward_scheme.name, "state": reward_scheme.state_dict()}
            (staging / _REWARD).write_text(json.dumps(reward) + "\n", encoding="utf-8")
        if memory_dir is not None and Path(memory_dir).is_dir():
            store = MemoryStore(memory_dir)
            try:
                store.copy_to(staging / "memory")  # each log as one consistent state
            finally:
                store.close()
        (staging / "config.yaml").write_text(config_yaml, encoding="utf-8")
        (staging / _STATE).write_text(json.dumps(asdict(state), indent=1) + "\n", encoding="utf-8")
        write_manifest(staging, state.run_id, state.step)
        if target.exists():
            shutil.rmtree(target)
        os.replace(staging, target)
        fsync_folder(target.parent)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _json_limit(folder: Path, name: str, manifest: Manifest | None) -> tuple[int, str]:
    """The most bytes file ``name`` of a checkpoint may have, and what sets that bound."""
    if manifest is not None and name in manifest.files:
        return manifest.files[name].size, f"the size {MANIFEST} records"
    return LEGACY_JSON_LIMIT, f"a {name} this trainer reads from a checkpoint without {MANIFEST}"


def read_state(checkpoint: str | os.PathLike[str], manifest: Manifest | None = None) -> TrainerState:
    """The :class:`TrainerState` saved in a checkpoint folder.

    Reads no more of ``trainer_state.json`` than the size a valid one can have: the size
    the manifest records, else :data:`LEGACY_JSON_LIMIT`.

    Args:
        checkpoint: The checkpoint folder.
        manifest: Its manifest when already read (else it is read here).

    Raises:
        DataFileError: the folder is not a complete checkpoint.
    """
    folder = Path(checkpoint)
    file = folder / _STATE
    if manifest is None and os.path.isdir(folder):
        manifest = read_manifest(folder)
    if not os.path.lexists(file):
        raise DataFileError(
            f"{str(folder)!r} is not a complete checkpoint ({file.name} missing). "
            f"Pass a step_* folder under {str(folder.parent)!r}, or use checkpoint.resume: auto. "
            f"{_DAMAGED}"
        )
    limit, bound = _json_limit(folder, _STATE, manifest)
    raw = read_bounded(file, limit, bound)  # its errors name the file
    try:
        data = json.loads(raw.decode("utf-8"))
        step, history = data["step"], data.get("history", [])
        run_id = data.get("run_id", "")
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"step must be a non-negative int, got {step!r}")
        if not isinstance(history, list) or not all(isinstance(h, dict) for h in history):
            raise ValueError("history must be a list of objects")
        if not isinstance(run_id, str):
            raise ValueError(f"run_id must be a string, got {run_id!r:.40}")
    except (ValueError, KeyError, TypeError) as exc:
        raise DataFileError(
            f"{str(folder)!r} is not a complete checkpoint ({file.name} unreadable: {exc}). "
            f"Pass a step_* folder under {str(folder.parent)!r}, or use checkpoint.resume: auto. "
            f"{_DAMAGED}"
        ) from exc
    if folder.name.startswith("step_") and folder.name[5:].isdigit() and int(folder.name[5:]) != step:
        raise DataFileError(f"{str(file)!r} says step {step}, but its folder is {folder.name!r}. {_DAMAGED}")
    return TrainerState(step=step, history=list(history), run_id=run_id)


@dataclass
class Checkpoint:
    """Everything :func:`load_checkpoint` read, checked before any of it is applied.

    Attributes:
        folder: The checkpoint folder.
        state: The run's progress.
        optimizer: AdamW's ``state_dict``.
        scheduler: The schedule's ``state_dict``.
        rng: What :func:`rng_state` returned.
        reward: ``{"scheme": name, "state": {...}}``, or None when the folder has no reward file.
        manifest: The folder's manifest, or None for a checkpoint written without one.
    """

    folder: Path
    state: TrainerState
    optimizer: dict[str, Any]
    scheduler: dict[str, Any]
    rng: dict[str, Any]
    reward: dict[str, Any] | None
    manifest: Manifest | None = None


def _numpy_globals() -> list[Any]:
    """The NumPy names an older ``rng.pt`` (a pickled NumPy array) needs; they only build arrays."""
    core = getattr(np, "_core", None) or np.core
    return [np.ndarray, np.dtype, type(np.dtype(np.uint32)), core.multiarray._reconstruct]


_GLOBAL = re.compile(r"GLOBAL ([\w.]+)")
_GOT_CLASS = re.compile(r"but got <class '([\w.]+)'>")
_ZIP = b"PK\x03\x04"


def _load_tensors(folder: Path, name: str, map_location: Any = None) -> Any:
    """``torch.load`` of a checkpoint file with ``weights_only=True``; errors name the file.

    The errors say what is wrong with the file, never torch's advice to load it with
    ``weights_only=False`` (which would run code from the checkpoint).
    """
    file = folder / name
    if not os.path.lexists(file):
        raise DataFileError(f"Checkpoint {str(folder)!r} has no {name}. {_DAMAGED}")
    fd = open_regular(file)  # no link, no device
    try:
        head = os.pread(fd, 4, 0)
    finally:
        os.close(fd)
    try:
        with torch.serialization.safe_globals(_numpy_globals()):
            return torch.load(file, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as exc:
        named = _GLOBAL.search(str(exc)) or _GOT_CLASS.search(str(exc))
        if named is not None:
            raise damaged_file(
                file,
                f"holds a {named.group(1)} object, not only tensors and numbers, and resuming never runs code "
                "from a checkpoint",
            ) from exc
        what = (
            "its contents are not tensors and numbers"
            if head == _ZIP
            else "it is not a file torch.save writes"
        )
        raise damaged_file(file, f"is truncated or corrupt: {what}") from exc
    except Exception as exc:  # torch raises RuntimeError, EOFError, ValueError... on a damaged file
        what = (
            "its zip archive is incomplete or damaged"
            if head == _ZIP
            else "it is not a file torch.save writes"
        )
        raise damaged_file(file, f"is truncated or corrupt: {what} ({type(exc).__name__})") from exc


def _check_rng(folder: Path, rng: Any) -> dict[str, Any]:
    """``rng`` if it has the shape :func:`rng_state` writes."""
    ok = (
        isinstance(rng, dict)
        and {"python", "numpy", "torch"} <= set(rng)
        and isinstance(rng["torch"], torch.Tensor)
        and isinstance(rng["numpy"], (tuple, list))
        and len(rng["numpy"]) == 5
    )
    if not ok:
        raise DataFileError(f"{str(folder / 'rng.pt')!r} does not hold generator states. {_DAMAGED}")
    return rng


def load_checkpoint(checkpoint: str | os.PathLike[str], map_location: Any = None) -> Checkpoint:
    """Check a checkpoint folder and read every file of it except the model and the memory copy.

    The folder is first checked against its manifest: every file present is listed, and
    every file outside ``memory/`` has its recorded size and SHA-256 (``memory/`` has its
    sizes checked here, its digests while it is copied back). A folder without a manifest
    is read with a warning that its files cannot be checked against each other. Runs no
    code from the folder (see the module docstring).

    Raises:
        DataFileError: a file is a link, missing, not listed in the manifest, not the one
            the manifest records, truncated, or not what this module writes; the message
            names it.
    """
    folder = Path(checkpoint)
    checkpoint_files(folder)  # no link and nothing but files and folders, before anything is read
    manifest = read_manifest(folder)
    state = read_state(folder, manifest)
    if manifest is None:
        if state.run_id:
            raise damaged_file(
                folder,
                f"has no {MANIFEST} although its {_STATE} was written with one (run {state.run_id}); "
                "it was deleted, so whether the files belong together cannot be checked",
            )
        logger.warning(
            "Checkpoint %s has no %s (it was written by an older searchgym): resuming cannot check that its "
            "files all belong to one run.",
            folder,
            MANIFEST,
        )
    else:
        verify_files(folder, manifest, skip_digest=("memory/",))
        if (state.run_id, state.step) != (manifest.run_id, manifest.step):
            raise damaged_file(
                folder / _STATE,
                f"belongs to run {state.run_id or '(none)'} at step {state.step}, but {MANIFEST} to run "
                f"{manifest.run_id} at step {manifest.step}",
            )
    optimizer = _load_tensors(folder, "optimizer.pt", map_location)
    scheduler = _load_tensors(folder, "scheduler.pt")
    for name, value in (("optimizer.pt", optimizer), ("scheduler.pt", scheduler)):
        if not isinstance(value, dict):
            raise DataFileError(f"{str(folder / name)!r} does not hold a state_dict. {_DAMAGED}")
    rng = _check_rng(folder, _load_tensors(folder, "rng.pt"))
    if not (folder / "model").is_dir():
        raise DataFileError(f"Checkpoint {str(folder)!r} has no model/ folder. {_DAMAGED}")
    return Checkpoint(folder, state, optimizer, scheduler, rng, _read_reward(folder, manifest), manifest)


def _shape(value: Any) -> list[int] | None:
    return list(value.shape) if isinstance(value, torch.Tensor) and value.dim() > 0 else None


def check_optimizer_fits(saved: Checkpoint, optimizer: torch.optim.Optimizer) -> None:
    """Check that the saved optimizer state is the state of ``optimizer``'s parameters.

    ``optimizer`` holds the parameters of the model loaded from the checkpoint. Each saved
    group must have as many parameters, and each saved per-parameter tensor (AdamW's moments)
    the shape of its parameter, or the update would fail or mix two models' states.

    Raises:
        DataFileError: the saved state is another model's; the message names the first
            parameter that differs.
    """
    file = saved.folder / "optimizer.pt"
    groups, state = saved.optimizer.get("param_groups"), saved.optimizer.get("state")
    if not isinstance(groups, list) or not isinstance(state, dict):
        raise damaged_file(file, "does not hold an optimizer state_dict (no param_groups and state)")
    live = [p for group in optimizer.param_groups for p in group["params"]]
    saved_ids = [i for group in groups if isinstance(group, dict) for i in group.get("params", [])]
    if len(saved_ids) != len(live) or len(groups) != len(optimizer.param_groups):
        raise damaged_file(
            file,
            f"holds the state of {len(saved_ids)} parameters in {len(groups)} groups, but the model in "
            f"{saved.folder / 'model'} has {len(live)} in {len(optimizer.param_groups)}: the two come from "
            "different models",
        )
    for index, (saved_id, param) in enumerate(zip(saved_ids, live, strict=True)):
        entry = state.get(saved_id, {})
        for key, value in entry.items() if isinstance(entry, dict) else ():
            shape = _shape(value)
            if shape is not None and shape != list(param.shape):
                raise damaged_file(
                    file,
                    f"holds {key} of shape {shape} for parameter {index}, but that parameter of the model "
                    f"in {saved.folder / 'model'} has shape {list(param.shape)}: the two come from different "
                    "models",
                )


def restore_reward(scheme: RewardScheme | None, saved: Checkpoint) -> None:
    """Load the reward state of ``saved`` into the run's ``scheme``, or say why it cannot be.

    Nothing is lost silently: a checkpoint without a reward file, or with another scheme's
    file, resumes only when the state it lacks or holds is empty (with a warning).

    Raises:
        DataFileError: the state would be lost, or the file does not fit the scheme.
    """
    if scheme is None:
        return
    reward = saved.reward
    if reward is None:
        if scheme.state_dict():
            raise damaged_file(
                saved.folder,
                f"has no {_REWARD}, and the {scheme.name!r} reward keeps a state across steps that would be "
                "lost; restore the file",
            )
        logger.warning(
            "Checkpoint %s has no %s; the %r reward keeps no state, so nothing is lost.",
            saved.folder,
            _REWARD,
            scheme.name,
        )
        return
    if reward["scheme"] != scheme.name:
        if reward["state"]:
            raise DataFileError(
                f"Checkpoint {str(saved.folder)!r} holds the state of the {reward['scheme']!r} reward, but this run "
                f"uses {scheme.name!r}; resume with the reward the checkpoint was written with."
            )
        logger.warning(
            "Checkpoint %s was written with the %r reward, which keeps no state; the %r reward starts afresh.",
            saved.folder,
            reward["scheme"],
            scheme.name,
        )
        return
    try:
        scheme.load_state_dict(reward["state"])
    except InvalidArgumentError as exc:
        raise damaged_file(saved.folder / _REWARD, f"does not fit the {scheme.name!r} reward: {exc}") from exc


def _read_reward(folder: Path, manifest: Manifest | None = None) -> dict[str, Any] | None:
    """The reward file's ``{"scheme", "state"}``, from ``reward.json`` or a safe legacy pickle."""
    file = folder / _REWARD
    if os.path.lexists(file):
        limit, bound = _json_limit(folder, _REWARD, manifest)
        raw = read_bounded(file, limit, bound)
        try:
            data = json.loads(raw.decode("utf-8"))
        except ValueError as exc:
            raise DataFileError(f"{str(file)!r} is unreadable ({exc}). {_DAMAGED}") from exc
        if not (
            isinstance(data, dict)
            and isinstance(data.get("scheme"), str)
            and isinstance(data.get("state"), dict)
        ):
            raise DataFileError(f'{str(file)!r} is not {{"scheme": name, "state": {{...}}}}. {_DAMAGED}')
        return data
    legacy = folder / _LEGACY_REWARD
    if legacy.is_file():
        scheme = _restricted_unpickle(legacy)
        return {"scheme": scheme.name, "state": scheme.state_dict()}
    return None


class _RewardUnpickler(pickle.Unpickler):
    """Unpickles searchgym's own reward classes and nothing else (no other code can run)."""

    def find_class(self, module: str, name: str) -> Any:
        for cls in [*REWARDS.values(), MinToolCallStore]:
            if (cls.__module__, cls.__qualname__) == (module, name):
                return cls
        raise pickle.UnpicklingError(f"{module}.{name} is not one of searchgym's reward classes")


def _restricted_unpickle(file: Path) -> Any:
    try:
        with open(file, "rb") as fh:
            scheme = _RewardUnpickler(fh).load()
    except pickle.UnpicklingError as exc:
        raise DataFileError(
            f"{str(file)!r} is an old-style reward pickle that refers to code outside searchgym's reward "
            f"schemes ({exc}), so resuming does not load it. If you trust this checkpoint, convert it to "
            f'reward.json with: python -c "from searchgym.trainers.grpo.checkpoint import convert_reward_pickle; '
            f"convert_reward_pickle('{file.parent}')\"; if the scheme keeps no state, deleting the file "
            "is enough."
        ) from exc
    except Exception as exc:
        raise DataFileError(
            f"{str(file)!r} is truncated or corrupt ({type(exc).__name__}: {exc}). {_DAMAGED}"
        ) from exc
    if not hasattr(scheme, "state_dict") or not isinstance(getattr(scheme, "name", None), str):
        raise DataFileError(f"{str(file)!r} does not hold a reward scheme. {_DAMAGED}")
    return scheme


def convert_reward_pickle(checkpoint: str | os.PathLike[str]) -> Path:
    """Write ``reward.json`` from an old checkpoint's ``reward.pkl`` and delete the pickle.

    This unpickles the file with the full ``pickle`` module, which can run any code the file
    names: call it only on checkpoints you trust. The class of the pickled scheme must be
    importable and have ``name`` and ``state_dict()`` (every :class:`RewardScheme` does).

    Returns:
        The written ``reward.json``.
    """
    folder = Path(checkpoint)
    with open(folder / _LEGACY_REWARD, "rb") as fh:
        scheme = pickle.load(fh)  # noqa: S301 - the caller vouches for this file
    target = folder / _REWARD
    reward = {"scheme": scheme.name, "state": scheme.state_dict()}
    target.write_text(json.dumps(reward) + "\n", encoding="utf-8")
    (folder / _LEGACY_REWARD).unlink()
    return target


def prune_checkpoints(output_dir: str | os.PathLike[str], keep_last: int) -> list[Path]:
    """Delete all but the newest ``keep_last`` checkpoints; return the deleted folders."""
    found = list_checkpoints(output_dir)
    doomed = [path for _, path in found[: max(0, len(found) - keep_last)]]
    for path in doomed:
        shutil.rmtree(path, ignore_errors=True)
    return doomed
