"""What a study model recalls, and how likely it then searches: the decision probe of the CPU study.

For one arm of a study file and one seed, loads the warm start (cached by ``searchgym
study``; built here when missing) or, with ``--run``, the final checkpoint of a finished
run, and prints :func:`tiny_lm.evaluation.decision_probe` for each
protocol of the warm start, greedily and at the rollouts' temperature (``--samples``
recollections per question), on the training and the held-out split::

    python -m studies.frugal.tiny_lm.benchmarks.study_probe [--config studies/frugal/tiny_lm/study.yaml] [--arm f1] [--seed 0]
        [--run runs/study/f1/seed0 | --model runs/sft/sft-...] [--samples 8] [--memory]
        [--out study_probe.json]

``--model`` probes any model folder of the study's tokenizer as a warm start, such as
the protocol stage's folder before its recall top-up.

``--memory`` asks every question behind the warm start's scripted experience memory (a
rule bank and a few-shot example, as the memory arms' prompts carry them): does the
memory's layout cost the model its recall, or move its choice to search?

``named_right`` is the share of recollections that name somebody and are right: a
direct answer after a name pays only when it is high (the probe's docstring).
"""

from __future__ import annotations

import argparse
import logging
import random
from pathlib import Path

from benchmarks._common import write_report

REPO = Path(__file__).resolve().parents[4]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="studies/frugal/tiny_lm/study.yaml")
    parser.add_argument("--arm", default="f1")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--run", help="a finished run's folder: probe its final checkpoint")
    parser.add_argument("--model", help="a model folder to probe as the warm start (e.g. runs/sft/sft-...)")
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--memory", action="store_true", help="prompts behind the scripted memory")
    parser.add_argument("--out", help="also write the figures as JSON")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)

    from searchgym.trainers.grpo.checkpoint import latest_checkpoint
    from searchgym.trainers.grpo.model import load_model, load_tokenizer_for, resolve_device
    from studies.frugal.tiny_lm.evaluation import decision_probe
    from studies.frugal.tiny_lm.sft import protocol_instructions, scripted_memory
    from studies.frugal.tiny_lm.study import arm_config, load_study
    from studies.frugal.tiny_lm.warm_start import warm_start

    config = arm_config(load_study(args.config), args.arm, args.seed)
    if args.run and args.model:
        parser.error("give --run or --model, not both")
    if args.model:
        if not (Path(args.model) / "config.json").is_file():
            parser.error(f"{args.model} is not a model folder (no config.json)")
        folder: Path | None = Path(args.model)
    else:
        folder = latest_checkpoint(Path(args.run)) if args.run else warm_start(config)
    if folder is None:
        parser.error(f"{args.run} holds no checkpoint")
    tokenizer = load_tokenizer_for(config.model, folder)
    model = load_model(config.model, folder, resolve_device(config.model.device))
    temperature = config.rollout.temperature
    rows = []
    protocols = protocol_instructions(config) if not args.run else {config.env.kwargs["protocol"]: None}
    for protocol, text in protocols.items():
        kwargs = {**config.env.kwargs, "protocol": protocol}
        if text is not None:
            kwargs["instructions"] = text
        for split in ("train", "eval"):
            probe = config.replace(
                env={"id": config.env.id, "kwargs": kwargs},
                eval={"enabled": True, "env_kwargs": {"split": split}},
            )
            for label, temp, samples in (
                ("greedy", 0.0, 1),
                (f"T={temperature:g}", temperature, args.samples),
            ):
                memory = scripted_memory(probe, protocol, random.Random(args.seed)) if args.memory else None
                wrap = memory.wrapped if memory else None
                found = decision_probe(model, tokenizer, probe, temperature=temp, samples=samples, wrap=wrap)
                rows.append({"protocol": protocol, "split": split, "decoding": label, **found})
    names = [k for k in rows[0] if k not in ("protocol", "split", "decoding")]
    print(f"model: {folder}" + (" (prompts behind the scripted memory)" if args.memory else ""))
    print("| protocol | split | recollection | " + " | ".join(names) + " |")
    print("|---|---|---|" + "---|" * len(names))
    for row in rows:
        cells = " | ".join(f"{row[k]:.2f}" for k in names)
        print(f"| {row['protocol']} | {row['split']} | {row['decoding']} | {cells} |")
    if args.out:
        write_report(Path(args.out), {"model": str(folder), "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
