"""Add the cells of a second output folder to a study's results file.

    python -m studies.real_lm.merge --results studies/real_lm/results/results.json \
        --config studies/real_lm/study.yaml --output-dir runs/real_lm_more

A study whose cells ran in two output folders (two machines, or a lost folder) ends with a
results file and a folder of further cells. The folder's warm start is trained from the same
settings and data, but float arithmetic on another machine can tip a borderline choice, so the
merge first compares the two warm starts on every held-out question: their known/unknown
flags must agree exactly, or nothing is written. How far they agree (the probe's answers,
the warm-started agent's greedy episodes, its recall and ``p(search)``, the warm start's
losses) is recorded under
``merged`` in the results; the arms are then aggregated again from all cells.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from searchgym.error import InvalidArgumentError

from .data import prepare_data
from .study import _collect, _write, aggregate, load_study, run_baselines, run_first_action, study_warm_start

__all__ = ["cells_of", "merge_results"]

_CELL_FIELDS = ("steps", "train_s", "wall_s", "median_step_s", "cpu_s", "train_cpu_s", "rollouts")


def cells_of(results: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The cells a results file was aggregated from, in :func:`aggregate`'s input shape."""
    cells = []
    for arm, entry in results["arms"].items():
        for seed in entry["seeds"]:
            questions = seed["questions"]
            cells.append(
                {
                    "arm": arm,
                    "seed": seed["seed"],
                    **{k: seed.get(k) for k in _CELL_FIELDS},
                    "greedy": [
                        {k: v for k, v in q.items() if k not in ("known", "sampled")} for q in questions
                    ],
                    "sampled": [{"qid": q["qid"], **q["sampled"]} for q in questions],
                }
            )
    return cells


def _agreement(
    results: Mapping[str, Any], baselines: Mapping[str, Any], first_action: Mapping[str, Any]
) -> dict[str, Any]:
    """On how many held-out questions the two warm starts agree."""
    old_probe = {p["qid"]: p for p in results["known"]["probe"]}
    new_probe = {p["qid"]: p for p in baselines["probe"]}
    qids = old_probe.keys() | new_probe.keys()
    differ = sorted(q for q in qids if old_probe.get(q, {}).get("known") != new_probe.get(q, {}).get("known"))
    if differ:
        raise InvalidArgumentError(
            f"the two warm starts split the held-out questions differently ({len(differ)} questions: "
            f"{', '.join(differ[:5])}{' ...' if len(differ) > 5 else ''}); their cells are not comparable"
        )
    old_greedy = {q["qid"]: q for q in results["baseline_questions"]["warm_started"]}
    new_greedy = baselines["rows"]["warm_started"]["questions"]
    return {
        "questions": len(old_probe),
        "known_flags": len(old_probe),
        "probe_answers": sum(old_probe[q]["answer"] == p["answer"] for q, p in new_probe.items()),
        "warm_started_greedy": sum(
            (old_greedy[q["qid"]]["searches"], old_greedy[q["qid"]]["answer"]) == (q["searches"], q["answer"])
            for q in new_greedy
        ),
        **_first_action_agreement(results["first_action"]["questions"], first_action["questions"]),
    }


def _first_action_agreement(
    old: Sequence[Mapping[str, Any]], new: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    """Same greedy recall, and the largest change of ``p(search)`` after it."""
    before = {q["qid"]: q for q in old}
    return {
        "recall": sum(before[q["qid"]]["recall"] == q["recall"] for q in new),
        "p_search_max_change": round(max(abs(before[q["qid"]]["p_search"] - q["p_search"]) for q in new), 4),
    }


def merge_results(
    results: Mapping[str, Any],
    cells: Sequence[dict[str, Any]],
    baselines: Mapping[str, Any],
    first_action: Mapping[str, Any],
    warm: Mapping[str, Any],
    arm_order: Sequence[str],
    folder: str,
) -> dict[str, Any]:
    """``results`` with ``cells`` added to its arms (from a folder whose warm start gave
    ``baselines``, ``first_action`` and ``warm``), and a ``merged`` entry saying what was
    added and how far the two warm starts agree."""
    agreement = _agreement(results, baselines, first_action)
    committed = cells_of(results)
    have = {(c["arm"], c["seed"]) for c in committed}
    clash = sorted((c["arm"], c["seed"]) for c in cells if (c["arm"], c["seed"]) in have)
    if clash:
        raise InvalidArgumentError(f"cells already in the results file: {clash}")
    if not cells:
        raise InvalidArgumentError(f"{folder!r} holds no finished cell of the study's arms and seeds")
    every = sorted([*committed, *cells], key=lambda c: (list(arm_order).index(c["arm"]), c["seed"]))
    known = {p["qid"]: p["known"] for p in results["known"]["probe"]}
    passes = {"main": warm, "decision": warm.get("decision", {})}
    entry = {
        "folder": folder,
        "cells": [[c["arm"], c["seed"]] for c in cells],
        "warm_start": {
            name: {k: p.get(k) for k in ("loss_first", "loss_last10", "wall_s", "torch_threads")}
            for name, p in passes.items()
        },
        "agreement": agreement,
    }
    return {**results, "arms": aggregate(every, known), "merged": [*results.get("merged", []), entry]}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m studies.real_lm.merge", description=__doc__)
    parser.add_argument("--results", type=Path, required=True, help="the results file to add to (rewritten)")
    parser.add_argument("--config", required=True, help="the study file both runs used")
    parser.add_argument("--output-dir", type=Path, required=True, help="the folder holding the further cells")
    args = parser.parse_args(argv)
    try:
        study = load_study(args.config)
        out = args.output_dir
        results = json.loads(args.results.read_text(encoding="utf-8"))
        data = prepare_data(study["data"], out / "data")
        model_dir, warm = study_warm_start(study, out, data, reuse_only=True)
        baselines = run_baselines(study, out, data, model_dir, reuse_only=True)
        known = {p["qid"]: p["known"] for p in baselines["probe"]}
        first_action = run_first_action(study, out, data, model_dir, known)
        cells = _collect(study, out, data, model_dir, [])
        merged = merge_results(results, cells, baselines, first_action, warm, list(study["arms"]), out.name)
    except (InvalidArgumentError, OSError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    _write(args.results, merged)
    entry = merged["merged"][-1]
    print(f"added {len(entry['cells'])} cells to {args.results}; agreement {entry['agreement']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
