"""Time of the GRPO update with micro-batches in arrival order against micro-batches of similar length.

On one arm of a study (its warm start, rollouts and settings), the script samples
``--steps`` training steps' rollouts once, then times the update (reference forward,
policy forward and backward, AdamW) on each of them in both orders, alternating, from
the same weights every time. It prints the median update time of each order, their
ratio and the share of padded token positions, and checks that both orders give the
same loss::

    python -m benchmarks.grpo_update_order [--config studies/frugal/tiny_lm/study.yaml] [--arm f1]
        [--seed 0] [--model runs/sft/top-...] [--steps 6] [--repeats 3] [--out update_order.json]

``--model`` starts from a warm start already built (a folder with ``config.json``);
without it the study's cached warm start is used, and built if missing (tens of minutes).
"""

from __future__ import annotations

import argparse
import logging
import math
import statistics
import time
from pathlib import Path

from benchmarks._common import write_report


def padding_share(lengths: list[list[int]]) -> float:
    """Share of padded positions over micro-batches of the given episode lengths."""
    padded = sum(len(batch) * max(batch) for batch in lengths)
    return 1.0 - sum(map(sum, lengths)) / padded


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--config", default="studies/frugal/tiny_lm/study.yaml", help="study file (default: %(default)s)"
    )
    parser.add_argument("--arm", default="f1", help="arm of the study (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="study seed (default: %(default)s)")
    parser.add_argument("--model", type=Path, help="warm-started model folder (default: the study's own)")
    parser.add_argument("--steps", type=int, default=6, help="rollout batches (default: %(default)s)")
    parser.add_argument("--repeats", type=int, default=3, help="timed updates per batch and order")
    parser.add_argument("--out", type=Path, help="write the figures as JSON")
    args = parser.parse_args()
    logging.disable(logging.INFO)
    import tempfile

    import torch

    from searchgym.trainers.grpo import trainer as trainer_module
    from searchgym.trainers.grpo.envs import question_schedule
    from searchgym.trainers.grpo.trainer import GRPOTrainer, step_seed
    from studies.frugal.tiny_lm.study import arm_config, load_study
    from studies.frugal.tiny_lm.warm_start import warm_start

    config = arm_config(load_study(args.config), args.arm, args.seed)
    model = args.model or warm_start(config)
    with tempfile.TemporaryDirectory() as tmp:
        config = config.replace(
            output_dir=tmp,
            model={**vars(config.model), "path": str(model), "tiny": None},
            sft={"enabled": False},
            eval={"enabled": False},
            wandb={"enabled": False},
        )
        trainer = GRPOTrainer(config, progress=False)
        trainer.setup()
        start = {k: v.clone() for k, v in trainer.model.state_dict().items()}
        optimizer = trainer.optimizer.state_dict()
        batches = []
        rollout = config.rollout
        for step in range(args.steps):
            questions = question_schedule(
                trainer.num_questions, rollout.questions_per_step, step, config.seed
            )
            episodes = trainer.collector.collect(questions, rollout.group_size, step_seed(config.seed, step))
            batches.append((episodes, trainer.advantages(episodes, step)))
        sorted_order = trainer_module.by_length  # the trainer's order; swapped for arrival order below
        orders = {"arrival": lambda episodes, indices: list(indices), "by_length": sorted_order}
        times: dict[str, list[float]] = {name: [] for name in orders}
        losses: dict[str, list[float]] = {name: [] for name in orders}
        size = config.algo.micro_batch_size
        shares: dict[str, list[float]] = {name: [] for name in orders}
        for episodes, advantages in batches:
            for name, order in orders.items():
                index = order(episodes, range(len(episodes)))
                lengths = [len(episodes[i].token_ids) for i in index]
                shares[name].append(
                    padding_share([lengths[k : k + size] for k in range(0, len(lengths), size)])
                )
            for _ in range(args.repeats):
                for name, order in orders.items():
                    trainer.model.load_state_dict(start)
                    trainer.optimizer.load_state_dict(optimizer)
                    trainer_module.by_length = order
                    began = time.perf_counter()
                    figures = trainer.update(episodes, advantages, step=0)
                    times[name].append(time.perf_counter() - began)
                    losses[name].append(figures["loss"])
        trainer_module.by_length = sorted_order
        trainer.close()
    same_loss = all(
        math.isclose(a, b, rel_tol=1e-4, abs_tol=1e-6)
        for a, b in zip(losses["arrival"], losses["by_length"], strict=True)
    )
    result = {
        "update_s_median": {name: statistics.median(t) for name, t in times.items()},
        "padding_share": {name: statistics.mean(s) for name, s in shares.items()},
        "same_loss": same_loss,
        "episodes_per_step": len(batches[0][0]),
        "micro_batch_size": size,
    }
    ratio = result["update_s_median"]["arrival"] / result["update_s_median"]["by_length"]
    result["speedup"] = ratio
    print(
        f"{args.arm} seed {args.seed}, {result['episodes_per_step']} episodes/step, micro-batches of {size}: "
        f"update {result['update_s_median']['arrival']:.2f} s in arrival order "
        f"({100 * result['padding_share']['arrival']:.0f}% padding), "
        f"{result['update_s_median']['by_length']:.2f} s by length "
        f"({100 * result['padding_share']['by_length']:.0f}% padding): {ratio:.2f}x; "
        f"same loss: {same_loss} (medians of {args.steps} batches x {args.repeats})"
    )
    write_report(
        args.out,
        {
            "torch_threads": torch.get_num_threads(),
            "settings": {k: str(v) for k, v in vars(args).items()},
            "result": result,
        },
    )
    if not same_loss:
        raise SystemExit("the two orders gave different losses")


if __name__ == "__main__":
    main()
