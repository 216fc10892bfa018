"""Batched search-QA envs: one retriever call per vector step, for all sub-envs at once.

``gym.make_vec("searchgym/HotpotQA-v1", num_envs=N, vectorization_mode="vector_entry_point")``
returns a :class:`SearchQAVectorEnv`. Its ``step`` runs the first half of every sub-env's
step (:meth:`SearchQAEnv.begin_step`: parse the action, record the turn), sends every query
of the batch to the shared retriever in *one* ``search(queries, k)`` call, and finishes each
sub-env's step with the documents it asked for (:meth:`SearchQAEnv.end_step`). Everything
else follows Gymnasium 1.x's :class:`~gymnasium.vector.SyncVectorEnv`: autoreset modes,
``infos`` as a dict of arrays with ``_key`` masks, ``reset(seed=int | list)``.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from ..checks import check_int
from ..error import InvalidArgumentError, SearchGymError
from ..retrieval import search_with_cache
from ..retrieval.records import Doc
from .search_env import SearchQAEnv

__all__ = ["SearchQAVectorEnv", "benchmark_vector_env", "stack_infos", "synthetic_facts_vector_env"]

_RESET_KEYS = ("reset_mask", "env_options")
_NO_SEARCH: tuple[list[Doc], None] = ([], None)  # end_step copies the list, never mutates it


def _check_autoreset_mode(mode: object) -> AutoresetMode:
    if isinstance(mode, AutoresetMode):
        return mode
    try:
        return AutoresetMode(mode)
    except ValueError:
        known = ", ".join(repr(m.value) for m in AutoresetMode)
        raise InvalidArgumentError(
            f"autoreset_mode must be a gymnasium.vector.AutoresetMode or one of {known}; got {mode!r}."
        ) from None


def _column(
    key: str, index: list[int], values: Sequence[Any], num_envs: int, rows: np.ndarray, unique: bool
) -> Any:
    """One key's batched value: what ``_add_info`` builds from ``values`` added in order.

    ``rows`` is ``index`` as an array and ``unique`` says it has no repeats; then a whole
    column goes in with one assignment.
    """
    first = values[0]
    if key == "final_obs":
        array = np.full(num_envs, fill_value=None, dtype=object)
    elif isinstance(first, dict):
        if not all(isinstance(value, dict) for value in values):
            raise InvalidArgumentError(f"info[{key!r}] is a dict for some sub-envs and not for others.")
        return stack_infos(list(zip(index, values, strict=True)), num_envs)
    elif type(first) in (int, float, bool) or isinstance(first, np.number):
        array = np.zeros(num_envs, dtype=type(first))
        if unique and set(map(type, values)) == {type(first)}:
            array[rows] = values  # one conversion for the whole column
            return array
    elif isinstance(first, np.ndarray):
        array = np.zeros((num_envs, *first.shape), dtype=first.dtype)
    else:
        array = np.full(num_envs, fill_value=None, dtype=object)
        if unique:  # fromiter keeps each value as is (a list stays one element)
            array[rows] = np.fromiter(values, dtype=object, count=len(values))
            return array
    for i, value in zip(index, values, strict=True):  # lists, arrays and mixed columns, one by one
        array[i] = value
    return array


def stack_infos(entries: Sequence[tuple[int, Mapping[str, Any]]], num_envs: int) -> dict[str, Any]:
    """Batch per-sub-env infos into Gymnasium's dict of arrays with ``_key`` masks.

    The result equals calling ``VectorEnv._add_info(infos, info, i)`` for each
    ``(i, info)`` of ``entries`` in order (the array of a key takes its dtype from the first
    value added, ``final_obs`` is an object array, dict values nest), but it builds each
    array once instead of once per sub-env, which matters at 64 sub-envs and a dozen keys.

    Args:
        entries: ``(sub-env index, info dict)`` pairs, in the order ``_add_info`` would see them.
        num_envs: The length of every array.
    """
    if not entries:
        return {}
    columns: dict[str, tuple[list[int], Sequence[Any]]] = {}
    first_keys = entries[0][1].keys()
    keys = list(first_keys)
    if len(keys) > 1 and all(info.keys() == first_keys for _, info in entries):
        index = [i for i, _ in entries]  # fast path: every info has the same keys
        getter = operator.itemgetter(*keys)
        for key, column in zip(keys, zip(*(getter(info) for _, info in entries), strict=True), strict=True):
            columns[key] = (index, column)
    else:
        for i, info in entries:
            for key, value in info.items():
                column = columns.setdefault(key, ([], []))
                column[0].append(i)
                column[1].append(value)  # type: ignore[attr-defined]
    infos: dict[str, Any] = {}
    # The fast path shares one index list between all keys: convert it and build its mask once.
    prepared: dict[int, tuple[np.ndarray, bool, np.ndarray]] = {}
    for key, (index, values) in columns.items():
        if id(index) not in prepared:
            rows = np.array(index, dtype=np.intp)
            mask = np.zeros(num_envs, dtype=np.bool_)
            mask[rows] = True
            prepared[id(index)] = rows, len(set(index)) == len(index), mask
        rows, unique, mask = prepared[id(index)]
        infos[key] = _column(key, index, values, num_envs, rows, unique)
        infos[f"_{key}"] = mask.copy()
    return infos


class SearchQAVectorEnv(VectorEnv):
    """``num_envs`` search-QA episodes side by side, with one batched retrieval per step.

    ## Description
    Holds ``num_envs`` sub-envs of one :class:`SearchQAEnv` class built from the same
    arguments, so they share one retriever (the process-wide cache of
    :func:`~searchgym.make_retriever`). ``step(actions)`` gathers the queries of every
    sub-env that searches into one ``retriever.search(queries, k)`` call (one call per
    distinct retriever and ``topk``, should sub-envs differ). Given the same seeds and
    actions, observations, rewards, terminations, truncations and infos equal those of
    ``num_envs`` single envs stepped one by one, and of ``SyncVectorEnv`` over them.

    ## Action Space
    ``batch_space(AnyText, num_envs)``: a ``Tuple`` of ``num_envs`` text spaces. ``step``
    takes a tuple or list of ``num_envs`` strings (an object array also works). A malformed
    string never raises: it becomes a format error of its sub-env, as in the single env.

    ## Observation Space
    ``batch_space(AnyText, num_envs)``: observations are a tuple of ``num_envs`` strings,
    each the new text of its sub-env (see :class:`SearchQAEnv`).

    ## Rewards, Episode End
    As the single env, per sub-env: float64 ``rewards`` and bool ``terminations`` and
    ``truncations`` arrays of shape ``(num_envs,)``.

    ## Autoreset
    ``autoreset_mode`` (``metadata["autoreset_mode"]``), as ``SyncVectorEnv`` does it:

    * ``NEXT_STEP`` (default): a sub-env whose episode ended is reset by the *next*
      ``step``, which ignores its action and returns its reset observation and info, reward
      0 and no termination or truncation.
    * ``SAME_STEP``: it is reset in the step that ends it; the step returns the reset
      observation, and ``infos["final_obs"]`` / ``infos["final_info"]`` (masked by
      ``infos["_final_obs"]`` / ``infos["_final_info"]``) hold the last ones.
    * ``DISABLED``: the caller resets ended sub-envs with
      ``reset(options={"reset_mask": mask})``; stepping one before that raises.

    ## Info
    Gymnasium's vector convention: ``infos[key]`` is an array over sub-envs and
    ``infos["_" + key]`` a bool mask of the sub-envs that reported ``key``; the keys are
    those of :class:`SearchQAEnv`. When the batched retrieval fails (the retriever raises a
    :class:`~searchgym.error.SearchGymError` such as ``RetrievalError``, as the
    :class:`Retriever` contract says, or answers the wrong number of result lists), every
    sub-env that searched in that step gets an error observation and ``retrieval_error``;
    ``step`` does not raise.

    ## Arguments
    envs: the sub-envs (unwrapped :class:`SearchQAEnv` instances of one class). The
        registered vector entry points build them: :func:`synthetic_facts_vector_env`,
        :func:`benchmark_vector_env`.
    autoreset_mode: ``AutoresetMode`` or its value (``"NextStep"``, ``"SameStep"``,
        ``"Disabled"``).

    ## Reset options
    ``reset(seed=, options=)``: ``seed`` is None, an int (sub-env i gets ``seed + i``) or a
    list of ``num_envs`` ints or Nones. ``options`` is one of:

    * a dict of single-env options (``{"index": 3}``, ``{"question": ...}``) given to every
      sub-env, as ``SyncVectorEnv`` does;
    * a list or tuple of ``num_envs`` dicts or Nones, one per sub-env (how a trainer feeds
      its own batch of questions);
    * a dict with ``"reset_mask"`` (a bool array of shape ``(num_envs,)``: reset only those
      sub-envs) and/or ``"env_options"`` (a per-sub-env list as above); its other keys go to
      every reset sub-env, under the per-sub-env ones. The caller's dict is not modified.
    """

    def __init__(
        self,
        envs: Sequence[SearchQAEnv],
        *,
        autoreset_mode: str | AutoresetMode = AutoresetMode.NEXT_STEP,
    ) -> None:
        super().__init__()
        if isinstance(envs, (str, bytes)) or not isinstance(envs, Sequence) or not envs:
            raise InvalidArgumentError(f"envs must be a non-empty list of SearchQAEnv, got {envs!r:.80}.")
        first = envs[0]
        for i, env in enumerate(envs):
            if not isinstance(env, SearchQAEnv) or type(env) is not type(first):
                raise InvalidArgumentError(
                    f"envs[{i}] must be an unwrapped {type(first).__name__} like envs[0] (SearchQAEnv "
                    f"subclass), got {type(env).__name__}. Pass env.unwrapped for a wrapped env."
                )
        self.envs: list[SearchQAEnv] = list(envs)
        self.num_envs = len(self.envs)
        self.autoreset_mode = _check_autoreset_mode(autoreset_mode)
        self.metadata = dict(first.metadata)
        self.metadata["autoreset_mode"] = self.autoreset_mode
        self.render_mode = first.render_mode
        self.single_observation_space = first.observation_space
        self.single_action_space = first.action_space
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        self._observations: list[str] = [""] * self.num_envs
        self._autoreset_envs = np.zeros(self.num_envs, dtype=np.bool_)
        self._started = np.zeros(self.num_envs, dtype=np.bool_)

    # -- Gymnasium vector API ----------------------------------------------------------------

    def reset(
        self,
        *,
        seed: int | Sequence[int | None] | None = None,
        options: Mapping[str, Any] | Sequence[Mapping[str, Any] | None] | None = None,
    ) -> tuple[tuple[str, ...], dict[str, Any]]:
        """Reset every sub-env (or those of ``options["reset_mask"]``); see the class docstring."""
        seeds = self._seeds(seed)
        mask, per_env = self._reset_options(options)
        entries: list[tuple[int, Mapping[str, Any]]] = []
        for i in map(int, np.flatnonzero(mask)):
            self._observations[i], env_info = self.envs[i].reset(seed=seeds[i], options=per_env[i])
            entries.append((i, env_info))
        infos = stack_infos(entries, self.num_envs)
        self._autoreset_envs[mask] = False
        self._started[mask] = True
        return tuple(self._observations), infos

    def step(
        self, actions: Sequence[object]
    ) -> tuple[tuple[str, ...], np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Step every sub-env with its action; all searches go to the retriever in one batch."""
        actions = self._check_actions(actions)
        n = self.num_envs
        pending_reset = self._autoreset_envs.tolist()
        # Check everything before touching a sub-env, so that an error leaves them all as they were.
        if not self._started.all():
            raise SearchGymError("Call reset() on the vector env before step().")
        if self.autoreset_mode is AutoresetMode.DISABLED and any(pending_reset):
            raise SearchGymError(
                f"Sub-envs {[i for i, done in enumerate(pending_reset) if done]} finished their episodes and "
                "autoreset_mode is Disabled: reset them with reset(options={'reset_mask': mask}) before "
                "stepping them again."
            )
        observations = self._observations
        env_infos: list[Mapping[str, Any]] = [{}] * n
        rewards, terminations, truncations = [0.0] * n, [False] * n, [False] * n
        stepping: list[int] = []
        searches: list[tuple[int, str]] = []
        for i, env in enumerate(self.envs):
            if pending_reset[i]:  # NEXT_STEP: this step resets it and ignores its action
                observations[i], env_infos[i] = env.reset()
                continue
            query = env.begin_step(actions[i])
            stepping.append(i)
            if query is not None:
                searches.append((i, query))

        results = self._retrieve(searches)

        same_step = self.autoreset_mode is AutoresetMode.SAME_STEP
        final: dict[int, dict[str, Any]] = {}
        for i in stepping:
            env = self.envs[i]
            docs, error = results.get(i, _NO_SEARCH)
            obs, rewards[i], terminations[i], truncations[i], env_infos[i] = env.end_step(docs, error)
            observations[i] = obs
            if same_step and (terminations[i] or truncations[i]):
                final[i] = {"final_obs": obs, "final_info": env_infos[i]}
                observations[i], env_infos[i] = env.reset()

        if final:
            entries = [
                (i, info) for i in range(n) for info in (final.get(i), env_infos[i]) if info is not None
            ]
        else:
            entries = list(enumerate(env_infos))
        infos = stack_infos(entries, n)
        done = np.logical_or(terminations, truncations)
        self._autoreset_envs = done if not same_step else np.zeros(n, dtype=np.bool_)
        return (
            tuple(observations),
            np.array(rewards, dtype=np.float64),
            np.array(terminations, dtype=np.bool_),
            np.array(truncations, dtype=np.bool_),
            infos,
        )

    def render(self) -> tuple[str | None, ...]:  # type: ignore[override]
        """The sub-envs' renders (``ansi`` transcripts, or Nones)."""
        return tuple(env.render() for env in self.envs)

    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Call method ``name`` of every sub-env (or read attribute ``name``)."""
        results = []
        for env in self.envs:
            attribute = env.get_wrapper_attr(name)
            results.append(attribute(*args, **kwargs) if callable(attribute) else attribute)
        return tuple(results)

    def get_attr(self, name: str) -> tuple[Any, ...]:
        """Attribute ``name`` of every sub-env."""
        return self.call(name)

    def set_attr(self, name: str, values: Any) -> None:
        """Set attribute ``name`` of every sub-env: one value each (a list or tuple) or one for all."""
        if not isinstance(values, (list, tuple)):
            values = [values] * self.num_envs
        if len(values) != self.num_envs:
            raise InvalidArgumentError(
                f"set_attr needs one value per sub-env ({self.num_envs}), got {len(values)}."
            )
        for env, value in zip(self.envs, values, strict=True):
            env.set_wrapper_attr(name, value)

    def close_extras(self, **kwargs: Any) -> None:
        """Close the sub-envs."""
        for env in getattr(self, "envs", []):
            env.close()

    @property
    def np_random_seed(self) -> tuple[int, ...]:  # type: ignore[override]
        """The sub-envs' numpy seeds."""
        return tuple(env.np_random_seed for env in self.envs)

    @property  # type: ignore[misc]
    def np_random(self) -> tuple[np.random.Generator, ...]:  # type: ignore[override]
        """The sub-envs' numpy generators."""
        return tuple(env.np_random for env in self.envs)

    def __repr__(self) -> str:
        name = self.spec.id if self.spec is not None else type(self.envs[0]).__name__
        return f"{type(self).__name__}({name}, num_envs={self.num_envs})"

    # -- Helpers -----------------------------------------------------------------------------

    def _retrieve(self, searches: list[tuple[int, str]]) -> dict[int, tuple[Sequence[Doc], str | None]]:
        """Run the searches, one batched call per (retriever, topk); errors become messages."""
        groups: dict[tuple[int, int], list[tuple[int, str]]] = {}
        for i, query in searches:
            env = self.envs[i]
            groups.setdefault((id(env.retriever), env.topk), []).append((i, query))
        results: dict[int, tuple[Sequence[Doc], str | None]] = {}
        for items in groups.values():
            env = self.envs[items[0][0]]
            queries = [query for _, query in items]
            found: Sequence[Sequence[Doc]] | None
            error: str | None
            try:
                found = search_with_cache(env.retriever, queries, env.topk)
            except SearchGymError as exc:  # same contract as SearchQAEnv.step
                found, error = None, str(exc)
            else:
                error = None
                if not isinstance(found, (list, tuple)) or len(found) != len(queries):
                    size = len(found) if isinstance(found, (list, tuple)) else type(found).__name__
                    error = (
                        f"The retriever {type(env.retriever).__name__} answered {size} results for a batch "
                        f"of {len(queries)} queries."
                    )
            for n, (i, _) in enumerate(items):
                # No copy of found[n]: end_step copies the documents it keeps.
                results[i] = ([], error) if error is not None or found is None else (found[n], None)
        return results

    def _check_actions(self, actions: object) -> Sequence[object]:
        if isinstance(actions, np.ndarray):
            actions = actions.tolist()
        if isinstance(actions, (str, bytes)) or not isinstance(actions, Sequence):
            raise InvalidArgumentError(
                f"actions must be a tuple or list of {self.num_envs} strings (one per sub-env), "
                f"got {type(actions).__name__}: {actions!r:.80}."
            )
        if len(actions) != self.num_envs:
            raise InvalidArgumentError(
                f"actions must hold one action per sub-env ({self.num_envs}), got {len(actions)}."
            )
        return actions

    def _seeds(self, seed: object) -> list[int | None]:
        if seed is None:
            return [None] * self.num_envs
        if isinstance(seed, (int, np.integer)) and not isinstance(seed, bool):
            return [int(seed) + i for i in range(self.num_envs)]
        if isinstance(seed, (list, tuple)) and len(seed) == self.num_envs:
            return list(seed)
        raise InvalidArgumentError(
            f"seed must be None, an int (sub-env i gets seed + i), or a list of {self.num_envs} ints or "
            f"Nones; got {seed!r:.80}."
        )

    def _reset_options(self, options: object) -> tuple[np.ndarray, list[dict[str, Any] | None]]:
        """Split ``options`` into a reset mask and one options dict (or None) per sub-env."""
        n = self.num_envs
        mask = np.ones(n, dtype=np.bool_)
        if options is None:
            return mask, [None] * n
        if isinstance(options, (list, tuple)):
            return mask, self._per_env_options(options, "options")
        if not isinstance(options, Mapping):
            raise InvalidArgumentError(
                f"options must be None, a dict, or a list of {n} dicts; got {type(options).__name__}."
            )
        common = {k: v for k, v in options.items() if k not in _RESET_KEYS}
        if "reset_mask" in options:
            mask = options["reset_mask"]
            if not isinstance(mask, np.ndarray) or mask.dtype != np.bool_ or mask.shape != (n,):
                raise InvalidArgumentError(
                    f"options['reset_mask'] must be a numpy bool array of shape ({n},), got {mask!r:.80}."
                )
            if not mask.any():
                raise InvalidArgumentError("options['reset_mask'] must select at least one sub-env.")
        per_env: list[dict[str, Any] | None] = [None] * n
        if "env_options" in options:
            per_env = self._per_env_options(options["env_options"], "options['env_options']")
        merged = [({**common, **(own or {})} if common or own else None) for own in per_env]
        return mask, merged

    def _per_env_options(self, options: object, name: str) -> list[dict[str, Any] | None]:
        if not isinstance(options, (list, tuple)) or len(options) != self.num_envs:
            raise InvalidArgumentError(
                f"{name} must be a list of {self.num_envs} dicts or Nones (one per sub-env), got {options!r:.80}."
            )
        for i, item in enumerate(options):
            if item is not None and not isinstance(item, Mapping):
                raise InvalidArgumentError(f"{name}[{i}] must be a dict or None, got {item!r:.80}.")
        return [None if item is None else dict(item) for item in options]


def _build(env_class: type[SearchQAEnv], num_envs: object, kwargs: dict[str, Any]) -> list[SearchQAEnv]:
    count = check_int("num_envs", num_envs, 1)
    if "max_episode_steps" in kwargs:
        raise InvalidArgumentError(
            f"max_episode_steps={kwargs['max_episode_steps']!r} is not supported by the searchgym vector "
            "envs; limit the episode length with max_turns= (and max_searches=) instead."
        )
    return [env_class(**kwargs) for _ in range(count)]


def synthetic_facts_vector_env(
    num_envs: int = 1, *, autoreset_mode: str | AutoresetMode = AutoresetMode.NEXT_STEP, **kwargs: Any
) -> SearchQAVectorEnv:
    """Vector entry point of ``searchgym/SyntheticFacts-v1``: ``num_envs`` SyntheticFactsEnv(**kwargs)."""
    from .synthetic_env import SyntheticFactsEnv

    return SearchQAVectorEnv(_build(SyntheticFactsEnv, num_envs, kwargs), autoreset_mode=autoreset_mode)


def benchmark_vector_env(
    num_envs: int = 1, *, autoreset_mode: str | AutoresetMode = AutoresetMode.NEXT_STEP, **kwargs: Any
) -> SearchQAVectorEnv:
    """Vector entry point of the benchmark ids: ``num_envs`` BenchmarkQAEnv(**kwargs)."""
    from .benchmarks import BenchmarkQAEnv

    return SearchQAVectorEnv(_build(BenchmarkQAEnv, num_envs, kwargs), autoreset_mode=autoreset_mode)
