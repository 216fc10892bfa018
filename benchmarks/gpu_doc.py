"""Write the GPU check's tables in ``docs/openrlhf.md`` from the committed result files.

    python -m benchmarks.gpu_doc [--check]

Reads every ``benchmarks/results/gpu_check_*.jsonl`` (lines of ``benchmarks/gpu_check.py``;
a ``source`` field attributes figures measured elsewhere) and replaces the text between
the ``gpu_check`` markers of ``docs/openrlhf.md``; the rest of the page is left as it is.
``--check`` exits 1 when the page is not what the result files give.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
PAGE = REPO / "docs" / "openrlhf.md"
BEGIN, END = "<!-- gpu_check:begin (benchmarks/gpu_doc.py writes this part) -->", "<!-- gpu_check:end -->"
COMMAND = "python -m benchmarks.gpu_check --out benchmarks/results/gpu_check_<card>.jsonl && python -m benchmarks.gpu_doc"


def _cell(value: object, unit: str = "") -> str:
    return "–" if value is None else f"{value}{unit}"


def _trainer_table(rows: list[dict]) -> list[str]:
    lines = [
        "| model | device | dtype | s / step | rollout s | update s | peak GPU GiB |",
        "|---|---|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        device = r["device"] + (f" ({r['cpus']} cores)" if r.get("cpus") and r["device"] == "cpu" else "")
        lines.append(
            f"| {r['size']} | {device} | {r['dtype']} | {r['step_s']} | {_cell(r.get('rollout_s'))} | "
            f"{_cell(r.get('update_s'))} | {_cell(r.get('peak_gpu_gib'))} |"
        )
    return lines


def _section(path: Path) -> list[str]:
    records = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    machine = next((r for r in records if r["check"] == "machine"), {})
    source = next((r["source"] for r in records if r.get("source")), None)
    card = machine.get("gpu") or next((r.get("gpu") for r in records if r.get("gpu")), None)
    where = card or (
        f"CPU only ({machine.get('cpus')} cores, {machine.get('torch_threads')} torch threads, "
        f"load average {machine.get('load_average_1m')} at the start)"
    )
    title = f"#### {where}" + (f": {source}" if source else "")
    lines = [title, "", f"From `benchmarks/results/{path.name}`."]
    trained = [r for r in records if r["check"] == "builtin_trainer" and "step_s" in r]
    if trained:
        first = trained[0]
        lines += [
            "",
            f"Built-in GRPO trainer, {first['episodes_per_step']} episodes per step, {first['max_turns']} turns, "
            f"{first['warmup_steps']} warm-up step(s), median of the timed steps:",
            "",
            *_trainer_table(trained),
        ]
    for r in records:
        if r["check"] == "builtin_trainer" and "skipped" in r:
            lines += ["", f"- Built-in trainer on {r['device']}: skipped ({r['skipped']})."]
        if r["check"] == "jax_gpu_memory":
            text = r.get("skipped") or r.get("without_fix")
            if text is None:
                text = f"JAX backend started: {r.get('jax_backend_started')}; GPU memory taken: " + _cell(
                    r.get("gpu_memory_taken_gib"), " GiB"
                )
            lines += ["", f"- JAX and GPU memory: {text}."]
        if r["check"] == "dense_retrieval":
            text = r.get("skipped") or ", ".join(f"{k} {v}" for k, v in sorted(r.items()) if k != "check")
            lines += ["", f"- Dense retrieval on the GPU: {text}."]
    return lines


def render() -> str:
    body = [
        BEGIN,
        "",
        f"Reproduce on your machine (offline, a few minutes): `{COMMAND}`.",
    ]
    for path in sorted(RESULTS.glob("gpu_check_*.jsonl")):
        body += ["", *_section(path)]
    return "\n".join([*body, "", END])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--check", action="store_true", help="exit 1 when docs/openrlhf.md is out of date")
    args = parser.parse_args(argv)
    text = PAGE.read_text(encoding="utf-8") if PAGE.exists() else "# The GPU path\n\n"
    section = render()
    if BEGIN in text and END in text:
        new = text[: text.index(BEGIN)] + section + text[text.index(END) + len(END) :]
    else:
        new = text.rstrip("\n") + "\n\n" + section + "\n"
    if args.check:
        if new != text:
            print(f"{PAGE} is out of date: run python -m benchmarks.gpu_doc", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(new, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
