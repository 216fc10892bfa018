"""The tiny-LM integration check's table and directions, generated from its committed result.

python -m studies.frugal.tiny_lm.integration_report [--from runs/integration]

``--from`` first copies a finished run's ``results.json``, ``results.md`` and
``frontier.png`` into ``studies/frugal/tiny_lm/results/`` (as ``integration.*``); then the
section between ``<!-- table:tiny_lm_integration -->`` and its end marker in
``docs/tiny_lm_study.md`` is written from ``integration.json``. Nothing in it is typed by hand.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
RESULT = RESULTS / "integration.json"
PAGE = HERE.parents[2] / "docs" / "tiny_lm_study.md"
NAME = "tiny_lm_integration"
COMMAND = (
    "OMP_NUM_THREADS=1 searchgym study --config studies/frugal/tiny_lm/integration.yaml "
    "--output-dir runs/integration"
)
BASELINE = "f1"


def _mean(cells: Mapping[str, Any], heading: str) -> float | None:
    cell = cells.get(heading)
    return None if cell is None else float(cell["mean"])


def _num(value: float | None, digits: int = 1) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def _change(value: float | None, base: float | None, *, relative: bool) -> str:
    if value is None or base is None:
        return "–"
    if relative:
        return "–" if base == 0 else f"{100 * (value - base) / base:+.0f}%"
    return f"{value - base:+.1f}"


def render(result: Mapping[str, Any]) -> str:
    """The Markdown section: the command, the table against f1, one line per arm, the timing."""
    arms = result["arms"]
    base = arms[BASELINE]
    train_min = {run["arm"]: run["result"]["settings"].get("train_s", 0.0) / 60 for run in result["runs"]}
    lines = [
        "| arm | EM | F1 | searches per question | vs f1 | SR known | SR unknown | EM known | EM unknown | ΔEM vs f1 | GRPO min |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for arm, cells in arms.items():
        st = _mean(cells, "ST")
        lines.append(
            f"| {arm} | {_num(_mean(cells, 'EM'))} | {_num(_mean(cells, 'F1'))} | {_num(st, 2)} | "
            f"{'–' if arm == BASELINE else _change(st, _mean(base, 'ST'), relative=True)} | "
            f"{_num(_mean(cells, 'SR known'))} | {_num(_mean(cells, 'SR unknown'))} | "
            f"{_num(_mean(cells, 'EM known'))} | {_num(_mean(cells, 'EM unknown'))} | "
            f"{'–' if arm == BASELINE else _change(_mean(cells, 'EM'), _mean(base, 'EM'), relative=False)} | "
            f"{train_min.get(arm, 0.0):.1f} |"
        )
    lines.append("")
    for arm, cells in arms.items():
        if arm == BASELINE:
            continue
        lines.append(f"- **{arm}** against f1: {_direction(cells, base)}.")
    timing = result.get("timing", {})
    seeds = sorted({run["seed"] for run in result["runs"]})
    lines += [
        "",
        f"Seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))}; "
        f"{timing.get('torch_threads', '?')} torch thread; whole run "
        f"{timing.get('wall_s', 0.0) / 60:.1f} min wall (warm start included). Reproduce: `{COMMAND}`, "
        "then `python -m studies.frugal.tiny_lm.integration_report --from runs/integration`.",
    ]
    return "\n".join(lines)


def _direction(cells: Mapping[str, Any], base: Mapping[str, Any]) -> str:
    parts = []
    for heading, what, digits in (
        ("ST", "searches per question", 2),
        ("SR known", "known questions searched (%)", 1),
        ("SR unknown", "unknown questions searched (%)", 1),
        ("EM", "EM", 1),
        ("F1", "F1", 1),
    ):
        value, ref = _mean(cells, heading), _mean(base, heading)
        if value is None or ref is None:
            continue
        word = "fewer" if value < ref else "more" if value > ref else "the same"
        if heading in ("EM", "F1"):
            word = "lower" if value < ref else "higher" if value > ref else "the same"
        parts.append(f"{what} {_num(value, digits)} against {_num(ref, digits)} ({word})")
    return "; ".join(parts)


def write_page(page: Path, section: str) -> None:
    """Replace the generated section of ``page``."""
    text = page.read_text(encoding="utf-8")
    pattern = re.compile(rf"(<!-- table:{NAME} -->\n)(?:.*?\n)?(<!-- end table:{NAME} -->)", re.S)
    if not pattern.search(text):
        raise SystemExit(f"{page} has no <!-- table:{NAME} --> ... <!-- end table:{NAME} --> markers.")
    page.write_text(pattern.sub(lambda m: m.group(1) + section + "\n" + m.group(2), text), encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--from", dest="source", type=Path, help="a finished run's output folder to copy in first"
    )
    args = parser.parse_args(argv)
    if args.source is not None:
        RESULTS.mkdir(exist_ok=True)
        for name, target in (("results.json", "integration.json"), ("results.md", "integration.md")):
            shutil.copyfile(args.source / name, RESULTS / target)
        shutil.copyfile(args.source / "frontier.png", RESULTS / "integration.png")
    write_page(PAGE, render(json.loads(RESULT.read_text(encoding="utf-8"))))
    print(f"wrote {PAGE}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
