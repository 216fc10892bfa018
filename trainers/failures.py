"""Samples that fail: one sample's exception becomes a failed episode, not a dead run.

A Ray backend runs many samples at once and waits on all of them (OpenRLHF 0.11.2's vLLM
actor with ``asyncio.gather`` in ``RolloutRayActor.generate_responses``; verl's
``AgentLoopWorker`` likewise), so an exception in one sample's ``reset`` or ``step`` (a
label that is not JSON, a store call that times out, a bug in a reward scheme) would end
the rollout and the run. The agent catches it and ends that sample as a *failed episode*
instead:

- one log line on the backend's logger (WARNING; ``searchgym.trainers.openrlhf``,
  ``searchgym.trainers.verl``) with the error and the label;
- ``failed = 1`` in the sample's numbers (OpenRLHF's ``extra_logs``, whose batch mean it
  logs as ``train/failed``; verl's ``extra_fields``);
- the reward of an episode whose only turn is malformed, as the env's reward scheme
  scores it (:func:`failure_reward`: LightSearcher -1, EM/F1 0, a scheme's
  ``format_penalty`` when it has one).

A dead retrieval server needs none of this: the env reports it in the observation and
the episode goes on. Only what a sample cannot recover from lands here; errors of the
run's configuration (an env that cannot be built, an ambiguous evaluation set) still stop
the run at the first rollout. So does a run in which every sample fails:
:class:`FailureCounter` raises :class:`SampleFailuresError` after
:data:`MAX_FAILURES_IN_A_ROW` failed samples in a row in one process and backend.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from ..envs.records import Action, Question, Trajectory, Turn
from ..error import SearchGymError

__all__ = [
    "MAX_FAILURES_IN_A_ROW",
    "FailureCounter",
    "SampleFailuresError",
    "failure_counter",
    "failure_reward",
]

logger = logging.getLogger("searchgym.trainers")

MAX_FAILURES_IN_A_ROW = 256
"""Failed samples in a row, with no episode finished between them, that stop the run."""

_UNKNOWN_QUESTION = Question(id="unknown", question="", golden_answers=("",))


class SampleFailuresError(SearchGymError):
    """Every sample fails: the cause is the run's, not one sample's."""


def failure_reward(env: Any, question: Question | None, why: str) -> float:
    """The reward of a failed sample: ``env``'s scheme on a trajectory with one malformed turn.

    Args:
        env: The sample's env (its ``unwrapped.reward_scheme`` and ``protocol`` are read),
            or None when there is none.
        question: The sample's question, or None when its label could not be read.
        why: The error, kept as the turn's error message.

    Returns:
        The scheme's value, or 0.0 without an env or when the scheme itself fails.
    """
    base = getattr(env, "unwrapped", None)
    scheme = getattr(base, "reward_scheme", None)
    if scheme is None:
        return 0.0
    protocol = getattr(getattr(base, "protocol", None), "name", "unknown")
    turn = Turn(action_text="", action=Action(kind="invalid", format_ok=False, error=why))
    trajectory = Trajectory(question or _UNKNOWN_QUESTION, protocol, [turn], truncated=True)
    try:
        return float(scheme(trajectory))
    except Exception as exc:  # noqa: BLE001 - the scheme failing is one more reason, not a crash
        logger.warning("The reward scheme failed on a failed sample too (%s); its reward is 0.", exc)
        return 0.0


class FailureCounter:
    """Failed samples of one process, and how many came in a row (thread-safe).

    Args:
        limit: Failures in a row after which :meth:`failed` raises.
        logger_name: The logger of the failure lines (the backend's).
    """

    def __init__(self, limit: int = MAX_FAILURES_IN_A_ROW, logger_name: str = "searchgym.trainers"):
        self.limit = limit
        self.logger = logging.getLogger(logger_name)
        self.total = 0
        """Failed samples so far."""
        self.in_a_row = 0
        """Failed samples since the last finished episode."""
        self._lock = threading.Lock()

    def failed(self, where: str, exc: BaseException, label: object, reward: float) -> None:
        """Log one failed sample and count it.

        Raises:
            SampleFailuresError: :attr:`limit` samples in a row have failed.
        """
        with self._lock:
            self.total += 1
            self.in_a_row += 1
            in_a_row = self.in_a_row
        self.logger.warning(
            "searchgym: a sample failed in %s and is recorded as a failed episode (reward %s): %s: %s "
            "[label %.200r]",
            where,
            reward,
            type(exc).__name__,
            exc,
            label,
        )
        if in_a_row >= self.limit:
            raise SampleFailuresError(
                f"{in_a_row} samples in a row failed in this process, none finished; the last in "
                f"{where}: {type(exc).__name__}: {exc}. The cause is not one sample's: fix it (the log "
                f"lines 'searchgym: a sample failed' show each error and label) and start again."
            ) from exc

    def finished(self) -> None:
        """An episode finished: the failures in a row start again from 0."""
        with self._lock:
            self.in_a_row = 0


_COUNTERS: dict[str, FailureCounter] = {}
_COUNTERS_LOCK = threading.Lock()


def failure_counter(backend: str) -> FailureCounter:
    """The process-wide :class:`FailureCounter` of ``backend`` (``openrlhf``, ``verl``), which
    logs on ``searchgym.trainers.<backend>``."""
    with _COUNTERS_LOCK:
        counter = _COUNTERS.get(backend)
        if counter is None:
            counter = _COUNTERS[backend] = FailureCounter(logger_name=f"searchgym.trainers.{backend}")
        return counter
