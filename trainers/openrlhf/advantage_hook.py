"""The Ray worker hook: Light-Search's TSAS and the memory's steps inside OpenRLHF's trainer.

Light-Search's two-stage advantage (docs/methods.md#light-search) cannot be written as a reward:
OpenRLHF's ``group_norm`` divides it by the group's std and ``dr_grpo`` subtracts the
group mean again. So the hook wraps
``RemoteExperienceMaker.compute_advantages_and_returns`` in the process that runs it, the
trainer actor. It is installed through Ray's job-level
``runtime_env={"worker_process_setup_hook": HOOK}`` (``launch`` sets it when the config
selects it), so it runs in every worker process of the job, and there it only registers
import hooks: the two OpenRLHF modules are patched when that process imports them, and
nothing is imported or patched in processes that never do (vLLM actors, reward models).

With a run file's ``advantage: {estimator: tsas, ...}`` (an estimator OpenRLHF does not
compute itself) the wrapped method, for each group of ``n_samples_per_prompt`` rollouts of
one prompt:

1. applies OpenRLHF's length penalties to the env's reward, as the original does first;
2. computes ``A_i`` with :func:`~searchgym.trainers.advantages.build_advantage`, the same
   function the built-in trainer uses (TSAS's ``variant``, ``alpha`` and ``warmup_steps``
   included), with R the reward, S the ``num_searches`` and T the ``reasoning_steps`` of
   the agent's ``extra_logs``, at OpenRLHF's ``global_step``;
3. runs the original with ``A_i`` as the reward and the group baseline, the whitening and
   the penalties switched off for that call, so ``A_i`` lands on the last action token and
   every action token's advantage is ``A_i`` (minus the KL penalty, when KL is a reward).

``info["reward"]`` keeps the env's reward for logging; ``info["tsas_advantage"]`` and
``info["tsas_stage"]`` (``{estimator}_advantage``, ``{estimator}_stage``) are added. With a
memory that learns (``memory.kind: lightsearcher``) the
wrapped ``train_step`` publishes each finished step and brings the memory up to it
(:mod:`~searchgym.trainers.memory_sync`), and logs ``memory_updates`` and
``memory_bank_version``.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import itertools
import logging
import os
import sys
import threading
from collections.abc import Callable
from contextlib import contextmanager
from types import ModuleType
from typing import Any

from ...error import SearchGymError
from ..advantages import GroupAdvantage, GroupFigures, build_advantage
from ..agent_config import AGENT_CONFIG_VARIABLE, AgentConfig, load_agent_config
from ..env_pool import open_memory
from ..memory_sync import MemoryStepper
from ..store_snapshots import run_stores
from .checkpoints import wrap_save_checkpoint
from .resume import (
    wrap_init_checkpoint_states,
    wrap_save_best_checkpoint,
    wrap_save_logs_and_checkpoints,
)

__all__ = [
    "HOOK",
    "PASSTHROUGH_ESTIMATOR",
    "check_hook_ran",
    "TSAS_ESTIMATORS",
    "install",
    "needs_hook",
    "setup_worker",
    "hooked_advantages",
    "wrap_compute_advantages",
    "wrap_train_step",
]

logger = logging.getLogger("searchgym.trainers.openrlhf")

HOOK = "searchgym.trainers.openrlhf.advantage_hook.setup_worker"
"""The ``worker_process_setup_hook`` value (a module path Ray imports in every worker)."""

PASSTHROUGH_ESTIMATOR = "searchgym_passthrough"
"""Set as ``args.algo.advantage.estimator`` during the wrapped call: a name OpenRLHF
matches with no baseline and no whitening, so the shaped reward passes through."""

TSAS_ESTIMATORS = ("group_norm", "dr_grpo", "reinforce_baseline", "rloo")
"""OpenRLHF estimators TSAS may run under: their per-token path is the cumulative return,
and OpenRLHF checks they have ``n_samples_per_prompt > 1``."""

_EXPERIENCE_MAKER = "openrlhf.trainer.ppo_utils.experience_maker"
_TRAINER = "openrlhf.trainer.ppo_trainer"
_ACTOR = "openrlhf.trainer.ray.ppo_actor"
_WRAPPED = "__searchgym_wrapped__"


class _State:
    """What the hook knows in this process."""

    def __init__(self) -> None:
        self.config: AgentConfig | None = None
        self.step: int | None = None
        self.calls = 0
        self.stepper: Any = None
        self.lock = threading.Lock()


_STATE = _State()


def needs_hook(config: AgentConfig) -> bool:
    """Whether ``config`` needs the trainer-side hook: an advantage OpenRLHF does not compute
    (TSAS), or a store that training writes (a memory that learns, a reward's shared store),
    which follows the checkpoints."""
    return config.advantage is not None or bool(run_stores(config))


def setup_worker() -> None:
    """Ray's ``worker_process_setup_hook``: read ``$SEARCHGYM_AGENT_CONFIG`` and :func:`install`.

    In every run it also makes the trainer ranks rotate ``ckpt.save_hf``'s copies with the
    checkpoints (:mod:`~searchgym.trainers.openrlhf.checkpoints`).
    """
    path = os.environ.get(AGENT_CONFIG_VARIABLE)
    if not path:
        return
    _after_import(_ACTOR, _patch_actor)
    config = load_agent_config(path)
    if needs_hook(config):
        install(config)


def _in_ray_worker() -> bool:
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return False
    return ray.get_runtime_context().worker.mode == ray.WORKER_MODE


def check_hook_ran() -> None:
    """Raise when this Ray worker's run needs the hook and Ray did not run it here.

    The agent file calls this as OpenRLHF loads it in each vLLM actor. The hook is a
    job-level runtime env setting, so it runs in every worker of the job or in none: when it
    did not run in this actor, it did not run in the trainer actor either, and TSAS and the
    memory would silently switch off.

    Raises:
        SearchGymError: the config needs the hook and it is missing (the message says what to add).
    """
    path = os.environ.get(AGENT_CONFIG_VARIABLE)
    if not path or _STATE.config is not None or not _in_ray_worker():
        return
    config = load_agent_config(path)
    if needs_hook(config):
        wanted = (
            f"the {config.advantage.estimator} advantage"
            if config.advantage is not None
            else "the stores of this run"
        )
        raise SearchGymError(
            f"{path} selects {wanted}, which runs in OpenRLHF's trainer actor through a Ray worker hook, and "
            f'this Ray job has none: add "worker_process_setup_hook": "{HOOK}" to the job\'s runtime env '
            "next to its env_vars. The supported way is `searchgym train --backend openrlhf --config FILE` "
            "(`--dry-run` prints the command with its runtime env)."
        )


def install(config: AgentConfig) -> None:
    """Patch OpenRLHF's trainer modules for ``config`` now if imported, else when imported."""
    _STATE.config = config
    _after_import(_EXPERIENCE_MAKER, _patch_experience_maker)
    _after_import(_TRAINER, _patch_trainer)


# -- lazy patching --------------------------------------------------------------------------------


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, loader: importlib.abc.Loader, patch: Callable[[ModuleType], None]):
        self._loader, self._patch = loader, patch

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        self._patch(module)


class _PatchingFinder(importlib.abc.MetaPathFinder):
    """Finds the target modules with the other finders and patches them once executed."""

    def __init__(self) -> None:
        self.patches: dict[str, Callable[[ModuleType], None]] = {}

    def find_spec(
        self, fullname: str, path: Any, target: Any = None
    ) -> importlib.machinery.ModuleSpec | None:
        patch = self.patches.get(fullname)
        if patch is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _PatchingLoader(spec.loader, patch)
                return spec
        return None


_FINDER = _PatchingFinder()


def _after_import(name: str, patch: Callable[[ModuleType], None]) -> None:
    module = sys.modules.get(name)
    if module is not None:
        patch(module)
        return
    _FINDER.patches[name] = patch
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)


def _patch_experience_maker(module: ModuleType) -> None:
    cls = module.RemoteExperienceMaker
    if not getattr(cls.compute_advantages_and_returns, _WRAPPED, False):
        cls.compute_advantages_and_returns = wrap_compute_advantages(cls.compute_advantages_and_returns)


def _patch_trainer(module: ModuleType) -> None:
    cls = module.BasePPOTrainer
    if not getattr(cls.train_step, _WRAPPED, False):
        cls.train_step = wrap_train_step(cls.train_step)
    for name, wrap in (
        ("init_checkpoint_states", wrap_init_checkpoint_states),
        ("save_logs_and_checkpoints", wrap_save_logs_and_checkpoints),
        ("save_best_checkpoint", wrap_save_best_checkpoint),
    ):
        method = getattr(cls, name)
        if not getattr(method, _WRAPPED, False):
            wrapped = wrap(method, lambda: _STATE.config)
            setattr(wrapped, _WRAPPED, True)
            setattr(cls, name, wrapped)


def _patch_actor(module: ModuleType) -> None:
    cls = module.PolicyModelActor
    if not getattr(cls.save_checkpoint, _WRAPPED, False):
        wrapped = wrap_save_checkpoint(cls.save_checkpoint)
        setattr(wrapped, _WRAPPED, True)
        cls.save_checkpoint = wrapped


# -- TSAS -------------------------------------------------------------------------------------


def _per_sample(experiences: list[Any], key: str) -> Any:
    import torch

    try:
        return torch.cat([e.info[key].reshape(-1).double() for e in experiences])
    except KeyError:
        raise SearchGymError(
            f"The hooked advantage needs the extra_logs key {key!r} on every sample, and a sample has none: run "
            "OpenRLHF with the searchgym agent (--train.agent_func_path from `python -m "
            "searchgym.trainers.openrlhf --print-agent-path`)."
        ) from None


_FIGURES = {"searches": "num_searches", "reasoning": "reasoning_steps"}
"""The agent's ``extra_logs`` key of each figure an estimator may read."""


def hooked_advantages(
    experiences: list[Any], n_samples_per_prompt: int, advantage: GroupAdvantage, step: int
) -> list[Any]:
    """The group advantages of OpenRLHF experiences under ``advantage``, one tensor per experience.

    Groups are formed exactly as OpenRLHF forms them: the samples in the order of their
    ``index`` (the rollout order), ``n_samples_per_prompt`` consecutive samples per prompt.
    R is ``experience.rewards``, S is ``info["num_searches"]``, T is ``info["reasoning_steps"]``
    (read only when the estimator uses them).
    """
    import torch

    lengths = [len(e.index) for e in experiences]
    indices = torch.tensor(list(itertools.chain.from_iterable(e.index for e in experiences)))
    uses = advantage.config.spec.uses
    columns = []
    for values in (
        torch.cat([e.rewards.reshape(-1).double() for e in experiences]),
        *(_per_sample(experiences, _FIGURES[name]) for name in uses),
    ):
        ordered = torch.empty_like(values)
        ordered[indices] = values
        columns.append(ordered.reshape(-1, n_samples_per_prompt))
    groups = []
    for row in zip(*columns, strict=True):
        figures = GroupFigures(
            row[0].tolist(), **{name: col.tolist() for name, col in zip(uses, row[1:], strict=True)}
        )
        groups.append(advantage(figures, step))
    shaped = torch.tensor(groups, dtype=torch.float64)
    return [
        chunk.to(e.rewards.dtype)
        for chunk, e in zip(shaped.reshape(-1)[indices].split(lengths), experiences, strict=True)
    ]


@contextmanager
def _passthrough(args: Any):
    """Switch off the group baseline, the whitening and the length penalties for one call."""
    saved = (
        args.algo.advantage.estimator,
        args.reward.overlong_buffer_len,
        args.reward.stop_properly_penalty_coef,
    )
    args.algo.advantage.estimator = PASSTHROUGH_ESTIMATOR
    args.reward.overlong_buffer_len = None
    args.reward.stop_properly_penalty_coef = None
    try:
        yield
    finally:
        (
            args.algo.advantage.estimator,
            args.reward.overlong_buffer_len,
            args.reward.stop_properly_penalty_coef,
        ) = saved


def wrap_compute_advantages(original: Callable[..., Any], state: _State = _STATE) -> Callable[..., Any]:
    """``compute_advantages_and_returns`` with the hooked advantage applied first (see the module docstring)."""

    @functools.wraps(original)
    def compute_advantages_and_returns(self: Any, experiences: list[Any]) -> list[Any]:
        config = state.config
        if config is None or config.advantage is None:
            return original(self, experiences)
        import torch
        from openrlhf.trainer.ppo_utils.length_penalty import apply_length_penalties

        args = self.strategy.args
        advantage = build_advantage(config.advantage)
        name = config.advantage.estimator
        if self.advantage_estimator not in TSAS_ESTIMATORS:
            raise SearchGymError(
                f"The {name} advantage runs under --algo.advantage.estimator in {TSAS_ESTIMATORS}, got "
                f"{self.advantage_estimator!r} (it replaces that estimator's group baseline)."
            )
        with state.lock:
            step = state.step if state.step is not None else state.calls
            state.calls += 1
        stage = advantage.stage(step)
        for e in experiences:
            e.rewards = e.rewards.to(torch.promote_types(e.rewards.dtype, torch.float32))
        apply_length_penalties(experiences, args)
        raw = [e.rewards.clone() for e in experiences]
        shaped = hooked_advantages(experiences, args.rollout.n_samples_per_prompt, advantage, step)
        for e, a in zip(experiences, shaped, strict=True):
            e.rewards = a
            e.info[f"{name}_advantage"] = a.clone()
            if stage is not None:
                e.info[f"{name}_stage"] = torch.full_like(a, float(stage))
        with _passthrough(args):
            out = original(self, experiences)
        for e, r in zip(out, raw, strict=True):
            e.info["reward"] = r
        return out

    setattr(compute_advantages_and_returns, _WRAPPED, True)
    return compute_advantages_and_returns


# -- training steps ------------------------------------------------------------------------------


def _stepper(config: AgentConfig, state: _State) -> Any:
    if config.memory is None or not config.memory.learns:
        return None
    if state.stepper is None:
        state.stepper = MemoryStepper(open_memory(config.memory, config))
    return state.stepper


def wrap_train_step(original: Callable[..., Any], state: _State = _STATE) -> Callable[..., Any]:
    """``train_step`` that records the step for TSAS, then publishes it and steps the memory."""

    @functools.wraps(original)
    def train_step(self: Any, rollout_samples: Any, global_step: int) -> Any:
        with state.lock:
            state.step = int(global_step)
        status, next_step = original(self, rollout_samples, global_step)
        config = state.config
        stepper = None if config is None else _stepper(config, state)
        if stepper is not None and config is not None and config.memory is not None:
            results = stepper.publish_and_follow(config.memory.path, int(next_step))
            status["memory_updates"] = float(sum(r.outcome == "written" for r in results))
            status["memory_bank_version"] = float(stepper.memory.experience.version)
        return status, next_step

    setattr(train_step, _WRAPPED, True)
    return train_step
