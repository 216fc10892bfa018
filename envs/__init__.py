"""Environments, protocols, reward schemes and question data.

The retrievers the envs search with live in :mod:`searchgym.retrieval`; the error family in
:mod:`searchgym.error`.
"""

from ..error import DataFileError, InvalidArgumentError, RetrievalError, SearchGymError, UnknownNameError
from ..retrieval.records import Doc
from .group_env import GROUP_SCHEMES, group_parallel_env
from .records import Action, Question, Trajectory, Turn
from .registration import BENCHMARKS, ENV_IDS, check_env_id, register_envs

__all__ = [
    # errors
    "SearchGymError",
    "UnknownNameError",
    "InvalidArgumentError",
    "DataFileError",
    "RetrievalError",
    # records
    "Action",
    "Doc",
    "Question",
    "Trajectory",
    "Turn",
    # PettingZoo group env
    "GROUP_SCHEMES",
    "group_parallel_env",
    # registration
    "BENCHMARKS",
    "ENV_IDS",
    "check_env_id",
    "register_envs",
]
