"""HiExp construction cost: K rollouts per question on SyntheticFacts, then the hierarchy.

Rollouts come from the scripted policies with randomness: for each rollout a seeded
generator picks ``oracle_synthetic``, a noisy oracle (which sometimes answers without the
search it needed, or searches for a different entity of the same kind), ``naive_rag`` or
``direct``. The env's reward is F1; a rollout succeeds at F1 >= 0.5.

The script times (medians of ``--repeats`` builds) level-1 distillation with the rule-based
summariser, title encoding with all-MiniLM-L6-v2 on CPU, and Ward clustering and merging
per level, and prints the records per level. It then prints the distances between distinct
titles of each level (all pairs, nearest neighbour, same lesson against different lessons)
and the level-2 clusters at several τ, the measurement behind the default thresholds, and
times a worst case: one distinct title per trajectory (7,000 titles), encoded and clustered
once. HiExp reports about 10 minutes on CPU for its clustering stage on ~7,000 MuSiQue
trajectories.

    python -m benchmarks.hiexp_build [--trajectories 7000] [--rollouts 8] [--repeats 5]
        [--no-scaling] [--out hiexp.json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from searchgym.envs.records import Trajectory
from searchgym.envs.synthetic_env import SyntheticFactsEnv
from searchgym.memory import BuildReport, HierarchicalExperience, MiniLMEncoder
from searchgym.memory.hiexp.encode import DEFAULT_THRESHOLDS, cluster
from searchgym.policies import (
    DirectPolicy,
    NaiveRAGPolicy,
    OracleSyntheticPolicy,
    Policy,
    synthetic_knowledge,  # noqa: E402
)

WORLD = {"num_people": 160, "num_cities": 80, "num_countries": 20, "num_companies": 80}
LESSON_END = " (questions about "
MIX = (("oracle", 0.4), ("noisy", 0.3), ("naive_rag", 0.15), ("direct", 0.15))


class NoisyOracle(Policy):
    """The SyntheticFacts oracle with mistakes: with ``p_skip`` a search becomes an answer
    ("unknown"); with ``p_swap`` the query's entity is swapped for another of the same kind."""

    name = "noisy_oracle"

    def __init__(
        self, oracle: OracleSyntheticPolicy, rng: random.Random, p_skip: float = 0.3, p_swap: float = 0.4
    ):
        self.oracle, self.rng, self.p_skip, self.p_swap = oracle, rng, p_skip, p_swap
        world = oracle.world
        self.kind_of = {e.name: e.kind for e in world.entities}
        self.names = {k: world.names(k) for k in ("person", "city", "country", "company")}

    def act(self, observations: Sequence[str]) -> list[str]:
        protocol = self.oracle.protocol
        actions = []
        for action in self.oracle.act(observations):
            parsed = protocol.parse(action, turn=0)
            if parsed.kind == "search" and parsed.query:
                roll = self.rng.random()
                if roll < self.p_skip:
                    action = protocol.write_action(answer="unknown", think="I will not search.")
                elif roll < self.p_skip + self.p_swap:
                    name = next((n for n in self.kind_of if n in parsed.query), None)
                    if name is not None:
                        other = self.rng.choice([n for n in self.names[self.kind_of[name]] if n != name])
                        action = protocol.write_action(
                            query=parsed.query.replace(name, other), think="Searching."
                        )
            actions.append(action)
        return actions


def rollout(env: SyntheticFactsEnv, policy: Policy, index: int) -> Trajectory:
    """Run one episode of question ``index``; the trajectory carries the env's reward."""
    context, _ = env.reset(options={"index": index})
    while True:
        action = policy.act([context])[0]
        observation, _, terminated, truncated, _ = env.step(action)
        context += action + observation
        if terminated or truncated:
            assert env.trajectory is not None
            return env.trajectory


def generate(num: int, rollouts: int, seed: int) -> list[Trajectory]:
    """``num`` trajectories, ``rollouts`` per question, policies drawn from :data:`MIX`."""
    env = SyntheticFactsEnv(world_seed=seed, world_kwargs=WORLD, reward="f1")
    rng = random.Random(seed)
    oracle = OracleSyntheticPolicy(env.world)
    policies: dict[str, Policy] = {
        "oracle": oracle,
        "noisy": NoisyOracle(oracle, rng),
        "naive_rag": NaiveRAGPolicy(),
        "direct": DirectPolicy(knowledge=synthetic_knowledge(env.world)),
    }
    names, weights = zip(*MIX, strict=True)
    out = []
    for i in range(num):
        index = (i // rollouts) % len(env.questions)
        out.append(rollout(env, policies[rng.choices(names, weights)[0]], index))
    return out


def _percentiles(values: np.ndarray) -> dict[str, float]:
    if not values.size:
        return {}
    return {f"p{q}": round(float(np.percentile(values, q)), 3) for q in (5, 25, 50, 75, 95)}


def distance_profile(encoder: MiniLMEncoder, titles: Sequence[str]) -> dict[str, dict[str, float]]:
    """Percentiles of Euclidean distances between distinct unit title vectors: all pairs,
    each title's nearest neighbour, and (for rule-based titles) pairs with the same lesson
    (the part before " (questions about ") against pairs with different lessons."""
    distinct = sorted(set(titles))
    if len(distinct) < 2:
        return {}
    vectors = encoder(distinct)
    dist = np.sqrt(np.maximum(0.0, 2.0 - 2.0 * vectors @ vectors.T))
    upper = np.triu_indices(len(distinct), 1)
    heads = np.array([t.split(LESSON_END)[0] for t in distinct])
    same = (heads[:, None] == heads[None, :])[upper]
    return {
        "all_pairs": _percentiles(dist[upper]),
        "nearest": _percentiles(np.sort(dist, axis=1)[:, 1]),
        "same_lesson": _percentiles(dist[upper][same]),
        "different_lesson": _percentiles(dist[upper][~same]),
    }


def lesson_purity(
    encoder: MiniLMEncoder, titles: Sequence[str], taus: Sequence[float]
) -> dict[str, list[int]]:
    """For each τ: [clusters of the distinct titles, clusters whose titles all share one lesson]."""
    distinct = sorted(set(titles))
    vectors = encoder(distinct)
    out = {}
    for tau in taus:
        groups = cluster(vectors, tau)
        pure = sum(len({distinct[i].split(LESSON_END)[0] for i in g}) == 1 for g in groups)
        out[str(tau)] = [len(groups), pure]
    return out


def scaling(encoder: MiniLMEncoder, trajectories: Sequence[Trajectory], tau: float) -> dict[str, float]:
    """Encode and Ward-cluster one distinct text per trajectory (question, attempt number,
    queries, answer): the worst case, where no title repeats (as with model-written ones)."""
    attempts: dict[str, int] = {}
    texts = []
    for t in trajectories:
        attempts[t.question.id] = attempts.get(t.question.id, 0) + 1
        texts.append(
            f"{t.question.question} Attempt {attempts[t.question.id]}: {'; '.join(t.queries)} -> {t.answer}"
        )
    start = time.perf_counter()
    vectors = encoder(texts)
    encode_s = time.perf_counter() - start
    start = time.perf_counter()
    groups = cluster(vectors, tau)
    return {
        "texts": len(texts),
        "encode_s": encode_s,
        "cluster_s": time.perf_counter() - start,
        "clusters": len(groups),
    }


def median_report(reports: Sequence[BuildReport]) -> BuildReport:
    """Per-stage medians of equal builds (their records per level agree)."""
    first = reports[0]

    def med(get: Callable[[BuildReport], float]) -> float:
        return statistics.median(get(r) for r in reports)

    return BuildReport(
        trajectories=first.trajectories,
        distill_s=med(lambda r: r.distill_s),
        encode_s={lv: med(lambda r, lv=lv: r.encode_s[lv]) for lv in first.encode_s},
        cluster_s={lv: med(lambda r, lv=lv: r.cluster_s[lv]) for lv in first.cluster_s},
        merge_s={lv: med(lambda r, lv=lv: r.merge_s[lv]) for lv in first.merge_s},
        records=first.records,
        thresholds=first.thresholds,
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--trajectories", type=int, default=7000)
    parser.add_argument("--rollouts", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--thresholds", type=float, nargs="+", default=list(DEFAULT_THRESHOLDS))
    parser.add_argument("--repeats", type=int, default=5, help="builds timed (medians reported)")
    parser.add_argument("--no-scaling", action="store_true", help="skip the worst-case Ward run")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    start = time.perf_counter()
    trajectories = generate(args.trajectories, args.rollouts, args.seed)
    rollout_s = time.perf_counter() - start
    encoder = MiniLMEncoder(device="cpu")
    start = time.perf_counter()
    encoder(["warm up"])
    load_s = time.perf_counter() - start

    reports = []
    for _ in range(args.repeats):
        hiexp = HierarchicalExperience.build(
            trajectories, encoder=encoder, thresholds=args.thresholds, progress=False
        )
        assert hiexp.report is not None
        reports.append(hiexp.report)
    report = median_report(reports)
    profiles = {lv: distance_profile(encoder, [r.title for r in rs]) for lv, rs in hiexp.levels.items()}
    titles1 = [r.title for r in hiexp.records(1)]
    purity = (
        lesson_purity(encoder, titles1, (0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.2)) if len(set(titles1)) > 1 else {}
    )
    worst = {} if args.no_scaling else scaling(encoder, trajectories, args.thresholds[0])
    result = {
        "trajectories": len(trajectories),
        "rollouts_per_question": args.rollouts,
        "repeats": args.repeats,
        "successes": sum(t.reward is not None and t.reward >= 0.5 for t in trajectories),
        "rollout_s": rollout_s,
        "encoder_load_s": load_s,
        "distill_s": report.distill_s,
        "encode_s": report.encode_s,
        "cluster_s": report.cluster_s,
        "merge_s": report.merge_s,
        "total_build_s": report.distill_s
        + sum(report.encode_s.values())
        + sum(report.cluster_s.values())
        + sum(report.merge_s.values()),
        "records_per_level": report.records,
        "thresholds": report.thresholds,
        "distinct_titles": {lv: len({r.title for r in rs}) for lv, rs in hiexp.levels.items()},
        "distances": profiles,
        "level2_clusters_and_lesson_pure_by_tau": purity,
        "worst_case_one_title_per_trajectory": worst,
        "types_level1": {
            k: sum(r.type == k for r in hiexp.records(1)) for k in sorted({r.type for r in hiexp})
        },
    }
    print(f"{len(trajectories)} trajectories ({result['successes']} successful) in {rollout_s:.1f} s")
    print(f"median of {args.repeats} builds:")
    print("| stage | level | seconds | records |")
    print("|---|---|---|---|")
    print(f"| distill (rule) | 1 | {report.distill_s:.2f} | {report.records.get(1, 0)} |")
    for lv in sorted(report.cluster_s):
        print(f"| encode titles | {lv - 1} | {report.encode_s[lv]:.2f} | |")
        print(
            f"| Ward cluster + merge (τ={report.thresholds[lv]}) | {lv} | "
            f"{report.cluster_s[lv]:.3f} + {report.merge_s[lv]:.3f} | {report.records[lv]} |"
        )
    print(f"total build {result['total_build_s']:.1f} s (encoder load {load_s:.1f} s not included)")
    for lv, profile in profiles.items():
        print(f"distances between distinct level-{lv} titles: {json.dumps(profile)}")
    print(
        f"level-2 clusters of the level-1 titles by τ, [clusters, one-lesson clusters]: {json.dumps(purity)}"
    )
    if worst:
        print(
            f"worst case, {worst['texts']} distinct titles: encode {worst['encode_s']:.1f} s, "
            f"Ward {worst['cluster_s']:.1f} s, {worst['clusters']} clusters at τ={args.thresholds[0]}"
        )
    for lv in sorted(hiexp.levels)[1:]:
        for r in hiexp.records(lv)[:6]:
            print(f"  E{lv} [{r.type}] {r.title[:150]}")
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
