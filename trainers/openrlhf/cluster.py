"""An OpenRLHF run on a Ray cluster: the store actor, the package and the config on every node.

Called from :func:`~searchgym.trainers.openrlhf.launch.compose` (:func:`cluster_runtime_env`)
and from the agents (:func:`~searchgym.trainers.store_client.store_client`). See ``docs/openrlhf.md`` (several nodes).

- **Stores.** By default an OpenRLHF run keeps the experience memory and LightSearcher's
  minimum tool-call store in one Ray actor (:mod:`searchgym.trainers.ray_store`) named
  by ``$SEARCHGYM_STORE_ACTOR``, which ``launch`` sets to a name made of the store paths
  and the launch (``searchgym-store-<paths>-<launch>``), so each launch has its own. The
  trainer starts it (:func:`claim_store_actor`) on the head node, whose local disk holds
  its files at the config's paths, with this launch's settings and its run recorded in it;
  it is not detached, so it ends with the run, and a resumed run starts its own on the
  files. Before that, a run whose store another living actor serves is refused
  (:func:`check_store_free`). ``launch.env: {SEARCHGYM_STORE_ACTOR: file}`` keeps the file
  stores instead (one machine, or a shared file system).
- **Package.** A run on more than one node, or submitted to a cluster
  (``launch.ray_address``), ships this searchgym to every worker through the runtime env's
  ``py_modules``, and the run file (its ``extends`` merged) through ``working_dir``.
- **Retrieval.** A retriever URL on loopback cannot be reached from other nodes: a
  multi-node run refuses it (serve with ``searchgym serve --host 0.0.0.0`` and give the
  head's address).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from ...envs.config_base import read_yaml
from ...error import InvalidArgumentError
from ..agent_config import AGENT_CONFIG_VARIABLE, AgentConfig
from ..store_client import FILE_STORES, STORE_ACTOR_VARIABLE, store_actor_name, store_client, store_spec
from .config import RunConfig

__all__ = [
    "agent_file_path",
    "check_store_free",
    "claim_store_actor",
    "num_nodes",
    "cluster_runtime_env",
    "stage_package",
    "snapshot_stores",
    "restore_stores",
]

RUN_FILE = "run.yaml"
AGENT_FILE = "searchgym_agent.py"
"""The run file and agent file of a cluster run, in its ``working_dir``."""

_PACKAGES = ("envs", "retrieval", "storage", "memory", "policies", "trainers", "configs")
_LOOPBACK = ("127.0.0.1", "localhost", "::1", "0.0.0.0")


def agent_file_path() -> str:
    """The absolute path of the shipped agent file, for ``--train.agent_func_path``."""
    return str(Path(__file__).resolve().with_name("agent_file.py"))


def new_launch_id() -> str:
    """A new launch's id (8 hex digits), the last part of its store actor's name."""
    return uuid.uuid4().hex[:8]


def _store_names(config: AgentConfig, spec: Any) -> list[tuple[str, str]]:
    """``(config key, path)`` of each store of ``spec``."""
    out = []
    if spec.memory_path is not None:
        out.append(("agent.memory.path", spec.memory_path))
    if spec.min_tool_calls_path is not None:
        out.append(("agent.env_kwargs.reward_kwargs.store", spec.min_tool_calls_path))
    return out


def _in_use(config: AgentConfig, spec: Any, actor: Any) -> Any:
    from ..store_actors import KILL_COMMAND, StoreInUseError

    shared = [
        f"{key} {path}" for key, path in _store_names(config, spec) if os.path.abspath(path) in actor.paths()
    ]
    what = " and ".join(shared) or "this run's store"
    return StoreInUseError(
        f"{what} is in use by another run: the Ray store actor {actor.name!r} ({actor.who()}) serves it, and "
        f"two runs on one store would mix their records. Stop that run; if it has ended, end its actor with "
        f"`{KILL_COMMAND} {actor.name}` (`searchgym memory actors` lists them)."
    )


def check_store_free(config: AgentConfig, own: str | None = None) -> None:
    """Refuse a run whose store another living store actor serves (needs ``ray.init``).

    Args:
        config: The run's agent config.
        own: This launch's actor name, which may live already (it is not another run's).

    Raises:
        StoreInUseError: an actor other than ``own`` serves one of the run's store paths
            (or is an older searchgym's actor named after them). The message names it and
            the command that ends it.
    """
    from ..store_actors import actors_serving, list_store_actors

    spec = store_spec(config)
    prefix = store_actor_name(config)
    if spec is None or prefix is None:
        return
    paths = [path for _, path in _store_names(config, spec)]
    others = [a for a in list_store_actors() if a.name != own]
    busy = actors_serving(paths, others, names=[prefix])
    if busy:
        raise _in_use(config, spec, busy[0])


_CLAIMED: dict[str, Any] = {}
"""The store actors this process started, by name (their handles live as long as the process)."""


def claim_store_actor(config: AgentConfig, run_id: str, checkpoint: str = "") -> Any:
    """Start this launch's store actor (named by ``$SEARCHGYM_STORE_ACTOR``) for run ``run_id``.

    The trainer calls it once, before it checks or restores the stores. The actor is not
    detached: Ray ends it when this process ends, so it never serves a later run. It opens
    the files at the config's paths with this launch's settings. Needs ``ray.init``.

    Returns:
        The :class:`~searchgym.trainers.ray_store.StoreClient`, or ``None`` for file stores.

    Raises:
        StoreInUseError: another living actor serves one of the run's stores, or an actor
            of this launch's name lives already (the same launch started twice).
    """
    client = store_client(config)
    if client is None:
        return None
    if client.name in _CLAIMED:
        client._actor = _CLAIMED[client.name]
        return client
    from ..ray_store import StoreOwner, start_store_actor
    from ..store_actors import list_store_actors

    check_store_free(config, client.name)
    owner = StoreOwner(run_id, checkpoint=checkpoint)
    try:
        handle = start_store_actor(client.spec, client.name, detached=False, owner=owner, get_if_exists=False)
    except ValueError:  # Ray: the name is taken
        same = [a for a in list_store_actors() if a.name == client.name]
        if not same:
            raise
        raise _in_use(config, client.spec, same[0]) from None
    _CLAIMED[client.name] = client._actor = handle
    return client


def snapshot_stores(config: AgentConfig, step: int) -> None:
    """Snapshot the memory and the minimum tool-call store of ``config`` at training step
    ``step`` (call it when the checkpoint of ``step`` is saved): through the store actor when
    ``$SEARCHGYM_STORE_ACTOR`` names one, else on the files."""
    _each_store(config, "snapshot", step)


def restore_stores(config: AgentConfig, step: int) -> None:
    """Bring both stores back to their snapshot of ``step`` (on resume, before the agents
    read them); later records are moved aside, not deleted."""
    _each_store(config, "restore", step)


def _each_store(config: AgentConfig, method: str, step: int) -> None:
    client = store_client(config)
    if client is not None:
        getattr(client, method)(step)
        return
    from ...envs.rewards.min_tool_calls import MinToolCallStore
    from ...memory.store import MemoryStore

    spec = store_spec(config)
    if spec is None:
        return
    if spec.memory_path is not None:
        getattr(MemoryStore(spec.memory_path), method)(step)
    if spec.min_tool_calls_path is not None:
        getattr(MinToolCallStore(spec.min_tool_calls_path), method)(step)


def num_nodes(flat: dict[str, Any]) -> int:
    """The most nodes any OpenRLHF role asks for (``*.num_nodes`` flags)."""
    counts = [v for k, v in flat.items() if k.endswith("num_nodes") and isinstance(v, int)]
    return max(counts, default=1)


def stage_package(dest: str) -> str:
    """Copy the importable ``searchgym`` package (every folder it is installed from) under
    ``dest``; returns the package folder, ready for a runtime env's ``py_modules``."""
    import searchgym

    target = os.path.join(dest, "searchgym")
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".venv", "tests", "build")
    shutil.copytree(os.path.dirname(searchgym.__file__), target, ignore=ignore, dirs_exist_ok=True)
    for name in _PACKAGES:
        module = __import__(f"searchgym.{name}", fromlist=["_"])
        source = os.path.dirname(module.__file__ or "")
        if source and os.path.abspath(source) != os.path.abspath(os.path.join(target, name)):
            shutil.copytree(source, os.path.join(target, name), ignore=ignore, dirs_exist_ok=True)
    return target


def _check_retriever(config: AgentConfig) -> None:
    retriever = config.env_kwargs.get("retriever")
    if isinstance(retriever, str) and "://" in retriever:
        host = urlparse(retriever).hostname or ""
        if host in _LOOPBACK:
            raise InvalidArgumentError(
                f"agent.env_kwargs.retriever is {retriever!r}, on loopback, which agents on other nodes "
                "cannot reach. Serve retrieval where every node reaches it (`searchgym serve --host "
                "0.0.0.0 --port 8000` on the head) and give that address (http://HEAD_IP:8000)."
            )


def cluster_runtime_env(
    config: RunConfig,
    flat: dict[str, Any],
    runtime_env: dict[str, Any],
    staging: str | None = None,
    created: list[str] | None = None,
) -> list[str]:
    """Fill ``runtime_env`` with the store actor's name and, for a cluster run, the package,
    the run file and the agent file (``flat``'s ``train.agent_func_path`` then names the
    shipped copy). Call it before ``flat`` becomes flags.

    Without ``staging``, the shipped files go to a new temporary folder, which is appended
    to ``created`` (the caller removes it once Ray has uploaded them: after the launch).

    Returns warnings to print. Raises :class:`InvalidArgumentError` for a multi-node run
    that cannot work (a loopback retriever).
    """
    warnings: list[str] = []
    env_vars = runtime_env.setdefault("env_vars", {})
    name = store_actor_name(config.agent, new_launch_id())
    if name is not None and STORE_ACTOR_VARIABLE not in config.launch.env:
        env_vars[STORE_ACTOR_VARIABLE] = name
    nodes = num_nodes(flat)
    if nodes <= 1 and config.launch.ray_address is None:
        return warnings
    if nodes > 1:
        _check_retriever(config.agent)
    if name is not None and config.launch.env.get(STORE_ACTOR_VARIABLE, name).lower() in FILE_STORES:
        warnings.append(
            f"searchgym: {STORE_ACTOR_VARIABLE}=file on a cluster: the memory and minimum tool-call stores are "
            "SQLite files in WAL mode, which only processes on one machine can share (not across nodes, not "
            "on NFS); drop that setting to let the store actor own them."
        )
    if staging is None:
        staging = tempfile.mkdtemp(prefix="searchgym-ray-")
        if created is not None:
            created.append(staging)
    runtime_env["py_modules"] = [stage_package(os.path.join(staging, "py_modules"))]
    workdir = os.path.join(staging, "working_dir")
    os.makedirs(workdir, exist_ok=True)
    import yaml

    data = {k: v for k, v in read_yaml(config.path).items() if k != "extends"}
    with open(os.path.join(workdir, RUN_FILE), "w", encoding="utf-8") as handle:
        yaml.safe_dump(data, handle, sort_keys=False)
    runtime_env["working_dir"] = workdir
    env_vars[AGENT_CONFIG_VARIABLE] = RUN_FILE  # relative: workers start in the working_dir
    if flat.get("train.agent_func_path") == agent_file_path():  # the head's source tree: ship a copy
        shutil.copyfile(agent_file_path(), os.path.join(workdir, AGENT_FILE))
        flat["train.agent_func_path"] = AGENT_FILE
    return warnings
