"""The Ray worker hook of a searchgym verl run: the patches of :mod:`.advantage` and :mod:`.checkpoints`.

verl's ``RayPPOTrainer`` runs inside the ``TaskRunner`` Ray actor, not in the process that
started the run, so the patches go in through the runtime env's
``worker_process_setup_hook`` (``searchgym.trainers.verl.hook.setup``), which Ray runs in
every worker process. The memory and the stores are opened lazily, on the first
``compute_advantage`` or checkpoint call, so only the trainer's process opens them.
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["HOOK", "setup"]

HOOK = "searchgym.trainers.verl.hook.setup"
"""The value of the runtime env's ``worker_process_setup_hook``."""


class _LazyMemory:
    """The run's experience memory, opened on first use (in the trainer's process only)."""

    def __init__(self, config: Any):
        self.config, self._memory = config, None

    def _open(self) -> Any:
        if self._memory is None:
            from ..env_pool import open_memory

            self._memory = open_memory(self.config.memory, self.config)
        return self._memory

    def __getattr__(self, name: str) -> Any:
        return getattr(self._open(), name)


class _LazyStores(list):
    """The run's stores (:func:`~searchgym.trainers.store_snapshots.run_stores`), found on first use."""

    def __init__(self, config: Any):
        super().__init__()
        self.config, self.found = config, False

    def __iter__(self):  # type: ignore[override]
        if not self.found:
            from ..store_snapshots import run_stores

            self.extend(run_stores(self.config))
            self.found = True
        return super().__iter__()


def setup() -> None:
    """Install the patches for the run file in ``$SEARCHGYM_AGENT_CONFIG`` (nothing without one)."""
    from ..agent_config import AGENT_CONFIG_VARIABLE, load_agent_config
    from ..run_spec import load_run

    path = os.environ.get(AGENT_CONFIG_VARIABLE)
    if not path:
        return
    config = load_agent_config(path)
    from . import advantage, checkpoints

    learns = config.memory is not None and config.memory.learns
    advantage.install(load_run(path).advantage, _LazyMemory(config) if learns else None)
    checkpoints.install(_LazyStores(config))
