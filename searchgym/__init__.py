"""searchgym: Gymnasium environments for training frugal LLM search agents.

``import searchgym`` registers the env ids (``searchgym/SyntheticFacts-v1``,
``searchgym/HotpotQA-v1``, ...) with string entry points, so nothing heavy is imported
until ``gym.make``. torch, ray and faiss are never imported here.
"""

__version__ = "0.2.0"

from searchgym import error
from searchgym.envs.metrics import cover_exact_match, exact_match, f1_score, normalize_answer
from searchgym.envs.protocols import PROTOCOLS, Protocol, make_protocol
from searchgym.envs.records import Action, Question, Trajectory, Turn
from searchgym.envs.registration import ENV_IDS, register_envs
from searchgym.envs.rewards import REWARDS, RewardScheme, make_reward, tsas_advantages
from searchgym.envs.search_env import SearchQAEnv
from searchgym.error import (
    DataFileError,
    InvalidArgumentError,
    RetrievalError,
    SearchGymError,
    UnknownNameError,
)
from searchgym.retrieval import Retriever, make_retriever
from searchgym.retrieval.records import Doc

register_envs()

__all__ = [
    "__version__",
    # environments
    "ENV_IDS",
    "SearchQAEnv",
    "register_envs",
    # protocols
    "PROTOCOLS",
    "Protocol",
    "make_protocol",
    # retrieval
    "Retriever",
    "make_retriever",
    # rewards
    "REWARDS",
    "RewardScheme",
    "make_reward",
    "tsas_advantages",
    # metrics
    "normalize_answer",
    "exact_match",
    "f1_score",
    "cover_exact_match",
    # records
    "Action",
    "Doc",
    "Question",
    "Trajectory",
    "Turn",
    # errors
    "error",
    "SearchGymError",
    "UnknownNameError",
    "InvalidArgumentError",
    "DataFileError",
    "RetrievalError",
]
