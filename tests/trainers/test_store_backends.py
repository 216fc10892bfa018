"""The two store backends under the same scenarios: the file store and the Ray store actor.

Several Ray worker processes append trajectories, read the bank and lower minima at once,
while the driver steps the memory; the process that writes the state (the writer itself,
or the store actor) is killed in the middle of a run of appends; a resumed run restores
both stores. One Ray session (``ray.init(num_cpus=2)``) serves the whole module.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from searchgym.envs.records import Action, Question, Trajectory, Turn
from searchgym.envs.rewards import LightSearcherReward, MinToolCallStore
from searchgym.memory import ExperienceBank, ExperienceMemory, MemoryStore

ray = pytest.importorskip("ray")
ray_store = pytest.importorskip("searchgym.trainers.ray_store")

WORKERS = 4
PER_WORKER = 20
SHARED_QUESTIONS = [f"shared-{i}" for i in range(5)]


class Counting:
    """A summariser whose bank names the number of Good and Bad trajectories it saw."""

    name = "counting"

    def summarize(self, good: Any, bad: Any, previous: Any) -> ExperienceBank:
        return ExperienceBank(success_strategies=(f"{len(good)} good, {len(bad)} bad",))


def trajectory(qid: str, reward: float) -> Trajectory:
    turn = Turn("a:x", Action(kind="answer", answer="x"))
    return Trajectory(Question(qid, f"question {qid}?", ("x",)), "search_r1", [turn], reward=reward)


def stored_ids(root: Path) -> list[str]:
    """The question id of every trajectory record on disk, in order."""
    return [r["trajectory"]["question"]["id"] for r in MemoryStore(root).log("trajectories").read()[0]]


@pytest.fixture(scope="module")
def ray_session() -> Any:
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # Ray workers cannot import tests/
    context = ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield context.address_info["address"]
    ray.shutdown()


def open_stores(backend: str, root: str, name: str) -> tuple[Any, Any]:
    """The memory and the minimum store of ``backend`` under ``root`` (opened in the calling process)."""
    memory_kwargs = {"update_every": 1, "summarizer": Counting()}
    if backend == "file":
        memory = ExperienceMemory(f"{root}/memory", **memory_kwargs)
        return memory, MinToolCallStore(f"{root}/min_tool_calls.sqlite")
    spec = ray_store.StoreSpec(f"{root}/memory", memory_kwargs, f"{root}/min_tool_calls.sqlite")
    client = ray_store.StoreClient(name, spec)
    return ray_store.RemoteMemory(client), ray_store.RemoteMinToolCalls(client)


def worker(backend: str, root: str, name: str, w: int) -> dict[str, Any]:
    """One Ray worker: add episodes, read the bank between them, score through the minimum store."""
    memory, mins = open_stores(backend, root, name)
    reward = LightSearcherReward(store=mins)
    rng = random.Random(w)
    versions, lowered = [], []
    for i in range(PER_WORKER):
        memory.add(trajectory(f"w{w}-{i}", 1.0 if i % 2 else 0.0))
        versions.append(memory.experience.version)
        qid, m = rng.choice(SHARED_QUESTIONS), rng.randrange(1, 9)
        lowered.append((qid, m))
        reward.store.lookup_and_lower(qid, m)
        memory.sample_few_shot(random.Random(i))
    return {"versions": versions, "lowered": lowered}


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["file", "actor"])
def test_workers_append_and_read_concurrently(ray_session: Any, tmp_path: Path, backend: str) -> None:
    name = f"store-{uuid.uuid4().hex[:8]}"
    memory, mins = open_stores(backend, str(tmp_path), name)
    task = ray.remote(worker)
    pending = [task.remote(backend, str(tmp_path), name, w) for w in range(WORKERS)]
    step = 0
    while True:  # the trainer steps the memory while the workers run
        done, _ = ray.wait(pending, num_returns=len(pending), timeout=0.2)
        step += 1
        if isinstance(memory, ExperienceMemory):
            memory.step()
        else:
            memory.step_to(step)
        if len(done) == len(pending):
            break
    results = ray.get(pending)
    memory.step() if isinstance(memory, ExperienceMemory) else memory.step_to(step + 1)

    fresh, fresh_mins = open_stores(backend, str(tmp_path), name)
    ids = stored_ids(tmp_path / "memory")
    assert sorted(ids) == sorted(f"w{w}-{i}" for w in range(WORKERS) for i in range(PER_WORKER))
    assert len(fresh) == WORKERS * PER_WORKER  # nothing lost, nothing twice
    for result in results:
        assert result["versions"] == sorted(result["versions"])  # bank versions never go back
    true_min: dict[str, int] = {}
    for result in results:
        for qid, m in result["lowered"]:
            true_min[qid] = min(m, true_min.get(qid, m))
    assert fresh_mins.minima() == true_min
    versions = [b.version for b in fresh.history()]
    assert versions == list(range(1, len(versions) + 1)) and versions  # one update per version
    if backend == "actor":
        ray.kill(ray.get_actor(name, namespace=ray_store.NAMESPACE), no_restart=True)


# -- under OpenRLHF: the launcher names the actor, the agents use it, a cluster run is shipped -----

RUN = """\
backend: openrlhf
env:
  id: searchgym/SyntheticFacts-v1
  protocol: tool_call
  retriever: {retriever}
  reward: lightsearcher
  reward_kwargs: {{store: runs/min_tool_calls.sqlite}}
memory: {{kind: lightsearcher, path: runs/memory, update_every: 1}}
openrlhf:
  launch: {{env: {{{launch_env}}}}}
  actor: {{model_name_or_path: m, num_nodes: {nodes}, num_gpus_per_node: 1}}
  ref: {{num_nodes: {nodes}, num_gpus_per_node: 1}}
  vllm: {{num_engines: 1}}
  train: {{batch_size: 8}}
  rollout: {{n_samples_per_prompt: 4, batch_size: 2}}
  algo: {{advantage: {{estimator: group_norm}}}}
  data: {{prompt_dataset: train.jsonl}}
"""


def run_file(tmp_path: Path, retriever: str = "bm25", nodes: int = 1, launch_env: str = "") -> Path:
    path = tmp_path / "run.yaml"
    path.write_text(RUN.format(retriever=retriever, nodes=nodes, launch_env=launch_env))
    (tmp_path / "train.jsonl").write_text('{"prompt": "q", "label": "{}"}\n' * 8)  # the dry run counts rows
    return path


def plan_of(path: Path) -> Any:
    from searchgym.trainers.openrlhf.config import load_run_config
    from searchgym.trainers.openrlhf.launch import compose

    return compose(load_run_config(path, basedir=str(path.parent)), basedir=str(path.parent))


def test_launch_names_one_store_actor_per_store(tmp_path: Path) -> None:
    from searchgym.error import InvalidArgumentError

    plan = plan_of(run_file(tmp_path))
    name = plan.runtime_env["env_vars"]["SEARCHGYM_STORE_ACTOR"]
    assert name.startswith("searchgym-store-") and "py_modules" not in plan.runtime_env  # one node
    again = plan_of(run_file(tmp_path)).runtime_env["env_vars"]["SEARCHGYM_STORE_ACTOR"]
    assert again != name and again.rsplit("-", 1)[0] == name.rsplit("-", 1)[0]  # each launch its own
    other = tmp_path / "other"
    other.mkdir()
    named = plan_of(run_file(other)).runtime_env["env_vars"]["SEARCHGYM_STORE_ACTOR"]
    assert named.rsplit("-", 1)[0] != name.rsplit("-", 1)[0]  # other paths
    files = plan_of(run_file(tmp_path, launch_env="SEARCHGYM_STORE_ACTOR: file"))
    assert files.runtime_env["env_vars"]["SEARCHGYM_STORE_ACTOR"] == "file"
    with pytest.raises(InvalidArgumentError, match=r"loopback.*--host 0.0.0.0"):
        plan_of(run_file(tmp_path, "http://127.0.0.1:8000", nodes=2))


@pytest.mark.slow
def test_a_cluster_run_ships_package_and_run_file_to_workers(ray_session: Any, tmp_path: Path) -> None:
    plan = plan_of(run_file(tmp_path, "http://10.0.0.7:8000", nodes=2))
    runtime = plan.runtime_env
    (package,) = runtime["py_modules"]
    assert (Path(package) / "storage" / "sqlite_log.py").is_file()  # every installed folder
    assert (Path(package) / "retrieval" / "http_client.py").is_file()
    assert (Path(runtime["working_dir"]) / "run.yaml").is_file()
    agent_flag = plan.flags[plan.flags.index("--train.agent_func_path") + 1]
    assert agent_flag == "searchgym_agent.py" and (Path(runtime["working_dir"]) / agent_flag).is_file()

    # A second driver joins the cluster with that runtime env, as train_ppo's ray.init does.
    script = """
import json, sys, ray
ray.init(address=sys.argv[1], runtime_env=json.loads(sys.argv[2]), log_to_driver=False)

@ray.remote
def on_a_worker():
    import searchgym
    from searchgym.trainers.agent_config import agent_config_from_env
    from searchgym.trainers.store_client import store_client

    config = agent_config_from_env()  # the shipped run file, from the working_dir
    import importlib.util

    # as openrlhf/trainer/ray/vllm_engine.py's _load_agent_executor loads it (that module needs vLLM)
    spec = importlib.util.spec_from_file_location("agent_module", "searchgym_agent.py")
    agent_module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(agent_module)
    executor = agent_module.AgentExecutor
    return [searchgym.__file__, config.env_kwargs["retriever"], store_client(config).name,
            executor.__module__]

print(json.dumps(ray.get(on_a_worker.remote(), timeout=120)))
"""
    out = subprocess.run(
        [sys.executable, "-c", script, ray_session, json.dumps(runtime)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    where, retriever, name, executor = json.loads(out.stdout.strip().splitlines()[-1])
    assert executor == "searchgym.trainers.openrlhf.agent"
    assert "runtime_resources" in where  # the shipped copy, not the one installed here
    assert retriever == "http://10.0.0.7:8000" and name == runtime["env_vars"]["SEARCHGYM_STORE_ACTOR"]


@pytest.mark.slow
def test_agents_keep_their_state_in_the_actor(ray_session: Any, tmp_path: Path, monkeypatch: Any) -> None:
    from searchgym.policies import make_policy
    from searchgym.trainers.agent_config import load_agent_config
    from searchgym.trainers.env_pool import build_env

    name = f"store-{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv("SEARCHGYM_STORE_ACTOR", name)
    config = load_agent_config(run_file(tmp_path), basedir=str(tmp_path))
    env = build_env(config)
    store = env.unwrapped.reward_scheme.store
    assert isinstance(store, ray_store.RemoteMinToolCalls)
    agent = make_policy("oracle_synthetic", protocol="tool_call", world=env.unwrapped.world)
    for seed in range(3):
        context, _ = env.reset(seed=seed)
        done = False
        while not done:
            action = agent.act([context])[0]
            obs, _, terminated, truncated, _ = env.step(action)
            context += action + obs
            done = terminated or truncated
    client = ray_store.StoreClient(name)
    assert client.call("status")["trajectories"] == 3
    assert client.call("minima") == store.minima() and len(store.minima()) >= 1
    assert len(stored_ids(tmp_path / "runs" / "memory")) == 3  # written by the actor, at the config's path
    ray.kill(client.actor, no_restart=True)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["file", "actor"])
def test_a_resumed_run_restores_both_stores_to_its_step(
    ray_session: Any, tmp_path: Path, monkeypatch: Any, backend: str
) -> None:
    from searchgym.trainers.agent_config import load_agent_config
    from searchgym.trainers.env_pool import build_env, open_memory
    from searchgym.trainers.openrlhf.cluster import restore_stores, snapshot_stores
    from searchgym.trainers.store_client import store_client

    name = f"store-{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv("SEARCHGYM_STORE_ACTOR", name if backend == "actor" else "file")
    config = load_agent_config(run_file(tmp_path), basedir=str(tmp_path))
    assert config.memory is not None
    env = build_env(config)
    memory, mins = open_memory(config.memory, config), env.unwrapped.reward_scheme.store
    client = store_client(config)
    assert client is None or not client.holds_data()  # a fresh run can check for an earlier run's records
    memory.add(trajectory("before", 1.0))
    mins.lookup_and_lower("q", 4)
    assert client is None or client.holds_data()
    snapshot_stores(config, 1)  # the checkpoint of step 1
    memory.add(trajectory("after", 0.0))  # work the crash loses
    mins.lookup_and_lower("q", 2)
    restore_stores(config, 1)  # resume from step 1
    assert [r for r in stored_ids(tmp_path / "runs" / "memory")] == ["before"]
    assert len(memory) == 1 and mins.lookup_and_lower("q", None) == 4
    assert "after" in (tmp_path / "runs" / "memory" / "trajectories.sqlite.cut-1.jsonl").read_text()
    if client is not None:
        ray.kill(client.actor, no_restart=True)


def test_a_retried_append_is_stored_once_even_after_a_restart(tmp_path: Path) -> None:
    from searchgym.memory import trajectory_to_dict

    spec = ray_store.StoreSpec(str(tmp_path / "memory"))
    server = ray_store.StoreServer(spec)
    record = trajectory_to_dict(trajectory("q", 1.0))
    assert server.add("key-1", record) is True
    assert server.add("key-1", record) is False  # Ray retried the call: dropped
    restarted = ray_store.StoreServer(spec)  # the actor came back from its files
    assert restarted.add("key-1", record) is False and restarted.add("key-2", record) is True
    assert stored_ids(tmp_path / "memory") == ["q", "q"]


def _counting_spec(root: Path) -> Any:
    return ray_store.StoreSpec(str(root / "memory"), {"update_every": 5, "summarizer": Counting()})


def _add_pair(server: Any, tag: str) -> None:
    """One Good and one Bad trajectory, so that an update writes a bank."""
    from searchgym.memory import trajectory_to_dict

    server.add(f"{tag}-good", trajectory_to_dict(trajectory(f"{tag}-good", 1.0)))
    server.add(f"{tag}-bad", trajectory_to_dict(trajectory(f"{tag}-bad", 0.0)))


def test_every_counter_of_the_actor_survives_its_restart(tmp_path: Path) -> None:
    spec = _counting_spec(tmp_path)
    server = ray_store.StoreServer(spec)
    _add_pair(server, "a")
    assert [r.step for r in server.step_to(7)] == [5]  # the update of step 5, then steps 6 and 7
    _add_pair(server, "b")
    before = server.status()
    assert before == {"trajectories": 4, "pool": 2, "steps": 7, "version": 1}
    restarted = ray_store.StoreServer(spec)  # Ray restarted the actor: it reads its files again
    assert restarted.status() == before
    updates = restarted.step_to(10)  # the update due at step 10, three steps on, sees b's pair only
    assert [(r.step, r.outcome, r.good, r.bad) for r in updates] == [(10, "written", 1, 1)]
    restarted.set_steps(12)  # a resumed run's step, acknowledged
    again = ray_store.StoreServer(spec)
    assert again.status()["steps"] == 12 and again.status()["version"] == 2
    assert [r.step for r in again.step_to(15)] == [15] and ray_store.StoreServer(spec).status()["steps"] == 15


def _wait_until_gone(name: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            ray.get_actor(name, namespace=ray_store.NAMESPACE)
        except ValueError:
            return
        time.sleep(0.2)
    raise AssertionError(f"the actor {name!r} still runs {timeout:.0f} s after ray.kill")


@pytest.mark.slow
def test_clients_find_a_restarted_or_recreated_actor_and_name_an_ended_one(
    ray_session: Any, tmp_path: Path
) -> None:
    from searchgym.error import SearchGymError

    name = f"store-{uuid.uuid4().hex[:8]}"
    trainer = ray_store.StoreClient(name, _counting_spec(tmp_path))  # starts the actor from its spec
    assert trainer.call("status")["steps"] == 0
    agent = ray_store.RemoteMemory(ray_store.StoreClient(name))  # an agent's client: no spec
    agent.add(trajectory("a", 1.0))
    agent.steps = 7
    first = agent.client.call("pid")
    ray.kill(agent.client.actor, no_restart=False)  # Ray restarts it from its files
    assert agent.steps == 7 and len(agent) == 1 and agent.client.call("pid") != first
    agent.steps = 12
    ray.kill(agent.client.actor, no_restart=False)
    assert agent.steps == 12

    ray.kill(agent.client.actor, no_restart=True)  # ended: nothing runs under its name
    _wait_until_gone(name)  # ray.kill returns before the actor has ended
    for client in (agent.client, ray_store.StoreClient(name)):  # a cached handle, then a new client
        with pytest.raises(SearchGymError) as ended:
            client.call("status")
        message = str(ended.value)
        assert "\n" not in message and f"store actor {name!r}" in message
        assert "was ended (it was killed by `ray.kill`)" in message and "resuming its run" in message
    assert trainer.call("status")["steps"] == 12  # its cached handle died: it starts the actor again
    assert agent.steps == 12 and len(agent) == 1  # and the agent's client finds the new one
    agent.add(trajectory("b", 0.0))
    assert trainer.call("status")["trajectories"] == 2
    ray.kill(trainer.actor, no_restart=True)


def test_a_count_lost_after_its_update_comes_back_from_the_update(tmp_path: Path, monkeypatch: Any) -> None:
    memory = ExperienceMemory(tmp_path, update_every=5, summarizer=Counting())
    memory.step_to(4)

    def die() -> None:
        raise KeyboardInterrupt  # the process dies between the update's record and the count's

    monkeypatch.setattr(memory, "_save_steps", die)
    with pytest.raises(KeyboardInterrupt):
        memory.step()
    reopened = ExperienceMemory(tmp_path, update_every=5, summarizer=Counting())
    assert reopened.steps == 5 and reopened.step_to(5) == []  # the update of step 5 is not made twice
    assert [u["step"] for u in MemoryStore(tmp_path).log("updates").read()[0]] == [5]


def test_a_restored_snapshot_brings_the_step_count_back(tmp_path: Path) -> None:
    memory = ExperienceMemory(tmp_path / "memory", update_every=5, summarizer=Counting())
    memory.step_to(3)
    MemoryStore(tmp_path / "memory").snapshot(3)
    memory.step_to(8)
    memory.close()
    MemoryStore(tmp_path / "memory").restore(3)
    assert ExperienceMemory(tmp_path / "memory", update_every=5).steps == 3


class Appender:
    """A Ray actor that adds episodes one by one and notes each acknowledged one in a file."""

    def __init__(self, backend: str, root: str, name: str):
        self.memory, _ = open_stores(backend, root, name)
        self.acks = f"{root}/acks.txt"

    def run(self, prefix: str, count: int) -> int:
        for i in range(count):
            self.memory.add(trajectory(f"{prefix}{i}", 1.0))
            with open(self.acks, "a") as handle:  # written only once add() returned
                handle.write(f"{prefix}{i}\n")
            time.sleep(0.005)
        return count

    def pid(self) -> int:
        import os

        return os.getpid()


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["file", "actor"])
def test_the_state_owner_killed_mid_appends_loses_no_acknowledged_record(
    ray_session: Any, tmp_path: Path, backend: str
) -> None:
    """The process that writes the files dies mid-run: the writer itself for the file store,
    the store actor for the Ray backend (restarted by Ray, its calls in flight retried)."""
    name = f"store-{uuid.uuid4().hex[:8]}"
    memory, mins = open_stores(backend, str(tmp_path), name)
    mins.lookup_and_lower("q", 3)
    appender = ray.remote(Appender).options(max_concurrency=2).remote(backend, str(tmp_path), name)
    run = appender.run.remote("k", 300)
    acks = tmp_path / "acks.txt"
    deadline = time.monotonic() + 60
    while (not acks.exists() or len(acks.read_text().split()) < 30) and time.monotonic() < deadline:
        time.sleep(0.02)
    if backend == "actor":
        first_pid = memory.client.call("pid")
        ray.kill(memory.client.actor, no_restart=False)
        assert ray.get(run, timeout=120) == 300  # the run goes on through the restart
        assert memory.client.call("pid") != first_pid
    else:
        import os
        import signal

        os.kill(ray.get(appender.pid.remote()), signal.SIGKILL)  # the writer dies mid-run
        with pytest.raises(ray.exceptions.RayActorError):
            ray.get(run, timeout=120)
        again = ray.remote(Appender).remote(backend, str(tmp_path), name)
        assert ray.get(again.run.remote("after", 5), timeout=120) == 5  # the run goes on
    acknowledged = acks.read_text().split()
    stored = stored_ids(tmp_path / "memory")
    assert 30 <= len([a for a in acknowledged if a.startswith("k")]) <= 300
    assert set(acknowledged) <= set(stored) and len(stored) == len(set(stored))  # none lost, none twice
    assert len(set(stored) - set(acknowledged)) <= 1  # at most the record in flight, unacknowledged
    assert mins.lookup_and_lower("q", None) == 3  # read back from disk by a restarted actor
    if backend == "actor":
        assert sorted(stored) == sorted(acknowledged)
        ray.kill(memory.client.actor, no_restart=True)
