"""``searchgym study --config studies/frugal/tiny_lm/study.yaml``: every arm for every seed, then the table and plot."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from searchgym.commands import log_to_stderr
from studies.frugal.tiny_lm.study import format_results, load_study, run_study


def run(
    config: str | Path,
    output_dir: str | Path | None,
    arms: Sequence[str] | None,
    seeds: Sequence[int] | None,
    *,
    collect: bool = False,
    progress: bool = True,
) -> int:
    """Run (or with ``collect``, only tabulate) the study file ``config``; print its table."""
    study = load_study(config)
    if output_dir:
        study["output_dir"] = str(output_dir)
    _log_progress()
    results = run_study(study, arms=arms, seeds=seeds, progress=progress, collect=collect)
    print(format_results(results["arms"]))
    print(f"results: {Path(study['output_dir'])} (results.md, results.json, frontier.png)", file=sys.stderr)
    return 0


def _log_progress() -> None:
    """One line per training step on stderr, without other libraries' logs."""
    log_to_stderr("searchgym.trainers")  # to sys.stderr as it is at each line, as the CLI does
