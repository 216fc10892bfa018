"""A short supervised warm start of SmolLM2-135M-Instruct on well-formed Search-R1 episodes.

    searchgym models pull smollm2-135m-instruct
    OMP_NUM_THREADS=1 python -m benchmarks.real_model_warm_start --out runs/smollm2_warm

The untrained model never writes Search-R1's tags in its first turn, so GRPO has nothing
to compare. This script shows it the format on questions of *another* dataset (the NQ
sample by default; the GRPO run trains on PopQA): for each question it plays one episode
through the benchmark env, with the env's own instructions and BM25 passages,

    turn 1: <search> {the question} </search>
    turn 2: <answer> {the first gold answer} </answer>

renders every turn's input with the chat formatter the trainer uses, and trains only the
actions' tokens (masked cross-entropy, :func:`searchgym.trainers.grpo.ptx.ptx_nll`) for a
few AdamW steps under bfloat16 autocast. The folder it writes loads like any model folder
(``model.path``). The demonstrations are written beside it (``demonstrations.jsonl``).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks._common import REPO, SHARED_DATA
from benchmarks.real_model_eval import DATASETS


def demonstrations(
    dataset: str, count: int, tokenizer: Any, index_dir: Path, seed: int
) -> list[tuple[str, str]]:
    """``(model input, action)`` pairs of ``count`` two-turn episodes of ``dataset``."""
    import gymnasium as gym

    import searchgym  # noqa: F401  (registers the ids)
    from searchgym.policies.chat import ChatFormatter

    env = gym.make(
        DATASETS[dataset],
        data_path=str(SHARED_DATA / "questions" / f"{dataset}.jsonl"),
        corpus_path=str(SHARED_DATA / "corpus.jsonl"),
        index_dir=str(index_dir),
        protocol="search_r1",
        reward="f1",
        topk=3,
        max_turns=2,
    )
    formatter = ChatFormatter(tokenizer)
    questions = env.unwrapped.questions
    order = np.random.default_rng(seed).permutation(len(questions))[:count]
    pairs = []
    for index in order:
        obs, _ = env.reset(seed=seed, options={"index": int(index)})
        question = questions[int(index)]
        search = f"<search> {question.question.strip()} </search>"
        answer = f"<answer> {question.golden_answers[0]} </answer>"
        context = formatter.prompt(obs)
        pairs.append((context, search))
        obs, _, terminated, _, info = env.step(search)
        if terminated or not info.get("format_ok", True):
            raise RuntimeError(f"the env refused the demonstration {search!r}: {info}")
        context += search + formatter.feedback(obs)
        pairs.append((context, answer))
        _, reward, terminated, _, info = env.step(answer)
        if not terminated or not info.get("format_ok"):
            raise RuntimeError(f"the env did not end the episode on {answer!r}: {info}")
    env.close()
    return pairs


def warm_start(
    out: Path,
    *,
    model: str = "smollm2-135m-instruct",
    dataset: str = "nq",
    episodes: int = 64,
    steps: int = 16,
    batch_size: int = 8,
    lr: float = 3e-5,
    seed: int = 0,
    index_dir: Path = REPO / "benchmarks" / ".cache" / "bm25_shared",
    bfloat16: bool = True,
    micro_batch_size: int = 0,
) -> dict[str, Any]:
    """Train and save the warm-started folder at ``out``; returns its figures."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from searchgym.models import resolve_model
    from searchgym.trainers.grpo.ptx import load_ptx_examples, ptx_backward, sample_ptx, write_ptx_examples

    torch.manual_seed(seed)
    source = resolve_model(model)
    tokenizer = AutoTokenizer.from_pretrained(source)
    policy = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    out.mkdir(parents=True, exist_ok=True)
    data = out / "demonstrations.jsonl"
    pairs = demonstrations(dataset, episodes, tokenizer, index_dir, seed)
    # the rollouts stop at </search> and </answer>: the actions end there, without an end token
    write_ptx_examples(data, pairs, eos=False)
    examples = load_ptx_examples(data, tokenizer)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=lr)
    rng = np.random.default_rng(seed)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    losses = []
    start = time.perf_counter()
    policy.train()
    for step in range(steps):
        batch = sample_ptx(examples, batch_size, rng)
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bfloat16):
            loss = ptx_backward(policy, batch, pad, "cpu", micro_batch_size)
        torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0)
        optimizer.step()
        losses.append(round(loss, 4))
        print(f"warm start step {step + 1}/{steps}: loss {losses[-1]:.3f}", flush=True)
    policy.eval()
    policy.save_pretrained(out)
    tokenizer.save_pretrained(out)
    figures = {
        "model": model,
        "dataset": dataset,
        "episodes": episodes,
        "examples": len(examples),
        "steps": steps,
        "batch_size": batch_size,
        "autocast": "bfloat16" if bfloat16 else None,
        "micro_batch_size": micro_batch_size or batch_size,
        "lr": lr,
        "seed": seed,
        "losses": losses,
        "wall_time_s": round(time.perf_counter() - start, 1),
    }
    (out / "warm_start.json").write_text(json.dumps(figures, indent=2) + "\n", encoding="utf-8")
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=REPO / "runs" / "smollm2_warm")
    parser.add_argument("--dataset", default="nq", choices=sorted(DATASETS))
    parser.add_argument("--episodes", type=int, default=64, help="demonstrated episodes (2 actions each)")
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--lr", type=float, default=3e-5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    figures = warm_start(
        args.out,
        dataset=args.dataset,
        episodes=args.episodes,
        steps=args.steps,
        batch_size=args.batch_size,
        lr=args.lr,
        seed=args.seed,
    )
    print(
        f"wrote {args.out} ({figures['wall_time_s']} s, loss {figures['losses'][0]} -> {figures['losses'][-1]})"
    )


if __name__ == "__main__":
    main()
