"""Write the real-model tables into docs/real_model.md from the committed result files.

    python -m benchmarks.real_model_table

Reads ``benchmarks/results/real_model_eval.json`` (``real_model_eval.py``),
``benchmarks/results/real_model_train*.json`` (``real_model_train.py``),
``benchmarks/results/real_model_baselines.json`` (``real_model_baselines.py``) and
``benchmarks/results/real_model_eval_speed.json`` (``real_model_eval_speed.py``), and
replaces the text between the ``<!-- real-model-eval -->``, ``<!-- real-model-train -->``,
``<!-- real-model-train-warm -->``, ``<!-- real-model-heldout -->``,
``<!-- real-model-baselines -->`` and ``<!-- real-model-speed -->`` markers and their
``<!-- end -->`` in the page (and the README's evaluation table and training summary). Nothing in the tables is typed by hand.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from benchmarks._common import REPO, shown_command

DOC = REPO / "docs" / "real_model.md"
README = REPO / "README.md"
RESULTS = REPO / "benchmarks" / "results"
NAMES = {"nq": "NQ", "hotpotqa": "HotpotQA", "popqa": "PopQA"}
MODES = {
    "no_retrieval": "no retrieval",
    "naive_rag": "naive RAG (BM25 top 3)",
    "search_r1": "`search_r1` + BM25",
    "tool_call": "`tool_call` + BM25",
}


def eval_table(report: dict[str, Any]) -> str:
    lines = [
        "| Dataset | Mode | N | EM | F1 | CoverEM | ST | SR | Well-formed | Tokens/episode | Time (s) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report["results"]:
        lines.append(
            f"| {NAMES.get(r['dataset'], r['dataset'])} | {MODES.get(r['mode'], r['mode'])} | {r['questions']} "
            f"| {100 * r['em']:.1f} | {100 * r['f1']:.1f} | {100 * r['cover_em']:.1f} | {r['st']:.2f} "
            f"| {100 * r['sr']:.0f} | {100 * r['format_ok']:.0f} | {r['tokens']:.1f} | {r['wall_time_s']:.0f} |"
        )
    s = report["settings"]
    measured = {(r["dataset"], r["mode"]) for r in report["results"]}
    missing = [f"{NAMES[d]} {MODES[m]}" for d in NAMES for m in MODES if (d, m) not in measured]
    lines += [
        "",
        f"`{shown_command(report['command'])}`: {report['wall_time_s'] / 60:.0f} min in all, "
        f"torch threads: {report['torch_threads']}, {s.get('dtype', 'float32')} weights, {s['max_new_tokens']} new "
        f"tokens per turn at most, {s['max_turns']} actions per multi-turn episode, batches of {s['batch_size']}, "
        "greedy decoding." + (f" Not run: {', '.join(missing)}." if missing else ""),
    ]
    return "\n".join(lines)


def train_table(reports: list[dict[str, Any]]) -> str:
    """First and last steps of each run (mean ± std over the steps), then each run's command."""
    columns = (
        ("Reward", "reward", 1, 3),
        ("Well-formed turns (%)", "format_ok_turns", 100, 0),
        ("Well-formed episodes (%)", "format_ok", 100, 0),
        ("F1 (%)", "f1", 100, 1),
        ("Searches (ST)", "st", 1, 2),
        ("Actions' tokens", "action_tokens", 1, 1),
    )

    def cell(key: str, part: list[dict], scale: float, digits: int) -> str:
        values = [scale * h["rollout"].get(key, 0.0) for h in part]
        mean = sum(values) / len(values)
        spread = (sum((v - mean) ** 2 for v in values) / len(values)) ** 0.5
        return f"{mean:.{digits}f} ± {spread:.{digits}f}"

    lines = [
        "| Seed | Steps | " + " | ".join(c[0] for c in columns) + " |",
        "|---|---|" + "---|" * len(columns),
    ]
    notes = []
    for report in reports:
        history = report["history"]
        window = max(1, min(5, len(history) // 2))
        for label, part in ((f"first {window}", history[:window]), (f"last {window}", history[-window:])):
            lines.append(
                f"| {_seed(report)} | {label} | "
                + " | ".join(cell(k, part, sc, d) for _, k, sc, d in columns)
                + " |"
            )
        notes.append(
            f"Seed {_seed(report)}: `{shown_command(report['command'])}`: {report['steps_done']} of {report['steps_configured']} "
            f"configured steps in {report['wall_time_s'] / 60:.0f} min, median step {report['median_step_s']:.0f} s "
            f"(torch threads: {report['torch_threads']}; config `{report['config']}`; {_precision(report)})."
        )
    lines += ["", "Each cell is the mean ± standard deviation over those steps (8 rollouts per step).", ""]
    return "\n".join(lines + notes)


def heldout_table(reports: list[dict[str, Any]]) -> str:
    """The greedy evaluation of each run's models on its held-out questions."""
    lines = [
        "| Seed | Model | N | EM | F1 | CoverEM | ST | Well-formed (%) | Tokens/episode |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for report in reports:
        for r in report["heldout"]:
            lines.append(
                f"| {_seed(report)} | {r['model']} | {r['questions']} | {100 * r['em']:.1f} | {100 * r['f1']:.1f} "
                f"| {100 * r['cover_em']:.1f} | {r['st']:.2f} | {100 * r['format_ok']:.0f} | {r['tokens']:.1f} |"
            )
    starts: dict[str, list[Any]] = {}  # one line per distinct warm start, naming its seeds
    for report in reports:
        if report.get("warm_start"):
            starts.setdefault(json.dumps(report["warm_start"], sort_keys=True), []).append(_seed(report))
    for blob, seeds in starts.items():
        warm = json.loads(blob)
        autocast = warm.get("autocast", "bfloat16")  # runs before the key was written used bfloat16
        who = (
            "shared by the seeds"
            if len(starts) == 1
            else "seed" + ("s " if len(seeds) > 1 else " ") + ", ".join(map(str, seeds))
        )
        lines += [
            "",
            f"Warm start ({who}): {warm['steps']} AdamW steps of {warm['batch_size']} actions "
            f"(learning rate {warm['lr']:g}, {autocast + ' autocast' if autocast else 'float32'}) "
            f"on {warm['episodes']} two-turn "
            f"episodes of the {NAMES.get(warm['dataset'], warm['dataset'])} sample, "
            f"{warm['wall_time_s'] / 60:.1f} min; loss {warm['losses'][0]:.2f} at the first step, "
            f"{sum(warm['losses'][-4:]) / len(warm['losses'][-4:]):.2f} over the last four.",
        ]
    return "\n".join(lines)


def _precision(report: dict[str, Any]) -> str:
    """How the run trained: float32 under ``--float32``, else as its config says."""
    from searchgym.trainers.run_spec import load_config

    if "--float32" in report["command"].split():
        return "float32"
    autocast = load_config(REPO / report["config"]).model.autocast
    return "bfloat16 autocast" if autocast == "bfloat16" else "float32"


def baselines_table(baselines: dict[str, Any], reports: list[dict[str, Any]]) -> str:
    """The no-learning baselines beside the warm-started model before and after GRPO (runs
    that trained all their steps), on the same held-out questions, then what the split shares
    with the training questions."""
    relations = list(baselines["relations"])
    lines = [
        "| Answers by | Learning | Searches per question | EM | F1 | "
        + " | ".join(f"EM, {rel} ({n})" for rel, n in baselines["relations"].items())
        + " |",
        "|---|---|---|---|---|" + "---|" * len(relations),
    ]
    names = {
        "prior": ("the template prior: the most frequent training answer of the question's template", "none"),
        "heuristic": (
            "the extraction heuristic: BM25 top-1 passage for the question, "
            '"born ... in X", else a training answer in the passage, else the prior',
            "none",
        ),
    }
    for key, (label, learning) in names.items():
        r = baselines["results"][key]
        lines.append(
            f"| {label} | {learning} | {r['searches']:.2f} | {100 * r['em']:.1f} | {100 * r['f1']:.1f} | "
            + " | ".join(f"{100 * r['by_relation'][rel]['em']:.1f}" for rel in relations)
            + " |"
        )
    kinds = {"start of GRPO": "warm start (supervised)", "end of GRPO": "warm start, then GRPO"}
    for report in filter(complete, reports):
        for r in report["heldout"]:
            if r["model"] not in kinds:
                continue
            cells = ["–"] * len(relations)
            if r.get("episodes"):
                by_id = {row["question_id"]: row["relation"] for row in baselines["rows"]}
                cells = [
                    f"{100 * sum(e['em'] for e in ep) / len(ep):.1f}"
                    for rel in relations
                    for ep in [[e for e in r["episodes"] if by_id[e["question_id"]] == rel]]
                ]
            lines.append(
                f"| SmolLM2-135M-Instruct, {r['model']}, seed {_seed(report)} | {kinds[r['model']]} "
                f"| {r['st']:.2f} | {100 * r['em']:.1f} | {100 * r['f1']:.1f} | " + " | ".join(cells) + " |"
            )
    n = baselines["questions"]
    lines += [
        "",
        f"The {n} held-out questions hold two relations only ("
        + ", ".join(f"{rel}: {k}" for rel, k in baselines["relations"].items())
        + f"); {baselines['gold_in_training_answers']} of {n} have a gold answer that is also a gold answer "
        f"of one of the {baselines['training_questions']} training questions, and "
        f"{baselines['subject_in_training']} of {n} name the subject of a training question. "
        f"The template prior answers {', '.join(repr(a) for a in baselines['prior_answers'].values())}.",
        "",
        f"`python -m benchmarks.real_model_baselines` (`benchmarks/results/real_model_baselines.json`, "
        f"with every question's passage, answers and scores; {baselines['wall_time_s']:.0f} s).",
    ]
    return "\n".join(lines)


def _seed(report: dict[str, Any]) -> Any:
    """The run's seed: in the report, else in its config file."""
    if "seed" in report:
        return report["seed"]
    from searchgym.trainers.run_spec import load_config

    return load_config(REPO / report["config"]).seed


def speed_table(report: dict[str, Any]) -> str:
    keys = ("em", "f1", "cover_em", "st", "format_ok", "tokens")
    lines = [
        "| Mode | CPU s without | CPU s with | Speed-up (CPU) | Wall s without | Wall s with "
        "| Same EM, F1, CoverEM, ST, well-formed, tokens |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in report["rows"]:
        base, now = row["base"], row["current"]
        same = all(abs(base["result"][k] - now["result"][k]) < 1e-9 for k in keys)
        lines.append(
            f"| {MODES.get(row['mode'], row['mode'])} | {base['cpu_s']:.0f} | {now['cpu_s']:.0f} "
            f"| {base['cpu_s'] / now['cpu_s']:.2f}x | {base['wall_s']:.0f} | {now['wall_s']:.0f} "
            f"| {'yes' if same else 'no'} |"
        )
    s = report["settings"]
    lines += [
        "",
        f"`{shown_command(report['command'])}`: {s['questions']} {NAMES.get(s['dataset'], s['dataset'])} questions, "
        f"batches of {s['batch_size']}, {s['max_new_tokens']} new tokens per turn at most, one torch thread.",
    ]
    return "\n".join(lines)


def replace(text: str, marker: str, body: str) -> str:
    pattern = re.compile(rf"(<!-- {marker} -->\n)(?:(?!<!-- ).*?\n)??(<!-- end -->)", re.S)
    if not pattern.search(text):
        raise SystemExit(f"{DOC} has no <!-- {marker} --> ... <!-- end --> block")
    return pattern.sub(lambda m: m.group(1) + body + "\n" + m.group(2), text)


def main_text(text: str) -> str:
    """``text`` (the page) with every table whose result files exist rewritten from them."""

    def read(path: Path) -> dict[str, Any]:
        return json.loads(path.read_text(encoding="utf-8"))

    if (RESULTS / "real_model_eval.json").is_file():
        text = replace(text, "real-model-eval", eval_table(read(RESULTS / "real_model_eval.json")))
    warm = sorted(RESULTS.glob("real_model_train_warm*.json"))
    if warm:
        text = replace(text, "real-model-train-warm", train_table([read(path) for path in warm]))
        text = replace(text, "real-model-heldout", heldout_table([read(path) for path in warm]))
    if warm and (RESULTS / "real_model_baselines.json").is_file():
        text = replace(
            text,
            "real-model-baselines",
            baselines_table(read(RESULTS / "real_model_baselines.json"), [read(path) for path in warm]),
        )
    runs = [RESULTS / "real_model_train.json", *sorted(RESULTS.glob("real_model_train_seed*.json"))]
    if runs[0].is_file():
        text = replace(text, "real-model-train", train_table([read(path) for path in runs]))
    if (RESULTS / "real_model_eval_speed.json").is_file():
        text = replace(text, "real-model-speed", speed_table(read(RESULTS / "real_model_eval_speed.json")))
    return text


def complete(report: dict[str, Any]) -> bool:
    """Whether the run trained for all its configured steps (a run stopped early is no replicate)."""
    return report["steps_done"] >= report["steps_configured"]


def _heldout(report: dict[str, Any], model: str) -> dict[str, Any]:
    return next(r for r in report["heldout"] if r["model"] == model)


def train_summary(reports: list[dict[str, Any]], baselines: dict[str, Any] | None = None) -> str:
    """One line per complete warm-started run: its steps and time, its held-out EM before and
    after GRPO and its searches per question; then the no-learning baselines on the same
    questions, and a line naming each run stopped early."""
    lines = []
    for report in filter(complete, reports):
        start, end = _heldout(report, "start of GRPO"), _heldout(report, "end of GRPO")
        lines.append(
            f"- seed {_seed(report)}: {report['steps_done']} of {report['steps_configured']} GRPO steps"
            f" in {report['wall_time_s'] / 60:.0f} min ({_precision(report)}); "
            f"EM on {end['questions']} held-out PopQA questions {100 * start['em']:.0f}% after the warm start, "
            f"{100 * end['em']:.0f}% after GRPO (F1 {100 * start['f1']:.1f} -> {100 * end['f1']:.1f}); "
            f"searches per question {start['st']:.2f} before GRPO and {end['st']:.2f} after."
        )
    if baselines:
        prior, heuristic = baselines["results"]["prior"], baselines["results"]["heuristic"]
        lines.append(
            f"- on the same {baselines['questions']} questions, with no learning: the template prior "
            f"(each template's most frequent training answer) {100 * prior['em']:.0f}% EM; an extraction "
            f"heuristic over the BM25 top-1 passage {100 * heuristic['em']:.0f}% EM, with "
            f"{heuristic['searches']:.2f} searches per question. The held-out questions hold two relations, "
            f"and {baselines['gold_in_training_answers']} of {baselines['questions']} have a training answer."
        )
    after = {f"{_heldout(r, 'end of GRPO')['st']:.2f}" for r in filter(complete, reports)}
    if len(after) == 1:
        lines.append(
            f"- after GRPO every complete run searches {after.pop()} times per question: none learned when to search."
        )
    for report in reports:
        if not complete(report):
            lines.append(
                f"- seed {_seed(report)} stopped by its time cap after {report['steps_done']} of "
                f"{report['steps_configured']} steps, with other settings: not a replicate (see the page)."
            )
    return "\n".join(lines)


def readme_text(text: str) -> str:
    """The README with the evaluation table and the training summary of the committed results."""
    text = replace(
        text, "real-model-eval", eval_table(json.loads((RESULTS / "real_model_eval.json").read_text()))
    )
    warm = [json.loads(path.read_text()) for path in sorted(RESULTS.glob("real_model_train_warm*.json"))]
    baselines = RESULTS / "real_model_baselines.json"
    summary = train_summary(warm, json.loads(baselines.read_text()) if baselines.is_file() else None)
    return replace(text, "real-model-train-summary", summary)


def main() -> None:
    DOC.write_text(main_text(DOC.read_text(encoding="utf-8")), encoding="utf-8")
    README.write_text(readme_text(README.read_text(encoding="utf-8")), encoding="utf-8")
    print(f"wrote {DOC} and {README}")


if __name__ == "__main__":
    main()
