"""Resume: the run's stores follow OpenRLHF's checkpoints, and a fresh run refuses a used store.

The checkpoint methods are OpenRLHF 0.11.2's own (``BasePPOTrainer.init_checkpoint_states``
and ``save_logs_and_checkpoints``, compiled from the installed source: importing
``ppo_trainer`` needs vLLM, DeepSpeed and ``datasets``), patched by the hook's
``_patch_trainer`` as in the trainer actor. What stands in is the world they call: the actor
group that saves and loads DeepSpeed checkpoints, and ``ray.get`` on its (plain) results.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import logging
import os
import sys
import types
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("openrlhf.utils.agent", reason="needs openrlhf==0.11.2 (--no-deps)")

from searchgym.envs.rewards.lightsearcher import MinToolCallStore  # noqa: E402
from searchgym.memory import ExperienceMemory  # noqa: E402
from searchgym.memory.config import MemoryConfig  # noqa: E402
from searchgym.trainers import env_pool  # noqa: E402
from searchgym.trainers.advantages import AdvantageConfig  # noqa: E402
from searchgym.trainers.agent_config import AgentConfig  # noqa: E402
from searchgym.trainers.openrlhf import advantage_hook, compose, load_run_config  # noqa: E402
from searchgym.trainers.store_snapshots import FileStoreSnapshots, StoreStateError, run_stores  # noqa: E402


def rows(path: Path) -> list[tuple]:
    """Every record of a store log, read with SQLite itself."""
    import sqlite3

    conn = sqlite3.connect(path)
    try:
        return conn.execute("SELECT id, body FROM records ORDER BY id").fetchall()
    finally:
        conn.close()


def finished_trajectory(question_index: int, good: bool):
    """A finished SyntheticFacts episode: a right answer (good), or two searches and a wrong one."""
    import gymnasium as gym

    env = gym.make("searchgym/SyntheticFacts-v1", protocol="tool_call", reward="f1", max_turns=6)
    env.reset(options={"index": question_index})
    if good:
        answer = env.unwrapped.trajectory.question.golden_answers[0]
        env.step(f"<think>I know it.</think>\n<answer>{answer}</answer>")
    else:
        env.step("no tags")
        for query in ("a thing", "another thing"):
            env.step(
                f'<think>x</think>\n<tool_call>{{"name": "search", "arguments": {{"query": "{query}"}}}}</tool_call>'
            )
        env.step("<think>x</think>\n<answer>nobody</answer>")
    return env.unwrapped.trajectory


def openrlhf_trainer_class(ray_get, extra=()):
    """``BasePPOTrainer`` with OpenRLHF's own checkpoint methods (and those named in ``extra``),
    in a module the hook can patch."""
    source = os.path.join(
        os.path.dirname(importlib.util.find_spec("openrlhf").origin), "trainer", "ppo_trainer.py"
    )
    tree = ast.parse(Path(source).read_text(encoding="utf-8"))
    base = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "BasePPOTrainer")
    wanted = {
        "init_checkpoint_states",
        "save_logs_and_checkpoints",
        "save_best_checkpoint",
        "train_step",
        *extra,
    }
    methods = [n for n in base.body if isinstance(n, ast.FunctionDef) and n.name in wanted]
    assert {m.name for m in methods} == wanted
    namespace = {"os": os, "ray": SimpleNamespace(get=ray_get), "Dict": dict, "Tuple": tuple}
    namespace["logger"] = logging.getLogger("openrlhf")
    exec(compile(ast.Module(body=methods, type_ignores=[]), source, "exec"), namespace)
    module = types.ModuleType("openrlhf.trainer.ppo_trainer")
    module.BasePPOTrainer = type("BasePPOTrainer", (), {m.name: namespace[m.name] for m in methods})
    return module


class DeepSpeedCheckpoints:
    """The actor group's checkpoint calls: ``client_states`` saved per tag, the latest one loaded."""

    def __init__(self, folder: Path):
        self.folder = folder / "_actor"

    def async_run_method(self, method_name, **kwargs):
        if method_name == "save_checkpoint":
            tag = self.folder / kwargs["tag"]
            tag.mkdir(parents=True, exist_ok=True)
            (tag / "client_states.json").write_text(json.dumps(kwargs["client_states"]))
            return []
        assert method_name == "get_checkpoint_states"
        latest = max(self.folder.glob("global_step*"), key=lambda p: int(p.name.removeprefix("global_step")))
        return [json.loads((latest / "client_states.json").read_text())]


def trainer(module, ckpt: Path, load_enable: bool):
    t = object.__new__(module.BasePPOTrainer)
    t.args = SimpleNamespace(
        ckpt=SimpleNamespace(path=str(ckpt), load_enable=load_enable, save_steps=2),
        logger=SimpleNamespace(logging_steps=1),
    )
    t.actor_model_group, t.critic_model_group = DeepSpeedCheckpoints(ckpt), None
    t.wandb_logger = t.tensorboard_logger = None
    t.best_eval_metric_key, t.best_eval_metric_value, t._latest_eval_metric_value = "", None, None
    return t


@pytest.fixture
def hook(monkeypatch):
    saved = vars(advantage_hook._STATE).copy()
    monkeypatch.setattr(env_pool, "_MEMORIES", {})
    yield
    vars(advantage_hook._STATE).clear()
    vars(advantage_hook._STATE).update(saved)


def start_process(config, monkeypatch):
    """What a fresh trainer actor has: the hook's state for ``config``, no memory opened yet."""
    monkeypatch.setattr(advantage_hook, "_STATE", advantage_hook._State())
    monkeypatch.setattr(env_pool, "_MEMORIES", {})
    advantage_hook._STATE.config = config


def run_steps(t, module, first: int, last: int, agents, minima, log):
    """Steps ``first..last``: agents add episodes and lower minima, then OpenRLHF's step and save."""

    def ppo_step(self, rollout_samples, global_step):  # the DeepSpeed update is not the unit here
        return {"loss": 0.0}, global_step + 1

    train_step = advantage_hook.wrap_train_step(ppo_step, advantage_hook._STATE)
    for step in range(first, last + 1):
        for i in range(2):
            agents.add(finished_trajectory((2 * step + i) % 6, good=i == 0))
        minima.update(f"q{step}", 3)
        minima.update("q0", max(1, 5 - step))
        status, done = train_step(t, None, step - 1)  # OpenRLHF's global_step counts finished steps
        log.append((done, status.get("memory_updates")))
        states = {
            "episode": 0,
            "global_step": done,
            "total_consumed_prompts": done,
            "data_loader_state_dict": {},
        }
        module.BasePPOTrainer.save_logs_and_checkpoints(t, done, status, states)


def test_a_killed_run_resumes_its_stores_at_the_checkpoint(tmp_path, hook, monkeypatch):
    store, minima_file, ckpt = tmp_path / "memory", tmp_path / "min_tool_calls.sqlite", tmp_path / "ckpt"
    config = AgentConfig(
        "searchgym/SyntheticFacts-v1",
        env_kwargs={"reward": "lightsearcher", "reward_kwargs": {"store": str(minima_file)}},
        memory=MemoryConfig(kind="lightsearcher", path=str(store), update_every=2),
        advantage=AdvantageConfig(warmup_steps=4),
    )
    module = openrlhf_trainer_class(ray_get=lambda refs: refs)
    advantage_hook._patch_trainer(module)
    start_process(config, monkeypatch)
    t = trainer(module, ckpt, load_enable=True)
    assert t.init_checkpoint_states()["global_step"] == 0  # fresh, empty stores: fine
    agents, minima, log = ExperienceMemory(str(store)), MinToolCallStore(str(minima_file)), []
    run_steps(t, module, 1, 4, agents, minima, log)  # checkpoints at steps 2 and 4
    logs = (store / "trajectories.sqlite", store / "updates.sqlite", store / "bank.sqlite", minima_file)
    at_4 = {p: rows(p) for p in logs}
    run_steps(t, module, 5, 6, agents, minima, log)  # steps 5 and 6; the run dies before saving step 6
    (ckpt / "_actor" / "global_step6").rename(tmp_path / "lost")  # its checkpoint never landed
    assert [u for _, u in log] == [0.0, 1.0, 0.0, 1.0, 0.0, 1.0]
    assert MinToolCallStore(str(minima_file)).get("q0") == 1

    start_process(config, monkeypatch)  # the resumed run: a new trainer process
    t = trainer(module, ckpt, load_enable=True)
    assert t.init_checkpoint_states()["global_step"] == 4
    for path, data in at_4.items():  # every store is as it was at step 4 ...
        assert rows(path) == data
    cut = (store / "trajectories.sqlite.cut-4.jsonl").read_text().splitlines()
    assert len(cut) == 4 and len(rows(store / "trajectories.sqlite")) == 8  # ... and nothing is lost
    assert (
        MinToolCallStore(str(minima_file)).get("q0") == 1
        and MinToolCallStore(str(minima_file)).get("q5") is None
    )
    memory = ExperienceMemory(str(store))
    assert memory.steps == 4 and memory.experience.version == 2
    log.clear()
    run_steps(t, module, 5, 6, ExperienceMemory(str(store)), MinToolCallStore(str(minima_file)), log)
    assert [u for _, u in log] == [0.0, 1.0]  # step 6's update runs again, once
    assert advantage_hook._STATE.step == 5  # TSAS's stage follows the restored global_step (stage 2 from 4)


def test_a_fresh_run_refuses_a_store_that_holds_an_earlier_run(tmp_path, hook, monkeypatch):
    store = tmp_path / "memory"
    config = AgentConfig(
        "searchgym/SyntheticFacts-v1",
        memory=MemoryConfig(kind="lightsearcher", path=str(store), update_every=2),
    )
    ExperienceMemory(str(store)).add(finished_trajectory(0, good=True))
    module = openrlhf_trainer_class(ray_get=lambda refs: refs)
    advantage_hook._patch_trainer(module)
    start_process(config, monkeypatch)
    with pytest.raises(
        StoreStateError, match=r"starts fresh.*memory\.path.*move or delete.*load_enable: true.*another"
    ):
        trainer(module, tmp_path / "ckpt", load_enable=False).init_checkpoint_states()
    # the launcher refuses it before Ray starts, too
    run = tmp_path / "run.yaml"
    run.write_text(
        "backend: openrlhf\nenv: {id: searchgym/SyntheticFacts-v1}\n"
        f"memory: {{kind: lightsearcher, path: {store}}}\n"
        "openrlhf:\n  actor: {model_name_or_path: m, num_gpus_per_node: 1}\n  vllm: {num_engines: 1}\n"
        "  train: {batch_size: 8}\n  rollout: {n_samples_per_prompt: 4, batch_size: 2}\n"
        "  algo: {advantage: {estimator: group_norm}}\n  data: {prompt_dataset: train.jsonl}\n"
        f"  ckpt: {{path: {tmp_path / 'ckpt'}, load_enable: true}}\n"
    )
    with pytest.raises(StoreStateError, match="earlier run"):
        compose(load_run_config(run), basedir=str(tmp_path))
    (tmp_path / "ckpt" / "_actor").mkdir(parents=True)  # a checkpoint to resume from: the trainer restores
    (tmp_path / "train.jsonl").write_text(
        '{"prompt": "q", "label": "{}"}\n' * 8
    )  # the dry run counts its rows
    compose(load_run_config(run), basedir=str(tmp_path))


def test_a_resume_without_a_snapshot_of_its_step_is_refused(tmp_path):
    mins = MinToolCallStore(tmp_path / "a.sqlite")
    snaps = FileStoreSnapshots("the store", mins)
    mins.update("q", 1)
    snaps.snapshot(2)
    with pytest.raises(StoreStateError, match=r"the store has no snapshot of that step.*snapshots: 2"):
        snaps.restore(4)
    assert mins.minima() == {"q": 1}  # nothing was cut


def test_run_stores_covers_what_training_writes(tmp_path):
    memory = MemoryConfig(kind="lightsearcher", path=str(tmp_path / "m"))
    # the scheme names its shared store (RewardScheme.shared_store): LightSearcher's "store"
    inside = {
        "reward": "lightsearcher",
        "reward_kwargs": {"store": str(tmp_path / "m" / "min_tool_calls.sqlite")},
    }
    outside = {"reward": "lightsearcher", "reward_kwargs": {"store": str(tmp_path / "min.sqlite")}}
    assert len(run_stores(AgentConfig("searchgym/SyntheticFacts-v1", env_kwargs=inside, memory=memory))) == 1
    assert len(run_stores(AgentConfig("searchgym/SyntheticFacts-v1", env_kwargs=outside, memory=memory))) == 2
    assert len(run_stores(AgentConfig("searchgym/SyntheticFacts-v1", env_kwargs=outside))) == 1
    hiexp = MemoryConfig(kind="hiexp", path=str(tmp_path / "h"))  # built offline, read-only in training
    assert run_stores(AgentConfig("searchgym/SyntheticFacts-v1", memory=hiexp)) == []
    assert advantage_hook.needs_hook(AgentConfig("searchgym/SyntheticFacts-v1", env_kwargs=outside))
    f1 = {"reward": "f1", "reward_kwargs": {"format_penalty": -1.0}}  # a scheme without a shared store
    assert run_stores(AgentConfig("searchgym/SyntheticFacts-v1", env_kwargs=f1)) == []


@pytest.mark.slow
def test_the_agent_file_refuses_a_ray_job_without_the_hook(tmp_path):
    """OpenRLHF loads the agent file in each vLLM actor; without the job's hook it fails there."""
    ray = pytest.importorskip("ray")
    if ray.is_initialized():
        pytest.skip("another test left Ray running")
    from searchgym.trainers.openrlhf import agent_file_path

    config = tmp_path / "agent.yaml"
    config.write_text(
        f"env: {{id: searchgym/SyntheticFacts-v1}}\nmemory: {{kind: lightsearcher, path: {tmp_path}/m}}\n"
    )
    ray.init(
        num_cpus=1,
        include_dashboard=False,
        object_store_memory=100 * 1024**2,
        log_to_driver=False,
        runtime_env={"env_vars": {"SEARCHGYM_AGENT_CONFIG": str(config)}},  # the README route before: no hook
    )
    try:

        @ray.remote
        def load_agent_file(path):  # what OpenRLHF's _load_agent_executor does first
            spec = importlib.util.spec_from_file_location("agent_module", path)
            module = importlib.util.module_from_spec(spec)
            try:
                spec.loader.exec_module(module)
            except Exception as exc:  # noqa: BLE001  (the message is what the test reads)
                return f"{type(exc).__name__}: {exc}"
            return "loaded"

        message = ray.get(load_agent_file.remote(agent_file_path()), timeout=180)
    finally:
        ray.shutdown()
    assert message.startswith("SearchGymError") and "worker_process_setup_hook" in message
    assert advantage_hook.HOOK in message and "searchgym train --backend openrlhf" in message
    assert "ray" not in sys.modules or not ray.is_initialized()


def test_a_best_checkpoint_snapshots_the_stores_too(tmp_path, hook, monkeypatch):
    """OpenRLHF's eval-driven ``best_global_stepN`` is a checkpoint a resume may load."""
    from searchgym.trainers.openrlhf.resume import wrap_save_best_checkpoint

    memory = MemoryConfig(kind="lightsearcher", path=str(tmp_path / "m"))
    config = AgentConfig("searchgym/SyntheticFacts-v1", memory=memory)
    module = openrlhf_trainer_class(ray_get=lambda refs: refs)
    advantage_hook._patch_trainer(module)
    assert getattr(module.BasePPOTrainer.save_best_checkpoint, "__searchgym_wrapped__", False)
    saved = []
    save = wrap_save_best_checkpoint(
        lambda self, metrics, step, states=None: saved.append(step), lambda: config
    )
    save(None, {"eval_pass1": 0.5}, 7)
    assert saved == [7] and run_stores(config)[0].steps() == [7]


# -- OpenRLHF's async trainer: its best checkpoint records the trainer's step, not the eval's --------


def openrlhf_async_classes(base_module):
    """``TrainingActor``, ``GenerateSamplesActor`` and ``PPOTrainerAsync`` with OpenRLHF 0.11.2's own
    ``fit`` methods (compiled from ``ppo_trainer_async.py``, which imports vLLM through
    ``ppo_trainer``), over ``base_module``'s patched ``BasePPOTrainer``. What stands in is Ray:
    ``.remote`` runs the method in a thread, ``ray.get`` waits for it, queues are ``queue.Queue``."""
    source = os.path.join(
        os.path.dirname(importlib.util.find_spec("openrlhf").origin), "trainer", "ppo_trainer_async.py"
    )
    tree = ast.parse(Path(source).read_text(encoding="utf-8"))
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    wanted = {
        "GenerateSamplesActor": {"_should_eval", "_run_eval", "fit"},
        "TrainingActor": {"fit"},
        "PPOTrainerAsync": {"fit"},
    }
    namespace = {
        "ray": SimpleNamespace(get=ray_get_threads),
        "time": __import__("time"),
        "tqdm": lambda *a, **k: SimpleNamespace(update=lambda n: None, close=lambda: None),
        "logger": logging.getLogger("openrlhf"),
        "compute_eval_metrics": lambda loader, samples, n: {"eval_searchgym_pass1": 0.5},
        "BasePPOTrainer": base_module.BasePPOTrainer,
    }
    out = {}
    for name, methods in wanted.items():
        body = [n for n in classes[name].body if isinstance(n, ast.FunctionDef) and n.name in methods]
        assert {m.name for m in body} == methods
        exec(compile(ast.Module(body=body, type_ignores=[]), source, "exec"), namespace)
        bases = (base_module.BasePPOTrainer,) if name == "TrainingActor" else ()
        out[name] = type(name, bases, {m: namespace[m] for m in methods})
    return out


def ray_get_threads(refs, timeout=120):
    """``ray.get`` over the stand-in's futures (and the plain values the checkpoint fakes return)."""
    from concurrent.futures import Future

    if isinstance(refs, list):
        return [ray_get_threads(r, timeout) for r in refs]
    return refs.result(timeout=timeout) if isinstance(refs, Future) else refs


class Remote:
    """A Ray actor handle stand-in: ``handle.method.remote(...)`` runs the method in its own thread."""

    def __init__(self, obj):
        self._obj = obj

    def __getattr__(self, name):
        import threading
        from concurrent.futures import Future

        def remote(*args, **kwargs):
            future: Future = Future()

            def run():
                try:
                    future.set_result(getattr(self._obj, name)(*args, **kwargs))
                except BaseException as exc:  # noqa: BLE001  (handed to ray.get, as Ray does)
                    future.set_exception(exc)

            threading.Thread(target=run, daemon=True).start()
            return future

        return SimpleNamespace(remote=remote)


class LatestCheckpoints(DeepSpeedCheckpoints):
    """DeepSpeed's ``save_checkpoint(save_latest=True)`` and ``load_checkpoint(tag=None)``: the tag
    saved last is written to ``latest``, and that is the one loaded; a new best replaces the old."""

    def async_run_method(self, method_name, **kwargs):
        if method_name == "save_checkpoint":
            if kwargs["tag"].startswith("best"):
                for old in self.folder.glob("best*"):
                    if old.name != kwargs["tag"]:
                        import shutil

                        shutil.rmtree(old)
            super().async_run_method(method_name, **kwargs)
            (self.folder / "latest").write_text(kwargs["tag"])
            return []
        tag = (self.folder / "latest").read_text()
        return [json.loads((self.folder / tag / "client_states.json").read_text())]


class Prompts:
    """OpenRLHF's stateful prompts dataloader: its position is its state."""

    def __init__(self, batches):
        self.batches, self.position = batches, 0

    def __len__(self):
        return self.batches

    def state_dict(self):
        return {"position": self.position}

    def load_state_dict(self, state):
        self.position = state["position"]


class Rollouts:
    """vLLM's side of ``SamplesGenerator``: each batch's agents add their episodes to the memory."""

    def __init__(self, prompts, store):
        self.prompts, self.store = prompts, store

    def generate_samples(self, **kwargs):
        batch = self.prompts.position
        memory = ExperienceMemory(str(self.store))
        for i in range(2):
            memory.add(finished_trajectory((2 * batch + i) % 6, good=i == 0))
        self.prompts.position += 1
        return [f"batch{batch}"], 1.0, 1, self.prompts.position == len(self.prompts)

    def generate_eval_samples(self, **kwargs):
        return []


def async_run(classes, module, ckpt: Path, store: Path, crash_at: int | None):
    """One ``PPOTrainerAsync.fit`` with queue size 1, eval and checkpoints every 2 steps, 4 batches."""
    import queue

    args = SimpleNamespace(
        ckpt=SimpleNamespace(path=str(ckpt), load_enable=True, save_steps=2),
        logger=SimpleNamespace(logging_steps=1),
        eval=SimpleNamespace(steps=2, temperature=0.6, n_samples_per_prompt=1),
        train=SimpleNamespace(num_episodes=1),
        algo=SimpleNamespace(dynamic_filtering_enable=False),
    )
    rollout_queue, slots = queue.Queue(maxsize=1), queue.Queue(maxsize=1)
    slots.put(0)
    lock = SimpleNamespace(
        acquire=SimpleNamespace(remote=lambda: None), release=SimpleNamespace(remote=lambda: None)
    )
    generator = object.__new__(classes["GenerateSamplesActor"])
    prompts = Prompts(4)
    vars(generator).update(
        args=args,
        generate_kwargs={},
        prompts_dataloader=prompts,
        eval_dataloader=["eval"],
        samples_generator=Rollouts(prompts, store),
        vllm_lock=lock,
        _partial_rollout=False,
        rollout_queue=rollout_queue,
        rollout_slots=slots,
        _last_eval_step=-1,
        _eval_just_done=False,
    )
    generator.load_state_dict = prompts.load_state_dict

    def ppo_step(self, rollout_samples, global_step):  # the DeepSpeed update is not the unit here
        if global_step + 1 == crash_at:
            raise RuntimeError("the node died")
        return {"loss": 0.0}, global_step + 1

    trainer = object.__new__(classes["TrainingActor"])
    vars(trainer).update(vars(_trainer_fields(module, ckpt, args)))
    vars(trainer).update(
        vllm_lock=lock, _partial_rollout=False, rollout_queue=rollout_queue, rollout_slots=slots
    )
    trainer.train_step = advantage_hook.wrap_train_step(ppo_step, advantage_hook._STATE).__get__(trainer)
    trainer.broadcast_to_vllm = lambda: None
    run = object.__new__(classes["PPOTrainerAsync"])
    run.generator_actor, run.trainer_actor = Remote(generator), Remote(trainer)
    run.fit()


def _trainer_fields(module, ckpt, args):
    t = trainer(module, ckpt, load_enable=True)
    t.args = args
    t.actor_model_group = LatestCheckpoints(ckpt)
    t.best_eval_metric_value = float("-inf")
    return t


def test_async_training_resumes_from_its_best_checkpoint(tmp_path, hook, monkeypatch):
    store, ckpt = tmp_path / "memory", tmp_path / "ckpt"
    config = AgentConfig(
        "searchgym/SyntheticFacts-v1",
        memory=MemoryConfig(kind="lightsearcher", path=str(store), update_every=2),
    )
    module = openrlhf_trainer_class(
        ray_get_threads, ("restore_best_checkpoint_state", "_detect_eval_metric_key")
    )
    advantage_hook._patch_trainer(module)
    classes = openrlhf_async_classes(module)
    start_process(config, monkeypatch)
    with pytest.raises(RuntimeError, match="the node died"):
        async_run(classes, module, ckpt, store, crash_at=4)
    # The eval ran on the step-2 token while the trainer trained batch 3; its best checkpoint
    # holds the trainer's step: OpenRLHF's own bookkeeping, which the resume below loads.
    best = json.loads((ckpt / "_actor" / "best_global_step2" / "client_states.json").read_text())
    assert (ckpt / "_actor" / "latest").read_text() == "best_global_step2" and best["global_step"] == 3
    assert best["data_loader_state_dict"] == {"position": 3}
    assert 3 in run_stores(config)[0].steps()

    start_process(config, monkeypatch)  # the resumed run: a new trainer process
    async_run(classes, module, ckpt, store, crash_at=None)  # resumes at step 3 and trains batch 4
    assert (ckpt / "_actor" / "latest").read_text() == "global_step4"
    memory = ExperienceMemory(str(store))
    assert memory.steps == 4 and memory.experience.version == 2  # updates at steps 2 and 4, once each
    kept = [
        json.loads(body)["trajectory"]["question"]["id"] for _, body in rows(store / "trajectories.sqlite")
    ]
    batches = [
        [finished_trajectory((2 * b + i) % 6, good=i == 0).question.id for i in range(2)] for b in range(4)
    ]
    assert kept[:6] == batches[0] + batches[1] + batches[2]  # as the best checkpoint's step 3 left them
    # OpenRLHF's generator runs ahead: batch 3's episodes may be written before the best
    # checkpoint's snapshot, and the resumed run generates batch 3 again.
    assert kept[-2:] == batches[3] and set(kept[6:]) == set(batches[3])
