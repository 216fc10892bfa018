"""A PettingZoo parallel env whose agents are the G rollouts of one question (a GRPO group).

``group_parallel_env("searchgym/SyntheticFacts-v1", group_size=5, group_scheme="tsas")``
returns a :class:`GroupParallelEnv`. Each ``reset`` draws one question and resets G
ordinary searchgym envs (``gym.make(env_id, **env_kwargs)``, sharing one retriever) to it;
each ``step`` steps every running rollout, with all their searches sent to the retriever in
one batched call; when the last rollout finishes, a group-level scheme turns the G
per-trajectory rewards into the rewards of that final step.

pettingzoo is imported only when an env is built (``pip install 'searchgym[group]'``), so
importing this module, or ``searchgym``, stays light. :class:`GroupParallelEnv` is created
on first use as a subclass of ``pettingzoo.ParallelEnv``.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.utils import seeding

from ..checks import check_int
from ..error import InvalidArgumentError, SearchGymError, did_you_mean
from ..retrieval import search_with_cache
from ..retrieval.records import Doc
from .records import Question
from .registration import check_env_id
from .rewards import TSAS_VARIANTS, check_number, otc_grpo_tool_rewards, tsas_advantages, tsas_stage
from .rewards.outcome import check_outcome
from .search_env import SearchQAEnv

__all__ = ["GROUP_SCHEMES", "group_parallel_env"]  # and GroupParallelEnv, built on first use

GROUP_SCHEMES: dict[str, dict[str, object]] = {
    "tsas": {"stage": None, "warmup_steps": 150, "alpha": 0.01, "variant": "eq4"},
    "otc": {"c": 1.0, "outcome": "em", "threshold": 1.0},
    "mean_baseline": {},
}
"""Group schemes by name, with their ``scheme_kwargs`` and defaults (``None`` is a scheme too)."""

_OPTION_KEYS = ("index", "question", "golden_answers", "id")
_MAKE_WRAPPER_KWARGS = ("max_episode_steps", "autoreset", "apply_api_compatibility")


def _check_scheme(scheme: object, scheme_kwargs: object) -> tuple[str | None, dict[str, Any]]:
    """Validate the scheme name and its keyword arguments; return them with defaults filled in."""
    if scheme is not None and not isinstance(scheme, str):
        raise InvalidArgumentError(
            f"group_scheme must be None or one of {', '.join(map(repr, GROUP_SCHEMES))}, got {scheme!r}."
        )
    if scheme is not None and scheme not in GROUP_SCHEMES:
        raise did_you_mean("group scheme", scheme, GROUP_SCHEMES)
    if scheme_kwargs is not None and not isinstance(scheme_kwargs, Mapping):
        raise InvalidArgumentError(f"scheme_kwargs must be a dict or None, got {scheme_kwargs!r:.80}.")
    given = dict(scheme_kwargs or {})
    defaults = GROUP_SCHEMES.get(scheme, {}) if scheme is not None else {}
    unknown = sorted(set(given) - set(defaults))
    if unknown:
        accepted = ", ".join(defaults) if defaults else "no scheme_kwargs"
        raise InvalidArgumentError(
            f"group_scheme={scheme!r} does not accept scheme_kwargs {unknown}; it accepts: {accepted}."
        )
    params = {**defaults, **given}
    if scheme == "tsas":
        if params["stage"] is not None and "warmup_steps" in given:
            raise InvalidArgumentError(
                f"Give tsas either stage={params['stage']!r} (fixed) or warmup_steps={given['warmup_steps']!r} "
                "(switch from stage 1 to 2 after that many groups), not both."
            )
        stage = params["stage"]
        if stage is not None and (isinstance(stage, bool) or stage not in (1, 2)):
            raise InvalidArgumentError(f"scheme_kwargs['stage'] must be 1, 2 or None, got {stage!r}.")
        tsas_stage(0, params["warmup_steps"])  # raises on a bad warmup_steps
        params["alpha"] = check_number("scheme_kwargs['alpha']", params["alpha"])
        if params["variant"] not in TSAS_VARIANTS:
            raise InvalidArgumentError(
                f"scheme_kwargs['variant'] must be one of {', '.join(TSAS_VARIANTS)}, got {params['variant']!r}."
            )
    elif scheme == "otc":
        params["c"] = check_number("scheme_kwargs['c']", params["c"], low=0.0)
        if params["c"] == 0.0:
            raise InvalidArgumentError("scheme_kwargs['c'] must be > 0, got 0.")
        params["outcome"] = check_outcome(params["outcome"])
        params["threshold"] = check_number(
            "scheme_kwargs['threshold']", params["threshold"], low=0.0, high=1.0
        )
    return scheme, params


def _make_envs(env_id: object, group_size: int, env_kwargs: dict[str, Any]) -> list[gym.Env]:
    for key in _MAKE_WRAPPER_KWARGS:
        if key in env_kwargs:
            raise InvalidArgumentError(
                f"{key}={env_kwargs[key]!r} is not supported by the group env: it adds a wrapper that the "
                "group's batched step would bypass. Limit episodes with max_turns= (and max_searches=) instead."
            )
    if not isinstance(env_id, str) or env_id not in gym.registry:
        env_id = check_env_id(env_id)  # maps "SyntheticFacts-v1" to its full id, or lists close matches
    envs = [gym.make(env_id, **env_kwargs) for _ in range(group_size)]
    for env in envs:
        if not isinstance(env.unwrapped, SearchQAEnv):
            raise InvalidArgumentError(
                f"env_id {env_id!r} makes a {type(env.unwrapped).__name__}; the group env needs a searchgym "
                "SearchQAEnv (any id of searchgym.ENV_IDS, or your own SearchQAEnv subclass)."
            )
    return envs


def _retrieve(
    envs: Sequence[SearchQAEnv], searches: list[tuple[int, str]]
) -> dict[int, tuple[list[Doc], str | None]]:
    """Run the group's searches in one ``search`` call per (retriever, topk); errors become messages."""
    batches: dict[tuple[int, int], list[tuple[int, str]]] = {}
    for i, query in searches:
        batches.setdefault((id(envs[i].retriever), envs[i].topk), []).append((i, query))
    results: dict[int, tuple[list[Doc], str | None]] = {}
    for items in batches.values():
        env = envs[items[0][0]]
        error: str | None = None
        found: Sequence[Sequence[Doc]] = []
        try:
            found = search_with_cache(env.retriever, [query for _, query in items], env.topk)
        except SearchGymError as exc:  # the single env's contract: an error observation, not a raise
            error = str(exc)
        if error is None and (not isinstance(found, (list, tuple)) or len(found) != len(items)):
            error = f"The retriever {type(env.retriever).__name__} answered a batch of {len(items)} queries wrongly."
        for n, (i, _) in enumerate(items):
            results[i] = ([], error) if error is not None else (list(found[n]), None)
    return results


class _GroupCore:
    """G rollouts of one question as a PettingZoo ``ParallelEnv`` (agents ``rollout_0`` …).

    ## Description
    ``reset`` draws one question (from the seeded generator, exactly as a single env's
    ``reset(seed=...)`` would draw it, or the one ``options`` names) and resets the G
    sub-envs to it with ``options={"index": i}``. ``step`` steps every rollout still
    running; the searches of all of them go to the shared retriever in one batched call.

    ## Action Space / Observation Space
    Those of the sub-env (``AnyText``): one string per agent. Observations are the new
    text of each step, as in the single env (the prompt at ``reset``).

    ## Rewards
    0 while the group runs. When the last rollout finishes, the group scheme maps the G
    per-trajectory rewards ``r_i`` (each sub-env's scheme, ``reward=``) onto the rewards of
    that step, for every agent:

    * ``"tsas"``: ``tsas_advantages(r, searches, reasoning_steps, stage, alpha)``
      (Light-Search; use ``reward="f1"`` as the paper). ``scheme_kwargs``: ``stage`` (1 or
      2, fixed), or ``warmup_steps`` (default 150): stage 1 while ``group_step <
      warmup_steps``, where ``group_step`` counts resets (0 for the first group); assign
      ``env.group_step`` to follow a trainer's own step count instead. ``alpha`` (0.01).
      ``variant``: ``"eq4"`` (Eq. 4 as printed, default) or ``"eq2"`` (the Eq. 2-faithful
      stage 2, which charges searches to successful rollouts only; docs/methods.md#light-search-readings).
    * ``"otc"``: ``s_i × otc_grpo_tool_rewards(searches, s >= threshold, c)[i]`` with
      ``s_i`` the rollout's EM (``outcome="em"``, default) or F1; ``threshold`` (1.0)
      decides correctness and ``c`` (1.0) is OTC's smoothing constant. A baseline.
    * ``"mean_baseline"``: ``r_i − mean_j r_j``.
    * ``None``: ``r_i`` itself.

    ## Episode End
    A rollout that answers (or runs out of turns) *waits*: it stays in ``agents`` with
    ``terminated`` and ``truncated`` False, its ``info["finished"]`` is True, its actions are
    ignored (they may be left out) and its observation is ``""``. This is how its group
    reward reaches it: PettingZoo drops an agent from ``agents`` in the step that reports it
    done, so it could receive nothing later. On the step where the last rollout finishes,
    every agent gets its group reward and its own sub-env's ``terminated``/``truncated``,
    and ``agents`` becomes empty.

    ## Info
    Each sub-env's info (for a waiting agent, the one of its last step) plus ``finished``;
    once a rollout has finished, ``group_reward_raw`` (its per-trajectory reward ``r_i``);
    on the final step, ``group_reward`` (the value in ``rewards``) and, under tsas,
    ``tsas_stage``.

    ## Arguments
    See :func:`group_parallel_env`.
    """

    metadata = {"name": "searchgym_group_v0", "render_modes": ["ansi"], "is_parallelizable": True}

    def __init__(
        self,
        envs: Sequence[gym.Env],
        *,
        group_scheme: str | None = None,
        scheme_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        self.group_scheme, self.scheme_kwargs = _check_scheme(group_scheme, scheme_kwargs)
        self.envs = list(envs)
        self._units: list[SearchQAEnv] = [env.unwrapped for env in self.envs]  # type: ignore[misc]
        self.possible_agents = [f"rollout_{i}" for i in range(len(self.envs))]
        self._index = {agent: i for i, agent in enumerate(self.possible_agents)}
        self.agents: list[str] = []
        self.observation_spaces = {
            a: env.observation_space for a, env in zip(self.possible_agents, self.envs, strict=True)
        }
        self.action_spaces = {
            a: env.action_space for a, env in zip(self.possible_agents, self.envs, strict=True)
        }
        self.render_mode = self._units[0].render_mode
        self.group_step = -1
        """Index of the current group: ``reset`` adds 1 (0 for the first); tsas's stage counts it."""
        self._np_random: np.random.Generator | None = None
        self._finished: list[bool] = []
        self._flags: list[tuple[bool, bool]] = []
        self._raw: list[float] = []
        self._last_infos: list[dict[str, Any]] = []

    # -- PettingZoo API ----------------------------------------------------------------------

    def observation_space(self, agent: str) -> gym.Space:
        return self.observation_spaces[self.possible_agents[self._agent_index(agent)]]

    def action_space(self, agent: str) -> gym.Space:
        return self.action_spaces[self.possible_agents[self._agent_index(agent)]]

    def reset(
        self, seed: int | None = None, options: Mapping[str, Any] | None = None
    ) -> tuple[dict[str, str], dict[str, dict[str, Any]]]:
        """Start a new group: every rollout gets the same question.

        Args:
            seed: Seeds the question draw (as a single env's ``reset(seed=...)``); sub-env
                ``i`` is reset with ``seed + i``.
            options: ``None`` (draw a question), ``{"index": i}``, or ``{"question": ...,
                "golden_answers": [...], "id": ...}``, given to every sub-env. Other keys are
                ignored with a warning.
        """
        chosen = self._question_options(options)
        seeds = [None if seed is None else int(seed) + i for i in range(len(self.envs))]
        results = []
        if chosen is not None:  # validated by the first sub-env before anything else changes
            results.append(self.envs[0].reset(seed=seeds[0], options=chosen))
        if seed is not None or self._np_random is None:
            self._np_random, _ = seeding.np_random(seed)
        if chosen is None:
            chosen = {"index": int(self._np_random.integers(len(self._units[0].questions)))}
        for env, env_seed in zip(self.envs[len(results) :], seeds[len(results) :], strict=True):
            results.append(env.reset(seed=env_seed, options=chosen))
        self.group_step += 1
        self.agents = list(self.possible_agents)
        n = len(self.envs)
        self._finished, self._flags, self._raw = [False] * n, [(False, False)] * n, [0.0] * n
        self._last_infos = [{**info, "finished": False} for _, info in results]
        observations = {agent: obs for agent, (obs, _) in zip(self.possible_agents, results, strict=True)}
        return observations, {
            agent: dict(info) for agent, info in zip(self.possible_agents, self._last_infos, strict=True)
        }

    def step(
        self, actions: Mapping[str, object]
    ) -> tuple[dict[str, str], dict[str, float], dict[str, bool], dict[str, bool], dict[str, dict[str, Any]]]:
        """Step every running rollout with its action; waiting rollouts ignore theirs."""
        running = self._check_actions(actions)
        searches = []
        for i in running:
            query = self._units[i].begin_step(actions[self.possible_agents[i]])
            if query is not None:
                searches.append((i, query))
        results = _retrieve(self._units, searches)
        observations = dict.fromkeys(self.agents, "")
        for i in running:
            obs, reward, terminated, truncated, info = self._units[i].end_step(*results.get(i, ([], None)))
            observations[self.possible_agents[i]] = obs
            info["finished"] = terminated or truncated
            if info["finished"]:
                self._finished[i], self._flags[i], self._raw[i] = True, (terminated, truncated), reward
                info["group_reward_raw"] = reward
            self._last_infos[i] = info
        infos = {agent: dict(self._last_infos[self._index[agent]]) for agent in self.agents}
        if not all(self._finished):
            zeros = dict.fromkeys(self.agents, False)
            return observations, dict.fromkeys(self.agents, 0.0), zeros, dict(zeros), infos
        values, extra = self._group_rewards()
        rewards, terminations, truncations = {}, {}, {}
        for i, agent in enumerate(self.possible_agents):
            rewards[agent] = values[i]
            terminations[agent], truncations[agent] = self._flags[i]
            infos[agent].update(group_reward=values[i], **extra)
        self.agents = []
        return observations, rewards, terminations, truncations, infos

    def render(self) -> str | None:
        """With ``render_mode="ansi"``: every rollout's transcript under a header."""
        if self.render_mode != "ansi":
            return None
        return "\n".join(
            f"=== {agent} ===\n{env.render()}"
            for agent, env in zip(self.possible_agents, self.envs, strict=True)
        )

    def close(self) -> None:
        for env in self.envs:
            env.close()

    @property
    def question(self) -> Question | None:
        """The current group's :class:`~searchgym.Question` (None before the first reset)."""
        trajectory = self._units[0].trajectory
        return None if trajectory is None else trajectory.question

    # -- Helpers -----------------------------------------------------------------------------

    def _agent_index(self, agent: object) -> int:
        if agent not in self._index:
            raise did_you_mean("agent", agent, self.possible_agents)
        return self._index[agent]  # type: ignore[index]

    def _question_options(self, options: object) -> dict[str, Any] | None:
        if options is None:
            return None
        if not isinstance(options, Mapping):
            raise InvalidArgumentError(f"options must be a dict or None, got {type(options).__name__}.")
        unknown = sorted(set(options) - set(_OPTION_KEYS))
        if unknown:
            warnings.warn(
                f"The group env ignores reset options {unknown}; it reads only {', '.join(_OPTION_KEYS)}.",
                stacklevel=3,
            )
        chosen = {key: options[key] for key in _OPTION_KEYS if key in options}
        return chosen or None

    def _check_actions(self, actions: object) -> list[int]:
        """The running rollouts, after checking ``actions`` (nothing has changed if this raises)."""
        if not self.agents:
            raise SearchGymError("The group is over (or has not started): call reset() before step().")
        if not isinstance(actions, Mapping):
            raise InvalidArgumentError(
                f"actions must be a dict of agent name -> action string, got {type(actions).__name__}: {actions!r:.80}."
            )
        for agent in actions:
            if agent not in self._index:
                raise did_you_mean("agent", agent, self.possible_agents)
        running = [i for i in range(len(self.envs)) if not self._finished[i]]
        missing = [self.possible_agents[i] for i in running if self.possible_agents[i] not in actions]
        if missing:
            raise InvalidArgumentError(
                f"actions has no action for the running agents {missing}; every agent whose info['finished'] "
                "is False must act (waiting agents may be left out)."
            )
        return running

    def _group_rewards(self) -> tuple[list[float], dict[str, Any]]:
        infos, params = self._last_infos, self.scheme_kwargs
        if self.group_scheme == "tsas":
            stage = params["stage"] or tsas_stage(self.group_step, params["warmup_steps"])
            searches = [info["num_searches"] for info in infos]
            reasoning = [info["reasoning_steps"] for info in infos]
            shaped = tsas_advantages(
                self._raw, searches, reasoning, stage, params["alpha"], params["variant"]
            )
            return shaped, {"tsas_stage": stage}
        if self.group_scheme == "otc":
            scores = [float(info[params["outcome"]]) for info in infos]
            correct = [score >= params["threshold"] for score in scores]
            tool = otc_grpo_tool_rewards([info["num_searches"] for info in infos], correct, params["c"])
            return [score * r for score, r in zip(scores, tool, strict=True)], {}
        if self.group_scheme == "mean_baseline":
            mean = math.fsum(self._raw) / len(self._raw)
            return [r - mean for r in self._raw], {}
        return list(self._raw), {}


_ENV_CLASS: type | None = None


def _env_class() -> type:
    """``GroupParallelEnv``: :class:`_GroupCore` under ``pettingzoo.ParallelEnv``, built once."""
    global _ENV_CLASS
    if _ENV_CLASS is None:
        try:
            from pettingzoo.utils.env import ParallelEnv
        except ImportError as exc:
            raise SearchGymError(
                "The group env needs PettingZoo: pip install 'searchgym[group]' (or pip install pettingzoo)."
            ) from exc
        namespace = {
            "__module__": __name__,
            "__qualname__": "GroupParallelEnv",
            "__doc__": _GroupCore.__doc__,
        }
        _ENV_CLASS = type("GroupParallelEnv", (_GroupCore, ParallelEnv), namespace)
    return _ENV_CLASS


def __getattr__(name: str) -> Any:
    if name == "GroupParallelEnv":  # built on first use, so that importing this module needs no pettingzoo
        return _env_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def group_parallel_env(
    env_id: str,
    group_size: int = 5,
    group_scheme: str | None = None,
    scheme_kwargs: Mapping[str, Any] | None = None,
    **env_kwargs: Any,
) -> Any:
    """A PettingZoo ``ParallelEnv`` whose ``group_size`` agents roll out the same question.

    >>> env = group_parallel_env("searchgym/SyntheticFacts-v1", group_size=4, group_scheme="tsas",
    ...                          scheme_kwargs={"warmup_steps": 150}, reward="f1")
    >>> observations, infos = env.reset(seed=0)
    >>> sorted(observations)
    ['rollout_0', 'rollout_1', 'rollout_2', 'rollout_3']

    Args:
        env_id: A searchgym env id (``"searchgym/HotpotQA-v1"``, or the short
            ``"HotpotQA-v1"``), or any registered id of a :class:`SearchQAEnv` subclass.
        group_size: G, the rollouts per question (>= 1; Light-Search uses 5).
        group_scheme: ``"tsas"``, ``"otc"``, ``"mean_baseline"`` or ``None``; see
            :class:`GroupParallelEnv` for what each computes.
        scheme_kwargs: The scheme's parameters (``GROUP_SCHEMES`` lists them with defaults).
        **env_kwargs: Given to ``gym.make(env_id, ...)`` for every sub-env (protocol, reward,
            retriever, data paths, …); the sub-envs share one retriever.

    Returns:
        A ``GroupParallelEnv`` (a ``pettingzoo.ParallelEnv``).

    Raises:
        InvalidArgumentError: A bad group size, scheme keyword or env keyword.
        UnknownNameError: An unknown env id or scheme name (the message lists close matches).
        SearchGymError: PettingZoo is not installed.
    """
    size = check_int("group_size", group_size, 1, note=" (the number of rollouts per question, e.g. 5)")
    _check_scheme(group_scheme, scheme_kwargs)  # before building any sub-env
    cls = _env_class()
    return cls(_make_envs(env_id, size, env_kwargs), group_scheme=group_scheme, scheme_kwargs=scheme_kwargs)
