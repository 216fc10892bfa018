"""The incentive study: what each reward scheme rewards, given a model's skills.

Every arm trains a :class:`~agent.DecisionPolicy` with GRPO group advantages through a
real SyntheticFacts env (its protocol, its simulated retriever, its reward scheme), then
evaluates it on the held-out questions, greedily and at the training temperature. One
run is a pure function of its arm, seed and skills: the same seed gives the same figures
bit for bit, in any process and in any order.

    searchgym study --config studies/frugal/incentive.yaml --output-dir DIR [--arms ...] [--seeds ...]

writes ``DIR/results.json``, ``DIR/results.md`` and ``DIR/sweep.png`` (see ``report.py``).
"""

from __future__ import annotations

import math
import os
import random
import statistics
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from searchgym.envs.config_base import read_yaml
from searchgym.envs.rewards import MinToolCallStore, tsas_stage
from searchgym.envs.synthetic_env import SyntheticFactsEnv
from studies.frugal.agent import DecisionPolicy, Recollector, SkillAgent, Skills

__all__ = ["load_study", "run_one", "run_study", "aggregate", "check_targets", "FIGURES"]

FIGURES = (
    "em",
    "f1",
    "st",
    "sr",
    "sr_known",
    "sr_unknown",
    "em_known",
    "em_unknown",
    "named_unknown",
    "unnamed_known",
)
"""The figures of one evaluation: percentages, except ``st`` (mean searches per question).

``named_unknown`` is the share of unknown one-hop questions whose recollection names
somebody (a policy that answers after a name answers them, wrongly), and
``unnamed_known`` the share of known questions whose recollection is "unknown" (a policy
that searches after "unknown" searches them): what the model's skills, not the scheme,
decide."""


def load_study(path: str | Path) -> dict[str, Any]:
    """The study file, with its folder recorded under ``_dir``."""
    path = Path(path)
    study = read_yaml(path)  # the library's one YAML reader: a study file may use extends
    if not isinstance(study, dict) or "arms" not in study:
        raise ValueError(f"{path}: a study file needs an 'arms' mapping.")
    study["_dir"] = str(path.resolve().parent)
    study["_config"] = f"studies/frugal/{path.name}"  # as the reproduce line names it
    return study


def _env(study: dict[str, Any], arm: dict[str, Any], seed: int, split: str, skills: Skills, train: bool):
    reward = arm.get("reward", "f1") if train else "f1"
    reward_kwargs = dict(arm.get("reward_kwargs") or {}) if train else {}
    if train and reward == "lightsearcher":
        reward_kwargs["store"] = MinToolCallStore()  # n per question, for this run only
    world = study["world"]
    return SyntheticFactsEnv(
        world_seed=seed,
        world_kwargs=world.get("kwargs") or {},
        split=split,
        split_by=world.get("split_by", "fact"),
        eval_fraction=world.get("eval_fraction", 0.25),
        retriever="simulated",
        retriever_kwargs={"noise_prob": skills.retrieval_noise, "seed": seed},
        topk=1,
        protocol=arm.get("protocol", "search_r1"),
        reward=reward,
        reward_kwargs=reward_kwargs,
        max_turns=4,
    )


def _advantages(
    arm: dict[str, Any], train: dict[str, Any], step: int, group: list[dict[str, Any]]
) -> list[float]:
    from searchgym.trainers.advantages import GroupFigures, group_advantages

    figures = GroupFigures(
        rewards=tuple(g["reward"] for g in group),
        searches=tuple(float(g["searches"]) for g in group),
        reasoning=tuple(float(g["reasoning"]) for g in group),
    )
    estimator = arm.get("advantage", "group_norm")
    warmup = arm.get("tsas_warmup_steps", train["tsas_warmup_steps"])
    if estimator == "tsas" and warmup is None:
        warmup = train["steps"]  # stage 1 throughout (the "without stage 2" ablation)
    return group_advantages(
        estimator,
        figures,
        step=step,
        tsas_warmup_steps=warmup,
        tsas_alpha=train.get("tsas_alpha", 0.01),
        tsas_variant=arm.get("tsas_variant", "eq4"),
    )


def _percent(values: Sequence[float]) -> float:
    return 100.0 * sum(values) / len(values) if values else float("nan")


def _figures(episodes: list[dict[str, Any]]) -> dict[str, float]:
    known = [e for e in episodes if e["known"]]
    unknown = [e for e in episodes if not e["known"]]
    return {
        "em": _percent([e["em"] for e in episodes]),
        "f1": _percent([e["f1"] for e in episodes]),
        "st": sum(e["searches"] for e in episodes) / len(episodes),
        "sr": _percent([e["searches"] > 0 for e in episodes]),
        "sr_known": _percent([e["searches"] > 0 for e in known]),
        "sr_unknown": _percent([e["searches"] > 0 for e in unknown]),
        "em_known": _percent([e["em"] for e in known]),
        "em_unknown": _percent([e["em"] for e in unknown]),
        "named_unknown": _percent([e["named"] for e in unknown if e["hops"] == 1]),
        "unnamed_known": _percent([not e["named"] for e in known]),
    }


def _episode(agent: SkillAgent, index: int, action: int, recalled: str | None, chain: list) -> dict[str, Any]:
    reward, info = agent.play(index, action, recalled, chain)
    return {
        "named": recalled is not None,
        "hops": len(chain),
        "reward": reward,
        "searches": info["num_searches"],
        "reasoning": info["reasoning_steps"],
        "em": info["em"],
        "f1": info["f1"],
        "known": bool(info["known"]),
    }


def evaluate(
    study: dict[str, Any],
    arm: dict[str, Any],
    seed: int,
    skills: Skills,
    policy: DecisionPolicy,
    greedy: bool,
) -> dict[str, float]:
    """The policy's figures on the held-out questions: greedy, or sampled at T = 1."""
    env = _env(study, arm, seed, "eval", skills, train=False)
    rng = random.Random(f"eval/{seed}")
    agent = SkillAgent(env, Recollector(env.unwrapped.world, skills, rng, greedy=greedy, seed=seed), rng)
    passes = 1 if greedy else int(study["eval"]["samples"])
    episodes = []
    for _ in range(passes):
        for index in range(len(env.unwrapped.questions)):
            if greedy:
                agent.rng = random.Random(f"eval/{seed}/{index}")  # a fixed chaining slip per question
            state, recalled, chain = agent.observe(index)
            action = policy.greedy(state) if greedy else policy.sample(state, rng)
            episodes.append(_episode(agent, index, action, recalled, chain))
    return _figures(episodes)


def run_one(study: dict[str, Any], arm_name: str, seed: int, skills: Skills | None = None) -> dict[str, Any]:
    """Train arm ``arm_name`` from seed ``seed`` and evaluate it; a pure function of its arguments."""
    skills = skills or Skills(**(study.get("skills") or {}))
    arm = study["arms"][arm_name] or {}
    train = study["train"]
    env = _env(study, arm, seed, "train", skills, train=True)
    rng = random.Random(f"train/{arm_name}/{seed}")
    agent = SkillAgent(env, Recollector(env.unwrapped.world, skills, rng, greedy=False, seed=seed), rng)
    policy = DecisionPolicy()
    n_questions = len(env.unwrapped.questions)
    every = int(train.get("curve_every") or 0)
    curve: list[dict[str, float]] = []
    window: list[dict[str, Any]] = []
    for step in range(int(train["steps"])):
        samples = []
        for index in rng.sample(range(n_questions), int(train["questions_per_step"])):
            group, decisions = [], []
            for _ in range(int(train["group_size"])):
                state, recalled, chain = agent.observe(index)
                action = policy.sample(state, rng)
                group.append(_episode(agent, index, action, recalled, chain))
                decisions.append((state, action))
            for (state, action), advantage in zip(
                decisions, _advantages(arm, train, step, group), strict=True
            ):
                samples.append((state, action, advantage))
            window += group
        policy.update(samples, float(train["lr"]))
        if every and (step + 1) % every == 0:
            curve.append({"step": step + 1, **_training_rates(window)})
            window = []
    greedy = evaluate(study, arm, seed, skills, policy, greedy=True)
    sampled = evaluate(study, arm, seed, skills, policy, greedy=False)
    stage = None
    if arm.get("advantage") == "tsas":
        warmup = arm.get("tsas_warmup_steps", train["tsas_warmup_steps"])
        stage = tsas_stage(int(train["steps"]) - 1, int(train["steps"]) if warmup is None else warmup)
    return {
        "seed": seed,
        **{k: round(v, 6) for k, v in greedy.items()},
        "sampled": {k: round(v, 6) for k, v in sampled.items()},
        "policy": policy.table(),
        **({"final_tsas_stage": stage} if stage is not None else {}),
        **({"curve": curve} if every else {}),
    }


def _training_rates(episodes: list[dict[str, Any]]) -> dict[str, float]:
    """The share (%) of known and of unknown questions searched in a window of training rollouts."""
    figures = _figures(episodes)
    return {key: round(figures[key], 6) for key in ("sr_known", "sr_unknown")}


# -- aggregation and targets -----------------------------------------------------------------


def _t975(n: int) -> float:
    from scipy.stats import t

    return float(t.ppf(0.975, n - 1))


def mean_ci(values: Sequence[float]) -> tuple[float, float]:
    """Mean and the half-width of its 95% t-interval (0 for one value)."""
    values = [v for v in values if not math.isnan(v)]
    if not values:
        return float("nan"), float("nan")
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, 0.0
    return mean, _t975(len(values)) * statistics.stdev(values) / math.sqrt(len(values))


def _summary(seeds: list[dict[str, float]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    ci: dict[str, float] = {}
    for key in FIGURES:
        out[key], ci[key] = (round(x, 4) for x in mean_ci([s[key] for s in seeds]))
    out["ci95"] = ci
    return out


def aggregate(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """``{arm: {"mean": {...greedy, "ci95", "sampled"}, "seeds": [...]}}``, seeds in order."""
    arms = {}
    for name, seeds in runs.items():
        seeds = sorted(seeds, key=lambda s: s["seed"])
        mean = _summary(seeds)
        mean["sampled"] = _summary([s["sampled"] for s in seeds])
        arms[name] = {"mean": mean, "seeds": seeds}
    return arms


def _value(seed: dict[str, Any], key: str, mode: str) -> float:
    return float((seed if mode == "greedy" else seed["sampled"])[key])


def _paired(
    arm: list[dict[str, Any]], base: list[dict[str, Any]], key: str, mode: str, cut: bool
) -> tuple[float, float]:
    """Mean and 95% half-width over seeds of arm − base (or, with ``cut``, 100·(1 − arm/base))."""
    by_seed = {s["seed"]: _value(s, key, mode) for s in base}
    values = []
    for s in arm:
        b = by_seed.get(s["seed"])
        if b is None or (cut and b == 0):
            continue
        v = _value(s, key, mode)
        values.append(100.0 * (1.0 - v / b) if cut else v - b)
    return mean_ci(values)


def check_targets(arms: dict[str, Any], targets: dict[str, Any]) -> list[dict[str, Any]]:
    """Each target of the study file, judged on the seed means (greedy and sampled)."""
    rows: list[dict[str, Any]] = []

    def add(mode: str, arm: str, what: str, value: tuple[float, float], op: str, threshold: float) -> None:
        mean, half = value
        met = {">=": mean >= threshold, ">": mean > threshold, "<=": mean <= threshold}[op]
        rows.append(
            {"eval": mode, "arm": arm, "target": f"{what} {op} {threshold:g}", "value": round(mean, 2),
             "ci95": round(half, 2), "met": bool(met)}
        )  # fmt: skip

    if "f1" not in arms or not targets:
        return rows
    f1 = arms["f1"]["seeds"]
    for mode in ("greedy", "sampled"):

        def figure(arm: str, key: str, mode: str = mode) -> tuple[float, float]:
            return mean_ci([_value(s, key, mode) for s in arms[arm]["seeds"]])

        add(mode, "f1", "sr_known", figure("f1", "sr_known"), ">=", targets["f1_sr_known_min"])
        for arm in (a for a in targets["frugal_arms"] if a in arms):
            seeds = arms[arm]["seeds"]
            add(mode, arm, "known-search cut vs f1", _paired(seeds, f1, "sr_known", mode, cut=True), ">=",
                targets["cut_min"])  # fmt: skip
            add(mode, arm, "sr_unknown", figure(arm, "sr_unknown"), ">=", targets["sr_unknown_min"])
            add(
                mode,
                arm,
                "EM − f1's EM",
                _paired(seeds, f1, "em", mode, cut=False),
                ">=",
                -targets["em_drop_max"],
            )
        if "sem" in arms:
            add(mode, "sem", "sr_known", figure("sem", "sr_known"), "<=", targets["sem_sr_known_max"])
            add(mode, "sem", "sr_unknown", figure("sem", "sr_unknown"), ">=", targets["sem_sr_unknown_min"])
        for ablation, full in targets["ablations"].items():
            if ablation in arms and full in arms:
                diff = _paired(arms[ablation]["seeds"], arms[full]["seeds"], "st", mode, cut=False)
                add(mode, ablation, f"ST − {full}'s ST (paper: more searches)", diff, ">", 0.0)
    return rows


# -- the whole study -------------------------------------------------------------------------

SWEPT = {"recall": ("recall", "recall_greedy"), "says_unknown": ("says_unknown", "says_unknown_greedy")}
"""The sweeps of the full study: each sets its skill, greedy and sampled alike (``sweep`` in the study file)."""


def _task(args: tuple[dict[str, Any], str, int, dict[str, float] | None]) -> tuple[str, int, dict[str, Any]]:
    study, arm, seed, skills = args
    return arm, seed, run_one(study, arm, seed, Skills(**skills) if skills else None)


def _rules_task(args: tuple[dict[str, Any], int, dict[str, float]]) -> list[dict[str, Any]]:
    from studies.frugal.fixed_policies import evaluate_rules

    study, seed, skills = args
    return evaluate_rules(study, [seed], Skills(**skills))


def _run_tasks(tasks: list[tuple], workers: int, task: Any = _task, progress: bool = False) -> list[Any]:
    """Every task's result, in order; with ``progress``, a bar that counts the finished runs."""
    from tqdm.auto import tqdm

    with tqdm(total=len(tasks), desc="study", unit="run", disable=not progress) as bar:
        if workers <= 1:
            done = []
            for one in tasks:
                done.append(task(one))
                bar.update(1)
            return done
        import multiprocessing

        with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) as pool:
            done = []
            for result in pool.map(task, tasks, chunksize=1):
                done.append(result)
                bar.update(1)
            return done


def _rules(study: dict[str, Any], seeds: Sequence[int], skills: Skills, workers: int) -> list[dict[str, Any]]:
    """Every deterministic rule (``fixed_policies``) on every seed, with its means over the seeds."""
    per_seed = _run_tasks([(study, s, skills.to_dict()) for s in seeds], workers, _rules_task)
    rules = []
    for i, row in enumerate(per_seed[0]):
        seeds_of_rule = [rows[i]["seeds"][0] for rows in per_seed]
        mean = {
            k: round(statistics.fmean(s[k] for s in seeds_of_rule), 4)
            for k in seeds_of_rule[0]
            if k not in ("seed", "sampled")
        }
        mean["sampled"] = {
            k: round(statistics.fmean(s["sampled"][k] for s in seeds_of_rule), 4)
            for k in seeds_of_rule[0]["sampled"]
        }
        rules.append({"rule": row["rule"], "mean": mean, "seeds": seeds_of_rule})
    return rules


def run_study(
    study: dict[str, Any],
    arms: Sequence[str] | None = None,
    seeds: Sequence[int] | None = None,
    progress: bool = False,
) -> dict[str, Any]:
    """Every arm x seed, then, for the full study only (no ``arms`` or ``seeds``), the sweeps over
    recall and over saying "unknown", and every deterministic rule (``rules: true``); the results dict.

    With ``progress``, a bar on standard error counts the finished runs."""
    unknown = sorted(set(arms or ()) - set(study["arms"]))
    if unknown:
        raise ValueError(f"unknown arms {unknown}; the study has {', '.join(study['arms'])}.")
    chosen_arms = list(arms or study["arms"])
    chosen_seeds = list(seeds if seeds is not None else study["seeds"])
    full = arms is None and seeds is None
    skills = Skills(**(study.get("skills") or {}))
    tasks: list[tuple] = [(study, a, s, None) for a in chosen_arms for s in chosen_seeds]
    knobs: list[tuple[str, float] | None] = [None] * len(tasks)  # the swept skill of each task
    sweep = study.get("sweep") or {}
    points = {knob: [float(x) for x in sweep.get(knob, [])] if full else [] for knob in SWEPT}
    for knob, values in points.items():
        for x in values:
            swept = {**skills.to_dict(), **{name: x for name in SWEPT[knob]}}
            runs = [(study, a, s, swept) for a in sweep["arms"] for s in sweep["seeds"]]
            tasks += runs
            knobs += [(knob, x)] * len(runs)
    workers = int(study.get("workers", os.cpu_count() or 1))
    started = time.perf_counter()
    done = _run_tasks(tasks, workers, progress=progress)
    rules = _rules(study, chosen_seeds, skills, workers) if full and study.get("rules") else None
    wall = time.perf_counter() - started
    main: dict[str, list[dict[str, Any]]] = {a: [] for a in chosen_arms}
    swept_runs: dict[tuple[str, float, str], list[dict[str, Any]]] = {}
    for knob, (arm, _, result) in zip(knobs, done, strict=True):
        if knob is None:
            main[arm].append(result)
        else:
            swept_runs.setdefault((*knob, arm), []).append(result)
    aggregated = aggregate(main)
    results: dict[str, Any] = {
        "arms": aggregated,
        "targets": check_targets(aggregated, study.get("targets") or {}),
        "settings": {
            "config": study["_config"],
            "skills": skills.to_dict(),
            "train": study["train"],
            "world": study["world"],
            "eval": study["eval"],
            "sweep_seeds": list(sweep.get("seeds", [])),
        },
    }
    for knob, values in points.items():
        if values:
            results["sweep" if knob == "recall" else f"sweep_{knob}"] = [
                {knob: x, "arm": a, **aggregate({a: swept_runs[(knob, x, a)]})[a]["mean"]}
                for x in values
                for a in sweep["arms"]
            ]
    if rules is not None:
        results["rules"] = rules
    results["_wall_s"] = round(wall, 1)
    return results


def run(
    config: str | Path,
    output_dir: str | Path | None,
    arms: Sequence[str] | None,
    seeds: Sequence[int] | None,
    progress: bool = True,
) -> int:
    """Entry point of ``searchgym study`` for this folder: run (a bar counts the finished
    runs unless ``progress`` is off), then write the report files."""
    import json

    from studies.frugal.report import render_summary, update_findings, write_report

    study = load_study(config)
    out = Path(output_dir or Path(study["_dir"]) / study.get("output_dir", "results"))
    out.mkdir(parents=True, exist_ok=True)
    results = run_study(study, arms, seeds, progress)
    wall = results.pop("_wall_s")
    text = json.dumps(results, indent=1) + "\n"
    (out / "results.json").write_text(text)
    write_report(json.loads(text), out)  # from the file's content, as a reader regenerates it
    findings = study.get("findings")  # the page that quotes the committed results
    if findings and out.resolve() == (Path(study["_dir"]) / study.get("output_dir", "results")).resolve():
        update_findings(json.loads(text), Path(study["_dir"]) / findings)
    print(render_summary(json.loads(text)))
    print(
        f"{len(results['arms'])} arms in {wall:.0f} s; every table in {out / 'results.md'}", file=sys.stderr
    )
    return 0


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(Path(__file__).with_name("incentive.yaml")))
    parser.add_argument("--output-dir")
    parser.add_argument("--arms", nargs="+")
    parser.add_argument("--seeds", nargs="+", type=int)
    a = parser.parse_args()
    sys.exit(run(a.config, a.output_dir, a.arms, a.seeds))
