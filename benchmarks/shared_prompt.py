"""Time of a memory arm's GRPO step with each group's prompt encoded once, against every
rollout encoding its own prompt.

The built-in trainer (``trainers/grpo/prefix.py``) encodes the prompt that a group's
rollouts share once per ``generate`` call and per micro-batch of the update, and copies its
key/value cache to the group's rows (``SamplingSettings.share_prefix``, on by default). This
script runs the same steps both ways, interleaved, on one torch thread: the tiny model (128x4, as the
tiny-LM study), SyntheticFacts, Search-R1's protocol, an experience memory whose bank
was written from scripted episodes, 8 questions x G = 8, up to 3 turns of 48 tokens. Both
ways give the same episodes token for token (``tests/trainers/test_grpo.py``); it checks that here
too. It reports the median seconds of the rollouts, the update and the whole step, and
their ratios::

    OMP_NUM_THREADS=1 python -m benchmarks.shared_prompt --out benchmarks/results/shared_prompt.json
    python -m benchmarks.shared_prompt --render   # docs/training.md's table from that file

``example_per: group`` shares the whole prompt (instructions, experience, example,
question); ``example_per: rollout`` (the default) shares the instructions and experience,
before each rollout's own example.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks._common import write_report

ENV_ID = "searchgym/SyntheticFacts-v1"


def experience_store(path: Path) -> Path:
    """An experience store whose bank is written from scripted right (oracle) and wrong
    (direct) episodes on unknown questions (:func:`searchgym.policies.good_and_bad_trajectories`)."""
    import gymnasium as gym

    from searchgym.memory import ExperienceMemory
    from searchgym.policies import good_and_bad_trajectories

    memory = ExperienceMemory(path)
    for trajectory in good_and_bad_trajectories(gym.make(ENV_ID, reward="f1"), 8):
        memory.add(trajectory)
    memory.update()
    return path


def measure(example_per: str, args: argparse.Namespace, root: Path, store: Path) -> dict[str, Any]:
    from searchgym.trainers.config import TrainConfig
    from searchgym.trainers.grpo import GRPOTrainer
    from searchgym.trainers.grpo.generation import SamplingSettings
    from searchgym.trainers.grpo.trainer import step_seed

    config = TrainConfig.from_dict(
        {
            "output_dir": str(root / f"run-{example_per}"),
            "seed": 0,
            "env": {"id": ENV_ID, "kwargs": {"protocol": "search_r1", "reward": "f1", "max_turns": 3}},
            "model": {
                "tiny": {"dir": str(root / "tiny"), "hidden_size": 128, "num_layers": 4},
                "cpu_threads": 1,
            },
            "rollout": {
                "group_size": args.group_size,
                "questions_per_step": args.questions,
                "max_new_tokens": args.max_new_tokens,
                "max_context_tokens": 1024,
                "generation_batch_size": 64,
            },
            "memory": {"kind": "lightsearcher", "path": str(store), "example_per": example_per},
            "algo": {"kl_coef": 0.001, "lr": 1e-4, "micro_batch_size": 16},
            "checkpoint": {"every": 0},
        }
    )
    trainer = GRPOTrainer(config, progress=False)
    trainer.setup()
    collector = trainer.collector
    questions = list(range(args.questions))
    rollout_s: dict[bool, list[float]] = {True: [], False: []}
    update_s: dict[bool, list[float]] = {True: [], False: []}
    episodes: dict[bool, Any] = {}
    same = []
    for rep in range(args.warmup + args.reps):
        order = (True, False) if rep % 2 == 0 else (False, True)  # interleaved, order alternating
        for share in order:  # both ways sample from the same weights
            collector.sampling = SamplingSettings(1.0, 1.0, 64, share_prefix=share)
            start = time.perf_counter()
            episodes[share] = collector.collect(questions, args.group_size, step_seed(0, rep))
            if rep >= args.warmup:
                rollout_s[share].append(time.perf_counter() - start)
        same.append([e.token_ids for e in episodes[True]] == [e.token_ids for e in episodes[False]])
        for share in order:  # each update steps the model, the same work both ways
            collector.sampling = SamplingSettings(1.0, 1.0, 64, share_prefix=share)
            start = time.perf_counter()
            trainer.update(episodes[share], trainer.advantages(episodes[share], 0), 0)
            if rep >= args.warmup:
                update_s[share].append(time.perf_counter() - start)
    trainer.close()
    eps = episodes[True]
    step = {k: [r + u for r, u in zip(rollout_s[k], update_s[k], strict=True)] for k in (True, False)}
    med = statistics.median
    return {
        "example_per": example_per,
        "prompt_tokens_mean": statistics.mean(e.prompt_tokens for e in eps),
        "tokens_per_episode_mean": statistics.mean(len(e.token_ids) for e in eps),
        "turns_mean": statistics.mean(len(e.actions()) for e in eps),
        "rollout_s_shared": rollout_s[True],
        "rollout_s_whole": rollout_s[False],
        "update_s_shared": update_s[True],
        "update_s_whole": update_s[False],
        "rollout_s_shared_median": med(rollout_s[True]),
        "rollout_s_whole_median": med(rollout_s[False]),
        "update_s_shared_median": med(update_s[True]),
        "update_s_whole_median": med(update_s[False]),
        "step_s_shared_median": med(step[True]),
        "step_s_whole_median": med(step[False]),
        "rollout_speedup": med(rollout_s[False]) / med(rollout_s[True]),
        "update_speedup": med(update_s[False]) / med(update_s[True]),
        "step_speedup": med(step[False]) / med(step[True]),
        "same_episodes_every_step": all(same),
    }


RESULT = Path(__file__).resolve().parent / "results" / "shared_prompt.json"
PAGE = Path(__file__).resolve().parents[1] / "docs" / "training.md"
TABLE = "shared_prompt"


def render(report: dict[str, Any]) -> str:
    """The Markdown table of a report: medians per way, and the ratios."""
    lines = [
        "| `example_per` | prompt tokens | rollouts: whole → shared | update: whole → shared | step: whole → shared | same episodes |",
        "|---|---|---|---|---|---|",
    ]
    for r in report["results"]:
        lines.append(
            f"| {r['example_per']} | {r['prompt_tokens_mean']:.0f} of {r['tokens_per_episode_mean']:.0f} | "
            f"{r['rollout_s_whole_median']:.1f} s → {r['rollout_s_shared_median']:.1f} s (×{r['rollout_speedup']:.2f}) | "
            f"{r['update_s_whole_median']:.1f} s → {r['update_s_shared_median']:.1f} s (×{r['update_speedup']:.2f}) | "
            f"{r['step_s_whole_median']:.1f} s → {r['step_s_shared_median']:.1f} s (×{r['step_speedup']:.2f}) | "
            f"{'yes' if r['same_episodes_every_step'] else 'no'} |"
        )
    settings = report["settings"]
    lines.append(
        f"\nMedians of {settings['reps']} interleaved steps after {settings['warmup']} warm-up, "
        f"{settings['questions']} questions × G = {settings['group_size']}, {report['torch_threads']} torch thread, "
        f"{report['cpus']} CPUs shared with other work (ratios, not seconds, carry over). "
        "Reproduce: `OMP_NUM_THREADS=1 python -m benchmarks.shared_prompt --out "
        "benchmarks/results/shared_prompt.json && python -m benchmarks.shared_prompt --render`."
    )
    return "\n".join(lines)


def write_page(page: Path, section: str) -> None:
    """Replace the section between ``<!-- table:shared_prompt -->`` and its end marker."""
    text = page.read_text(encoding="utf-8")
    pattern = re.compile(rf"(<!-- table:{TABLE} -->\n)(?:.*?\n)?(<!-- end table:{TABLE} -->)", re.S)
    if not pattern.search(text):
        raise SystemExit(f"{page} has no <!-- table:{TABLE} --> markers.")
    page.write_text(pattern.sub(lambda m: m.group(1) + section + "\n" + m.group(2), text), encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--reps", type=int, default=3, help="timed steps per way (default: %(default)s)")
    parser.add_argument(
        "--warmup", type=int, default=1, help="untimed steps per way first (default: %(default)s)"
    )
    parser.add_argument("--questions", type=int, default=8, help="questions per step (default: %(default)s)")
    parser.add_argument("--group-size", type=int, default=8, help="G (default: %(default)s)")
    parser.add_argument(
        "--max-new-tokens", type=int, default=48, help="tokens per turn (default: %(default)s)"
    )
    parser.add_argument(
        "--example-per", nargs="+", default=["group", "rollout"], choices=["group", "rollout"]
    )
    parser.add_argument("--out", type=Path, help="write the figures as JSON")
    parser.add_argument(
        "--render", action="store_true", help=f"only write {PAGE.name}'s table from {RESULT.name}"
    )
    args = parser.parse_args()
    if args.render:
        write_page(PAGE, render(json.loads(RESULT.read_text(encoding="utf-8"))))
        return
    logging.disable(logging.INFO)
    import torch

    torch.set_num_threads(1)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        store = experience_store(Path(tmp) / "store")
        for per in args.example_per:
            result = measure(per, args, Path(tmp), store)
            results.append(result)
            print(
                f"example_per {per}: prompt {result['prompt_tokens_mean']:.0f} tokens, "
                f"{result['tokens_per_episode_mean']:.0f} per episode; rollouts "
                f"{result['rollout_s_whole_median']:.2f} s -> {result['rollout_s_shared_median']:.2f} s "
                f"(x{result['rollout_speedup']:.2f}), update {result['update_s_whole_median']:.2f} s -> "
                f"{result['update_s_shared_median']:.2f} s (x{result['update_speedup']:.2f}), whole step "
                f"x{result['step_speedup']:.2f}; same episodes: {result['same_episodes_every_step']}"
            )
    settings = {k: v for k, v in vars(args).items() if k not in ("out", "render")}
    write_report(
        args.out, {"torch_threads": torch.get_num_threads(), "settings": settings, "results": results}
    )


if __name__ == "__main__":
    main()
