"""``searchgym study --config studies/real_lm/study.yaml``: the real-LM study's entry point."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from searchgym.commands import log_to_stderr
from studies.real_lm.report import format_summary
from studies.real_lm.study import configure_threads, load_study, run_study


def run(
    config: str | Path,
    output_dir: str | Path | None,
    arms: Sequence[str] | None,
    seeds: Sequence[int] | None,
    *,
    collect: bool = False,
    progress: bool = True,
) -> int:
    """Run (or pick up) the study file ``config``; print its summary table.

    With ``collect``, nothing new runs: ``results.json`` is written from the finished cells.
    """
    study = load_study(config)
    configure_threads(int(study.get("threads", 1)))
    if progress:
        log_to_stderr("searchgym.trainers")  # to sys.stderr as it is at each line, as the CLI does
    results = run_study(
        study,
        output_dir,
        arms=arms,
        seeds=seeds,
        collect=collect,
        log=lambda m: print(m, file=sys.stderr, flush=True),
    )
    print(format_summary(results))
    out = Path(output_dir or study["output_dir"])
    print(f"results: {out / 'results.json'}", file=sys.stderr)
    return 0
