"""Write the measured tables of the docs pages from the committed result files.

Each table sits between ``<!-- table:NAME -->`` and ``<!-- end table:NAME -->`` in its page and
is regenerated from ``benchmarks/results/NAME.json``; nothing in a table is typed by hand.

Usage::

    python -m benchmarks.render_docs
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks._common import shown_command

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
HARDENING = REPO / "docs" / "hardening.md"
BENCHMARKS = REPO / "docs" / "benchmarks.md"
RETRIEVAL = REPO / "docs" / "retrieval.md"
TRAIN_CLI = REPO / "docs" / "train-cli.md"
EVALUATION = REPO / "docs" / "evaluation.md"

DATASET_NAMES = {
    "2wikimultihopqa": "2WikiMultihopQA",
    "hotpotqa": "HotpotQA",
    "musique": "MuSiQue",
    "nq": "NQ",
    "popqa": "PopQA",
}


def _ms(value: float | None) -> str:
    return "–" if value is None else f"{value:,.0f}" if value >= 100 else f"{value:.1f}"


def _what(phase: dict[str, Any]) -> str:
    name = phase["phase"]
    if name == "bad input":
        statuses = ", ".join(f"{n} answered {s}" for s, n in phase["statuses"].items())
        return f"{phase['requests']} malformed requests: {statuses}"
    if name == "slow connections":
        closed = phase["closed_by_server"]
        return (
            f"{phase['connections']:,} held {phase['held_s']:g} s (opened in {phase['seconds_to_open']:g} s); "
            f"closed by the server: {closed['idle']:,} idle, {closed['partial head']:,} partial head, "
            f"{closed['partial body']:,} partial body; {phase['answered_503']} answered 503"
        )
    if name == "max-size requests":
        answers = phase["answers"]
        big = [a for a in answers if a["status"] == 200]
        over = [a for a in answers if a["status"] != 200]
        text = (
            f"{len(big)} at once × {phase['request_bytes'] / 1e6:.1f} MB: 200 with "
            f"{big[0]['bytes'] / 1e6:.1f} MB each in {max(a['seconds'] for a in big):.1f} s"
            if big
            else "none answered"
        )
        if over:
            text += f"; over the cap: {over[0]['status']} in {over[0]['seconds']:.2f} s"
        return (
            text
            + f"; workers' memory {phase['workers_rss_mb_before']:.0f} → {phase['workers_rss_mb_peak']:.0f} MB"
        )
    if name == "kill -9 worker":
        return f"replaced and answering after {phase['seconds_to_replace']} s"
    if name == "second server":
        outcome = f"refused (exit code {phase['exit_code']})" if phase["refused"] else "NOT refused"
        return f"`serve --workers 2` on the held port: {outcome} after {phase['seconds_to_exit']} s"
    if name == "kill -9 parent":
        return (
            f"{phase['workers']} workers {'exited' if phase['workers_exited'] else 'still running'} after "
            f"{phase['seconds_to_exit']} s; port {'free' if phase['port_free'] else 'still held'}"
        )
    return "nothing else running"


def server_hardening(report: dict[str, Any]) -> str:
    rows = [
        "| phase | what happened | normal queries answered | within 1 s | p50 ms | max ms |",
        "|---|---|---|---|---|---|",
    ]
    for phase in report["phases"]:
        probe = phase.get("normal_query")
        if probe is None:
            rows.append(f"| {phase['phase']} | {_what(phase)} | – | – | – | – |")
            continue
        rows.append(
            f"| {phase['phase']} | {_what(phase)} | {probe['answered_200']} / {probe['probes']} | "
            f"{probe['within_1s']} | {_ms(probe['p50_ms'])} | {_ms(probe['max_ms'])} |"
        )
    machine = report["machine"]
    rows += [
        "",
        f"{report['server']}; {machine['cores']} cores, load average {machine['load_average'][0]:.1f} at the end.",
    ]
    return "\n".join(rows)


def http_clients(report: dict[str, Any]) -> str:
    rows = ["| client | requests/s | p50 ms | p99 ms |", "|---|---|---|---|"]
    for name, r in report["clients"].items():
        rows.append(f"| {name} | {r['requests_per_s']:.0f} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} |")
    return "\n".join(rows)


def _machine(report: dict[str, Any]) -> str:
    return (
        f"{report['cpus']} CPUs, `OMP_NUM_THREADS={report['omp_num_threads']}`, "
        f"load average {report['load_average'][0]:.1f} at the end"
    )


def _source(name: str, report: dict[str, Any]) -> str:
    return (
        f"From `benchmarks/results/{name}.json`, written by "
        f"`OMP_NUM_THREADS={report['omp_num_threads']} {shown_command(report['command'])}`."
    )


def hardening_battery(report: dict[str, Any]) -> str:
    rows = ["| fault | trials | promise held | what was seen | seconds |", "|---|---:|---:|---|---:|"]
    for c in report["checks"]:
        rows.append(f"| {c['fault']} | {c['trials']} | {c['held']} | {c['detail']} | {c['seconds']:.1f} |")
    held = sum(c["held"] for c in report["checks"])
    trials = sum(c["trials"] for c in report["checks"])
    rows += [
        "",
        f"{held} of {trials} trials kept their promise. Measured on {_machine(report)} (shared with other "
        f"jobs), seed {report['seed']}.",
        "",
        f"From `benchmarks/results/hardening_battery.json`, written by `{shown_command(report['command'])}`.",
    ]
    return "\n".join(rows)


def bm25_recall(report: dict[str, Any]) -> str:
    rows = [
        "| dataset | questions | recall@3 | all@3 | recall@5 | all@5 |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in sorted(report["datasets"], key=lambda r: list(DATASET_NAMES).index(r["dataset"])):
        rows.append(
            f"| {DATASET_NAMES[r['dataset']]} | {r['questions']} | {r['recall_at_3']:.3f} | {r['all_at_3']:.3f} "
            f"| {r['recall_at_5']:.3f} | {r['all_at_5']:.3f} |"
        )
    rows += [
        "",
        f"Building the index takes {report['index_build_s']:.1f} s for the {report['corpus_passages']:,} passages. "
        f"A query takes a median of {report['median_ms_per_query_single']:.2f} ms one at a time and "
        f"{report['median_ms_per_query_batched']:.2f} ms in batches of {report['batch_size']} "
        f"({_machine(report)}).",
        "",
        _source("bm25_recall", report),
    ]
    return "\n".join(rows)


def dense_recall(report: dict[str, Any]) -> str:
    rows = [
        "| dataset | retriever | recall@3 | all@3 | recall@5 | all@5 |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for r in report["rows"]:
        retriever = "BM25" if r["retriever"] == "bm25" else r["retriever"]
        rows.append(
            f"| {DATASET_NAMES[r['dataset']]} | {retriever} | {r['recall@3']:.3f} | {r['all@3']:.3f} "
            f"| {r['recall@5']:.3f} | {r['all@5']:.3f} |"
        )
    build, dense = report["dense_build"], report["latency"]["dense"]
    rows.append("")
    if build.get("passages_per_s"):
        rows.append(
            f"- Encoding runs at {build['passages_per_s']:.0f} passages/s, "
            f"{report['corpus_passages'] / build['passages_per_s'] / 60:.1f} minutes for the corpus."
        )
    rows += [
        f"- A dense query takes {dense['ms_batched']:.1f} ms in batches of 64 and {dense['ms_single']:.1f} ms "
        "one at a time.",
        f"- Measured on {_machine(report)}.",
        "",
        _source("dense_recall", report),
    ]
    return "\n".join(rows)


def tiny_lm_throughput(report: dict[str, Any]) -> str:
    modes = list(dict.fromkeys(r["mode"] for r in report["rows"]))
    cell = {(r["length"], r["mode"]): r for r in report["rows"]}
    header = " | ".join(m.replace("torch.compile", "`torch.compile`") for m in modes)
    rows = [f"| tokens per sequence | {header} |", "|---:|" + "---:|" * len(modes)]
    for length in dict.fromkeys(r["length"] for r in report["rows"]):
        cells = " | ".join(
            f"{cell[length, m]['ms']:.0f} ms ({cell[length, m]['gflops']:.0f} GFLOP/s)" for m in modes
        )
        rows.append(f"| {length} | {cells} |")
    rows += [
        "",
        f"{report['parameters'] / 1e6:.2f} M parameters, {report['batch']} sequences, "
        f"`torch.set_num_threads({report['threads']})`. A 2048 × 2048 float32 matrix multiply reaches "
        f"{report['matmul_gflops']:.0f} GFLOP/s with the same threads. Measured on {_machine(report)}.",
        "",
        _source("tiny_lm_throughput", report),
    ]
    return "\n".join(rows)


def server_workers(report: dict[str, Any]) -> str:
    rows = [
        "| workers | batching | clients | queries/request | q/s | p50 ms | p99 ms | vs in-process batched |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for run in report["reports"]:
        base = run["in_process_batched_qps"]
        for r in run["runs"]:
            if not r["batching"] and r["clients"] != 64:
                continue
            cells = [
                str(run["workers"]),
                "on" if r["batching"] else "off",
                str(r["clients"]),
                str(r["queries_per_request"]),
                f"{r['qps']:.0f}",
                f"{r['p50_ms']:.2f}",
                f"{r['p99_ms']:.2f}",
                f"{r['qps'] / base:.0%}",
            ]
            if r["batching"] and r["clients"] == 64 and r["queries_per_request"] == 1:
                cells = [f"**{c}**" for c in cells]  # the target: 64 clients, one query per request
            rows.append("| " + " | ".join(cells) + " |")
    for run in report["reports"]:
        at_64 = {
            r["batching"]: r for r in run["runs"] if r["clients"] == 64 and r["queries_per_request"] == 1
        }
        rows.append(
            f"\n{run['workers']} worker{'s' if run['workers'] > 1 else ''}, 64 clients: "
            f"{at_64[True]['qps'] / run['in_process_batched_qps']:.0%} of in-process batched with p99 "
            f"{at_64[True]['p99_ms']:.0f} ms; batching gives {at_64[True]['qps'] / at_64[False]['qps'] - 1:+.0%} "
            "throughput."
        )
    first = report["reports"][0]
    baselines = " and ".join(f"{r['in_process_batched_qps']:,.0f} q/s" for r in report["reports"])
    machine = first["machine"]
    rows += [
        "",
        f"The in-process baseline is one `search` call per {first['max_batch_size']} queries, on one core: "
        f"{baselines} in the runs above. BM25 over the {first['passages']:,}-passage shared corpus, k = "
        f"{first['k']}; each row the median of the repeats; {machine['cores']} cores, "
        f"`OMP_NUM_THREADS={machine['omp_num_threads']}`.",
        "",
        "From "
        + ", ".join(f"`benchmarks/results/server_workers_{r['workers']}.json`" for r in report["reports"])
        + ", written back to back by "
        + " and ".join(
            f"`OMP_NUM_THREADS={r['machine']['omp_num_threads']} {shown_command(r['command'])}`"
            for r in report["reports"]
        )
        + ".",
    ]
    return "\n".join(rows)


def server_dense(report: dict[str, Any]) -> str:
    base = report["in_process_batched_qps"]
    rows = [
        "| batching | clients | queries/request | q/s | p50 ms | p99 ms | mean batch | "
        f"vs in-process batched ({base:.0f} q/s) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in report["runs"]:
        rows.append(
            f"| {'on' if r['batching'] else 'off'} | {r['clients']} | {r['queries_per_request']} | {r['qps']:.0f} | "
            f"{r['p50_ms']:.2f} | {r['p99_ms']:.2f} | {r['mean_batch']:.1f} | {r['qps'] / base:.0%} |"
        )
    at_64 = {r["batching"]: r for r in report["runs"] if r["clients"] == 64 and r["queries_per_request"] == 1}
    machine = report["machine"]
    rows += [
        "",
        f"64 clients: {at_64[True]['qps']:.0f} q/s with batching, {at_64[True]['qps'] / base:.0%} of in-process "
        f"batched, p99 {at_64[True]['p99_ms']:.0f} ms; {at_64[False]['qps']:.0f} q/s without, p99 "
        f"{at_64[False]['p99_ms']:.0f} ms. {report['passages']:,} passages, k = {report['k']}; "
        f"{machine['cores']} cores, `OMP_NUM_THREADS={machine['omp_num_threads']}`.",
        "",
        f"From `benchmarks/results/server_dense.json`, written by "
        f"`OMP_NUM_THREADS={machine['omp_num_threads']} {shown_command(report['command'])}`.",
    ]
    return "\n".join(rows)


def autocast_cpu(report: dict[str, Any], stem: str = "autocast_cpu") -> str:
    median = report["median_s"]
    rows = ["| setting | sampling (s) | update (s) |", "|---|---:|---:|"]
    for name, parts in median.items():
        rows.append(f"| {name} | {parts['sampling']:.1f} | {parts['update']:.1f} |")
    base, fast = median["float32"], median["bfloat16 autocast"]
    flags = ", ".join(report["cpu_flags"]) or "none of amx_bf16, avx512_bf16, avx512f"
    return "\n".join(rows) + (
        f"\n\nSmolLM2-135M-Instruct, {report['batch']} sequences of {report['prompt_tokens']} tokens; sampling "
        f"{report['new_tokens']} new tokens each; update: their log-probabilities and the backward pass. "
        f"{_runs(report['repeats'])}: autocast is {_speed(base['sampling'], fast['sampling'])} at sampling and "
        f"{_speed(base['update'], fast['update'])} at the update. {_machine(report)}, "
        f"torch threads {report['torch_threads']}, CPU flags: {flags}. {_source(stem, report)}"
    )


def _runs(repeats: int) -> str:
    return f"Medians of {repeats} alternated runs" if repeats > 1 else "One run of each"


def _speed(base_s: float, other_s: float) -> str:
    """``other_s`` against ``base_s`` in words: "2.3x as fast" or "4.4x slower"."""
    if other_s <= base_s:
        return f"{base_s / other_s:.1f}x as fast"
    return f"{other_s / base_s:.1f}x slower"


def server_cache(report: dict[str, Any]) -> str:
    rows = [
        "| server | q/s | step (s) | p50 ms | p99 ms | queries searched | cache hit rate |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in report["rows"]:
        rate = "–" if r["hit_rate"] is None else f"{r['hit_rate']:.1%}"
        rows.append(
            f"| {r['server']} | {r['qps']:.0f} | {r['step_s']:.2f} | {r['p50_ms']:.0f} | {r['p99_ms']:.0f} "
            f"| {r['searched']:,} | {rate} |"
        )
    on, off = ({r["server"]: r for r in report["rows"]}[name] for name in ("cache on", "cache off"))
    total = report["queries_per_step"] * report["steps"]
    faster = sum(a > b for a, b in zip(on["step_qps"], off["step_qps"], strict=True))
    rows += [
        "",
        f"{report['steps']} steps of {report['groups']} groups x {report['group_size']} rollouts x "
        f"{report['turns']} searches ({total:,} queries per server); k = {report['k']}. With the cache the "
        f"server searched {on['searched']:,} of them and answered {on['qps'] / off['qps']:.2f}x as many queries "
        f"per second (faster in {faster} of the {report['steps']} steps, which alternate between the "
        f"servers); q/s and step time are medians over the steps. Measured on {_machine(report)}, with "
        "other jobs running.",
        "",
        _source("server_cache", report),
    ]
    return "\n".join(rows)


def e5_prefix(report: dict[str, Any]) -> str:
    rows = [
        "| dataset | queries | recall@1 | recall@3 | recall@5 | top 5 differs |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for r in report["rows"]:
        label = f"with `{report['query_prefix']}`" if r["query_prefix"] == "with" else "without a prefix"
        rows.append(
            f"| {DATASET_NAMES[r['dataset']]} ({r['questions']}) | {label} | {r['recall@1']:.3f} | "
            f"{r['recall@3']:.3f} | {r['recall@5']:.3f} | {r['top5_differs']:.0%} |"
        )
    rows += [
        "",
        f"{report['corpus_passages']:,} passages (every passage the questions name, then random others, "
        f"seed {report['seed']}), encoded with `{report['passage_prefix']}` by {report['model']}; exact "
        f"(flat) search; recall@k is the share of a question's supporting passages in the top k; top 5 "
        "differs is the share of questions whose five results (ids, in order) differ between the two. "
        f"Measured on {_machine(report)}.",
        "",
        _source("e5_prefix", report),
    ]
    return "\n".join(rows)


def kv_reuse(report: dict[str, Any]) -> str:
    names = {"tiny": "tiny (128×4)", "smollm2": "SmolLM2-135M-Instruct"}
    work = {"rollouts": "GRPO step's rollouts", "evaluation": "`hf:` evaluation, per episode"}
    rows = [
        "| model | work | tokens encoded per episode: whole → reused | generated per episode "
        "| time: whole → reused | same tokens |",
        "|---|---|---:|---:|---:|---|",
    ]
    for r in report["results"]:
        rows.append(
            f"| {names[r['model']]} | {work[r['kind']]} | {r['encoded_per_episode_whole']:,.0f} → "
            f"{r['encoded_per_episode_reuse']:,.0f} | {r['generated_per_episode']:.0f} | "
            f"{r['median_s_whole']:.2f} s → {r['median_s_reuse']:.2f} s (×{r['speedup']:.2f}) | "
            f"{'yes' if r['same_tokens_every_rep'] else 'no'} |"
        )
    settings = report["settings"]
    return "\n".join(rows) + (
        f"\n\nSyntheticFacts with Search-R1's protocol, up to {settings['max_turns']} turns of "
        f"{settings['max_new_tokens']} tokens; rollouts: {settings['questions']} question{'s' if settings['questions'] != 1 else ''} × G = "
        f"{settings['group_size']} sampled at temperature 1; evaluation: {settings['eval_episodes']} greedy "
        f"episodes side by side. Tokens encoded: the contexts encoded before sampling (the first forward pass of "
        f"each `generate` call and the shared-prompt passes), padding included. Medians of {settings['reps']} interleaved runs after {settings['warmup']} warm-up, "
        f"torch threads {report['torch_threads']}; {_machine(report)}, shared with other jobs (ratios, not "
        f"seconds, carry over). {_source('kv_reuse', report)}"
    )


TABLES: dict[str, tuple[Path, Callable[[dict[str, Any]], str]]] = {
    "server_hardening": (HARDENING, server_hardening),
    "http_clients": (HARDENING, http_clients),
    "hardening_battery": (HARDENING, hardening_battery),
    "bm25_recall": (BENCHMARKS, bm25_recall),
    "dense_recall": (BENCHMARKS, dense_recall),
    "tiny_lm_throughput": (BENCHMARKS, tiny_lm_throughput),
    "server_workers": (RETRIEVAL, server_workers),
    "server_dense": (RETRIEVAL, server_dense),
    "server_cache": (RETRIEVAL, server_cache),
    "e5_prefix": (RETRIEVAL, e5_prefix),
    "autocast_cpu": (TRAIN_CLI, autocast_cpu),
    "autocast_cpu_avx2": (TRAIN_CLI, lambda report: autocast_cpu(report, "autocast_cpu_avx2")),
    "kv_reuse": (EVALUATION, kv_reuse),
}
SOURCES = {"server_workers": ("server_workers_1", "server_workers_2")}
"""Tables drawn from several result files (their renderer gets ``{"reports": [...]}``); others from NAME.json."""


def block(name: str) -> re.Pattern[str]:
    """The ``<!-- table:NAME -->`` ... ``<!-- end table:NAME -->`` block; group 2 is the table."""
    return re.compile(rf"(<!-- table:{name} -->\n)(.*?)(\n<!-- end table:{name} -->)", re.S)


def render_table(name: str) -> str:
    """Table ``name`` as rendered from its committed result file."""

    def load(stem: str) -> dict[str, Any]:
        return json.loads((RESULTS / f"{stem}.json").read_text(encoding="utf-8"))

    report = {"reports": [load(stem) for stem in SOURCES[name]]} if name in SOURCES else load(name)
    return TABLES[name][1](report)


def render_page(path: Path, page: str) -> str:
    """``page`` (the text of ``path``) with every table of it rendered from its result file."""
    for name, (where, _) in TABLES.items():
        if where != path:
            continue
        pattern = block(name)
        if not pattern.search(page):
            raise SystemExit(f"{path} has no <!-- table:{name} --> ... <!-- end table:{name} --> block")
        table = render_table(name)
        page = pattern.sub(lambda m, table=table: m.group(1) + table + m.group(3), page)
    return page


def main() -> None:
    for path in sorted({where for where, _ in TABLES.values()}):
        path.write_text(render_page(path, path.read_text(encoding="utf-8")), encoding="utf-8")
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
