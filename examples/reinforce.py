"""REINFORCE with a baseline on a searchgym env, through the plain Gymnasium API.

searchgym envs are ordinary Gymnasium envs, so any RL algorithm can drive them. This
example learns *when to search* on SyntheticFacts under the ``cost`` reward (F1 minus 0.1
per search, charged when the answer is right):

* two actions per question, each a searchgym policy that plays the whole episode:
  ``answer`` (:class:`~searchgym.policies.DirectPolicy`, which remembers the world's
  "known" facts) and ``search`` (:class:`~searchgym.policies.NaiveRAGPolicy`, which
  searches with the question, then answers from the top passage);
* a softmax policy over the two, linear in the question's features
  ``[1, known, two_hop]`` read from ``reset``'s ``info``;
* REINFORCE: ``W += lr · (R − b) · ∇ log π(a | x)``, with the baseline ``b`` the mean
  reward of the batch.

Answering a known question from memory scores 1.0; searching for it costs 0.1 (and a
two-hop question is lost by a single search), so the search rate on known questions falls
towards 0 while unknown one-hop questions keep being searched (0.9 against 0). Runs in a
few seconds on a CPU::

    python examples/reinforce.py --episodes 3200
"""

from __future__ import annotations

import argparse
import time

import gymnasium as gym
import numpy as np

import searchgym  # noqa: F401  (registers the env ids)
from searchgym.policies import DirectPolicy, NaiveRAGPolicy, synthetic_knowledge

ACTIONS = ("answer", "search")


def features(info: dict) -> np.ndarray:
    """``[1, known, two_hop]`` of the question, from the info ``reset`` returns."""
    return np.array([1.0, float(info["known"]), float(info["hops"] == 2)])


def softmax(logits: np.ndarray) -> np.ndarray:
    z = np.exp(logits - logits.max())
    return z / z.sum()


def play(env: gym.Env, policy, options: dict, seed: int) -> tuple[float, dict, dict]:
    """One episode of a searchgym policy: ``(terminal reward, reset info, final info)``."""
    context, first = env.reset(seed=seed, options=options)
    while True:
        action = policy.act([context])[0]
        observation, reward, terminated, truncated, info = env.step(action)
        context += action + observation
        if terminated or truncated:
            return float(reward), first, info


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--episodes", type=int, default=3200, help="episodes in all (default: %(default)s)")
    parser.add_argument("--batch", type=int, default=32, help="episodes per update (default: %(default)s)")
    parser.add_argument("--lr", type=float, default=2.0, help="learning rate (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="seed (default: %(default)s)")
    args = parser.parse_args(argv)

    env = gym.make("searchgym/SyntheticFacts-v1", reward="cost")
    world = env.unwrapped.world
    policies = {
        "answer": DirectPolicy(knowledge=synthetic_knowledge(world)),
        "search": NaiveRAGPolicy(),
    }
    rng = np.random.default_rng(args.seed)
    weights = np.zeros((3, len(ACTIONS)))  # logits = features · weights
    num_questions = len(env.unwrapped.questions)
    history: list[tuple[np.ndarray, bool, float]] = []  # (features, searched, reward) per episode
    start = time.perf_counter()
    for first in range(0, args.episodes, args.batch):
        grads, rewards = [], []
        for n in range(first, min(first + args.batch, args.episodes)):
            options = {"index": int(rng.integers(num_questions))}
            x = features(env.reset(seed=n, options=options)[1])
            probs = softmax(x @ weights)
            a = int(rng.choice(len(ACTIONS), p=probs))
            reward, _, _ = play(env, policies[ACTIONS[a]], options, seed=n)
            grads.append(np.outer(x, np.eye(len(ACTIONS))[a] - probs))  # ∇_W log π(a | x)
            rewards.append(reward)
            history.append((x, ACTIONS[a] == "search", reward))
        baseline = float(np.mean(rewards))
        for grad, reward in zip(grads, rewards, strict=True):
            weights += args.lr * (reward - baseline) * grad / len(rewards)
    elapsed = time.perf_counter() - start

    def search_prob(w: np.ndarray, known: bool) -> float:
        """Mean P(search | x) over the episodes' questions with that known flag."""
        xs = [x for x, _, _ in history if bool(x[1]) == known]
        return float(np.mean([softmax(x @ w)[1] for x in xs]))

    window = history[-max(args.batch, len(history) // 8) :]
    summary = {
        "p_search_known_start": search_prob(np.zeros_like(weights), True),
        "p_search_known_end": search_prob(weights, True),
        "p_search_unknown_start": search_prob(np.zeros_like(weights), False),
        "p_search_unknown_end": search_prob(weights, False),
        "reward_first_batch": float(np.mean([r for _, _, r in history[: args.batch]])),
        "reward_last_window": float(np.mean([r for _, _, r in window])),
    }
    print(f"REINFORCE on SyntheticFacts (cost reward): {len(history)} episodes in {elapsed:.1f} s")
    print(
        f"P(search) on known questions:   {summary['p_search_known_start']:.2f} -> {summary['p_search_known_end']:.2f}"
    )
    print(
        f"P(search) on unknown questions: {summary['p_search_unknown_start']:.2f} -> "
        f"{summary['p_search_unknown_end']:.2f}"
    )
    print(
        f"mean reward: {summary['reward_first_batch']:.3f} (first batch) -> "
        f"{summary['reward_last_window']:.3f} (last {len(window)} episodes)"
    )
    env.close()
    return summary


if __name__ == "__main__":
    main()
