"""LightSearcher's contrastive experience memory (docs/methods.md#lightsearcher-memory, Sec. 4.2 and 4.4 of the paper).

Finished trajectories go in with :meth:`ExperienceMemory.add`. Every ``update_every``
calls of :meth:`ExperienceMemory.step` (a training step, as the trainer counts them) the
memory takes the trajectories added since the previous update, splits them into Good
(reward ≥ ``good_reward``, the maximum R = 1 of LightSearcher's reward) and Bad (reward <
``theta_r`` = 0.3), summarises each, asks the summariser to contrast the groups, and
stores the result as a new version of the experience bank. Trajectories with reward ≥
``theta_r`` also form the few-shot pool, from which one example per episode is drawn.

With ``path`` everything lives in a store folder (:mod:`searchgym.memory.store`) that
several processes can open at once: rollout workers ``add`` and read the bank and the
pool, the trainer calls ``step``. Without ``path`` the memory lives in this process only.
"""

from __future__ import annotations

import logging
import math
import os
import random
import threading
import time
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from ...checks import check_int, check_number
from ...envs.records import Trajectory
from ...error import InvalidArgumentError
from ..store import MemoryStore
from .bank import (
    ExperienceBank,
    Summarizer,
    SummarizerError,
    check_bank,
    summarise_trajectory,
    summarizer_name,
)
from .bank_history import BankHistory, BankRecord
from .summarizers import make_summarizer
from .trajectory_feed import TrajectoryFeed

__all__ = ["ExperienceMemory", "UpdateResult"]

logger = logging.getLogger("searchgym.memory")

_EPS = 1e-9  # R = 1 is computed as 0.5·F1 + 0.5·exp(0); allow for rounding of a stored float


@dataclass(frozen=True)
class UpdateResult:
    """What one update did."""

    step: int
    outcome: Literal["written", "skipped", "failed"]
    reason: str
    good: int
    bad: int
    window: tuple[int, int]
    """Trajectory numbers ``[start, end)`` the update looked at (0-based, in store order)."""
    bank: ExperienceBank | None = None
    """The bank written (``outcome == "written"``), else ``None``."""


class ExperienceMemory:
    """LightSearcher's experience bank and few-shot pool (see the module docstring).

    Args:
        path: A store folder shared by every process that opens it; ``None`` keeps the
            memory in this process (a pickled copy is a copy, not shared).
        update_every: Training steps between updates (paper: 5).
        summarizer: ``"rule"`` (default), ``"transformers:PATH"``, ``"openai:MODEL@URL"``
            or a :class:`~searchgym.memory.lightsearcher.bank.Summarizer`.
        theta_r: Bad is reward < ``theta_r``; the few-shot pool is reward ≥ ``theta_r``
            (paper: 0.3).
        good_reward: Good is reward ≥ ``good_reward`` (paper: R = 1, its maximum).
        max_pool: The few-shot pool keeps the latest ``max_pool`` trajectories (``None``:
            all of them).
        seed: Seed of the generator :meth:`sample_few_shot` uses when given no ``rng``.
        summarize_timeout: Seconds an update waits for the summariser before giving up
            (``None``: no limit). The abandoned call keeps running in a daemon thread.
        fsync: Sync every append to disk (with ``path``).

    Raises:
        InvalidArgumentError: a bad argument (the message shows it).
        DataFileError: the store holds a record of a newer searchgym. A corrupt line is
            skipped and logged instead.
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        update_every: int = 5,
        summarizer: str | Summarizer = "rule",
        theta_r: float = 0.3,
        good_reward: float = 1.0,
        max_pool: int | None = 10_000,
        seed: int | None = None,
        *,
        summarize_timeout: float | None = None,
        fsync: bool = False,
    ):
        self.update_every = check_int("update_every", update_every, 1)
        self.theta_r = check_number("theta_r", theta_r)
        self.good_reward = check_number("good_reward", good_reward)
        self.max_pool = check_int("max_pool", max_pool, 1, optional=True)
        if summarize_timeout is not None:
            check_number("summarize_timeout", summarize_timeout)
        self.summarize_timeout = summarize_timeout
        self.summarizer = make_summarizer(summarizer)
        self._steps = 0
        self.last_update: UpdateResult | None = None
        self._rng = np.random.default_rng(seed)
        self._lock = threading.RLock()
        self._store = MemoryStore(path, fsync=fsync) if path is not None else None
        cursor = 0  # number of the first trajectory of the next update's window
        if self._store is not None:
            self._steps, cursor = self._read_counts(self._store)
        self._trajectories = TrajectoryFeed(self._store, self.theta_r, self.max_pool, cursor)
        self._banks = BankHistory(self._store)
        self._banks.records()  # read the store now, so that a corrupt one fails here

    @staticmethod
    def _read_counts(store: MemoryStore) -> tuple[int, int]:
        """``(steps counted, first trajectory of the next window)`` as the store holds them.

        The count is the last record of the ``steps`` log. An update record written after it
        (a process that died between an update and its count) or a store without that log
        gives the step of the last update instead.
        """
        updates = store.log("updates").read()[0]
        last = updates[-1] if updates else {}
        steps, cursor = int(last.get("step", 0)), int(last.get("window", [0, 0])[1])
        if os.path.exists(store.path_of("steps")):
            count = store.log("steps").last()
            if count is not None and store.log("updates").count() <= count["updates"]:
                steps = int(count["step"])
        return steps, cursor

    @property
    def steps(self) -> int:
        """Training steps counted by :meth:`step`.

        With a store, every change is written to its ``steps`` log before the call that made
        it returns, so a process that opens the store later (a restarted store actor) counts
        on from the same step. Setting it (a resumed run's step) updates nothing.
        """
        return self._steps

    @steps.setter
    def steps(self, value: int) -> None:
        value = check_int("steps", value, 0)
        with self._lock:
            if value != self._steps:
                self._steps = value
                self._save_steps()

    def _save_steps(self) -> None:
        if self._store is not None:
            self._store.log("steps").append(
                {"step": self._steps, "updates": self._store.log("updates").count(), "time": time.time()}
            )

    @property
    def path(self) -> str | None:
        """The store folder, or ``None`` for a memory kept in this process."""
        return None if self._store is None else str(self._store.root)

    # -- trajectories ----------------------------------------------------------------------------

    def add(self, trajectory: Trajectory, key: str | None = None) -> bool:
        """Store one finished trajectory (its ``reward`` must be set).

        ``key`` is stored with it in the store: a later add with the same key is dropped (a
        retried call is stored once). Returns whether the trajectory was stored.

        Raises:
            InvalidArgumentError: not a :class:`Trajectory`, or no reward yet.
            DataFileError: the store cannot be written.
        """
        if not isinstance(trajectory, Trajectory):
            raise InvalidArgumentError(
                f"add() takes a searchgym Trajectory, got {type(trajectory).__name__}: pass "
                "env.unwrapped.trajectory once the episode has ended."
            )
        if trajectory.reward is None:
            raise InvalidArgumentError(
                f"The trajectory of question {trajectory.question.id!r} has no reward yet: add it after "
                "the episode ends (terminated or truncated)."
            )
        if not math.isfinite(trajectory.reward):
            raise InvalidArgumentError(f"The trajectory's reward must be finite, got {trajectory.reward!r}.")
        if self._store is None:
            with self._lock:
                return self._trajectories.add(trajectory)
        # appending to the store is safe without the lock (and must not wait for an update)
        return self._trajectories.add(trajectory, key)

    def __len__(self) -> int:
        """Trajectories stored (by every process sharing the store)."""
        with self._lock:
            self._trajectories.sync()
            return self._trajectories.count

    @property
    def pool_size(self) -> int:
        """Trajectories in the few-shot pool (reward ≥ ``theta_r``)."""
        with self._lock:
            self._trajectories.sync()
            return len(self._trajectories.pool)

    def sample_few_shot(self, rng: np.random.Generator | random.Random | None = None) -> Trajectory | None:
        """One trajectory drawn uniformly from the pool (reward ≥ ``theta_r``), or ``None``.

        Args:
            rng: A numpy ``Generator`` or a ``random.Random``; ``None`` uses the memory's
                own generator (``seed``).
        """
        with self._lock:
            self._trajectories.sync()
            pool = self._trajectories.pool
            if not pool:
                return None
            n = len(pool)
            if rng is None:
                rng = self._rng
            if isinstance(rng, np.random.Generator):
                index = int(rng.integers(n))
            elif isinstance(rng, random.Random):
                index = rng.randrange(n)
            else:
                raise InvalidArgumentError(
                    f"rng must be a numpy Generator, a random.Random or None, got {type(rng).__name__}."
                )
            return pool[index]

    def pool_item(self, fraction: float) -> Trajectory | None:
        """The pool's trajectory at ``floor(fraction · pool size)``, or ``None`` for an empty pool.

        ``fraction`` in [0, 1): a uniform draw gives a uniform example (how a remote caller
        draws one with its own generator).
        """
        if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 <= fraction < 1:
            raise InvalidArgumentError(f"fraction must be a number in [0, 1), got {fraction!r}.")
        with self._lock:
            self._trajectories.sync()
            pool = self._trajectories.pool
            return pool[min(int(fraction * len(pool)), len(pool) - 1)] if pool else None

    # -- the bank ------------------------------------------------------------------------------

    @property
    def experience(self) -> ExperienceBank:
        """The current bank (the latest version in the store); empty before the first update."""
        with self._lock:
            return self._banks.current()

    def history(self) -> list[ExperienceBank]:
        """Every version of the bank, oldest first (LightSearcher's Figure 6)."""
        return [r.bank for r in self.history_records()]

    def history_records(self) -> list[BankRecord]:
        """Every version with its group sizes, summariser and window."""
        with self._lock:
            return self._banks.records()

    def step_hints(self, query: str) -> str:
        """Hints to add after a search for ``query``: none for LightSearcher's memory."""
        return ""

    # -- updates -------------------------------------------------------------------------------

    def step(self) -> UpdateResult | None:
        """Count one training step; every ``update_every`` steps run :meth:`update`.

        Returns:
            The update's result on an update step, else ``None``.
        """
        with self._lock:
            self._steps += 1
            result = self.update() if self._steps % self.update_every == 0 else None
            self._save_steps()
            return result

    def step_to(self, step: int) -> list[UpdateResult]:
        """Count training steps until ``step`` (nothing when the count is there already).

        As many calls of :meth:`step`, with the count written once at the end (and with
        every update on the way).

        Returns:
            The results of the updates made, oldest first.
        """
        step = check_int("step", step, 0)
        results: list[UpdateResult] = []
        with self._lock:
            if self._steps >= step:
                return results
            while self._steps < step:
                self._steps += 1
                if self._steps % self.update_every == 0:
                    results.append(self.update())
            self._save_steps()
        return results

    def _summarize(
        self, good: list[Trajectory], bad: list[Trajectory], previous: ExperienceBank | None
    ) -> Any:
        good_s = [summarise_trajectory(t) for t in good]
        bad_s = [summarise_trajectory(t) for t in bad]
        if self.summarize_timeout is None:
            return self.summarizer.summarize(good_s, bad_s, previous)
        box: dict[str, Any] = {}

        def run() -> None:
            try:
                box["bank"] = self.summarizer.summarize(good_s, bad_s, previous)
            except BaseException as exc:  # noqa: BLE001 - handed back to the caller
                box["error"] = exc

        worker = threading.Thread(target=run, name="searchgym-summarizer", daemon=True)
        worker.start()
        worker.join(self.summarize_timeout)
        if worker.is_alive():
            raise SummarizerError(f"no bank within {self.summarize_timeout:g} s")
        if "error" in box:
            raise box["error"]
        return box["bank"]

    def update(self) -> UpdateResult:
        """Contrast Good against Bad among the trajectories added since the last update.

        Skips (with an info log line) when either group is empty. A summariser that raises,
        times out or returns an empty or malformed bank leaves the current bank in place
        (with a warning). Either way the window is consumed: the next update looks only at
        newer trajectories.
        """
        with self._lock:
            window, span = self._trajectories.take_window()
            good = [t for t in window if t.reward is not None and t.reward >= self.good_reward - _EPS]
            bad = [t for t in window if t.reward is not None and t.reward < self.theta_r]
            if not good or not bad:
                missing = [
                    f"no Good trajectory (reward >= {self.good_reward:g})" if not good else "",
                    f"no Bad trajectory (reward < {self.theta_r:g})" if not bad else "",
                ]
                reason = (
                    f"{' and '.join(m for m in missing if m)} among the {len(window)} added since the last "
                    "update; the bank is unchanged"
                )
                logger.info("Experience update at step %d skipped: %s.", self.steps, reason)
                return self._finish(UpdateResult(self.steps, "skipped", reason, len(good), len(bad), span))
            previous = self.experience
            try:
                bank = self._summarize(good, bad, previous if len(previous) else None)
                problem = check_bank(bank)
            except Exception as exc:  # noqa: BLE001 - any summariser failure keeps the bank
                problem = f"the summariser {summarizer_name(self.summarizer)!r} failed: {exc}"
            if problem is not None:
                logger.warning(
                    "Experience update at step %d failed, the bank stays at version %d: %s.",
                    self.steps,
                    previous.version,
                    problem,
                )
                return self._finish(UpdateResult(self.steps, "failed", problem, len(good), len(bad), span))
            written = self._banks.write(
                bank,
                step=self.steps,
                good=len(good),
                bad=len(bad),
                summarizer=summarizer_name(self.summarizer),
                window=span,
            )
            logger.info(
                "Experience update at step %d wrote version %d (%d Good, %d Bad trajectories, %d items).",
                self.steps,
                written.version,
                len(good),
                len(bad),
                len(written),
            )
            return self._finish(
                UpdateResult(
                    self.steps,
                    "written",
                    f"version {written.version}",
                    len(good),
                    len(bad),
                    span,
                    bank=written,
                )
            )

    def _finish(self, result: UpdateResult) -> UpdateResult:
        self.last_update = result
        if self._store is not None:
            self._store.log("updates").append(
                {
                    "step": result.step,
                    "outcome": result.outcome,
                    "reason": result.reason,
                    "good": result.good,
                    "bad": result.bad,
                    "window": list(result.window),
                    "version": None if result.bank is None else result.bank.version,
                    "summarizer": summarizer_name(self.summarizer),
                    "time": time.time(),
                }
            )
        return result

    # -- protocol ------------------------------------------------------------------------------

    def close(self) -> None:
        """Close the store's database connections (reopened when needed)."""
        if self._store is not None:
            self._store.close()

    def __enter__(self) -> ExperienceMemory:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        del state["_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.RLock()

    def __repr__(self) -> str:
        where = f"path={self.path!r}" if self.path else "in memory"
        return f"ExperienceMemory({where}, update_every={self.update_every}, summarizer={summarizer_name(self.summarizer)!r})"
