"""Append-only JSON-lines logs that many processes share: the format of every searchgym store.

- :mod:`~searchgym.envs.storage.jsonl_format`: records to lines and back, atomic rewrites.
- :mod:`~searchgym.envs.storage.jsonl_log`: :class:`JsonlLog`, one file appended to by many
  processes under ``flock``, with torn-line and corrupt-line handling and repair.

They live beside the envs because both the experience memory's store and LightSearcher's
minimum tool-call store (a reward's state) keep their records in them.
"""

from .jsonl_format import SCHEMA_VERSION, Validator, write_atomically
from .jsonl_log import JsonlLog, RepairReport

__all__ = ["SCHEMA_VERSION", "Validator", "JsonlLog", "RepairReport", "write_atomically"]
