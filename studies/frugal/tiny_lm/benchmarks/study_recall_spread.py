"""How many known facts a study model recalls reliably enough that skipping their search pays.

For each run folder (``{output_dir}/{arm}/seed{S}`` of ``searchgym study``), samples
``--samples`` direct answers per known one-hop question of ``--split`` at each
``--temperatures`` (0 = greedy, once) with
:func:`tiny_lm.evaluation.recall_by_fact`, from the run's last checkpoint,
or with ``--warm-start`` from the warm start it began with. Prints, per temperature, the
mean share of right answers per fact and the share of facts whose rate reaches each
``--thresholds``; ``skippable`` is the share of the split's *known* questions (two-hop
ones included) that are one-hop questions about such facts: the cut in known-question
searches a policy would make if it skipped exactly the searches that pay. A direct answer
pays against a search that finds the answer 80% of the time when the fact's rate exceeds
0.59 under LightSearcher (a needless search earns 0.74) and 0.8 under F1. With ``--plain``
each question is asked as a recall lesson asks it (``Question: <q> Answer:``, no prompt):
how well the facts are stored, whatever the protocol's format::

    python -m studies.frugal.tiny_lm.benchmarks.study_recall_spread runs/study/lightsearcher_no_memory/seed2 [--warm-start]
        [--split eval] [--samples 16] [--temperatures 0 0.7 1] [--thresholds 0.59 0.8] [--plain]
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Any

from benchmarks._common import run_policy

REPO = Path(__file__).resolve().parents[4]


def spread(
    run: Path,
    *,
    warm_start: bool,
    split: str,
    samples: int,
    temperatures: list[float],
    thresholds: list[float],
    plain: bool = False,
) -> list[dict[str, Any]]:
    """One row per temperature: the mean rate, and per threshold the share of facts and
    the share of known questions that are skippable."""
    from studies.frugal.tiny_lm.demos import demo_env
    from studies.frugal.tiny_lm.evaluation import recall_by_fact

    measure = plain_recall_by_fact if plain else recall_by_fact

    config, tokenizer, model = run_policy(run, warm_start=warm_start)
    env = demo_env(int(config.env.kwargs.get("world_seed", 0)), config.env.kwargs, split)
    known = [q for q in env.questions if q.known]
    one_hop = [env.world.chain(q.id)[0] for q in known if (q.hops or 1) == 1]
    env.close()
    if not one_hop:
        raise SystemExit(f"the {split} split of {run} holds no known one-hop question")
    rows = []
    for temperature in temperatures:
        rates = measure(
            model,
            tokenizer,
            config,
            split=split,
            samples=samples if temperature > 0 else 1,
            temperature=temperature,
        )
        row: dict[str, Any] = {
            "T": temperature,
            "facts": len(rates),
            "mean": sum(rates.values()) / len(rates),
        }
        for threshold in thresholds:
            row[f"facts >= {threshold:g}"] = sum(r >= threshold for r in rates.values()) / len(rates)
            row[f"skippable >= {threshold:g}"] = sum(rates[f] >= threshold for f in one_hop) / len(known)
        rows.append(row)
    return rows


def plain_recall_by_fact(
    model: Any, tokenizer: Any, config: Any, *, split: str, samples: int, temperature: float
) -> dict[Any, float]:
    """As :func:`~tiny_lm.evaluation.recall_by_fact`, each known one-hop
    question of ``split`` asked in a recall lesson's words, without the prompt."""
    from searchgym.envs.metrics import exact_match
    from searchgym.trainers.grpo.generation import SamplingSettings, sample_actions
    from studies.frugal.tiny_lm.demos import demo_env, lesson_context

    env = demo_env(int(config.env.kwargs.get("world_seed", 0)), config.env.kwargs, split)
    contexts, facts = [], []
    for question in env.questions:
        if question.known and (question.hops or 1) == 1:
            text = lesson_context(question.question)
            contexts += [tokenizer(text, add_special_tokens=False)["input_ids"]] * samples
            facts += [env.world.chain(question.id)[0]] * samples
    env.close()
    settings = SamplingSettings(temperature, 1.0, config.rollout.generation_batch_size)
    actions = sample_actions(model, tokenizer, contexts, [24] * len(contexts), ["\n"], settings)
    scores: dict[Any, list[float]] = {}
    for fact, action in zip(facts, actions, strict=True):
        scores.setdefault(fact, []).append(exact_match(action.text.split("Question:")[0], [fact.object]))
    return {fact: sum(v) / len(v) for fact, v in scores.items()}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("runs", nargs="+", type=Path, help="run folders of searchgym study")
    parser.add_argument(
        "--warm-start", action="store_true", help="probe the warm start, not the last checkpoint"
    )
    parser.add_argument(
        "--split", default="eval", choices=["train", "eval", "all"], help="default: %(default)s"
    )
    parser.add_argument("--samples", type=int, default=16, help="answers per question when T > 0")
    parser.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 0.7, 1.0])
    parser.add_argument("--thresholds", type=float, nargs="+", default=[0.59, 0.8])
    parser.add_argument(
        "--plain", action="store_true", help="ask as the recall lessons do, without the prompt"
    )
    args = parser.parse_args()
    logging.disable(logging.INFO)
    for run in args.runs:
        rows = spread(
            run,
            warm_start=args.warm_start,
            split=args.split,
            samples=args.samples,
            temperatures=args.temperatures,
            thresholds=args.thresholds,
            plain=args.plain,
        )
        names = list(rows[0])
        form = "recall lessons' words" if args.plain else "protocol's format"
        print(f"{run} ({'warm start' if args.warm_start else 'last checkpoint'}, {args.split} split, {form})")
        print("| " + " | ".join(names) + " |")
        print("|" + "---|" * len(names))
        for row in rows:
            print(
                "| " + " | ".join(f"{v:.2f}" if isinstance(v, float) else str(v) for v in row.values()) + " |"
            )


if __name__ == "__main__":
    main()
