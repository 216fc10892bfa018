"""Time of one built-in GRPO step on CPU, with the offline tiny model on SyntheticFacts.

A step is: rollouts (questions × G episodes, up to ``max_turns`` turns each, batched
sampling), the group advantages, the update (reference and policy forward passes,
backward, AdamW) and the memory step. The script runs ``--warmup`` steps, then ``--steps``
timed ones, and prints the medians of the step and of its rollout and update parts, for
each model size asked for::

    python -m benchmarks.grpo_step [--sizes 64x2,128x4] [--steps 10] [--out grpo_step.json]

Numbers depend on the machine and its load; the README quotes one run.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import tempfile
from pathlib import Path

from benchmarks._common import write_report


def run(size: str, args: argparse.Namespace, root: Path) -> dict:
    from searchgym.trainers.config import TrainConfig
    from searchgym.trainers.grpo import GRPOTrainer

    hidden, layers = (int(x) for x in size.split("x"))
    config = TrainConfig.from_dict(
        {
            "output_dir": str(root / f"run-{size}"),
            "steps": args.warmup + args.steps,
            "env": {"kwargs": {"protocol": "search_r1", "reward": "f1", "max_turns": args.max_turns}},
            "model": {"tiny": {"dir": str(root / "tiny"), "hidden_size": hidden, "num_layers": layers}},
            "rollout": {
                "group_size": args.group_size,
                "questions_per_step": args.questions,
                "max_new_tokens": args.max_new_tokens,
                "max_context_tokens": 2048,
            },
            "algo": {"kl_coef": 0.001, "lr": 1e-4, "micro_batch_size": 8},
            "checkpoint": {"every": 0},
        }
    )
    trainer = GRPOTrainer(config, progress=False)
    trainer.setup()
    parameters = sum(p.numel() for p in trainer.model.parameters())
    records = [trainer.train_step(step) for step in range(args.warmup + args.steps)][args.warmup :]
    trainer.close()
    train = [r["train"] for r in records]
    rollout = [r["rollout"] for r in records]
    result = {
        "model": f"tiny Llama {hidden}x{layers} ({parameters / 1e6:.2f} M parameters)",
        "episodes_per_step": args.questions * args.group_size,
        "step_s_median": statistics.median(t["step_s"] for t in train),
        "rollout_s_median": statistics.median(t["rollout_s"] for t in train),
        "update_s_median": statistics.median(t["update_s"] for t in train),
        "action_tokens_per_episode": statistics.mean(r["action_tokens"] for r in rollout),
        "tokens_per_episode": statistics.mean(r["total_tokens"] for r in rollout),
        "steps": args.steps,
    }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--sizes", default="64x2,128x4", help="hidden x layers, comma-separated (default: %(default)s)"
    )
    parser.add_argument("--steps", type=int, default=10, help="timed steps (default: %(default)s)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first (default: %(default)s)")
    parser.add_argument("--questions", type=int, default=2, help="questions per step (default: %(default)s)")
    parser.add_argument("--group-size", type=int, default=4, help="G (default: %(default)s)")
    parser.add_argument(
        "--max-new-tokens", type=int, default=24, help="tokens per turn (default: %(default)s)"
    )
    parser.add_argument("--max-turns", type=int, default=3, help="turns per episode (default: %(default)s)")
    parser.add_argument("--out", type=Path, help="write the figures as JSON")
    args = parser.parse_args()
    logging.disable(logging.INFO)
    import torch

    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for size in args.sizes.split(","):
            result = run(size.strip(), args, Path(tmp))
            results.append(result)
            print(
                f"{result['model']}: {result['episodes_per_step']} episodes/step, "
                f"{result['tokens_per_episode']:.0f} tokens/episode ({result['action_tokens_per_episode']:.0f} sampled): "
                f"step {result['step_s_median']:.2f} s (rollout {result['rollout_s_median']:.2f} s, "
                f"update {result['update_s_median']:.2f} s), median of {args.steps}"
            )
    write_report(
        args.out,
        {
            "torch_threads": torch.get_num_threads(),
            "settings": vars(args) | {"out": None},
            "results": results,
        },
    )


if __name__ == "__main__":
    main()
