"""The line format of the stores; it lives in :mod:`searchgym.envs.storage.jsonl_format`."""

from ..envs.storage.jsonl_format import *  # noqa: F403
from ..envs.storage.jsonl_format import __all__  # noqa: F401
