"""How often a study run's final policy searches its known questions, greedy and sampled.

Loads the last checkpoint of a run folder (``{output_dir}/{arm}/seed{S}`` of ``searchgym
study``), rolls it out on the known questions of one split with ``--hops`` hops (the
training split by default: questions RL trained on), once greedily and ``--samples``
times at temperature 1, and counts the rollouts by searched or not and right (EM) or
not. Runs with experience memory are rolled out without it::

    python -m studies.frugal.tiny_lm.benchmarks.study_searches runs/study/lightsearcher_no_memory/seed0 [--split train] [--hops 2]
"""

from __future__ import annotations

import argparse
import collections
import logging
from pathlib import Path

from benchmarks._common import run_policy

REPO = Path(__file__).resolve().parents[4]


def count(run: Path, split: str, hops: int, samples: int) -> dict[str, dict[str, int]]:
    """``{"greedy" | "T=1": {"searched, right": n, ...}}`` for ``run``'s last checkpoint."""
    from searchgym.trainers.grpo.envs import build_reward, env_factory
    from studies.frugal.tiny_lm.evaluation import rollout_collector

    config, tokenizer, model = run_policy(run)
    env_config = config.replace(
        env={"id": config.env.id, "kwargs": {**config.env.kwargs, "split": split}}
    ).env
    out = {}
    for name, temperature, repeats in (("greedy", 0.0, 1), ("T=1", 1.0, samples)):
        make_env = env_factory(env_config, build_reward(env_config), None, None)
        collector = rollout_collector(make_env, model, tokenizer, config, temperature)
        questions = collector.env(0).unwrapped.questions
        picked = [i for i, q in enumerate(questions) if q.known and (q.hops or 1) == hops]
        cells: collections.Counter[str] = collections.Counter()
        for episode in collector.collect(picked, repeats, seed=config.seed):
            searched = "searched" if episode.info["num_searches"] else "direct"
            cells[f"{searched}, {'right' if episode.info['em'] > 0 else 'wrong'}"] += 1
        collector.close()
        out[name] = dict(sorted(cells.items()))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("runs", nargs="+", type=Path, help="run folders with checkpoints")
    parser.add_argument("--split", default="train", help="train or eval (default: %(default)s)")
    parser.add_argument("--hops", type=int, default=2, help="1 or 2 (default: %(default)s)")
    parser.add_argument("--samples", type=int, default=8, help="rollouts per question at T = 1")
    args = parser.parse_args()
    logging.disable(logging.INFO)
    for run in args.runs:
        for name, cells in count(run, args.split, args.hops, args.samples).items():
            print(f"{run} ({args.split}, {args.hops}-hop known, {name}): {cells}")


if __name__ == "__main__":
    main()
