"""A short built-in GRPO run of SmolLM2-135M-Instruct on a CPU: its curve and step times.

    searchgym models pull smollm2-135m-instruct
    OMP_NUM_THREADS=1 python -m benchmarks.real_model_train --max-minutes 35

Trains with ``configs/grpo_smollm2_cpu.yaml`` (``--config``) from scratch in a fresh output
folder and, after every step, writes the per-step figures to ``benchmarks/results/real_model_train.json``
and the curve of the reward, the well-formed share of turns and of episodes and the tokens
written per episode (per step, and their mean over a sliding window) to ``docs/real_model_train.png``.

``--heldout N`` keeps the first N questions of ``evaluate``'s seed-0 order out of training
(the run trains on a copy of the data file without them) and, after training, evaluates
greedily on them, in the training env's settings: the start model (the untrained model too,
with ``--warm-start``) and the trained one, all in bfloat16. ``--float32`` trains (warm start
included, in ``model.path`` + ``_float32``) and evaluates in float32 instead: the fast choice
on a CPU without bfloat16 units, where bfloat16 is emulated
(``benchmarks/results/autocast_cpu_avx2.json``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks._common import REPO, write_report


def plot(history: list[dict], path: Path, window: int, title: str, heldout: list[dict] | None = None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    steps = [h["step"] for h in history]
    fig, axes = plt.subplots(1, 5 if heldout else 4, figsize=(18.5 if heldout else 15, 3.4))
    for ax, key, label in zip(
        axes[:4],
        ("reward", "format_ok_turns", "format_ok", "action_tokens"),
        (
            "reward",
            "well-formed share of turns",
            "well-formed share of episodes",
            "tokens written per episode",
        ),
        strict=True,
    ):
        values = np.array([h["rollout"].get(key, np.nan) for h in history])
        ax.plot(steps, values, "o-", alpha=0.4, label="per step")
        if len(values) >= window:
            smooth = np.convolve(values, np.ones(window) / window, mode="valid")
            ax.plot(steps[window - 1 :], smooth, "-", linewidth=2, label=f"mean of {window} steps")
        ax.set_xlabel("GRPO step")
        ax.set_title(label)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8, loc="lower right")
    if heldout:
        names = [r["model"] for r in heldout]
        spots = np.arange(len(names))
        for shift, key in ((-0.2, "em"), (0.2, "f1")):
            axes[4].bar(spots + shift, [100 * r[key] for r in heldout], width=0.4, label=key.upper())
        axes[4].set_xticks(spots, names, fontsize=8)
        axes[4].set_title(f"held-out, greedy ({heldout[0]['questions']} questions, %)")
        axes[4].legend(fontsize=8)
        axes[4].grid(alpha=0.3, axis="y")
    fig.suptitle(f"SmolLM2-135M-Instruct, built-in GRPO on CPU ({title})", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)  # redrawn after every step: an open figure per step would pile up


def hold_out(config, count: int) -> tuple[Any, list[int]]:
    """``config`` training on its data file without the first ``count`` questions of
    ``evaluate``'s seed-0 order (written to ``{output_dir}/train_questions.jsonl``), and
    those questions' indices in the original file."""
    import gymnasium as gym
    import numpy as np

    import searchgym  # noqa: F401  (registers the ids)

    kwargs = dict(config.env.kwargs)
    questions = gym.make(config.env.id, **kwargs).unwrapped.questions
    heldout = [int(i) for i in np.random.default_rng(0).permutation(len(questions))[:count]]
    held_ids = {questions[i].id for i in heldout}
    lines = Path(kwargs["data_path"]).read_text(encoding="utf-8").splitlines()
    kept = [line for line in lines if line.strip() and json.loads(line)["id"] not in held_ids]
    if len(kept) != len(questions) - len(held_ids):
        raise SystemExit(f"{kwargs['data_path']}: question ids are not unique; cannot hold questions out")
    path = Path(config.output_dir) / "train_questions.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(kept) + "\n", encoding="utf-8")
    env = dataclasses.replace(config.env, kwargs={**kwargs, "data_path": str(path)})
    return dataclasses.replace(config, env=env), heldout


def evaluate_heldout(
    config, trainer, data_path: str, count: int, untrained: bool, bfloat16: bool = True
) -> list[dict]:
    """Greedy figures of the start model(s) and the trained one on the held-out questions,
    each with its per-question records (``episodes``: question id, queries, retrieved passage
    ids, answer, scores)."""
    import copy

    from benchmarks.real_model_eval import multi_turn
    from searchgym.models import resolve_model
    from searchgym.policies import HFPolicy

    kwargs = {**config.env.kwargs, "data_path": data_path}
    models: list[tuple[str, Any]] = []
    if untrained:
        models.append(("untrained", resolve_model("smollm2-135m-instruct")))
    models.append(("start of GRPO", resolve_model(config.model.path)))
    models.append(
        ("end of GRPO", copy.deepcopy(trainer.model).to(torch.bfloat16 if bfloat16 else torch.float32))
    )
    rows = []
    for label, model in models:
        policy = HFPolicy(
            model,
            tokenizer=trainer.tokenizer if not isinstance(model, str) else None,
            protocol=kwargs.get("protocol", "search_r1"),
            max_new_tokens=config.rollout.max_new_tokens,
            batch_size=32,
            dtype=("bfloat16" if bfloat16 else "float32") if isinstance(model, str) else None,
            device="cpu",
            name=label,
        )
        episodes: list[dict] = []
        row = multi_turn(policy, config.env.id, kwargs, count, 0, episodes)
        rows.append({"model": label, "questions": count, **row, "episodes": episodes})
        print(f"held-out {label}: EM {row['em']:.3f} F1 {row['f1']:.3f} well-formed {row['format_ok']:.2f}")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", type=Path, default=REPO / "configs" / "grpo_smollm2_cpu.yaml")
    parser.add_argument(
        "--threads", type=int, default=1, help="torch CPU threads (1 is fastest on a shared machine)"
    )
    parser.add_argument(
        "--max-minutes",
        type=float,
        default=0,
        help="stop after the step that passes this wall time (0: run all steps)",
    )
    parser.add_argument("--seed", type=int, default=None, help="replace the config's seed")
    parser.add_argument(
        "--warm-start",
        action="store_true",
        help="first write model.path with benchmarks/real_model_warm_start.py (unless it holds a model)",
    )
    parser.add_argument(
        "--float32",
        action="store_true",
        help="train and evaluate in float32 (no bfloat16 autocast): fast on CPUs without bfloat16 units",
    )
    parser.add_argument("--window", type=int, default=4, help="steps in the curve's sliding mean")
    parser.add_argument(
        "--heldout", type=int, default=0, help="questions kept out of training and evaluated on (0: none)"
    )
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "real_model_train.json")
    parser.add_argument("--replot", action="store_true", help="only redraw the PNG from --out")
    parser.add_argument("--png", type=Path, default=REPO / "docs" / "real_model_train.png")
    args = parser.parse_args()
    if args.replot:
        report = json.loads(args.out.read_text())
        plot(report["history"], args.png, args.window, args.config.stem, report.get("heldout"))
        return
    torch.set_num_threads(args.threads)
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    from searchgym.trainers.grpo import GRPOTrainer
    from searchgym.trainers.run_spec import load_config

    config = load_config(args.config)
    if args.seed is not None:  # its own output folder, so runs of several seeds can go side by side
        config = dataclasses.replace(
            config, seed=args.seed, output_dir=f"{config.output_dir}_seed{args.seed}"
        )
    if args.float32:
        model = dataclasses.replace(config.model, autocast="off", path=f"{config.model.path}_float32")
        config = dataclasses.replace(config, model=model)
    shutil.rmtree(config.output_dir, ignore_errors=True)  # a fresh run, never a resumed one
    heldout: list[int] = []
    source = config.env.kwargs.get("data_path")
    if args.heldout:
        config, heldout = hold_out(config, args.heldout)
    warm: dict | None = None
    if args.warm_start:
        from benchmarks.real_model_warm_start import warm_start

        folder = Path(config.model.path)
        done = folder / "warm_start.json"
        warm = (
            json.loads(done.read_text())
            if done.is_file()
            # float32 under eager attention: 8 long examples at once exceed 24 GB, 2 do not
            else warm_start(
                folder, seed=config.seed, bfloat16=not args.float32, micro_batch_size=2 if args.float32 else 0
            )
        )
    start = time.perf_counter()  # --max-minutes and wall_time_s count GRPO only
    trainer = GRPOTrainer(config, progress=False)
    samples: list[dict] = []
    try:
        while trainer.state.step < config.steps:  # one step at a time: the files follow the run
            trainer.train(steps=1)
            history = trainer.state.history
            first = trainer.last_episodes[0]  # what the policy wrote: the first rollout of the step
            samples.append({"step": trainer.state.step, "reward": first.reward, "actions": first.actions()})
            step_s = sorted(h["train"]["step_s"] for h in history)
            wall = time.perf_counter() - start
            write_report(
                args.out,
                {
                    "command": f"OMP_NUM_THREADS={args.threads} python -m benchmarks.real_model_train "
                    + " ".join(sys.argv[1:]),
                    "config": str(args.config.resolve().relative_to(REPO)),
                    "seed": config.seed,
                    "torch_threads": torch.get_num_threads(),
                    "steps_done": trainer.state.step,
                    "steps_configured": config.steps,
                    "wall_time_s": round(wall, 1),
                    "median_step_s": step_s[len(step_s) // 2],
                    "warm_start": warm,
                    "history": history,
                    "samples": samples,
                },
            )
            plot(history, args.png, args.window, args.config.stem)
            if args.max_minutes and wall > 60 * args.max_minutes:
                print(f"stopped after {trainer.state.step} steps: --max-minutes {args.max_minutes:g} reached")
                break
        if trainer.state.step < config.steps:  # stopped early: keep the model it reached
            trainer.save()
        if heldout:
            report = json.loads(args.out.read_text())
            report["heldout"] = evaluate_heldout(
                config, trainer, source, len(heldout), args.warm_start, bfloat16=not args.float32
            )
            write_report(args.out, report)
            plot(report["history"], args.png, args.window, args.config.stem, report["heldout"])
    finally:
        trainer.close()
    print(f"wrote {args.out} and {args.png}")


if __name__ == "__main__":
    main()
