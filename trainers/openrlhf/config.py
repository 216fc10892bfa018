"""The OpenRLHF plugin's view of a run file: the launch's (the agent's is :mod:`searchgym.trainers.agent_config`).

A run file with ``backend: openrlhf`` (:mod:`searchgym.trainers.run_spec`; the shipped ones
are in ``configs/openrlhf/``) serves both sides of a run: :func:`load_run_config` reads it
for ``launch``, and every agent instance on the Ray workers reads its component sections
with :func:`~searchgym.trainers.agent_config.load_agent_config`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Literal

from ...envs.config_base import ConfigError, check
from ...error import InvalidArgumentError
from ..agent_config import AgentConfig
from ..eval_stores import stores_written
from ..run_spec import LaunchOptions, RunSpec, load_run
from .eval_split import EvalSign

__all__ = ["RunConfig", "load_run_config"]


@dataclass
class RunConfig:
    """A whole OpenRLHF run file: the agent, the launch options and the OpenRLHF flags.

    Attributes:
        backend: Always ``openrlhf`` here; lets ``searchgym train`` pick the backend.
        agent: See :class:`AgentConfig`.
        launch: See :class:`LaunchOptions`.
        openrlhf: The ``openrlhf`` section as written: nested keys, turned into dotted
            flags by ``flags``.
        path: The file read (absolute); set by :func:`load_run_config`, not a key of the file.
    """

    agent: AgentConfig
    backend: Literal["openrlhf"] = "openrlhf"
    launch: LaunchOptions = field(default_factory=LaunchOptions)
    openrlhf: dict[str, Any] = field(default_factory=dict)
    path: str = field(default="", init=False)

    @classmethod
    def from_spec(cls, spec: RunSpec, basedir: str | None = None) -> RunConfig:
        """The OpenRLHF view of the run file ``spec`` (``backend: openrlhf``)."""
        check(
            "backend",
            spec.backend,
            spec.backend == "openrlhf",
            "'openrlhf'",
            "A built-in trainer config goes to searchgym train --backend builtin.",
        )
        config = cls(
            agent=AgentConfig.from_spec(spec, basedir),
            launch=spec.launch_options(),
            openrlhf=spec.openrlhf_flags(),
        )
        config.path = spec.path
        return config


def load_run_config(path: str | os.PathLike[str], basedir: str | None = None) -> RunConfig:
    """Read and validate a whole run file (see the module docstring).

    Raises:
        DataFileError: the file cannot be read.
        ConfigError: an unknown key (with "did you mean"), a missing ``agent`` section, or a
            value of the wrong type or range; the message names the file and the dotted field.
        InvalidArgumentError: a sampling temperature vLLM would change, or evaluation
            episodes the agent could not tell from training ones
            (:class:`~searchgym.trainers.openrlhf.eval_split.EvalSign`).
    """
    spec = load_run(path)
    try:
        config = RunConfig.from_spec(spec, basedir)
    except ConfigError as exc:
        raise exc.within(source=str(path)) from None
    try:
        EvalSign.from_flags(config.openrlhf).check(stores_written(config.agent))
    except InvalidArgumentError as exc:
        raise InvalidArgumentError(f"{path}: {exc}") from None
    return config
