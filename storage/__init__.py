"""The stores' storage: append-only logs of records in SQLite databases that many processes share.

- :mod:`~searchgym.storage.sqlite_log`: :class:`SqliteLog`, one log in one database
  file (WAL mode), with snapshots for resume, corrupt-record handling and repair.
- :mod:`~searchgym.storage.records`: records to JSON text and back, with a format version.
- :mod:`~searchgym.storage.legacy`: the one-time import of an old JSON-lines store.
- :mod:`~searchgym.storage.recovery`: rebuilding a damaged database from what is
  readable, so that a crash leaves the old file or the new one.
- :mod:`~searchgym.storage.salvage`: the rows of a damaged database and its WAL, read
  page by page.
- :mod:`~searchgym.storage.acked`: the highest acknowledged id, kept outside the database.
- :mod:`~searchgym.storage.diagnose`: one-line errors that name the cause.
- :mod:`~searchgym.storage.atomic`: :func:`write_atomically`, for whole-file documents.

A package of its own below the envs and the memory, because both use it: the experience
memory's store and LightSearcher's minimum tool-call store (a reward's state, in the envs)
keep their records in it. It imports nothing of searchgym but :mod:`searchgym.error`.
"""

from .atomic import write_atomically
from .records import SCHEMA_VERSION, Validator
from .sqlite_log import RepairReport, SqliteLog

__all__ = ["SCHEMA_VERSION", "Validator", "SqliteLog", "RepairReport", "write_atomically"]
