"""The OpenRLHF plugin (target: openrlhf 0.11.2): searchgym envs as multi-turn agents.

- :mod:`.agent`: ``SearchGymAgentInstance`` and ``SearchGymAgentExecutor`` (imports
  openrlhf, torch and transformers, so it is loaded only when asked for);
- ``agent_file.py``: the file for ``--train.agent_func_path``
  (``python -m searchgym.trainers.openrlhf --print-agent-path``);
- :mod:`.advantage_hook`: the Ray worker hook that applies Light-Search's TSAS in the
  trainer actor and steps the experience memory;
- :mod:`.launch`: a run file → an ``openrlhf.cli.train_ppo_ray`` run (``searchgym train
  --backend openrlhf``); :mod:`.flags`: the YAML → dotted flags, checked by OpenRLHF;
- :mod:`.config`: the run file (the agent's sections are
  :mod:`searchgym.trainers.agent_config`, shared with verl, as are the env pool, the
  failures, the memory's steps and the store snapshots in :mod:`searchgym.trainers`).

Nothing here imports openrlhf, torch or ray until it is used.
"""

from __future__ import annotations

from typing import Any

from ...memory.config import MemoryConfig
from ..advantages import AdvantageConfig
from ..agent_config import AGENT_CONFIG_VARIABLE, AgentConfig, load_agent_config
from ..run_spec import LaunchOptions
from .config import RunConfig, load_run_config
from .launch import LaunchPlan, agent_file_path, compose, launch

__all__ = [
    # running
    "launch",
    "compose",
    "LaunchPlan",
    "agent_file_path",
    # configs
    "AGENT_CONFIG_VARIABLE",
    "AgentConfig",
    "MemoryConfig",
    "AdvantageConfig",
    "LaunchOptions",
    "RunConfig",
    "load_agent_config",
    "load_run_config",
    # the agent (imports openrlhf when first used)
    "SearchGymAgentInstance",
    "SearchGymAgentExecutor",
    "EXTRA_LOG_KEYS",
]

_LAZY = {"SearchGymAgentInstance", "SearchGymAgentExecutor", "EXTRA_LOG_KEYS"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from . import agent

        return getattr(agent, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
