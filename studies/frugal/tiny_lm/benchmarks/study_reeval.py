"""Evaluate finished study runs again from their last checkpoint, and split their known-question searches.

For each run folder (``{output_dir}/{arm}/seed{S}`` of ``searchgym study``), copies the
folder aside, resumes its trainer there (the final weights and, for the memory arms, the
final experience store), and runs the study's held-out evaluation again. Greedy decoding
makes it repeat ``eval.json``'s figures; the script checks EM and ST against it and
prints the evaluation's skills, including the split of known-question searches by what
the model recalls (``sr_known_recalled`` / ``sr_known_unrecalled`` / ``sr_known_2hop``,
:func:`tiny_lm.evaluation.skills`), which runs finished before that
split existed lack. The run folders are never written::

    python -m studies.frugal.tiny_lm.benchmarks.study_reeval runs/study/lightsearcher_no_memory/seed0 [more runs] [--out reeval.json]
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import tempfile
from pathlib import Path
from typing import Any

from benchmarks._common import write_report

REPO = Path(__file__).resolve().parents[4]

SHOWN = ("sr_known_recalled", "sr_known_unrecalled", "sr_known_2hop", "forced_recall", "forced_chain")


def reevaluate(run: Path, prompt: str = "own", warm_start: bool = False) -> dict[str, Any]:
    """The held-out evaluation of ``run``'s last checkpoint (or, with ``warm_start``, its
    starting model), as a dict; ``prompt`` is ``"own"``, ``"plain"`` or a run folder whose
    final memory store gives the prompt (see the module docstring)."""
    from searchgym.trainers.grpo.envs import build_memory, memory_store_dir
    from searchgym.trainers.grpo.trainer import GRPOTrainer
    from studies.frugal.tiny_lm.config import load_run_config
    from studies.frugal.tiny_lm.evaluation import evaluate_model

    saved = json.loads((run / "eval.json").read_text())
    if not list((run / "checkpoints").glob("step_*")):
        raise SystemExit(f"{run} holds no checkpoint to evaluate")
    with tempfile.TemporaryDirectory() as scratch:
        copy = Path(scratch) / run.name
        shutil.copytree(run, copy, ignore=shutil.ignore_patterns("wandb"))
        config = load_run_config(copy / "config.yaml")
        config = config.replace(output_dir=str(copy), wandb={"enabled": False})
        if warm_start:
            shutil.rmtree(copy / "checkpoints")
        trainer = GRPOTrainer(config, progress=False)
        try:
            trainer.setup()
            if not warm_start and trainer.state.step != config.steps:
                raise SystemExit(
                    f"{run}: its last checkpoint is step {trainer.state.step}, not {config.steps}"
                )
            memory = trainer.memory
            if prompt == "plain":
                memory = None
                config = config.replace(memory={"kind": "none"})
            elif prompt != "own":
                other = Path(prompt)
                other_config = load_run_config(other / "config.yaml")
                if other_config.memory.kind == "none":
                    raise SystemExit(f"{other} trained without experience memory: no prompt to borrow")
                borrowed = vars(other_config.memory)
                store = memory_store_dir(other_config.memory, other)
                if store is not None:  # an experience store: read a copy, never the run's own
                    borrowed = {**borrowed, "path": str(shutil.copytree(store, Path(scratch) / "borrowed"))}
                config = config.replace(
                    memory=borrowed,
                    rollout={
                        **vars(config.rollout),
                        "max_context_tokens": other_config.rollout.max_context_tokens,
                    },
                )
                memory = build_memory(config.memory, copy, config.seed)
            result = evaluate_model(trainer.model, trainer.tokenizer, config, memory=memory).to_dict()
        finally:
            trainer.close()
    result["run"] = str(run)
    result["step"] = trainer.state.step
    result["prompt"] = prompt
    result["warm_start"] = warm_start
    same = prompt == "own" and not warm_start
    result["repeats_eval_json"] = (
        all(abs(result[k] - saved[k]) < 1e-9 for k in ("em", "st", "sr")) if same else None
    )
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="finished run folders (each holds eval.json)")
    parser.add_argument(
        "--prompt",
        default="own",
        help="'own' (default), 'plain' (no experience memory) or a run folder whose memory to use",
    )
    parser.add_argument(
        "--warm-start", action="store_true", help="evaluate each run's starting model instead"
    )
    parser.add_argument("--out", help="also write the results as JSON")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    missing = [str(run) for run in args.runs if not (run / "eval.json").is_file()]
    if missing:
        parser.error(f"not a finished run (no eval.json): {', '.join(missing)}")
    if args.prompt not in ("own", "plain") and not (Path(args.prompt) / "config.yaml").is_file():
        parser.error(f"--prompt {args.prompt}: not 'own', 'plain' or a run folder (with config.yaml)")
    results = [reevaluate(run, args.prompt, args.warm_start) for run in args.runs]
    print(f"prompt: {args.prompt}; model: {'warm start' if args.warm_start else 'last checkpoint'}")
    print(
        "| run | EM | EM 1-hop | EM 2-hop | EM unknown | ST | SR known | "
        + " | ".join(SHOWN)
        + " | repeats eval.json |"
    )
    print("|---|---|---|---|---|---|---|" + "---|" * len(SHOWN) + "---|")
    for r in results:
        found = r["settings"]["skills"]
        cells = " | ".join("-" if found.get(k) is None else f"{100 * found[k]:.0f}" for k in SHOWN)
        known = r["splits"].get("known", {}).get("sr")
        known_cell = "-" if known is None else f"{100 * known:.0f}"
        ems = " | ".join(_split_em(r, split) for split in ("1-hop", "2-hop", "unknown"))
        repeats = "-" if r["repeats_eval_json"] is None else r["repeats_eval_json"]
        print(
            f"| {r['run']} | {100 * r['em']:.1f} | {ems} | {r['st']:.2f} | {known_cell} | {cells} | {repeats} |"
        )
    if args.out:
        write_report(Path(args.out), {"runs": results})
    return 0 if all(r["repeats_eval_json"] is not False for r in results) else 1


def _split_em(result: dict[str, Any], split: str) -> str:
    em = result["splits"].get(split, {}).get("em")
    return "-" if em is None else f"{100 * em:.1f}"


if __name__ == "__main__":
    raise SystemExit(main())
