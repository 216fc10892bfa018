"""Write the measured tables of ``docs/hardening.md`` from the committed result files.

Each table sits between ``<!-- table:NAME -->`` and ``<!-- end table:NAME -->`` in the page and
is regenerated from ``benchmarks/results/NAME.json``; nothing in a table is typed by hand.

Usage::

    python benchmarks/render_docs.py
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
PAGE = REPO / "docs" / "hardening.md"


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


TABLES: dict[str, Callable[[dict[str, Any]], str]] = {
    "server_hardening": server_hardening,
    "http_clients": http_clients,
}


def main() -> None:
    page = PAGE.read_text(encoding="utf-8")
    for name, render in TABLES.items():
        report = json.loads((RESULTS / f"{name}.json").read_text(encoding="utf-8"))
        pattern = re.compile(rf"(<!-- table:{name} -->\n).*?(\n<!-- end table:{name} -->)", re.S)
        if not pattern.search(page):
            raise SystemExit(f"{PAGE} has no <!-- table:{name} --> ... <!-- end table:{name} --> block")
        table = render(report)
        page = pattern.sub(lambda m, table=table: m.group(1) + table + m.group(2), page)
    PAGE.write_text(page, encoding="utf-8")
    print(f"wrote {PAGE}")


if __name__ == "__main__":
    main()
