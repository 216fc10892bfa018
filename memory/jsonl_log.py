"""One shared append-only log; it lives in :mod:`searchgym.envs.storage.jsonl_log`."""

from ..envs.storage.jsonl_log import *  # noqa: F403
from ..envs.storage.jsonl_log import __all__  # noqa: F401
