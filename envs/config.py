"""The ``env`` section of a run file: which env a run builds, with which options, typed.

Each field is a keyword argument of ``gym.make`` for the env id; a field left out (``null``)
is not passed, so the env's own default applies (its docstring's Arguments). Which fields an
env takes is read from its constructor: :class:`EnvConfig` refuses a field the env does not
take, a reward parameter the scheme lacks, and an unknown protocol or scheme, each with
"did you mean"::

    env:
      id: searchgym/MuSiQue-v1
      protocol: tool_call
      reward: lightsearcher
      reward_kwargs: {lam: 0.75, store: runs/min_tool_calls.sqlite}
      retriever: http://127.0.0.1:8000
      topk: 3
      max_turns: 6
      data_path: data/musique_train.jsonl

``gym.make(config.id, **config.kwargs())`` builds the env the section describes.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, fields
from typing import Any

from ..error import InvalidArgumentError, UnknownNameError, did_you_mean
from .config_base import ConfigError, check

__all__ = ["EnvConfig", "env_keywords"]


def env_keywords(env_id: str) -> dict[str, inspect.Parameter] | None:
    """The keyword arguments ``gym.make(env_id, ...)`` passes on to the env's constructor
    (``None`` when it takes ``**kwargs``), without those the registration fixes."""
    import gymnasium as gym

    from . import registration

    registration.register_envs()
    spec = gym.spec(env_id)
    creator = spec.entry_point
    if isinstance(creator, str):
        module, _, name = creator.partition(":")
        creator = getattr(__import__(module, fromlist=[name]), name)
    parameters = inspect.signature(creator).parameters  # type: ignore[arg-type]
    if any(p.kind is p.VAR_KEYWORD for p in parameters.values()):
        return None
    kinds = (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return {
        name: p
        for name, p in parameters.items()
        if p.kind in kinds and name not in (spec.kwargs or {}) and name not in ("self", "render_mode")
    }


@dataclass
class EnvConfig:
    """The env every rollout of the run plays (the ``env`` section).

    Attributes:
        id: A registered searchgym env id (``searchgym/SyntheticFacts-v1``,
            ``searchgym/HotpotQA-v1``, …; the short ``HotpotQA-v1`` works).
        protocol: The action protocol (``search_r1``, ``tool_call``, ``research``, ``sem``);
            null: the env's default (``search_r1``).
        reward: A registered reward scheme (``f1``, ``em``, ``lightsearcher``, ``otc``,
            ``sem``, ``cost``); null: the env's default (``f1``). Every env of a run shares
            one instance of the scheme.
        reward_kwargs: The scheme's parameters (its docstring's Args; docs/config.md lists
            them); a parameter the scheme does not take is an error.
        retriever: A retriever backend (``bm25``, ``dense``, ``simulated``, …) or a retrieval
            server's URL (``http://host:8000``); null: the env's default (``bm25``).
        retriever_kwargs: Options of the retriever backend (e.g. ``{noise_prob: 0.3}``).
        topk: Documents returned per search.
        max_turns: Turns (actions) per episode before it is truncated.
        max_searches: Searches allowed per episode (null: no limit beyond ``max_turns``).
        instructions: Text that replaces the protocol's instructions in the prompt.
        data_path: Benchmark envs: the questions file (JSONL); null: the pulled sample.
        corpus_path: Benchmark envs: the passage corpus (JSONL) a local retriever indexes.
        index_dir: Benchmark envs: a folder where the retriever's index is built once and reused.
        world_seed: SyntheticFacts: seed of the generated world.
        world_kwargs: SyntheticFacts: options of the world generator (sizes, ``known_fraction``, …).
        split: SyntheticFacts: ``all``, ``train`` or ``eval`` (a seeded partition of the questions).
        eval_fraction: SyntheticFacts: the eval part's share of the questions.
        split_by: SyntheticFacts: hold questions out by ``question`` or by ``fact``.
    """

    id: str = "searchgym/SyntheticFacts-v1"
    protocol: str | None = None
    reward: str | None = None
    reward_kwargs: dict[str, Any] | None = None
    retriever: str | None = None
    retriever_kwargs: dict[str, Any] | None = None
    topk: int | None = None
    max_turns: int | None = None
    max_searches: int | None = None
    instructions: str | None = None
    data_path: str | None = None
    corpus_path: str | None = None
    index_dir: str | None = None
    world_seed: int | None = None
    world_kwargs: dict[str, Any] | None = None
    split: str | None = None
    eval_fraction: float | None = None
    split_by: str | None = None

    def __post_init__(self) -> None:
        from .protocols import PROTOCOLS
        from .registration import check_env_id
        from .rewards import check_reward_kwargs

        try:
            self.id = check_env_id(self.id)
        except UnknownNameError as exc:
            raise ConfigError("id", self.id, "a registered searchgym env id", str(exc)) from None
        keywords = env_keywords(self.id)
        for name, value in self.kwargs().items():
            if keywords is not None and name not in keywords:
                allowed = ", ".join(f.name for f in fields(self) if f.name in keywords)
                raise ConfigError(name, value, f"null: {self.id} does not take it (it takes: {allowed})")
        if self.protocol is not None and self.protocol not in PROTOCOLS:
            raise ConfigError(
                "protocol",
                self.protocol,
                "a registered protocol",
                str(did_you_mean("protocol", self.protocol, PROTOCOLS)),
            )
        for name in ("topk", "max_turns"):
            value = getattr(self, name)
            if value is not None:
                check(name, value, value >= 1, "an int >= 1")
        if self.max_searches is not None:
            check("max_searches", self.max_searches, self.max_searches >= 0, "an int >= 0 or null")
        from .rewards import reward_class

        try:
            reward_class(self.reward_name)
        except UnknownNameError as exc:
            raise ConfigError("reward", self.reward, "a registered reward scheme", str(exc)) from None
        try:
            check_reward_kwargs(self.reward_name, self.reward_kwargs or {})
        except (InvalidArgumentError, UnknownNameError) as exc:
            raise ConfigError(
                "reward_kwargs", self.reward_kwargs, "the scheme's parameters", str(exc)
            ) from None

    def kwargs(self) -> dict[str, Any]:
        """The keyword arguments of ``gym.make(self.id, ...)``: every field that is set."""
        return {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if f.name != "id" and getattr(self, f.name) is not None
        }

    @classmethod
    def from_kwargs(cls, env_id: str, kwargs: dict[str, Any]) -> EnvConfig:
        """The section for ``gym.make(env_id, **kwargs)`` (plain values only).

        Raises:
            ConfigError: a keyword that is not a field (with "did you mean"), or a bad value.
        """
        from .config_base import from_dict

        return from_dict(cls, {"id": env_id, **kwargs})

    def _default(self, name: str) -> Any:
        keywords = env_keywords(self.id) or {}
        parameter = keywords.get(name)
        return None if parameter is None else parameter.default

    @property
    def reward_name(self) -> str:
        """The reward scheme's name: ``reward``, else the env's default."""
        return str(self.reward if self.reward is not None else self._default("reward"))

    @property
    def protocol_name(self) -> str:
        """The protocol's name: ``protocol``, else the env's default."""
        return str(self.protocol if self.protocol is not None else self._default("protocol"))

    @property
    def reward_class(self) -> type:
        """The registered class of the run's reward scheme."""
        from .rewards import reward_class

        return reward_class(self.reward_name)

    @property
    def turns(self) -> int:
        """Turns per episode: ``max_turns``, else the env's default."""
        return int(self.max_turns if self.max_turns is not None else self._default("max_turns"))
