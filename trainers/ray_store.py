"""The stores on a Ray cluster: one named, detached actor owns the memory and the minimum store.

On one machine, processes share the stores as SQLite files (:mod:`searchgym.memory.store`).
On a cluster that would need a shared file system, where SQLite's WAL mode does not work. Here instead one
Ray actor, :class:`StoreServer`, owns both stores: LightSearcher's experience memory (its
trajectories, bank versions and updates) and the per-question minimum of searches. Agents
on any node reach it by name through a :class:`StoreClient`; no shared file system is
needed.

The actor
    - is **named** (namespace :data:`NAMESPACE`), so every process of the job finds it by
      name. Under OpenRLHF it belongs to one run: its name carries the launch, the trainer
      starts it (not detached, so it ends with the run) and records the run in it
      (:class:`StoreOwner`, :meth:`StoreServer.describe`), and a resumed run starts its
      own from the files (:mod:`searchgym.trainers.store_actors` finds and ends actors);
    - is **pinned to the head node** (the resource ``node:__internal_head__``), whose local
      disk holds its files under the paths of the config, and restarts there
      (``max_restarts=-1``); calls in flight when it died are retried
      (``max_task_retries=-1``);
    - is the **single writer**: Ray runs its calls one at a time, and it writes with the
      file store's code (:class:`~searchgym.storage.sqlite_log.SqliteLog`) on its node.

**An acknowledged write** is a call (``add``, ``lookup_and_lower``, ``step_to``) that
returned to its caller. By then the actor has committed the record to its SQLite log, so
the record survives the actor process dying (a restart reads it back); with ``fsync`` it
also survives the node losing power. A retried ``add`` carries the key of its first try,
which the log stores uniquely, so it is stored once; lowering a minimum and stepping to a
step are idempotent.

Hot path: an agent calls the actor once to add an episode, once to read the bank (the
client caches it and the actor sends it only when its version changed), once to draw the
few-shot example, and once to read and lower a question's minimum of searches
(:meth:`RemoteMinToolCalls.lookup_and_lower`; ``lookup_and_lower_many`` batches).
``benchmarks/store_backends.py`` measures what that costs per episode.
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from ..envs.records import Trajectory
from ..envs.rewards.min_tool_calls import MinToolCallStore
from ..error import InvalidArgumentError, SearchGymError
from ..memory.lightsearcher.bank import ExperienceBank
from ..memory.lightsearcher.experience import ExperienceMemory, UpdateResult
from ..memory.serialize import trajectory_from_dict, trajectory_to_dict
from ..memory.store import MemoryStore

__all__ = [
    "NAMESPACE",
    "StoreOwner",
    "StoreSpec",
    "StoreServer",
    "StoreClient",
    "RemoteMemory",
    "RemoteMinToolCalls",
    "start_store_actor",
]

NAMESPACE = "searchgym"
"""The Ray namespace of the store actors."""

HEAD_RESOURCE = "node:__internal_head__"


@dataclass(frozen=True)
class StoreSpec:
    """What a store actor owns, and where on its node it keeps it.

    Attributes:
        memory_path: The experience memory's store folder (``None``: no memory).
        memory_kwargs: Keyword arguments of :class:`~searchgym.memory.ExperienceMemory`
            (``update_every``, ``summarizer``, ...).
        min_tool_calls_path: LightSearcher's minimum tool-call store, a file (``None``: none).
        fsync: Sync every write to disk (acknowledged writes then survive power loss).
    """

    memory_path: str | None = None
    memory_kwargs: dict[str, Any] = field(default_factory=dict)
    min_tool_calls_path: str | None = None
    fsync: bool = False

    def __post_init__(self) -> None:
        if self.memory_path is None and self.min_tool_calls_path is None:
            raise InvalidArgumentError("A StoreSpec needs memory_path, min_tool_calls_path or both.")


@dataclass(frozen=True)
class StoreOwner:
    """The run a store actor belongs to, recorded in the actor (:meth:`StoreServer.describe`).

    Attributes:
        run_id: The run: made by its first launch, recorded in each of its checkpoints and
            taken from there by a resumed run.
        host: The machine that started the actor's run.
        pid: The process that started it (under OpenRLHF the trainer actor).
        started: When, in seconds since the epoch.
        checkpoint: The run's checkpoint folder (``openrlhf.ckpt.path``), or ``""``.
    """

    run_id: str
    host: str = field(default_factory=socket.gethostname)
    pid: int = field(default_factory=os.getpid)
    started: float = field(default_factory=time.time)
    checkpoint: str = ""


class StoreServer:
    """The state a store actor owns (a plain class: Ray wraps it in :func:`start_store_actor`).

    Every method is one actor call; arguments and results are plain data.

    Args:
        spec: What it owns.
        owner: The run it belongs to (``None``: not recorded).
        detached: Whether it was started detached (it then outlives its run); for :meth:`describe`.
    """

    def __init__(self, spec: StoreSpec, owner: StoreOwner | None = None, detached: bool = True):
        self.spec = spec
        self.owner = owner
        self.detached = detached
        self.started = time.time()
        self.memory: ExperienceMemory | None = None
        self.mins: MinToolCallStore | None = None
        self._open()

    def _open(self) -> None:
        spec = self.spec
        if spec.memory_path is not None:
            self.memory = ExperienceMemory(spec.memory_path, fsync=spec.fsync, **spec.memory_kwargs)
        if spec.min_tool_calls_path is not None:
            self.mins = MinToolCallStore(spec.min_tool_calls_path, fsync=spec.fsync)

    def _memory(self) -> ExperienceMemory:
        if self.memory is None:
            raise InvalidArgumentError("This store actor keeps no experience memory (StoreSpec.memory_path).")
        return self.memory

    def _mins(self) -> MinToolCallStore:
        if self.mins is None:
            raise InvalidArgumentError("This store actor keeps no minimum tool-call store.")
        return self.mins

    # -- the memory ----------------------------------------------------------------------------

    def add(self, key: str, trajectory: dict[str, Any]) -> bool:
        """Store one finished trajectory once (a retried call with the same key is dropped)."""
        return self._memory().add(trajectory_from_dict(trajectory), key=key)

    def bank(self, known_version: int) -> dict[str, Any] | None:
        """The current bank as a dict, or ``None`` when its version is ``known_version``."""
        bank = self._memory().experience
        return None if bank.version == known_version else bank.to_dict()

    def example(self, u: float) -> dict[str, Any] | None:
        """The pool's trajectory at ``floor(u · pool size)`` (``u`` in [0, 1)), or ``None``."""
        example = self._memory().pool_item(u)
        return None if example is None else trajectory_to_dict(example)

    def status(self) -> dict[str, int]:
        """Trajectories, pool size, counted steps and bank version."""
        memory = self._memory()
        return {
            "trajectories": len(memory),
            "pool": memory.pool_size,
            "steps": memory.steps,
            "version": memory.experience.version,
        }

    def step_to(self, step: int) -> list[UpdateResult]:
        """Count training steps until ``step`` (idempotent); the updates made."""
        return self._memory().step_to(step)

    def set_steps(self, step: int) -> None:
        """Set the count of training steps without updating (a resumed run's step)."""
        self._memory().steps = step

    def history(self) -> list[dict[str, Any]]:
        """Every bank version, oldest first."""
        return [bank.to_dict() for bank in self._memory().history()]

    # -- the minimum tool-call store -----------------------------------------------------------

    def lookup_and_lower(self, items: list[tuple[str, int | None]]) -> list[int | None]:
        """For each ``(question id, m)``: the minimum before, then lowered to ``m`` (``None``: look only)."""
        return self._mins().lookup_and_lower_many(items)

    def minima(self) -> dict[str, int]:
        return self._mins().minima()

    # -- checkpoints ---------------------------------------------------------------------------

    def snapshot(self, step: int) -> None:
        """Snapshot both stores at training step ``step`` (see :meth:`MemoryStore.snapshot`)."""
        if self.spec.memory_path is not None:
            MemoryStore(self.spec.memory_path).snapshot(step)
        if self.mins is not None:
            self.mins.snapshot(step)

    def restore(self, step: int) -> None:
        """Bring both stores back to their snapshot of ``step`` and reopen them."""
        if self.spec.memory_path is not None:
            if self.memory is not None:
                self.memory.close()
            MemoryStore(self.spec.memory_path).restore(step)
        if self.mins is not None:
            self.mins.restore(step)
        self._open()

    def holds_data(self) -> bool:
        """Whether either store holds a record (an earlier run's, for a run that starts fresh)."""
        memory = self.spec.memory_path is not None and MemoryStore(self.spec.memory_path).holds_data()
        return memory or (self.mins is not None and self.mins.holds_data())

    def pid(self) -> int:
        return os.getpid()

    def describe(self) -> dict[str, Any]:
        """What the actor serves and whose it is: plain data for ``searchgym memory actors``."""
        kwargs = self.spec.memory_kwargs
        return {
            "memory_path": self.spec.memory_path,
            "min_tool_calls_path": self.spec.min_tool_calls_path,
            "settings": {
                k: v if isinstance(v, (int, float, str, bool)) else repr(v) for k, v in kwargs.items()
            },
            "owner": None if self.owner is None else asdict(self.owner),
            "detached": self.detached,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started": self.started,
            "trajectories": len(self.memory) if self.memory is not None else None,
        }


def start_store_actor(
    spec: StoreSpec,
    name: str,
    *,
    on_head: bool = True,
    detached: bool = True,
    owner: StoreOwner | None = None,
    get_if_exists: bool = True,
) -> Any:
    """The store actor called ``name``: found when it exists, else started with ``spec``.

    Needs ``ray.init`` first. Two processes that start it at once get the same actor.

    Args:
        spec: What it owns.
        name: Its name in :data:`NAMESPACE`.
        on_head: Pin it to the head node (whose disk holds its files); ``False`` lets Ray
            place it (tests, one machine).
        detached: Let it outlive the process that starts it (the built-in trainer ends it
            itself). ``False``: Ray ends it with that process, so it ends with its run.
        owner: The run it belongs to, recorded in it.
        get_if_exists: Return a living actor of that name. ``False``: raise Ray's
            ``ValueError`` when the name is taken.
    """
    import ray

    options: dict[str, Any] = {
        "name": name,
        "namespace": NAMESPACE,
        "get_if_exists": get_if_exists,
        "max_restarts": -1,
        "max_task_retries": -1,
        "num_cpus": 0,
    }
    if detached:
        options["lifetime"] = "detached"
    if on_head:
        options["resources"] = {HEAD_RESOURCE: 0.001}
    return ray.remote(StoreServer).options(**options).remote(spec, owner, detached)


class StoreClient:
    """A handle on the store actor ``name``, looked up by name on first use (picklable).

    Args:
        name: The actor's name in :data:`NAMESPACE`.
        spec: Start the actor with this when it does not exist yet; ``None`` requires it
            to exist.
        timeout: Seconds a call waits for the actor (a restart included).
        detached: Start it detached (see :func:`start_store_actor`).
    """

    def __init__(
        self, name: str, spec: StoreSpec | None = None, *, timeout: float = 300.0, detached: bool = True
    ):
        self.name = name
        self.spec = spec
        self.timeout = timeout
        self.detached = detached
        self._actor: Any = None

    @property
    def actor(self) -> Any:
        """The actor's handle: looked up by name, or started from :attr:`spec` when none runs.

        Raises:
            SearchGymError: none runs and the client has no spec (the message says whether
                the actor was ended, why, and how to start it again).
        """
        if self._actor is None:
            self._actor = self._find(None)
        return self._actor

    def _find(self, cause: str | None) -> Any:
        import ray

        try:
            return ray.get_actor(self.name, namespace=NAMESPACE)
        except ValueError:
            pass
        if self.spec is not None:
            return start_store_actor(self.spec, self.name, detached=self.detached)
        cause = cause or _death_cause(self.name)
        if cause is not None:
            raise SearchGymError(
                f"The store actor {self.name!r} (Ray namespace {NAMESPACE!r}) was ended ({cause}) and no actor "
                "of that name runs now; its stores stay on disk. Start it again by resuming its run from the "
                "last checkpoint (the trainer starts the run's store actor), or with "
                f"StoreClient({self.name!r}, spec) in the Ray job."
            )
        raise SearchGymError(
            f"No store actor {self.name!r} in Ray namespace {NAMESPACE!r}: the launcher starts it; check that "
            "this process runs in the same Ray cluster."
        )

    def call(self, method: str, *args: Any) -> Any:
        """Call ``method`` on the actor and wait for its answer (the acknowledgement).

        An actor that Ray restarts answers through the same handle (Ray retries the call).
        When the actor was ended, the client looks it up again by name and makes the call
        there: a new actor of that name (started by its run, or by a client with a spec), or
        one this client starts from its spec. Every call is safe to make twice (see the
        module docstring), so a call the ended actor may have made is not doubled.

        Raises:
            SearchGymError: the actor was ended, none of its name runs and this client has
                no spec (the message says why it ended and how to start it again).
        """
        import ray
        from ray.exceptions import ActorDiedError

        dead = self.actor
        try:
            return ray.get(getattr(dead, method).remote(*args), timeout=self.timeout)
        except ActorDiedError as exc:
            cause = _cause_line(exc.error_msg or "")
        self._actor = None
        deadline = time.monotonic() + min(self.timeout, 30.0)
        while True:  # Ray may still list the dead actor under its name for a moment
            actor = self._find(cause)
            if actor._actor_id != dead._actor_id or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        self._actor = actor
        return ray.get(getattr(actor, method).remote(*args), timeout=self.timeout)

    def snapshot(self, step: int) -> None:
        """Snapshot both stores at training step ``step`` (when its checkpoint is saved)."""
        self.call("snapshot", step)

    def restore(self, step: int) -> None:
        """Bring both stores back to their snapshot of ``step`` (on resume)."""
        self.call("restore", step)

    def holds_data(self) -> bool:
        """Whether the actor's stores hold any record."""
        return bool(self.call("holds_data"))

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_actor": None}

    def __repr__(self) -> str:
        return f"StoreClient({self.name!r})"


def _cause_line(message: str) -> str:
    """Ray's reason an actor died, from its multi-line message ("it was killed by `ray.kill`")."""
    lines = (line.strip() for line in message.splitlines())
    reason = next((line for line in lines if line.startswith("The actor is dead because")), None)
    return (
        "Ray reports it dead"
        if reason is None
        else reason.removeprefix("The actor is dead because ").rstrip(".")
    )


def _death_cause(name: str) -> str | None:
    """Why the actor ``name`` of :data:`NAMESPACE` ended, when the cluster remembers it; else ``None``."""
    try:
        from ray._private import state

        actors = list(state.actors().values())
    except Exception:  # noqa: BLE001 - Ray's private actor table: without it, no cause
        return None
    for actor in actors:
        if actor.get("Name") != name or actor.get("State") != "DEAD":
            continue
        context = getattr(actor.get("DeathCause"), "actor_died_error_context", None)
        if context is not None and context.ray_namespace not in ("", NAMESPACE):
            continue
        message = str(getattr(context, "error_message", "") or "")
        return _cause_line(message)
    return None


class RemoteMemory:
    """An :class:`~searchgym.memory.ExperienceMemory` whose state lives in the store actor.

    Has what :class:`~searchgym.memory.ExperienceWrapper` and the trainer's
    :class:`~searchgym.trainers.memory_sync.MemoryStepper` use. The bank is
    cached here and fetched again only when the actor's version differs.
    """

    def __init__(self, client: StoreClient):
        self.client = client
        self._bank = ExperienceBank()

    def add(self, trajectory: Trajectory) -> None:
        """Store one finished trajectory; returns once the actor has written it."""
        if not isinstance(trajectory, Trajectory) or trajectory.reward is None:
            raise InvalidArgumentError("add() takes a finished searchgym Trajectory with its reward set.")
        self.client.call("add", uuid.uuid4().hex, trajectory_to_dict(trajectory))

    @property
    def experience(self) -> ExperienceBank:
        """The current bank (one small call; the bank itself only when it changed)."""
        data = self.client.call("bank", self._bank.version)
        if data is not None:
            self._bank = ExperienceBank.from_dict(data)
        return self._bank

    def sample_few_shot(self, rng: np.random.Generator | Any = None) -> Trajectory | None:
        """One trajectory drawn uniformly from the actor's few-shot pool, or ``None``."""
        u = float((rng if rng is not None else np.random.default_rng()).random())
        data = self.client.call("example", u)
        return None if data is None else trajectory_from_dict(data)

    def step_hints(self, query: str) -> str:
        return ""

    @property
    def steps(self) -> int:
        return int(self.client.call("status")["steps"])

    @steps.setter
    def steps(self, step: int) -> None:
        self.client.call("set_steps", step)

    def step_to(self, step: int) -> list[UpdateResult]:
        """Bring the actor's memory to training step ``step`` (one call); the updates made."""
        return list(self.client.call("step_to", step))

    def step(self) -> UpdateResult | None:
        """Count one training step (as :meth:`ExperienceMemory.step`)."""
        results = self.step_to(self.steps + 1)
        return results[-1] if results else None

    def history(self) -> list[ExperienceBank]:
        return [ExperienceBank.from_dict(d) for d in self.client.call("history")]

    def __len__(self) -> int:
        return int(self.client.call("status")["trajectories"])

    @property
    def pool_size(self) -> int:
        return int(self.client.call("status")["pool"])

    def __repr__(self) -> str:
        return f"RemoteMemory({self.client.name!r})"


class RemoteMinToolCalls:
    """LightSearcher's minimum tool-call store, kept by the store actor (a :class:`MinToolCalls`)."""

    def __init__(self, client: StoreClient):
        self.client = client

    def lookup_and_lower(self, qid: str, m: int | None) -> int | None:
        """The minimum for ``qid``, then lowered to ``m``: one actor call."""
        return self.lookup_and_lower_many([(qid, m)])[0]

    def lookup_and_lower_many(self, items: list[tuple[str, int | None]]) -> list[int | None]:
        """:meth:`lookup_and_lower` for many questions in one actor call."""
        return list(self.client.call("lookup_and_lower", list(items)))

    def get(self, qid: str) -> int | None:
        return self.lookup_and_lower(qid, None)

    def update(self, qid: str, m: int) -> None:
        self.lookup_and_lower(qid, m)

    def minima(self) -> dict[str, int]:
        return dict(self.client.call("minima"))

    def __len__(self) -> int:
        return len(self.minima())

    def __repr__(self) -> str:
        return f"RemoteMinToolCalls({self.client.name!r})"
