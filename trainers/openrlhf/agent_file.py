"""The agent file for OpenRLHF: pass this file's path to ``--train.agent_func_path``.

OpenRLHF loads it by path and builds ``AgentExecutor()``. The env comes from the YAML file
named by ``$SEARCHGYM_AGENT_CONFIG`` (keys ``env_id`` and ``env_kwargs``, or an ``agent``
section); each training row's ``label`` is the JSON ``{"id", "question", "golden_answers"}``
that ``searchgym prepare`` writes. ``python -m searchgym.trainers.openrlhf --print-agent-path``
prints this file's path.
"""

from searchgym.trainers.openrlhf.advantage_hook import check_hook_ran

check_hook_ran()  # a config that needs the trainer's hook fails here when the Ray job lacks it

from searchgym.trainers.openrlhf.agent import SearchGymAgentExecutor as AgentExecutor  # noqa: E402
from searchgym.trainers.openrlhf.agent import SearchGymAgentInstance as AgentInstance  # noqa: E402

__all__ = ["AgentExecutor", "AgentInstance"]
