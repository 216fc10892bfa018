"""Cost of LightSearcher's experience memory on CPU: update, store appends, wrapper latency.

1. **Update**: one ``ExperienceMemory.update()`` over 7,000 trajectories with the
   rule-based summariser (summarising every trajectory, contrasting Good against Bad,
   writing the bank), in memory and with a store folder (which also re-reads the window
   from disk).
2. **Appends**: adding the 7,000 trajectories to a store folder, one ``add`` each.
3. **Wrapper latency**: ``ExperienceWrapper`` reset and steps against the bare env on
   SyntheticFacts (BM25), the same actions interleaved episode by episode, medians and
   their ratio; with an in-memory memory and with the 7,000-trajectory store.

The trajectories come from SyntheticFacts rollouts of the scripted policies (direct,
naive_rag, oracle_synthetic drawn at random per episode) under LightSearcher's reward.

    python -m benchmarks.memory_update [--trajectories 7000] [--rounds 3] [--episodes 300] [--out memory.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import gymnasium as gym
import numpy as np

import searchgym  # noqa: F401  (registers the env ids)
from searchgym.memory import ExperienceMemory, ExperienceWrapper
from searchgym.policies import make_policy

ENV_ID = "searchgym/SyntheticFacts-v1"


def _env() -> gym.Env:
    return gym.make(ENV_ID, protocol="tool_call", reward="lightsearcher").unwrapped


def rollouts(n: int, seed: int = 0) -> list:
    """``n`` finished trajectories from randomly chosen scripted policies."""
    env = _env()
    policies = [
        make_policy(name, protocol="tool_call", world=env.world)
        for name in ("direct", "naive_rag", "oracle_synthetic")
    ]
    rng = np.random.default_rng(seed)
    out = []
    for ep in range(n):
        policy = policies[int(rng.integers(len(policies)))]
        context, _ = env.reset(seed=seed * 1_000_000 + ep)
        done = False
        while not done:
            action = policy.act([context])[0]
            obs, _, terminated, truncated, _ = env.step(action)
            context += action + obs
            done = terminated or truncated
        out.append(env.trajectory)
    return out


def bench_update(trajectories: list, rounds: int) -> dict:
    in_memory, on_disk, appends, opens = [], [], [], []
    result = None
    for _ in range(rounds):
        memory = ExperienceMemory(update_every=1)
        for t in trajectories:
            memory.add(t)
        start = time.perf_counter()
        result = memory.update()
        in_memory.append(time.perf_counter() - start)
        with tempfile.TemporaryDirectory() as folder:
            writer = ExperienceMemory(folder)
            for t in trajectories:
                start = time.perf_counter()
                writer.add(t)
                appends.append(time.perf_counter() - start)
            start = time.perf_counter()
            trainer = ExperienceMemory(folder, update_every=1)
            opens.append(time.perf_counter() - start)
            start = time.perf_counter()
            trainer.update()
            on_disk.append(time.perf_counter() - start)
            size = sum(p.stat().st_size for p in Path(folder).glob("trajectories.sqlite*"))  # with its WAL
    assert result is not None
    return {
        "trajectories": len(trajectories),
        "good": result.good,
        "bad": result.bad,
        "bank_items": len(result.bank) if result.bank is not None else 0,
        "update_in_memory_s": statistics.median(in_memory),
        "update_with_store_s": statistics.median(on_disk),
        "open_store_s": statistics.median(opens),
        "append_median_us": 1e6 * statistics.median(appends),
        "append_total_s": sum(appends) / rounds,
        "store_mb": size / 1e6,
    }


def _episode(env, actions: list[str], seed: int) -> tuple[float, list[float]]:
    start = time.perf_counter()
    env.reset(seed=seed)
    reset = time.perf_counter() - start
    steps = []
    for action in actions:
        start = time.perf_counter()
        env.step(action)
        steps.append(time.perf_counter() - start)
    return reset, steps


def bench_wrapper(memory: ExperienceMemory, episodes: int) -> dict:
    bare = _env()
    wrapped = ExperienceWrapper(_env(), memory)
    protocol = bare.protocol
    rows: dict[str, list[float]] = {
        k: [] for k in ("bare_reset", "bare_step", "wrapped_reset", "wrapped_step")
    }
    for ep in range(episodes):
        bare.reset(seed=ep)
        question = bare.trajectory.question.question
        actions = [
            protocol.write_action(query=question, think="look"),
            protocol.write_action(answer="x", think="t"),
        ]
        for name, env in (("bare", bare), ("wrapped", wrapped)):
            reset, steps = _episode(env, actions, ep)
            rows[f"{name}_reset"].append(reset)
            rows[f"{name}_step"].extend(steps)
    med = {k: 1e6 * statistics.median(v) for k, v in rows.items()}
    return {
        **{f"{k}_median_us": v for k, v in med.items()},
        "reset_ratio": med["wrapped_reset"] / med["bare_reset"],
        "step_ratio": med["wrapped_step"] / med["bare_step"],
        "added_step_us": med["wrapped_step"] - med["bare_step"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--trajectories", type=int, default=7000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--episodes", type=int, default=300, help="episodes per side for the wrapper latency")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    start = time.perf_counter()
    trajectories = rollouts(args.trajectories)
    print(f"generated {len(trajectories)} trajectories in {time.perf_counter() - start:.1f} s")
    update = bench_update(trajectories, args.rounds)
    print(
        f"update over {update['trajectories']} trajectories ({update['good']} Good, {update['bad']} Bad, "
        f"{update['bank_items']} items): {update['update_in_memory_s']:.3f} s in memory, "
        f"{update['update_with_store_s']:.3f} s with the store (opening it: {update['open_store_s']:.3f} s)"
    )
    print(
        f"appending {update['trajectories']} trajectories: {update['append_total_s']:.3f} s, "
        f"median {update['append_median_us']:.0f} µs each, {update['store_mb']:.1f} MB"
    )

    in_memory = ExperienceMemory(update_every=1, seed=0)
    for t in trajectories[:500]:
        in_memory.add(t)
    in_memory.update()
    wrapper = {"in_memory": bench_wrapper(in_memory, args.episodes)}
    with tempfile.TemporaryDirectory() as folder:
        stored = ExperienceMemory(folder, update_every=1, seed=0)
        for t in trajectories:
            stored.add(t)
        stored.update()
        wrapper["store"] = bench_wrapper(stored, args.episodes)
    print(
        "\n| memory | bare reset | wrapped reset | bare step | wrapped step | step ratio | added per step |"
    )
    print("|---|---|---|---|---|---|---|")
    for name, w in wrapper.items():
        print(
            f"| {name} | {w['bare_reset_median_us']:.0f} µs | {w['wrapped_reset_median_us']:.0f} µs | "
            f"{w['bare_step_median_us']:.0f} µs | {w['wrapped_step_median_us']:.0f} µs | "
            f"{w['step_ratio']:.2f} | {w['added_step_us']:+.0f} µs |"
        )
    if args.out:
        args.out.write_text(json.dumps({"update": update, "wrapper": wrapper}, indent=2) + "\n")


if __name__ == "__main__":
    main()
