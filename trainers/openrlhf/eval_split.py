"""How the agent tells OpenRLHF's evaluation episodes from its training episodes.

OpenRLHF 0.11.2 runs the ``--eval.dataset`` rows through the same agent executor as the
training rows (``SamplesGenerator.generate_eval_samples``), and the executor's ``execute``
gets no flag that says which is which. The one difference it can see is the sampling
temperature: ``PPOTrainer.fit`` evaluates with ``--eval.temperature`` (default 0.6) where
training samples at ``--rollout.temperature`` (default 1.0). The agent keeps evaluation
episodes out of the experience memory and the minimum tool-call store by that sign, so
the two temperatures must differ when a run has an eval set and either store
(:meth:`EvalSign.check` says so when the run file is loaded); the keeping out itself is
:mod:`searchgym.trainers.eval_stores`.

The temperatures compared are the ones vLLM samples at. vLLM 0.29's
``SamplingParams.__post_init__`` raises any temperature in ``(0, _MAX_TEMP)`` to
``_MAX_TEMP = 1e-2`` (``vllm/sampling_params.py``: ``if 0 < self.temperature < _MAX_TEMP:
... self.temperature = max(self.temperature, _MAX_TEMP)``), and OpenRLHF builds that object
on the driver, so the agent sees ``0.01`` for a configured ``0.005``. A configured
temperature in that range is refused (:func:`vllm_temperature` names the rule); ``0``
stays greedy.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ...envs.config_base import read_yaml
from ...error import InvalidArgumentError
from .flags import flatten

__all__ = [
    "VLLM_MIN_TEMPERATURE",
    "OPENRLHF_EVAL_TEMPERATURE",
    "OPENRLHF_ROLLOUT_TEMPERATURE",
    "EvalSign",
    "vllm_temperature",
]

OPENRLHF_ROLLOUT_TEMPERATURE = 1.0
"""``--rollout.temperature``'s default in openrlhf 0.11.2."""
OPENRLHF_EVAL_TEMPERATURE = 0.6
"""``--eval.temperature``'s default in openrlhf 0.11.2."""
VLLM_MIN_TEMPERATURE = 1e-2
"""vLLM's ``_MAX_TEMP``: the lowest non-zero temperature it samples at."""


def vllm_temperature(temperature: float) -> float:
    """The temperature vLLM samples at when asked for ``temperature`` (0 stays 0, greedy)."""
    return VLLM_MIN_TEMPERATURE if 0 < temperature < VLLM_MIN_TEMPERATURE else temperature


@dataclass(frozen=True)
class EvalSign:
    """The sampling temperatures of training and evaluation episodes in one run.

    Attributes:
        train_temperature: ``--rollout.temperature``.
        eval_temperature: ``--eval.temperature`` when the run has an ``--eval.dataset``,
            else ``None`` (no episode is an evaluation episode).
    """

    train_temperature: float = OPENRLHF_ROLLOUT_TEMPERATURE
    eval_temperature: float | None = None

    @classmethod
    def from_flags(cls, openrlhf: Mapping[str, Any]) -> EvalSign:
        """From a run file's ``openrlhf`` section (nested or dotted keys), with OpenRLHF's defaults."""
        flat = flatten(openrlhf)
        train = flat.get("rollout.temperature", OPENRLHF_ROLLOUT_TEMPERATURE)
        evaluates = bool(flat.get("eval.dataset"))
        evals = flat.get("eval.temperature", OPENRLHF_EVAL_TEMPERATURE)
        used = [("rollout.temperature", train)] + ([("eval.temperature", evals)] if evaluates else [])
        for name, value in used:
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise InvalidArgumentError(f"openrlhf.{name} must be a number, got {value!r}.")
            if value < 0 or 0 < value < VLLM_MIN_TEMPERATURE:
                raise InvalidArgumentError(
                    f"openrlhf.{name} is {value}, which vLLM samples at {vllm_temperature(value)} (it raises any "
                    f"temperature in (0, {VLLM_MIN_TEMPERATURE}) to {VLLM_MIN_TEMPERATURE}, and refuses a negative "
                    f"one): set {name} to 0 (greedy) or to at least {VLLM_MIN_TEMPERATURE}."
                )
        return cls(float(train), float(evals) if evaluates else None)

    @classmethod
    def from_run_file(cls, path: str | os.PathLike[str]) -> EvalSign:
        """From the run file at ``path`` (an agent-only file has no eval set)."""
        section = read_yaml(path).get("openrlhf")
        return cls.from_flags(section if isinstance(section, Mapping) else {})

    @property
    def ambiguous(self) -> bool:
        """Whether the run has an eval set that vLLM samples at the training temperature."""
        return self.eval_temperature is not None and math.isclose(
            vllm_temperature(self.eval_temperature), vllm_temperature(self.train_temperature)
        )

    def check(self, stores: str) -> None:
        """Refuse an eval set whose episodes would look like training to the agent.

        Args:
            stores: What the run writes from its episodes (for the message), e.g.
                ``"the experience memory"``; empty when it writes nothing.

        Raises:
            InvalidArgumentError: ``stores`` is non-empty and :attr:`ambiguous`.
        """
        if stores and self.ambiguous:
            other = (
                0.5
                if math.isclose(vllm_temperature(self.train_temperature), OPENRLHF_EVAL_TEMPERATURE)
                else 0.6
            )
            raise InvalidArgumentError(
                f"openrlhf.eval.temperature and openrlhf.rollout.temperature are both sampled at "
                f"{vllm_temperature(self.train_temperature)}, so the agent cannot tell evaluation episodes from "
                f"training ones and would write them into {stores}: set openrlhf.eval.temperature to another "
                f"value (e.g. {other}), or drop eval.dataset."
            )

    def is_eval(self, sampling_params: Any) -> bool:
        """Whether an episode sampled with ``sampling_params`` is an evaluation episode."""
        if self.eval_temperature is None or self.ambiguous:
            return False
        temperature = getattr(sampling_params, "temperature", None)
        return isinstance(temperature, (int, float)) and math.isclose(
            vllm_temperature(temperature), vllm_temperature(self.eval_temperature)
        )
