"""Registration of every searchgym env id with Gymnasium (string entry points only)."""

from __future__ import annotations

import re

import gymnasium as gym

from ..error import UnknownNameError, did_you_mean

__all__ = ["BENCHMARKS", "ENV_IDS", "register_envs", "check_env_id"]

BENCHMARKS: dict[str, str] = {
    "NQ": "nq",
    "TriviaQA": "triviaqa",
    "PopQA": "popqa",
    "HotpotQA": "hotpotqa",
    "2WikiMultihopQA": "2wikimultihopqa",
    "MuSiQue": "musique",
    "Bamboogle": "bamboogle",
    "MMLU": "mmlu",
    "GSM8K": "gsm8k",
}
"""Env name → dataset key (the file stem of ``questions/<key>.jsonl``)."""

_NAMESPACE = "searchgym"
ENV_IDS: list[str] = [f"{_NAMESPACE}/SyntheticFacts-v1"] + [f"{_NAMESPACE}/{name}-v1" for name in BENCHMARKS]


def register_envs() -> None:
    """Register all ids; safe to call more than once. Imports nothing heavy."""
    specs: dict[str, tuple[str, str, dict[str, str]]] = {
        ENV_IDS[0]: (
            "searchgym.envs.synthetic_env:SyntheticFactsEnv",
            "searchgym.envs.vector_env:synthetic_facts_vector_env",
            {},
        )
    }
    for name, key in BENCHMARKS.items():
        specs[f"{_NAMESPACE}/{name}-v1"] = (
            "searchgym.envs.benchmarks:BenchmarkQAEnv",
            "searchgym.envs.vector_env:benchmark_vector_env",
            {"dataset": key},
        )
    for env_id, (entry_point, vector_entry_point, kwargs) in specs.items():
        if env_id not in gym.registry:
            gym.register(
                id=env_id, entry_point=entry_point, vector_entry_point=vector_entry_point, kwargs=kwargs
            )


_VERSIONED = re.compile(r"^(?:searchgym/)?(.+)-v(\d+)$")


def _name_and_version(env_id: str) -> tuple[str, int] | None:
    """``("SyntheticFacts", 1)`` for ``searchgym/SyntheticFacts-v1`` (namespace optional)."""
    found = _VERSIONED.match(env_id)
    return (found.group(1), int(found.group(2))) if found else None


def check_env_id(env_id: object) -> str:
    """Return ``env_id`` if it is a searchgym id, else raise an error that says which id to use.

    An older version of a registered id is named deprecated, with the current id; any other
    unknown id gets close matches.

    Raises:
        UnknownNameError: ``env_id`` is not a registered searchgym id (short ids such as
            ``SyntheticFacts-v1`` are completed).
    """
    if env_id in ENV_IDS:
        return env_id  # type: ignore[return-value]
    short = {i.split("/", 1)[1]: i for i in ENV_IDS}
    if env_id in short:
        return short[env_id]  # type: ignore[index]
    asked = _name_and_version(env_id) if isinstance(env_id, str) else None
    for current in ENV_IDS:
        latest = _name_and_version(current)
        if asked is not None and latest is not None and asked[0] == latest[0]:
            why = "is deprecated" if asked[1] < latest[1] else f"does not exist (the latest is v{latest[1]})"
            raise UnknownNameError(
                f"Env id {env_id!r} {why}: use {current!r}. The env class's docstring lists what "
                "changed under Version History."
            )
    raise did_you_mean("env id", env_id, ENV_IDS)
