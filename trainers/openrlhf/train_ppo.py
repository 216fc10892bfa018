"""``python -m searchgym.trainers.openrlhf.train_ppo FLAGS``: OpenRLHF's PPO entry with searchgym's Ray env.

It starts Ray with the runtime env ``launch`` composed (``$SEARCHGYM_RAY_RUNTIME_ENV``):
``SEARCHGYM_AGENT_CONFIG`` and friends for every worker, OpenRLHF's own defaults, and the
worker hook when the config needs it, plus ``WANDB_API_KEY`` from this process's environment
(``launch`` passes the key there, never in the printed command). Before any model loads it
refuses a run whose store another run's store actor serves
(:func:`~searchgym.trainers.openrlhf.cluster.check_store_free`). Then it runs
``openrlhf.cli.train_ppo_ray`` as ``__main__`` with the same flags; that module sees Ray
already started and keeps it.
"""

from __future__ import annotations

import json
import os
import runpy
import sys

from ...error import InvalidArgumentError
from ..agent_config import AGENT_CONFIG_VARIABLE, BASEDIR_VARIABLE, agent_config_from_env, load_agent_config
from ..store_client import FILE_STORES, STORE_ACTOR_VARIABLE
from .advantage_hook import HOOK, needs_hook
from .cluster import check_store_free
from .launch import OPENRLHF_ENV_DEFAULTS, RUNTIME_ENV_VARIABLE
from .secrets import KEY_VARIABLE

__all__ = ["check_stores", "main", "runtime_env"]


def runtime_env() -> dict:
    """The runtime env from ``$SEARCHGYM_RAY_RUNTIME_ENV``, or one built from ``$SEARCHGYM_AGENT_CONFIG``,
    with ``$WANDB_API_KEY`` added when set (OpenRLHF's trainer actor logs in to W&B with it)."""
    env = _composed_env()
    if os.environ.get(KEY_VARIABLE):
        env.setdefault("env_vars", {})[KEY_VARIABLE] = os.environ[KEY_VARIABLE]
    return env


def _composed_env() -> dict:
    text = os.environ.get(RUNTIME_ENV_VARIABLE)
    if text:
        try:
            env = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InvalidArgumentError(f"${RUNTIME_ENV_VARIABLE} is not JSON ({exc}): {text!r:.200}") from exc
        if not isinstance(env, dict):
            raise InvalidArgumentError(f"${RUNTIME_ENV_VARIABLE} must be a JSON object, got {text!r:.200}.")
        return env
    config = agent_config_from_env()
    env_vars = {
        **OPENRLHF_ENV_DEFAULTS,
        AGENT_CONFIG_VARIABLE: os.path.abspath(os.environ[AGENT_CONFIG_VARIABLE]),
    }
    env_vars[BASEDIR_VARIABLE] = os.environ.get(BASEDIR_VARIABLE) or os.getcwd()
    out: dict = {"env_vars": env_vars}
    if needs_hook(config):
        out["worker_process_setup_hook"] = HOOK
    return out


def check_stores(env: dict) -> None:
    """Refuse (``StoreInUseError``) a run whose store a living store actor of another run serves.

    ``env`` is the run's runtime env; its ``env_vars`` name the run file and the store
    actor. Needs ``ray.init``.
    """
    env_vars = env.get("env_vars") or {}
    name = str(env_vars.get(STORE_ACTOR_VARIABLE, "")).strip()
    path = env_vars.get(AGENT_CONFIG_VARIABLE)
    if name.lower() in FILE_STORES or not path:
        return
    check_store_free(load_agent_config(path, basedir=env_vars.get(BASEDIR_VARIABLE)), name)


def main(argv: list[str] | None = None) -> None:
    """Start Ray with :func:`runtime_env`, check the stores (:func:`check_stores`), then run
    ``openrlhf.cli.train_ppo_ray`` with ``argv``."""
    import ray

    env = runtime_env()
    flags = sys.argv[1:] if argv is None else argv
    if "--ckpt.save_hf" in flags:  # the hook rotates the HF copies with the checkpoints
        env.setdefault("worker_process_setup_hook", HOOK)
    if not ray.is_initialized():
        ray.init(runtime_env=env)
    check_stores(env)
    sys.argv = ["openrlhf.cli.train_ppo_ray", *flags]
    runpy.run_module("openrlhf.cli.train_ppo_ray", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    from ...error import SearchGymError

    try:
        main()
    except SearchGymError as exc:  # one line, as the searchgym CLI prints it
        print(f"searchgym: error: {exc}", file=sys.stderr)
        sys.exit(2)
