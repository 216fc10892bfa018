"""Wall time of a short ``configs/grpo_synthetic.yaml`` run for several torch thread counts.

Each setting runs in a fresh process (torch fixes its thread pool at the first parallel
op): ``auto`` is the shipped default (``model.cpu_threads: 0``), ``torch`` is torch's own
default (one thread per core, what a run got before ``cpu_threads`` existed), and a number
is that many threads. ``OMP_NUM_THREADS`` is removed from the children's environment. The
tiny model is built once before the timed runs; settings are interleaved over ``--repeats``::

    python -m benchmarks.cpu_threads [--steps 10] [--settings auto,torch,1,2] [--repeats 1] \\
        [--out benchmarks/results/cpu_threads.json]
    python -m benchmarks.cpu_threads --render docs/cpu-threads.md   # the table, from the JSON

Numbers depend on the machine and its load (the report records the load average).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks._common import REPO, shown_command, write_report

CONFIG = REPO / "configs" / "grpo_synthetic.yaml"

# The child: load the shipped config, shorten it, set the threads, train, print the seconds.
CHILD = """
import json, sys, time
from searchgym.trainers.run_spec import load_config
from searchgym.trainers.grpo import train
import torch
config, steps, output, tiny, threads = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
cfg = load_config(config)
cfg = cfg.replace(steps=steps, output_dir=output)
cfg.model.tiny.dir = tiny
cfg.model.cpu_threads = torch.get_num_threads() if threads == "torch" else int(threads)
start = time.perf_counter()
train(cfg, progress=False)
print(json.dumps({"train_s": time.perf_counter() - start, "threads": torch.get_num_threads()}))
"""


def run_once(setting: str, steps: int, root: Path, index: int) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    threads = "0" if setting == "auto" else setting
    output = root / f"run-{setting}-{index}"
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(CONFIG), str(steps), str(output), str(root / "tiny"), threads],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    wall = time.perf_counter() - start
    child = json.loads(done.stdout.strip().splitlines()[-1])
    return {
        "setting": setting,
        "wall_s": round(wall, 2),
        "train_s": round(child["train_s"], 2),
        "threads": child["threads"],
    }


RESULT = REPO / "benchmarks" / "results" / "cpu_threads.json"
BEGIN, END = "<!-- cpu_threads:begin -->", "<!-- cpu_threads:end -->"
LABELS = {"auto": "auto (shipped default: 1 for the tiny model)", "torch": "torch's default (one per core)"}


def render(doc: Path) -> None:
    """Rewrite the table between the markers of ``doc`` from :data:`RESULT`."""
    report = json.loads(RESULT.read_text(encoding="utf-8"))
    rows = ["| torch threads | runs (s) | median (s) |", "|---|---:|---:|"]
    for setting, median in report["median_train_s"].items():
        runs = ", ".join(f"{r['train_s']:.1f}" for r in report["runs"] if r["setting"] == setting)
        label = LABELS.get(setting, setting)
        if setting == str(report["cpus"]):
            label += " (torch's default here: one per core)"
        rows.append(f"| {label} | {runs} | {median:.1f} |")
    load = report["load_average_1min_before_after"]
    rows += [
        "",
        f"{report['steps']} steps of `{report['config']}` (training time, model already built); "
        f"{report['cpus']} CPUs, Python {report['python']}, 1-minute load average {load[0]:g} before and "
        f"{load[1]:g} after (a machine shared with other jobs). Reproduce: `{shown_command(report['command'])}`.",
    ]
    text = doc.read_text(encoding="utf-8")
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    doc.write_text(text[:start] + "\n" + "\n".join(rows) + "\n" + text[end:], encoding="utf-8")
    print(f"wrote {doc}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--settings", default="auto,torch,1,2")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--out", type=Path)
    parser.add_argument(
        "--render", type=Path, metavar="DOC", help="only rewrite DOC's table from the JSON result"
    )
    args = parser.parse_args()
    if args.render:
        render(args.render)
        return
    settings = [s.strip() for s in args.settings.split(",") if s.strip()]
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        run_once("1", 1, root, -1)  # builds the tiny model once, untimed
        load_before = os.getloadavg()
        for index in range(args.repeats):
            for setting in settings:
                runs.append(run_once(setting, args.steps, root, index))
                print(json.dumps(runs[-1]), flush=True)
        load_after = os.getloadavg()
    summary = {s: statistics.median(r["train_s"] for r in runs if r["setting"] == s) for s in settings}
    for setting, seconds in summary.items():
        print(f"{setting:>6}: {seconds:.1f} s for {args.steps} steps (median train time)")
    write_report(
        args.out,
        {
            "benchmark": "cpu_threads",
            "command": "python -m benchmarks.cpu_threads " + " ".join(sys.argv[1:]),
            "config": "configs/grpo_synthetic.yaml",
            "steps": args.steps,
            "median_train_s": summary,
            "runs": runs,
            "load_average_1min_before_after": [round(load_before[0], 2), round(load_after[0], 2)],
        },
    )


if __name__ == "__main__":
    main()
