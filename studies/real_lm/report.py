"""Tables and the plot of the real-LM study, generated from its ``results.json``.

    python -m studies.real_lm.report --results studies/real_lm/results/results.json \
        --earlier studies/real_lm/results/taught_share_0.5.json \
        --page docs/real_lm_study.md --png docs/real_lm_study.png

rewrites every block of the page between ``<!-- real-lm:NAME -->`` and ``<!-- end -->``
from the JSON; ``tests/studies/test_real_lm_study.py`` checks that the page equals what this writes.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["format_summary", "blocks", "render_page", "plot"]

_ARM_COLUMNS = (
    ("EM", "em"),
    ("F1", "f1"),
    ("Searches/q", "st"),
    ("Searched known (%)", "sr_known"),
    ("Searched unknown (%)", "sr_unknown"),
    ("EM known", "em_known"),
    ("EM unknown", "em_unknown"),
    ("Well-formed (%)", "format_ok"),
)

_BASELINES = (
    ("untrained", "untrained model, agent env, greedy"),
    ("warm_started", "warm-started model, agent env, greedy"),
    ("warm_started_sampled", "warm-started model, agent env, T = training"),
    ("no_retrieval", "warm-started model, no retrieval (fact-lesson chat)"),
    ("naive_rag", "warm-started model, naive RAG (BM25 top 1 in the question)"),
    ("answer_prior", "answer-type prior (most frequent training answer per relation)"),
    ("heuristic", "extraction heuristic over BM25 top 1 (no learning)"),
)


def _num(value: Any, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return f"{value:.{digits}f}"


def _pm(value: Any, ci: Any, n: int, digits: int = 1) -> str:
    """``value ± ci``; the value alone where one seed gives no interval."""
    if n < 2 or ci is None or value is None or (isinstance(value, float) and math.isnan(value)):
        return _num(value, digits)
    return f"{_num(value, digits)} ± {_num(ci, digits)}"


def _cell(block: Mapping[str, Any], key: str, n: int) -> str:
    return _pm(block.get(key), block.get("ci95", {}).get(key), n, 2 if key == "st" else 1)


def _arm_table(results: Mapping[str, Any], mode: str) -> str:
    head = "| Arm | Seeds | " + " | ".join(h for h, _ in _ARM_COLUMNS) + " |"
    lines = [head, "|---|---|" + "---|" * len(_ARM_COLUMNS)]
    for arm, entry in results["arms"].items():
        block = entry["mean"] if mode == "greedy" else entry["mean"]["sampled"]
        n = len(entry["seeds"])
        cells = " | ".join(_cell(block, key, n) for _, key in _ARM_COLUMNS)
        lines.append(f"| {arm} | {n} | {cells} |")
    return "\n".join(lines)


def _baseline_table(results: Mapping[str, Any]) -> str:
    head = "| Baseline | " + " | ".join(h for h, _ in _ARM_COLUMNS) + " |"
    lines = [head, "|---|" + "---|" * len(_ARM_COLUMNS)]
    for name, label in _BASELINES:
        row = results["baselines"].get(name)
        if row is not None:
            cells = " | ".join(_num(row.get(key), 2 if key == "st" else 1) for _, key in _ARM_COLUMNS)
            lines.append(f"| {label} | {cells} |")
    return "\n".join(lines)


def _paired_table(results: Mapping[str, Any]) -> str:
    lines = [
        "| Arm | Seeds paired | ΔEM | ΔSearches/q | ΔSearched known | ΔSearched unknown |",
        "|---|---|---|---|---|---|",
    ]
    for arm, entry in results["arms"].items():
        diffs = entry.get("vs_f1")
        if arm == "f1" or not diffs:
            continue
        cells = [
            _pm(diffs[k]["mean"], diffs[k]["ci95"], diffs[k]["n"], 2 if k == "st" else 1)
            for k in ("em", "st", "sr_known", "sr_unknown")
        ]
        lines.append(f"| {arm} | {diffs['em']['n']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _split_text(results: Mapping[str, Any]) -> str:
    split, known, warm = results["split"], results["known"], results["warm_start"]
    ws = warm["settings"]
    overlap = split["overlap"]
    n = split["heldout"]
    return "\n".join(
        [
            f"- Questions: {split['train']} RL-training and {n} held-out PopQA questions, no question in both; "
            f"of the held-out questions {_num(overlap['subject_pct'])}% share a subject and "
            f"{_num(overlap['answer_pct'])}% their first gold answer with a training question.",
            f"- Taught facts: {split['taught_train']} training and {split['taught_heldout']} held-out questions.",
            f"- Known held-out questions (measured on the warm-started model, greedy, no search): "
            f"{_num(known['pct'])}% ({_num(known['taught_pct'])}% of the taught, "
            f"{_num(known['untaught_pct'])}% of the untaught ones).",
            f"- Warm start: {warm['steps']} AdamW steps on {warm['lessons']} fact lessons and "
            f"{warm['episode_actions']} demonstrated actions ({_num(100 * ws['direct_share'], 0)}% of the "
            f"taught training questions answer at once), learning rate {ws['lr']:g} "
            f"({ws.get('lr_schedule', 'constant')}), {_num(warm['wall_s'], 0)} s on "
            f"{warm['torch_threads']} torch thread(s); loss {_num(warm['loss_first'], 2)} at the first step, "
            f"{_num(warm['loss_last10'], 2)} over the last ten.",
            *_decision_lines(warm),
            *_first_action_lines(results),
            *_merged_lines(results),
        ]
    )


def _merged_lines(results: Mapping[str, Any]) -> list[str]:
    """Cells added from another output folder, whose warm start was trained again."""
    lines = []
    main_pass = results["warm_start"]
    for entry in results.get("merged", []):
        cells = ", ".join(f"{arm} seed {seed}" for arm, seed in entry["cells"])
        other, agree = entry["warm_start"]["main"], entry["agreement"]
        n = agree["questions"]
        lines.append(
            f"- Cells from a second output folder ({cells}) start from a warm start trained again from "
            f"the same settings and data on another machine ({_num(other['wall_s'], 0)} s on "
            f"{other['torch_threads']} torch thread(s); loss {_num(other['loss_last10'], 5)} over the last "
            f"ten steps, against {_num(main_pass['loss_last10'], 5)} for the first). On the {n} held-out questions the two "
            f"agree on {agree['known_flags']} known/unknown flags, {agree['probe_answers']} probe answers "
            f"and {agree['warm_started_greedy']} warm-started greedy episodes (searches and answer); "
            f"its greedy recall is the same on {agree['recall']} questions and its `p(search)` after it "
            f"moves by at most {_num(agree['p_search_max_change'], 3)}."
        )
    return lines


def _decision_lines(warm: Mapping[str, Any]) -> list[str]:
    decision = warm.get("decision")
    if not decision:
        return []
    return [
        f"- Decision pass: {decision['steps']} more AdamW steps at {warm['settings']['decision_lr']:g} "
        f"on the {sum(decision['first_actions'].values())} demonstrated first actions alone, each batch "
        "holding direct, searching-taught and searching-untaught ones in their demonstrated shares "
        f"({_num(decision['wall_s'], 0)} s); loss {_num(decision['loss_first'], 3)} at its first step, "
        f"{_num(decision['loss_last10'], 3)} over the last ten.",
    ]


def _first_action_lines(results: Mapping[str, Any]) -> list[str]:
    groups = results.get("first_action", {}).get("groups")
    if not groups:
        return []
    return [
        "- The warm-started agent's probability of searching first, `p(search)` (median over questions): "
        f"{_num(groups['known'].get('median'), 3)} on known and {_num(groups['unknown'].get('median'), 3)} on unknown "
        f"held-out questions ({_num(groups['taught'].get('median'), 3)} taught, "
        f"{_num(groups['untaught'].get('median'), 3)} untaught)"
        + (
            f", read after its greedy recall in `<think>`, which is `unknown` on "
            f"{_pct(groups['known']['recall_unknown_share'])} of known and "
            f"{_pct(groups['unknown']['recall_unknown_share'])} of unknown questions"
            if "recall_unknown_share" in groups["known"]
            else ""
        )
        + (
            f"; an action opens at all (`<search>` or `<answer>`, not the end of the turn) with "
            f"probability {_num(groups['known']['p_action_median'], 3)} on known and "
            f"{_num(groups['unknown']['p_action_median'], 3)} on unknown questions (median)."
            if "p_action_median" in groups["known"]
            else "."
        )
    ]


def _pct(share: float) -> str:
    return f"{100 * share:.0f}%"


def _training_table(results: Mapping[str, Any]) -> str:
    """The searched share of the sampled training rollouts (%), averaged over windows of steps."""
    rows = [(arm, s) for arm, entry in results["arms"].items() for s in entry["seeds"] if s.get("rollouts")]
    if not rows:
        return "No per-step rollout figures in this results file."
    steps = max(r["step"] for _, s in rows for r in s["rollouts"])
    width = max(1, -(-steps // 6))
    windows = [(a, min(a + width - 1, steps)) for a in range(1, steps + 1, width)]
    head = "| Arm | Seed | " + " | ".join(f"Steps {a}–{b}" for a, b in windows) + " |"
    lines = [head, "|" + "---|" * (len(windows) + 2)]
    for arm, seed in rows:
        cells = []
        for a, b in windows:
            values = [r["sr"] for r in seed["rollouts"] if a <= r["step"] <= b]
            cells.append(_num(100 * statistics.fmean(values), 0) if values else "–")
        lines.append(f"| {arm} | {seed['seed']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _timing_text(results: Mapping[str, Any]) -> str:
    lines = []
    for arm, entry in results["arms"].items():
        for s in entry["seeds"]:
            lines.append(
                f"- {arm}, seed {s['seed']}: {s['steps']} steps, training {_num(s['train_s'], 0)} s "
                f"(median step {_num(s['median_step_s'], 1)} s), cell {_num(s['wall_s'], 0)} s with evaluation; "
                f"CPU time {_num(s.get('train_cpu_s'), 0)} s training, {_num(s.get('cpu_s'), 0)} s in all."
            )
    cpu = [s.get("cpu_s") or math.nan for entry in results["arms"].values() for s in entry["seeds"]]
    warm = results["warm_start"]
    before = [
        warm["wall_s"],
        warm.get("decision", {}).get("wall_s", 0.0),
        results["timing"].get("baselines_s") or math.nan,  # earlier results files lack it
    ]
    lines.append(
        f"- In all: {len(cpu)} cells, {_num(sum(cpu), 0)} s of CPU time, {_num(sum(cpu) / 7200, 1)} hours of two "
        f"cores however they are packed. Before them, the warm start {_num(before[0], 0)} s and its decision "
        f"pass {_num(before[1], 0)} s on {warm['torch_threads']} torch thread(s), the baselines "
        f"{_num(before[2], 0)} s; with them, about {_num((sum(cpu) / 2 + sum(before)) / 3600, 1)} hours "
        "of two cores."
    )
    return "\n".join(lines)


_FRUGAL_ARMS = ("otc", "lightsearcher", "lightsearcher_no_memory", "sem", "cost")


def _judged(
    mean: float, ci: float, n: int, line: float, above: bool, strict: bool = False, digits: int = 1
) -> str:
    """``mean ± ci``, ``met`` or ``missed`` on the mean, flagged when the interval holds the line."""
    if strict:
        met = mean > line if above else mean < line
    else:
        met = mean >= line if above else mean <= line
    crosses = ci > 0 and mean - ci <= line <= mean + ci
    verdict = ("met" if met else "missed") + (", the interval crosses the line" if crosses else "")
    return f"{_pm(mean, ci, n, digits)}: {verdict}"


def _seeds(n: int) -> str:
    return f"{n} seed" if n == 1 else f"{n} seeds"


def _targets_table(results: Mapping[str, Any]) -> str:
    """The issue's targets, greedy, each judged on the mean over seeds (± 95% interval)."""
    arms = results["arms"]
    if "f1" not in arms:
        return "No f1 arm in this results file: the targets are set against it."
    f1 = arms["f1"]["mean"]
    half = f1["sr_known"] / 2
    lines = [
        f"- f1 ({_seeds(len(arms['f1']['seeds']))}) searches at least 80% of known questions: "
        f"{_judged(f1['sr_known'], f1['ci95']['sr_known'], len(arms['f1']['seeds']), 80.0, True)}.",
    ]
    for arm in (a for a in arms if a.startswith("light_search")):
        st = arms[arm].get("vs_f1", {}).get("st")
        if st:
            lines.append(
                f"- {arm} ({_seeds(st['n'])}, paired) cuts searches per question (the paired "
                "difference against f1 below 0): "
                f"{_judged(st['mean'], st['ci95'], st['n'], 0.0, False, strict=True, digits=2)}."
            )
    lines += [
        "",
        f"| Arm | Seeds | Searched known (%), at most half of f1's ({_num(half)}) | ΔEM against f1, at least −2 "
        "| Searched unknown (%), at least 80 |",
        "|---|---|---|---|---|",
    ]
    for arm in _FRUGAL_ARMS:
        if arm not in arms:
            continue
        mean, n, paired = arms[arm]["mean"], len(arms[arm]["seeds"]), arms[arm].get("vs_f1", {}).get("em")
        em = _judged(paired["mean"], paired["ci95"], paired["n"], -2.0, True) if paired else "–"
        known = _judged(mean["sr_known"], mean["ci95"]["sr_known"], n, half, False)
        unknown = _judged(mean["sr_unknown"], mean["ci95"]["sr_unknown"], n, 80.0, True)
        lines.append(f"| {arm} | {n} | {known} | {em} | {unknown} |")
    return "\n".join(lines)


def _recall_table(results: Mapping[str, Any]) -> str:
    """Greedy searched share (%) of each arm by what the warm start recalled first (``unknown``
    or a name) and by known/unknown, pooled over seeds; the groups' sizes in the header."""
    from .warm_start import UNKNOWN

    recalls = {q["qid"]: q.get("recall") for q in results.get("first_action", {}).get("questions", [])}
    if not recalls or None in recalls.values():
        return "The warm start recalled nothing first (`recall_first` is off)."
    groups = [(said, known) for said in (UNKNOWN, "a name") for known in (True, False)]

    def group(qid: str, known: bool) -> tuple[str, bool]:
        return (UNKNOWN if recalls[qid] == UNKNOWN else "a name", known)

    probe = {p["qid"]: p["known"] for p in results["known"]["probe"]}
    sizes = {g: sum(group(q, k) == g for q, k in probe.items() if q in recalls) for g in groups}
    head = [
        f"recalled {said}, {'known' if known else 'unknown'} ({sizes[(said, known)]})"
        for said, known in groups
    ]
    lines = ["| Arm | " + " | ".join(head) + " |", "|---|" + "---|" * len(groups)]
    for arm, entry in results["arms"].items():
        searched: dict[tuple[str, bool], list[bool]] = {g: [] for g in groups}
        for seed in entry["seeds"]:
            for q in seed["questions"]:
                searched[group(q["qid"], q["known"])].append(q["searches"] > 0)
        cells = [_num(100 * statistics.fmean(v), 0) if v else "–" for v in searched.values()]
        lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _recalled_a_name(results: Mapping[str, Any]) -> tuple[int, int]:
    """How many unknown held-out questions the warm start's greedy recall names an answer on,
    and how many unknown questions there are."""
    from .warm_start import UNKNOWN

    unknown = [q for q in results["first_action"]["questions"] if not q["known"]]
    return sum(q.get("recall") not in (None, UNKNOWN) for q in unknown), len(unknown)


def _compare_table(results: Mapping[str, Any], earlier: Mapping[str, Any] | None) -> str:
    """Each arm's greedy figures from an earlier run, whose warm start taught another share of
    the facts, beside this run's."""
    if earlier is None:
        return "No earlier run given (`--earlier FILE`)."
    runs = [earlier, results]
    lines = []
    for run in runs:
        named, unknown = _recalled_a_name(run)
        lines.append(
            f"- Taught share {run['settings']['data']['taught_share']:g}: {_num(run['known']['pct'])}% of the "
            f"held-out questions known; the warm start's recall names an answer on {named} of the "
            f"{unknown} unknown ones ({_num(100 * (unknown - named) / unknown)}% recalled as `unknown`)."
        )
    lines += [
        "",
        "| Arm | Taught share | Seeds | EM | Searches/q | Searched known (%) | Searched unknown (%) "
        "| ΔEM against f1 (paired) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for arm in dict.fromkeys([*earlier["arms"], *results["arms"]]):
        for run in runs:
            entry = run["arms"].get(arm)
            if entry is None:
                continue
            n, paired = len(entry["seeds"]), entry.get("vs_f1", {}).get("em")
            delta = _pm(paired["mean"], paired["ci95"], paired["n"]) if paired and arm != "f1" else "–"
            cells = [_cell(entry["mean"], key, n) for key in ("em", "st", "sr_known", "sr_unknown")]
            lines.append(
                f"| {arm} | {run['settings']['data']['taught_share']:g} | {n} | "
                + " | ".join(cells)
                + f" | {delta} |"
            )
    return "\n".join(lines)


def blocks(results: Mapping[str, Any], earlier: Mapping[str, Any] | None = None) -> dict[str, str]:
    """The page's generated blocks, by name (``compare`` sets ``results`` beside ``earlier``)."""
    return {
        "split": _split_text(results),
        "arms-greedy": _arm_table(results, "greedy"),
        "arms-sampled": _arm_table(results, "sampled"),
        "paired": _paired_table(results),
        "targets": _targets_table(results),
        "by-recall": _recall_table(results),
        "baselines": _baseline_table(results),
        "training": _training_table(results),
        "timing": _timing_text(results),
        "compare": _compare_table(results, earlier),
    }


def render_page(page: str, results: Mapping[str, Any], earlier: Mapping[str, Any] | None = None) -> str:
    """``page`` with every ``<!-- real-lm:NAME -->`` block rewritten from ``results`` (and the
    ``compare`` block from ``earlier`` beside it)."""
    generated = blocks(results, earlier)

    def replace(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in generated:
            raise KeyError(f"the page names an unknown block {name!r}; known: {sorted(generated)}")
        return f"<!-- real-lm:{name} -->\n{generated[name]}\n<!-- end -->"

    return re.sub(r"<!-- real-lm:([\w-]+) -->\n.*?<!-- end -->", replace, page, flags=re.S)


def format_summary(results: Mapping[str, Any]) -> str:
    """The greedy arm table and the baselines, for the terminal."""
    return _arm_table(results, "greedy") + "\n\n" + _baseline_table(results)


def plot(results: Mapping[str, Any], path: Path) -> Path:
    """EM against searches per question and searched known against searched unknown (%), one
    marker per arm (mean ± 95% CI) and the warm start's; the searched share of training
    rollouts per step, a line per seed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right, curve) = plt.subplots(1, 3, figsize=(15, 4.6))
    # arms often coincide (every arm that always searches sits at one point): hollow markers of
    # shrinking size and distinct shapes keep each one visible
    markers = "osD^vPX*"
    for k, (arm, entry) in enumerate(results["arms"].items()):
        m = entry["mean"]
        ci = m["ci95"]
        style = {
            "fmt": markers[k % len(markers)],
            "color": f"C{k}",
            "markerfacecolor": "none",
            "markersize": 13 - k,
            "markeredgewidth": 1.6,
            "capsize": 3,
        }
        bar = {key: v or None for key, v in ci.items() if not isinstance(v, dict)}  # no caps for one seed
        left.errorbar(m["st"], m["em"], xerr=bar["st"], yerr=bar["em"], label=arm, **style)
        right.errorbar(m["sr_known"], m["sr_unknown"], xerr=bar["sr_known"], yerr=bar["sr_unknown"], **style)
        for seed in entry["seeds"]:
            points = seed.get("rollouts") or []
            curve.plot([r["step"] for r in points], [100 * r["sr"] for r in points], color=f"C{k}", alpha=0.7)
    warm = results.get("baselines", {}).get("warm_started")
    if warm:
        left.plot(warm["st"], warm["em"], "k+", markersize=14, label="warm start (greedy)")
        right.plot(warm["sr_known"], warm["sr_unknown"], "k+", markersize=14)
    left.set_xlabel("searches per question")
    left.set_ylabel("held-out EM (%)")
    # the targets: at least 80% of unknown questions searched, at most half of f1's known ones
    right.axhline(80.0, color="grey", linestyle=":", linewidth=1)
    if "f1" in results["arms"]:
        right.axvline(results["arms"]["f1"]["mean"]["sr_known"] / 2, color="grey", linestyle=":", linewidth=1)
    right.set_xlabel("searched, known questions (%)")
    right.set_ylabel("searched, unknown questions (%)")
    right.set_xlim(-5, 105)
    right.set_ylim(-5, 105)
    curve.set_xlabel("GRPO step")
    curve.set_ylabel("training rollouts that searched (%)")
    curve.set_ylim(-5, 105)
    for ax in (left, right, curve):
        ax.grid(alpha=0.3)
    fig.legend(*left.get_legend_handles_labels(), loc="lower center", ncol=9, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, required=True)
    parser.add_argument("--page", type=Path, required=True)
    parser.add_argument("--png", type=Path)
    parser.add_argument("--earlier", type=Path, help="an earlier run's results.json, for the compare block")
    args = parser.parse_args(argv)
    results = json.loads(args.results.read_text(encoding="utf-8"))
    earlier = json.loads(args.earlier.read_text(encoding="utf-8")) if args.earlier else None
    page = render_page(args.page.read_text(encoding="utf-8"), results, earlier)
    args.page.write_text(page, encoding="utf-8")
    if args.png:
        plot(results, args.png)
    print(f"wrote {args.page}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
