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
from searchgym.trainers.openrlhf import advantage_hook, compose, env_pool, load_run_config  # noqa: E402
from searchgym.trainers.openrlhf.config import AdvantageConfig, AgentConfig, MemoryConfig  # noqa: E402
from searchgym.trainers.openrlhf.resume import FileStoreSnapshots, StoreStateError, run_stores  # noqa: E402


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

    env = gym.make("searchgym/SyntheticFacts-v0", protocol="tool_call", reward="f1", max_turns=6)
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


def openrlhf_trainer_class(ray_get):
    """``BasePPOTrainer`` with OpenRLHF's own checkpoint methods, in a module the hook can patch."""
    source = os.path.join(
        os.path.dirname(importlib.util.find_spec("openrlhf").origin), "trainer", "ppo_trainer.py"
    )
    tree = ast.parse(Path(source).read_text(encoding="utf-8"))
    base = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "BasePPOTrainer")
    wanted = {"init_checkpoint_states", "save_logs_and_checkpoints", "save_best_checkpoint", "train_step"}
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
        "searchgym/SyntheticFacts-v0",
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
        "searchgym/SyntheticFacts-v0",
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
        "agent:\n  env_id: searchgym/SyntheticFacts-v0\n"
        f"  memory: {{kind: lightsearcher, path: {store}}}\n"
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
    inside = {"reward_kwargs": {"store": str(tmp_path / "m" / "min_tool_calls.sqlite")}}
    outside = {"reward_kwargs": {"store": str(tmp_path / "min.sqlite")}}
    assert len(run_stores(AgentConfig("searchgym/SyntheticFacts-v0", env_kwargs=inside, memory=memory))) == 1
    assert len(run_stores(AgentConfig("searchgym/SyntheticFacts-v0", env_kwargs=outside, memory=memory))) == 2
    assert len(run_stores(AgentConfig("searchgym/SyntheticFacts-v0", env_kwargs=outside))) == 1
    hiexp = MemoryConfig(kind="hiexp", path=str(tmp_path / "h"))  # built offline, read-only in training
    assert run_stores(AgentConfig("searchgym/SyntheticFacts-v0", memory=hiexp)) == []
    assert advantage_hook.needs_hook(AgentConfig("searchgym/SyntheticFacts-v0", env_kwargs=outside))


@pytest.mark.slow
def test_the_agent_file_refuses_a_ray_job_without_the_hook(tmp_path):
    """OpenRLHF loads the agent file in each vLLM actor; without the job's hook it fails there."""
    ray = pytest.importorskip("ray")
    if ray.is_initialized():
        pytest.skip("another test left Ray running")
    from searchgym.trainers.openrlhf import agent_file_path

    config = tmp_path / "agent.yaml"
    config.write_text(
        f"env_id: searchgym/SyntheticFacts-v0\nmemory: {{kind: lightsearcher, path: {tmp_path}/m}}\n"
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
    config = AgentConfig("searchgym/SyntheticFacts-v0", memory=memory)
    module = openrlhf_trainer_class(ray_get=lambda refs: refs)
    advantage_hook._patch_trainer(module)
    assert getattr(module.BasePPOTrainer.save_best_checkpoint, "__searchgym_wrapped__", False)
    saved = []
    save = wrap_save_best_checkpoint(
        lambda self, metrics, step, states=None: saved.append(step), lambda: config
    )
    save(None, {"eval_pass1": 0.5}, 7)
    assert saved == [7] and run_stores(config)[0].steps() == [7]
