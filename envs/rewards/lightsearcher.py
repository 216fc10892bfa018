"""LightSearcher's reward: F1 plus an adaptive penalty on searches beyond the best seen so far.

The per-question record of the fewest searches that led to a good answer outlives one
episode, so it lives in :class:`MinToolCallStore`, which several env workers (threads or
processes) can share through an append-only JSON-lines file.
"""

from __future__ import annotations

import json
import math
import os
import threading
from typing import Any

from ..errors import DataFileError, InvalidArgumentError
from ..records import Trajectory
from .base import RewardScheme, check_number

__all__ = ["LightSearcherReward", "MinToolCallStore"]


def _parse_record(line: bytes) -> tuple[str, int] | None:
    """Read one ``{"id": ..., "n": ...}`` line; ``None`` for a blank, torn or corrupt line."""
    try:
        record = json.loads(line)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(record, dict):
        return None
    qid, n = record.get("id"), record.get("n")
    if not isinstance(qid, str) or isinstance(n, bool) or not isinstance(n, int) or n < 0:
        return None
    return qid, n


class MinToolCallStore:
    """Per question id, the fewest searches among trajectories that answered well.

    In memory by default. With ``path``, every lowered minimum is also appended to a
    JSON-lines log, one ``{"id": ..., "n": ...}`` object per line, written with a single
    ``os.write`` on an ``O_APPEND`` descriptor so that several processes can share one file
    without interleaving their lines. Reading the log takes the minimum per id and skips any
    line that does not parse (for example one torn by a crash); it never raises on content.

    The store is thread-safe and picklable (the lock and the descriptor are rebuilt on the
    other side), so a Ray or multiprocessing worker can receive it with its reward scheme.

    Args:
        path: The log file, created (with its folders) on the first write; ``None`` keeps
            the store in memory.
        follow: With ``path``, make :meth:`get` first read what other processes appended
            since the last read, so workers see each other's records. ``False`` reads the
            file only at start-up and on :meth:`refresh`.

    Raises:
        DataFileError: ``path`` names a folder or cannot be read.
    """

    def __init__(self, path: str | os.PathLike[str] | None = None, follow: bool = True) -> None:
        if path is not None and not isinstance(path, (str, os.PathLike)):
            raise InvalidArgumentError(f"path must be a file path or None, got {path!r}.")
        if not isinstance(follow, bool):
            raise InvalidArgumentError(f"follow must be a bool, got {follow!r}.")
        self.path = os.fspath(path) if path is not None else None
        self.follow = follow
        self.skipped_lines = 0
        """How many log lines could not be read (torn or corrupt) so far."""
        self._mins: dict[str, int] = {}
        self._offset = 0  # bytes of the log already read
        self._lock = threading.Lock()
        self._fd: int | None = None
        if self.path is not None:
            if os.path.isdir(self.path):
                raise DataFileError(f"MinToolCallStore path {self.path!r} is a folder; give a file path.")
            self.refresh()

    # -- reading ---------------------------------------------------------------------------

    def _read_new_lines(self, path: str) -> None:
        """Merge complete lines appended since ``_offset``; call with the lock held."""
        try:
            with open(path, "rb") as handle:
                if os.fstat(handle.fileno()).st_size < self._offset:
                    self._offset = 0  # the file was replaced: read it again (merging is idempotent)
                handle.seek(self._offset)
                data = handle.read()
        except FileNotFoundError:
            return
        except OSError as exc:
            raise DataFileError(f"Cannot read MinToolCallStore log {path!r}: {exc}.") from exc
        end = data.rfind(b"\n")
        if end < 0:
            return  # no complete line yet; a partial tail is read once a newline follows it
        for line in data[: end + 1].split(b"\n"):
            if not line.strip():
                continue
            record = _parse_record(line)
            if record is None:
                self.skipped_lines += 1
                continue
            qid, n = record
            if qid not in self._mins or n < self._mins[qid]:
                self._mins[qid] = n
        self._offset += end + 1

    def refresh(self) -> None:
        """Merge the records other processes appended to the log since the last read."""
        if self.path is None:
            return
        with self._lock:
            self._read_new_lines(self.path)

    def get(self, qid: str) -> int | None:
        """The fewest searches recorded for ``qid``, or ``None`` when there is none yet."""
        with self._lock:
            if self.path is not None and self.follow:
                self._read_new_lines(self.path)
            return self._mins.get(qid)

    # -- writing ---------------------------------------------------------------------------

    @staticmethod
    def _open(path: str) -> int:
        """Open the log for appending; end a torn last line so ours starts on a fresh one."""
        folder = os.path.dirname(path)
        if folder:
            os.makedirs(folder, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        size = os.fstat(fd).st_size
        if size:
            with open(path, "rb") as handle:
                handle.seek(size - 1)
                if handle.read(1) != b"\n":
                    os.write(fd, b"\n")
        return fd

    def update(self, qid: str, m: int) -> None:
        """Record that ``qid`` was answered well with ``m`` searches (keeps the minimum)."""
        if not isinstance(qid, str):
            raise InvalidArgumentError(f"qid must be a str (a question id), got {qid!r}.")
        if isinstance(m, bool) or not isinstance(m, int) or m < 0:
            raise InvalidArgumentError(f"m must be a non-negative int (a search count), got {m!r}.")
        with self._lock:
            current = self._mins.get(qid)
            if current is not None and current <= m:
                return
            self._mins[qid] = m
            if self.path is not None:
                if self._fd is None:
                    self._fd = self._open(self.path)
                line = json.dumps({"id": qid, "n": m}) + "\n"
                os.write(self._fd, line.encode("utf-8"))

    def close(self) -> None:
        """Close the log's descriptor (a later update reopens it)."""
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    # -- protocol --------------------------------------------------------------------------

    def __len__(self) -> int:
        with self._lock:
            return len(self._mins)

    def minima(self) -> dict[str, int]:
        """A copy of the fewest searches per question id known so far."""
        with self._lock:
            return dict(self._mins)

    def __getstate__(self) -> dict[str, Any]:
        with self._lock:
            state = self.__dict__.copy()
        del state["_lock"]
        state["_fd"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def __del__(self) -> None:
        fd = getattr(self, "_fd", None)
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass

    def __repr__(self) -> str:
        return f"MinToolCallStore(path={self.path!r}, questions={len(self._mins)})"


class LightSearcherReward(RewardScheme):
    """LightSearcher's reward (PAPERS.md §1, Eq. 16-18).

    Equations, for a trajectory with ``m`` searches and final answer ``y``::

        Format = -1 when some turn is malformed, else 0
        Tool   = exp(-λ · max(0, m - n))   when F1(y) >= θ_t
               = 0                          when F1(y) <  θ_t
        R      = -1                         when Format = -1
               = W_α · F1(y) + W_β · Tool   otherwise

    ``n`` is the fewest searches among earlier trajectories of the same question whose F1
    reached θ_t, kept in a :class:`MinToolCallStore`. When the question has no ``n`` yet,
    ``n = m`` (no penalty). After scoring a well-formed trajectory with F1 >= θ_t, the store
    keeps ``n ← min(n, m)``; a wrong answer never changes it. The reward is therefore not a
    function of one trajectory alone: scoring order within a batch matters, as in the paper.

    Settled here: a malformed trajectory (R = -1) does not update the store, since Eq. 16
    is not evaluated for it. A truncated episode has no answer, so F1 = 0 and Tool = 0.

    Example: m = 3, n = 1, F1 = 1 gives Tool = exp(-0.75·2) ≈ 0.22313 and
    R = 0.5 + 0.5·0.22313 ≈ 0.61157.

    Defaults (paper, Sec. 5.1.4): λ = 0.75, θ_t = 0.8, W_α = W_β = 0.5.

    Args:
        lam: Decay λ >= 0 per search beyond ``n``.
        theta_t: F1 threshold in [0, 1] for a good answer.
        w_alpha: Weight of F1.
        w_beta: Weight of the tool term.
        store: The shared store, a log file path for a file-backed one, or ``None`` for a
            fresh in-memory store. An in-memory store is copied, not shared, when the scheme
            is pickled to another process; give every worker the same path to share ``n``.
    """

    name = "lightsearcher"

    def __init__(
        self,
        lam: float = 0.75,
        theta_t: float = 0.8,
        w_alpha: float = 0.5,
        w_beta: float = 0.5,
        store: MinToolCallStore | str | os.PathLike[str] | None = None,
    ) -> None:
        self.lam = check_number("lam", lam, low=0.0)
        self.theta_t = check_number("theta_t", theta_t, low=0.0, high=1.0)
        self.w_alpha = check_number("w_alpha", w_alpha)
        self.w_beta = check_number("w_beta", w_beta)
        if store is None:
            store = MinToolCallStore()
        elif isinstance(store, (str, os.PathLike)):
            store = MinToolCallStore(path=store)
        elif not isinstance(store, MinToolCallStore):
            raise InvalidArgumentError(
                f"store must be a MinToolCallStore, a log file path, or None, got {store!r}."
            )
        self.store = store

    def tool_score(self, m: int, n: int | None, f1: float) -> float:
        """Eq. 16: ``exp(-λ·max(0, m - n))`` when ``f1 >= θ_t`` (``n = m`` if unknown), else 0."""
        if f1 < self.theta_t:
            return 0.0
        n = m if n is None else n
        return math.exp(-self.lam * max(0, m - n))

    def __call__(self, trajectory: Trajectory) -> float:
        if not trajectory.format_ok:
            return -1.0
        m = trajectory.num_searches
        f1 = trajectory.f1
        qid = trajectory.question.id
        tool = self.tool_score(m, self.store.get(qid), f1)
        if f1 >= self.theta_t:
            self.store.update(qid, m)
        return self.w_alpha * f1 + self.w_beta * tool

    def state_dict(self) -> dict[str, Any]:
        """``{"min_tool_calls": {question id: fewest searches}}``."""
        return {"min_tool_calls": self.store.minima()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Merge saved minima into the store (each question keeps the lower count).

        Raises:
            InvalidArgumentError: ``state`` is not ``{"min_tool_calls": {str: int >= 0}}``.
        """
        mins = state.get("min_tool_calls") if isinstance(state, dict) else None
        if not isinstance(mins, dict) or set(state) != {"min_tool_calls"}:
            raise InvalidArgumentError(
                f'A LightSearcher state is {{"min_tool_calls": {{question id: count}}}}, got {state!r:.200}.'
            )
        for qid, n in mins.items():
            if isinstance(n, bool) or not isinstance(n, int) or n < 0:
                raise InvalidArgumentError(f"min_tool_calls[{qid!r}] must be a non-negative int, got {n!r}.")
        for qid, n in mins.items():
            self.store.update(qid, n)
