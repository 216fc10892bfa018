"""``ckpt.save_hf``'s copies are rotated with the checkpoints, and the dry run says the disk a run needs.

OpenRLHF 0.11.2's ``PolicyModelActor.save_checkpoint`` and ``DeepspeedStrategy.save_ckpt``
(its rotation, ``_read_ckpt_metric``, ``_write_ckpt_metric``) run as installed, compiled from
their source since their modules import DeepSpeed. What stands in: the DeepSpeed engine
(``save_checkpoint`` writes the tag folder), ``save_model`` (writes the ``_hf`` folder), the
barrier, and the clock (each save is a minute later, as steps of a real run are).
"""

from __future__ import annotations

import json
import os
import shutil
import types
from pathlib import Path

import pytest
from test_openrlhf_epochs import openrlhf_function

from searchgym.trainers.openrlhf import compose, load_run_config
from searchgym.trainers.openrlhf.advantage_hook import HOOK
from searchgym.trainers.openrlhf.checkpoints import disk_lines, prune_hf_copies, wrap_save_checkpoint
from searchgym.trainers.openrlhf.flags import check_flags, openrlhf_parser

pytestmark = pytest.mark.skipif(openrlhf_parser() is None, reason="needs openrlhf==0.11.2 (--no-deps)")


class Engine:
    """DeepSpeed's engine: ``save_checkpoint`` writes ``save_dir/tag``."""

    def save_checkpoint(self, save_dir, tag, client_state=None, save_latest=True):
        os.makedirs(os.path.join(save_dir, tag), exist_ok=True)
        Path(save_dir, tag, "mp_rank_00_model_states.pt").write_bytes(b"x" * 10)


def strategy_class():
    deepspeed = types.SimpleNamespace(DeepSpeedEngine=Engine)
    namespace = {
        "os": os,
        "shutil": shutil,
        "json": json,
        "gc": __import__("gc"),
        "deepspeed": deepspeed,
        "torch_dist_barrier_and_cuda_sync": lambda: None,
    }
    members = {
        name: openrlhf_function("utils/deepspeed/deepspeed.py", f"DeepspeedStrategy.{name}", namespace)
        for name in ("save_ckpt", "_read_ckpt_metric", "_write_ckpt_metric", "_get_ckpt_metric_path")
    }

    def save_model(self, model, tokenizer, output_dir, **kwargs):
        os.makedirs(output_dir, exist_ok=True)
        Path(output_dir, "model.safetensors").write_bytes(b"w" * 10)

    return type(
        "Strategy",
        (),
        {
            **members,
            "CKPT_METRIC_FILENAME": "metric.json",
            "is_rank_0": lambda self: True,
            "print": lambda self, *a: None,
            "save_model": save_model,
        },
    )


def actor_class():
    save = openrlhf_function(
        "trainer/ray/ppo_actor.py",
        "PolicyModelActor.save_checkpoint",
        {"os": os, "torch_dist_barrier_and_cuda_sync": lambda: None},
    )
    return type("PolicyModelActor", (), {"save_checkpoint": save})


def make_actor(cls, tmp_path: Path, *, save_hf=True, disable_ds=False, max_num=3):
    ckpt = types.SimpleNamespace(
        path=str(tmp_path / "ckpt"), max_num=max_num, max_mem=float("inf"), save_hf=save_hf
    )
    actor = cls()
    actor.strategy = strategy_class()()
    actor.strategy.args = types.SimpleNamespace(ckpt=ckpt, train=types.SimpleNamespace(enable_ema=False))
    actor.actor, actor.tokenizer, actor.ema_model = types.SimpleNamespace(model=Engine()), None, None
    actor.save_hf_ckpt, actor.disable_ds_ckpt = save_hf, disable_ds
    return actor


def run_saves(actor, tmp_path: Path, steps: int = 360, save_steps: int = 20, best_at=()) -> None:
    """``PPOTrainer``'s saves over a run: ``global_stepN`` every ``save_steps``, ``best_global_stepN`` at ``best_at``."""
    for step in range(save_steps, steps + 1, save_steps):
        for tag in [f"global_step{step}"] + ([f"best_global_step{step}"] if step in best_at else []):
            actor.save_checkpoint(tag, client_states={}, metric_value=None, metric_key=None)
            for folder in (tmp_path / "ckpt" / "_actor" / tag, tmp_path / "ckpt" / f"{tag}_hf"):
                if folder.exists():  # a minute per step
                    os.utime(folder, (1_000_000 + step * 60, 1_000_000 + step * 60))


def hf_copies(tmp_path: Path) -> list[str]:
    return sorted(p.name for p in (tmp_path / "ckpt").iterdir() if p.name.endswith("_hf"))


def test_openrlhf_alone_keeps_every_hf_copy(tmp_path):
    actor = make_actor(actor_class(), tmp_path)
    run_saves(actor, tmp_path)
    assert sorted(os.listdir(tmp_path / "ckpt" / "_actor")) == [
        "global_step320",
        "global_step340",
        "global_step360",
    ]
    assert len(hf_copies(tmp_path)) == 18  # the issue's ~18 copies


def test_the_wrapped_save_keeps_the_hf_copies_of_the_kept_checkpoints(tmp_path):
    cls = actor_class()
    cls.save_checkpoint = wrap_save_checkpoint(cls.save_checkpoint)
    actor = make_actor(cls, tmp_path)
    run_saves(actor, tmp_path, best_at=(100, 240))
    kept = sorted(
        d for d in os.listdir(tmp_path / "ckpt" / "_actor") if (tmp_path / "ckpt" / "_actor" / d).is_dir()
    )
    assert kept == ["best_global_step240", "global_step320", "global_step340", "global_step360"]
    assert hf_copies(tmp_path) == [f"{tag}_hf" for tag in kept]


def test_without_deepspeed_checkpoints_the_newest_are_kept(tmp_path):
    cls = actor_class()
    cls.save_checkpoint = wrap_save_checkpoint(cls.save_checkpoint)
    actor = make_actor(cls, tmp_path, disable_ds=True, max_num=2)
    actor.strategy.args.ckpt.disable_ds = True
    run_saves(actor, tmp_path, steps=100, best_at=(40, 80))
    assert hf_copies(tmp_path) == ["best_global_step80_hf", "global_step100_hf", "global_step80_hf"]
    assert prune_hf_copies(str(tmp_path / "absent"), 3) == []


def test_the_hook_wraps_the_actor_once():
    from searchgym.trainers.openrlhf.advantage_hook import _patch_actor

    cls = actor_class()
    module = types.SimpleNamespace(PolicyModelActor=cls)
    _patch_actor(module)
    first = cls.save_checkpoint
    _patch_actor(module)
    assert cls.save_checkpoint is first and first.__wrapped__.__name__ == "save_checkpoint"


RUN = """\
backend: openrlhf
env: {{id: searchgym/SyntheticFacts-v1, protocol: tool_call}}
openrlhf:
  actor: {{model_name_or_path: {model}, num_gpus_per_node: 1}}
  vllm: {{num_engines: 1}}
  train: {{batch_size: 8, num_episodes: 2}}
  rollout: {{n_samples_per_prompt: 4, batch_size: 2}}
  algo: {{advantage: {{estimator: group_norm}}}}
  data: {{prompt_dataset: {prompts}}}
  ckpt: {{save_steps: 5, max_num: 3, save_hf: true, path: ck, output_dir: out}}
"""


def write_run(tmp_path: Path, model: str) -> Path:
    prompts = tmp_path / "train.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": "q", "label": "{}"}) + "\n" for _ in range(64)))
    run = tmp_path / "run.yaml"
    run.write_text(RUN.format(model=model, prompts=prompts))
    return run


def test_save_hf_alone_installs_the_hook(tmp_path):
    plan = compose(load_run_config(write_run(tmp_path, "m")), basedir=str(tmp_path))
    assert plan.runtime_env["worker_process_setup_hook"] == HOOK  # no store, no TSAS: only for the copies


def safetensors_parameters(folder: Path) -> int:
    """The parameters stored in a folder's safetensors files, read from their headers."""
    import math
    import struct

    total = 0
    for path in folder.glob("*.safetensors"):
        with open(path, "rb") as handle:
            header = json.loads(handle.read(struct.unpack("<Q", handle.read(8))[0]))
        total += sum(math.prod(v["shape"]) for k, v in header.items() if k != "__metadata__")
    return total


def test_the_dry_run_prints_the_disk_a_run_needs(tmp_path, smollm2_dir):
    params = safetensors_parameters(smollm2_dir)
    plan = compose(load_run_config(write_run(tmp_path, str(smollm2_dir))), basedir=str(tmp_path))
    line = next(n for n in plan.notes if "disk:" in n)
    # 64 rows = 32 rollout batches of 2 per episode, 2 episodes: 64 steps, a save every 5: 12 saves, 3 kept
    ds, hf = params * 14, params * 2
    assert f"{params / 1e9:.2f}B parameters; 12 checkpoints saved over 64 steps, 3 kept at a time" in line
    assert f"each {ds / 1e9:,.1f} GB of DeepSpeed state + a {hf / 1e9:,.1f} GB HF copy" in line
    assert f"about {(3 * (ds + hf) + hf) / 1e9:,.1f} GB" in line


def test_disk_lines_without_a_known_model_say_the_rule():
    args, _ = check_flags(
        ["--actor.model_name_or_path", "org/unknown", "--ckpt.save_steps", "10", "--ckpt.save_hf"]
        + ["--vllm.num_engines", "1", "--data.prompt_dataset", "x.jsonl", "--train.agent_func_path", "a.py"],
        openrlhf_parser(),
    )
    (line,) = disk_lines(args, steps=100)
    assert "14 bytes per parameter and each HF copy 2 more, 3 kept at a time" in line
