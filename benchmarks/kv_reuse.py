"""Rollout and evaluation time with each episode's key/value cache kept between turns, against
encoding every turn's whole context.

The built-in trainer's sampler (``SamplingSettings.reuse_cache``) and the ``hf`` policy
(``HFPolicy(reuse_cache=...)``) keep each episode's cache from one turn to the next, so a
turn encodes only the tokens after what the model already encoded
(``searchgym.policies.turn_cache``). This script runs the same work both ways, interleaved
with the order alternating, on one torch thread, for each model:

* **rollouts**: one GRPO step's rollouts (``RolloutCollector.collect``) on SyntheticFacts
  with Search-R1's protocol, ``--questions`` x G = ``--group-size``, up to ``--max-turns``
  turns of ``--max-new-tokens`` tokens, sampled at temperature 1 with a fixed seed;
* **evaluation**: ``searchgym.policies.evaluate`` with ``HFPolicy`` (greedy) over
  ``--eval-episodes`` episodes, side by side.

It counts the tokens the model encodes before sampling (the first forward pass of each
``generate`` call and the trainer's shared-prompt passes, padding included) against the
tokens it generates, checks that both ways
give the same episodes token for token, and reports medians and ratios::

    OMP_NUM_THREADS=1 python -m benchmarks.kv_reuse --out benchmarks/results/kv_reuse.json
    python -m benchmarks.render_docs   # docs/evaluation.md's table from that file

SmolLM2-135M-Instruct must be pulled first (``searchgym models pull smollm2-135m-instruct``);
``--models tiny`` runs without it.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks._common import write_report

ENV_ID = "searchgym/SyntheticFacts-v1"


class Counter:
    """Counts the tokens the model encodes before sampling: every forward pass outside
    ``generate`` (the trainer's shared prompts) and the first one of each ``generate`` call
    (the contexts), padding included."""

    def __init__(self, model: Any):
        self.model, self.generate = model, model.generate
        self.encoded = 0
        self._inside = False
        self._first = False
        self.handle = model.get_input_embeddings().register_forward_hook(self._hook)
        model.generate = self._generate

    def _generate(self, *args: Any, **kwargs: Any) -> Any:
        self._inside = self._first = True
        try:
            return self.generate(*args, **kwargs)
        finally:
            self._inside = False

    def _hook(self, module: Any, inputs: Any, output: Any) -> None:
        if not self._inside or self._first:
            self._first = False
            self.encoded += int(inputs[0].numel())

    def close(self) -> None:
        self.handle.remove()
        del self.model.generate


def load(name: str, root: Path) -> tuple[Any, Any]:
    import torch

    from searchgym.policies.tiny import build_tiny_lm, load_tiny_lm, load_tokenizer

    if name == "tiny":
        model, tok = load_tiny_lm(build_tiny_lm(root / "tiny", hidden_size=128, num_layers=4))
        return model.float().eval(), tok
    from transformers import AutoModelForCausalLM

    from searchgym.models import resolve_model

    folder = resolve_model("smollm2-135m-instruct")
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    return model, load_tokenizer(folder)


def rollouts(model: Any, tok: Any, args: argparse.Namespace) -> dict[str, Any]:
    import gymnasium as gym

    from searchgym.policies.chat import ChatFormatter
    from searchgym.trainers.grpo.generation import SamplingSettings
    from searchgym.trainers.grpo.rollout import RolloutCollector

    seconds: dict[bool, list[float]] = {True: [], False: []}
    counts: dict[bool, list[tuple[int, int, int]]] = {True: [], False: []}
    same = []
    for rep in range(args.warmup + args.reps):
        got = {}
        for reuse in (True, False) if rep % 2 == 0 else (False, True):
            collector = RolloutCollector(
                lambda: gym.make(ENV_ID, protocol="search_r1", max_turns=args.max_turns),
                model,
                tok,
                ChatFormatter(tok),
                max_new_tokens=args.max_new_tokens,
                max_context_tokens=4096,
                sampling=SamplingSettings(temperature=1.0, batch_size=64, reuse_cache=reuse),
            )
            counter = Counter(model)
            start = time.perf_counter()
            episodes = collector.collect(list(range(args.questions)), args.group_size, seed=100 + rep)
            elapsed = time.perf_counter() - start
            counter.close()
            collector.close()
            got[reuse] = [ep.token_ids for ep in episodes]
            if rep >= args.warmup:
                seconds[reuse].append(elapsed)
                generated = sum(ep.action_tokens for ep in episodes)
                counts[reuse].append((counter.encoded, generated, len(episodes)))
        same.append(got[True] == got[False])
    return summary(seconds, counts, same, "step")


def evaluation(model: Any, tok: Any, args: argparse.Namespace) -> dict[str, Any]:
    import gymnasium as gym

    from searchgym.policies import HFPolicy, evaluate

    seconds: dict[bool, list[float]] = {True: [], False: []}
    counts: dict[bool, list[tuple[int, int, int]]] = {True: [], False: []}
    same = []
    for rep in range(args.warmup + args.reps):
        got = {}
        for reuse in (True, False) if rep % 2 == 0 else (False, True):
            policy = HFPolicy(
                model,
                tokenizer=tok,
                max_new_tokens=args.max_new_tokens,
                batch_size=args.eval_episodes,
                reuse_cache=reuse,
            )
            actions: list[list[str]] = []
            act = policy.act
            policy.act = lambda contexts, act=act, actions=actions: (
                actions.append(act(contexts)) or actions[-1]
            )
            generated: list[int] = []
            complete = policy.complete

            def counted(texts: Any, complete: Any = complete, generated: list[int] = generated) -> Any:
                out = complete(texts)
                generated.extend(len(c.completion_ids) for c in out)
                return out

            policy.complete = counted
            counter = Counter(model)
            result = evaluate(
                lambda: gym.make(ENV_ID, protocol="search_r1", max_turns=args.max_turns),
                policy,
                args.eval_episodes,
                seed=rep,
                batch_size=args.eval_episodes,
                progress=False,
            )
            counter.close()
            got[reuse] = actions
            if rep >= args.warmup:
                seconds[reuse].append(result.wall_time_s / result.episodes)
                counts[reuse].append((counter.encoded, sum(generated), result.episodes))
        same.append(got[True] == got[False])
    return summary(seconds, counts, same, "episode")


def summary(
    seconds: dict[bool, list[float]],
    counts: dict[bool, list[tuple[int, int, int]]],
    same: list[bool],
    unit: str,
) -> dict[str, Any]:
    med = statistics.median

    def per_episode(reuse: bool, k: int) -> float:
        return med(c[k] / c[2] for c in counts[reuse])

    return {
        f"s_per_{unit}_whole": seconds[False],
        f"s_per_{unit}_reuse": seconds[True],
        "median_s_whole": med(seconds[False]),
        "median_s_reuse": med(seconds[True]),
        "speedup": med(seconds[False]) / med(seconds[True]),
        "encoded_per_episode_whole": per_episode(False, 0),
        "encoded_per_episode_reuse": per_episode(True, 0),
        "generated_per_episode": per_episode(True, 1),
        "same_tokens_every_rep": all(same),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--models", nargs="+", default=["tiny", "smollm2"], choices=["tiny", "smollm2"])
    parser.add_argument("--reps", type=int, default=3, help="timed runs per way (default: %(default)s)")
    parser.add_argument(
        "--warmup", type=int, default=1, help="untimed runs per way first (default: %(default)s)"
    )
    parser.add_argument("--questions", type=int, default=2, help="questions per step (default: %(default)s)")
    parser.add_argument("--group-size", type=int, default=2, help="G (default: %(default)s)")
    parser.add_argument("--max-turns", type=int, default=4, help="turns per episode (default: %(default)s)")
    parser.add_argument(
        "--max-new-tokens", type=int, default=24, help="tokens per turn (default: %(default)s)"
    )
    parser.add_argument(
        "--eval-episodes", type=int, default=2, help="episodes per evaluation (default: %(default)s)"
    )
    parser.add_argument("--out", type=Path, help="write the figures as JSON")
    args = parser.parse_args()
    logging.disable(logging.INFO)
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            model, tok = load(name, Path(tmp))
            for kind, run in (("rollouts", rollouts), ("evaluation", evaluation)):
                result = {"model": name, "kind": kind, **run(model, tok, args)}
                results.append(result)
                print(
                    f"{name} {kind}: {result['median_s_whole']:.2f} s -> {result['median_s_reuse']:.2f} s "
                    f"(x{result['speedup']:.2f}); encoded per episode {result['encoded_per_episode_whole']:.0f} -> "
                    f"{result['encoded_per_episode_reuse']:.0f} for {result['generated_per_episode']:.0f} generated; "
                    f"same tokens: {result['same_tokens_every_rep']}",
                    flush=True,
                )
    settings = {k: v for k, v in vars(args).items() if k != "out"}
    write_report(
        args.out, {"torch_threads": torch.get_num_threads(), "settings": settings, "results": results}
    )


if __name__ == "__main__":
    main()
