"""The agent file for OpenRLHF: pass this file's path to ``--train.agent_func_path``.

OpenRLHF loads it by path and builds ``AgentExecutor()``. The env comes from the YAML file
named by ``$SEARCHGYM_AGENT_CONFIG`` (keys ``env_id`` and ``env_kwargs``, or an ``agent``
section); each training row's ``label`` is the JSON ``{"id", "question", "golden_answers"}``
that ``searchgym prepare`` writes. ``python -m searchgym.trainers.openrlhf --print-agent-path``
prints this file's path.
"""

from searchgym.trainers.openrlhf.agent import SearchGymAgentExecutor as AgentExecutor
from searchgym.trainers.openrlhf.agent import SearchGymAgentInstance as AgentInstance

__all__ = ["AgentExecutor", "AgentInstance"]
