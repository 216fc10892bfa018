"""A store actor belongs to one run, on a persistent Ray cluster (``ray start --head``).

Each run is a driver process that joins the cluster as a new Ray job, as the multi-node
recipe's ``searchgym train`` does: it composes its launch (``launch.compose``: the actor's
name), runs the driver's check (``train_ppo.check_stores``) and OpenRLHF's
``init_checkpoint_states`` patched by the hook (which starts the run's store actor and
checks the stores through it), then its agents add episodes through the actor. The cluster
outlives the runs, as a cluster started with ``ray start`` does.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("openrlhf.utils.agent", reason="needs openrlhf==0.11.2 (--no-deps)")
ray = pytest.importorskip("ray")

from searchgym.trainers.store_actors import StoreActorInfo, actors_serving  # noqa: E402

TESTS = Path(__file__).resolve().parent

RUN = """\
backend: openrlhf
env:
  id: searchgym/SyntheticFacts-v1
  protocol: tool_call
  reward: lightsearcher
  reward_kwargs: {{store: runs/min_tool_calls.sqlite}}
memory: {{kind: lightsearcher, path: runs/memory, update_every: {update_every}}}
openrlhf:
  actor: {{model_name_or_path: m, num_gpus_per_node: 1}}
  ref: {{num_gpus_per_node: 1}}
  vllm: {{num_engines: 1}}
  train: {{batch_size: 8}}
  rollout: {{n_samples_per_prompt: 4, batch_size: 2}}
  algo: {{advantage: {{estimator: group_norm}}}}
  data: {{prompt_dataset: train.jsonl}}
  ckpt: {{path: ckpt}}
"""

DRIVER = r"""
import json, os, sys
sys.path.insert(0, sys.argv[4])
address, run_file, mode = sys.argv[1:4]
from searchgym.error import SearchGymError
from searchgym.trainers.openrlhf import advantage_hook
from searchgym.trainers.env_pool import open_memory
from searchgym.trainers.openrlhf.config import load_run_config
from searchgym.trainers.store_client import store_client
from searchgym.trainers.openrlhf.launch import compose
from searchgym.trainers.openrlhf.train_ppo import check_stores
from test_openrlhf_resume import finished_trajectory, openrlhf_trainer_class, trainer

run = load_run_config(run_file)
plan = compose(run, basedir=os.path.dirname(run_file))  # the launcher: this launch's actor name
os.environ.update(plan.runtime_env["env_vars"])  # what every process of the job gets
import ray
ray.init(address=address, log_to_driver=False)  # a new job on the running cluster
try:
    if mode != "trainer-only":
        check_stores(plan.runtime_env)  # train_ppo's check, before any model loads
    module = openrlhf_trainer_class(ray_get=lambda refs: refs)  # OpenRLHF's own init_checkpoint_states
    advantage_hook._patch_trainer(module)
    advantage_hook._STATE.config = run.agent
    from pathlib import Path
    trainer(module, Path(run_file).parent / "ckpt", load_enable=False).init_checkpoint_states()
except SearchGymError as exc:
    print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}), flush=True)
    sys.exit(0)
memory = open_memory(run.agent.memory, run.agent)  # what the agents use
before = len(memory)
for i in range(3 if mode != "hold" else 0):  # a held run is still loading its models
    memory.add(finished_trajectory(i, good=i == 0))
info = store_client(run.agent).call("describe")
out = {"name": store_client(run.agent).name, "before": before, "after": len(memory), "pid": info["pid"],
       "update_every": info["settings"]["update_every"], "run": info["owner"]["run_id"], "detached": info["detached"]}
print(json.dumps(out), flush=True)
if mode == "hold":
    sys.stdin.readline()  # the run goes on until the test ends it
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def cluster() -> Any:
    """A Ray head started with ``ray start --head --block`` (its process group is ended after)."""
    if ray.is_initialized():
        ray.shutdown()
    previous_mode = os.environ.get("RAY_AUTH_MODE")
    set_auth_mode("disabled")  # no token for the drivers to find (Ray 2.60 asks for one)
    port, client, agent = _free_port(), _free_port(), _free_port()
    temp = tempfile.mkdtemp(prefix="sgray", dir="/tmp")
    ray_bin = Path(sys.executable).with_name("ray")
    head = subprocess.Popen(
        [
            str(ray_bin),
            "start",
            "--head",
            "--block",
            f"--port={port}",
            f"--ray-client-server-port={client}",
            f"--dashboard-agent-listen-port={agent}",
            "--node-ip-address=127.0.0.1",
            "--num-cpus=2",
            "--include-dashboard=false",
            "--disable-usage-stats",
            f"--temp-dir={temp}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    address = f"127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # wait until a driver can join
        probe = subprocess.run(
            [sys.executable, "-c", f"import ray; ray.init(address={address!r}, log_to_driver=False)"],
            capture_output=True,
            timeout=120,
        )
        if probe.returncode == 0:
            break
        time.sleep(2)
    else:
        os.killpg(head.pid, signal.SIGTERM)
        pytest.fail("ray start --head did not come up in 120 s")
    yield address
    os.killpg(head.pid, signal.SIGTERM)  # the group this fixture started, by its id
    try:
        head.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(head.pid, signal.SIGKILL)
    shutil.rmtree(temp, ignore_errors=True)
    set_auth_mode(previous_mode)  # later in-process clusters run as they would without this module


def set_auth_mode(mode: str | None) -> None:
    """Set ``RAY_AUTH_MODE`` for this process's Ray and the processes it starts (``None``: unset).

    Ray caches the mode in its config when it first reads it; a driver left on the old mode
    starts clusters whose GCS cannot call it back (it then ends every actor the driver owns).
    """
    from ray._raylet import AuthenticationTokenLoader, Config

    if mode is None:
        os.environ.pop("RAY_AUTH_MODE", None)
    else:
        os.environ["RAY_AUTH_MODE"] = mode
    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()


def write_run(folder: Path, update_every: int) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "train.jsonl").write_text("{}\n" * 8)  # whole rollout batches (the launch counts them)
    path = folder / "run.yaml"
    path.write_text(RUN.format(update_every=update_every))
    return path


def start_run(address: str, run_file: Path, mode: str = "exit") -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", DRIVER, address, str(run_file), mode, str(TESTS)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=run_file.parent,
    )


def result(process: subprocess.Popen) -> dict[str, Any]:
    """The driver's JSON line (waits for it)."""
    assert process.stdout is not None
    line = process.stdout.readline()
    if not line:
        process.wait(timeout=60)
        raise AssertionError(process.stderr.read()[-3000:] if process.stderr else "no output")
    return json.loads(line)


def finish(process: subprocess.Popen) -> None:
    if process.poll() is None and process.stdin is not None:
        process.stdin.write("\n")
        process.stdin.flush()
    assert process.wait(timeout=120) == 0, process.stderr.read()[-3000:] if process.stderr else ""


def memory_cli(address: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "searchgym", "memory", "actors", "--ray-address", address, *args],
        capture_output=True,
        text=True,
        timeout=180,
    )


def wait_for_no_actors(address: str) -> str:
    deadline = time.monotonic() + 60
    while True:
        out = memory_cli(address)
        assert out.returncode == 0, out.stderr
        if "No store actor lives" in out.stdout or time.monotonic() > deadline:
            return out.stdout
        time.sleep(2)


@pytest.mark.slow
def test_a_second_run_gets_its_own_actor_and_sees_the_moved_store_empty(cluster: str, tmp_path: Path) -> None:
    first = start_run(cluster, write_run(tmp_path, update_every=1))
    one = result(first)
    finish(first)
    assert one["before"] == 0 and one["after"] == 3 and one["update_every"] == 1 and not one["detached"]
    assert "No store actor lives" in wait_for_no_actors(cluster)  # the actor ended with its run

    # Start fresh, as the fresh-run error advises: move the files aside.
    (tmp_path / "runs").rename(tmp_path / "runs.first")
    second = start_run(cluster, write_run(tmp_path, update_every=3))
    two = result(second)
    finish(second)
    assert two["before"] == 0 and two["after"] == 3  # what is really in the store: nothing, then its own
    assert two["update_every"] == 3 and two["pid"] != one["pid"] and two["run"] != one["run"]
    assert two["name"] != one["name"] and two["name"].rsplit("-", 1)[0] == one["name"].rsplit("-", 1)[0]
    from searchgym.memory import MemoryStore

    assert MemoryStore(tmp_path / "runs.first" / "memory").log("trajectories").count() == 3  # untouched since


@pytest.mark.slow
def test_two_live_runs_on_one_store_are_refused(cluster: str, tmp_path: Path) -> None:
    run_file = write_run(tmp_path, update_every=2)
    first = start_run(cluster, run_file, mode="hold")
    try:
        one = result(first)
        for mode in ("exit", "trainer-only"):  # the driver refuses it; a submitted job's trainer too
            refused = result(start_run(cluster, run_file, mode=mode))
            message = refused.get("error", "")
            assert message.startswith("StoreInUseError: agent.memory.path"), refused
            assert f"'{one['name']}'" in message and f"run {one['run']}" in message
            assert f"`searchgym memory actors --kill {one['name']}`" in message and "\n" not in message
    finally:
        finish(first)
    wait_for_no_actors(cluster)
    again = start_run(cluster, run_file)  # the first run has ended: the store is free
    assert result(again)["after"] == 3
    finish(again)


@pytest.mark.slow
def test_a_stale_detached_actor_is_named_and_ended_by_the_command(cluster: str, tmp_path: Path) -> None:
    """An actor that outlives its run (detached, as older searchgym versions started it)."""
    from searchgym.trainers.ray_store import StoreSpec, start_store_actor

    run_file = write_run(tmp_path, update_every=2)
    runs = tmp_path / "runs"
    spec = StoreSpec(str(runs / "memory"), {"update_every": 1}, str(runs / "min_tool_calls.sqlite"))
    ray.init(address=cluster, log_to_driver=False)
    try:
        stale = "searchgym-store-left-behind"
        ray.get(start_store_actor(spec, stale, on_head=False).pid.remote())
    finally:
        ray.shutdown()  # its job ends; the detached actor stays
    refused = result(start_run(cluster, run_file))
    assert f"'{stale}'" in refused["error"] and f"--kill {stale}`" in refused["error"]
    listed = memory_cli(cluster)
    assert (
        listed.returncode == 0
        and f"{stale}: no run recorded" in listed.stdout
        and "detached" in listed.stdout
    )
    assert f"memory {runs / 'memory'} (update_every 1)" in listed.stdout
    typo = memory_cli(cluster, "--kill", stale[:-1])
    assert (
        typo.returncode != 0 and "Did you mean" in typo.stderr and len(typo.stderr.strip().splitlines()) == 1
    )
    killed = memory_cli(cluster, "--kill", stale)
    assert killed.returncode == 0 and f"Ended the store actor {stale}" in killed.stdout, killed.stderr
    assert "No store actor lives" in wait_for_no_actors(cluster)
    ok = start_run(cluster, run_file)
    assert "error" not in result(ok)
    finish(ok)


def test_actors_serving_matches_paths_and_old_names(tmp_path: Path) -> None:
    mine = [str(tmp_path / "memory"), str(tmp_path / "mins.sqlite")]
    actors = [
        StoreActorInfo("a", memory_path=str(tmp_path / "other")),
        StoreActorInfo("b", min_tool_calls_path=str(tmp_path / "x" / ".." / "mins.sqlite")),  # same file
        StoreActorInfo(
            "searchgym-store-abc", error="an actor of an older searchgym"
        ),  # named after our paths
        StoreActorInfo("searchgym-store-abd", error="an actor of an older searchgym"),
    ]
    found = actors_serving(mine, actors, names=["searchgym-store-abc"])
    assert [a.name for a in found] == ["b", "searchgym-store-abc"]
