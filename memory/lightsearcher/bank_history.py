"""The versions of LightSearcher's experience bank: who wrote each one from what.

Every update that writes a bank adds a version (LightSearcher's Figure 6 shows how the
guidance evolves). :class:`BankHistory` keeps the versions an
:class:`~searchgym.memory.ExperienceMemory` knows, read incrementally from its store's
``bank.sqlite`` (shared by every process that opens the store) or kept in this process.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any

from ...error import DataFileError, InvalidArgumentError
from ..store import MemoryStore
from .bank import ExperienceBank

__all__ = ["BankRecord", "BankHistory", "read_bank_history"]


@dataclass(frozen=True)
class BankRecord:
    """One stored version of the bank, with who wrote it from what."""

    bank: ExperienceBank
    good: int
    bad: int
    summarizer: str
    window: tuple[int, int]
    time: float


def _bank_record_from(record: dict[str, Any], where: str) -> BankRecord:
    try:
        bank = ExperienceBank.from_dict(
            {**record["bank"], "step": record["step"], "version": record["version"]}
        )
        window = record["window"]
        if not (isinstance(window, list) and len(window) == 2 and all(isinstance(w, int) for w in window)):
            raise InvalidArgumentError(f"'window' must be [start, end], got {window!r}")
        return BankRecord(
            bank=bank,
            good=int(record["good"]),
            bad=int(record["bad"]),
            summarizer=str(record["summarizer"]),
            window=(window[0], window[1]),
            time=float(record["time"]),
        )
    except (KeyError, TypeError, ValueError) as exc:
        detail = f"missing field {exc}" if isinstance(exc, KeyError) else str(exc)
        raise DataFileError(
            f"{where}: not a bank record ({detail}). Run `searchgym memory repair` on the store to rewrite "
            "the file keeping every readable record."
        ) from None


def read_bank_history(store: MemoryStore) -> list[BankRecord]:
    """Every bank version in ``store``, oldest first."""
    return BankHistory(store).records()


class BankHistory:
    """The bank versions known so far, oldest first, kept up to date with ``store``.

    Args:
        store: The store whose ``bank.sqlite`` holds the versions; ``None`` keeps them in
            this process.
    """

    def __init__(self, store: MemoryStore | None):
        self._store = store
        self._records: list[BankRecord] = []
        self._last = 0  # id of the last record read
        self._generation: int | None = None

    def _sync(self) -> None:
        """Read the versions appended to the store since the last read."""
        if self._store is None:
            return
        log = self._store.log("bank")
        generation = log.generation()
        if generation != self._generation:  # records were cut or moved out: read from the start
            self._records, self._last, self._generation = [], 0, generation
        records, self._last = log.read(self._last)
        for record in records:
            where = f"{log.path}, version {len(self._records) + 1}"
            self._records.append(_bank_record_from(record, where))

    def records(self) -> list[BankRecord]:
        """Every version, oldest first (a copy)."""
        self._sync()
        return list(self._records)

    def current(self) -> ExperienceBank:
        """The latest version; an empty bank before the first."""
        self._sync()
        return self._records[-1].bank if self._records else ExperienceBank()

    def write(
        self,
        bank: ExperienceBank,
        *,
        step: int,
        good: int,
        bad: int,
        summarizer: str,
        window: tuple[int, int],
    ) -> ExperienceBank:
        """Add ``bank`` as the next version; returns it with its ``step`` and ``version``.

        With a store, the version number is taken in the append's transaction, so two processes
        never write the same one.
        """
        now = time.time()
        if self._store is None:
            record = BankRecord(
                bank=replace(bank, step=step, version=len(self._records) + 1),
                good=good,
                bad=bad,
                summarizer=summarizer,
                window=window,
                time=now,
            )
            self._records.append(record)
            return record.bank
        body = {
            "step": step,
            "good": good,
            "bad": bad,
            "summarizer": summarizer,
            "window": list(window),
            "time": now,
            "bank": {name: list(getattr(bank, name)) for name, _ in ExperienceBank.GROUPS},
        }

        def build(existing: list[dict[str, Any]]) -> dict[str, Any]:
            version = int(existing[-1].get("version", len(existing))) + 1 if existing else 1
            return {"version": version, **body}

        written = self._store.log("bank").append_after(build)
        assert written is not None  # build never returns None
        self._sync()
        return _bank_record_from(written, "written record").bank
