"""Helpers shared by the benchmark scripts (imported as ``_common`` when they run).

Gold-passage recall over the shared question sets, per-query latency medians, the JSON
report every script writes with ``--out``, and the policy of a finished study run.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import re
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # searchgym is imported where it is used, so a child process pays only for what it needs
    from searchgym.retrieval import Retriever
    from searchgym.trainers.config import TrainConfig

__all__ = [
    "REPO",
    "SHARED_DATA",
    "median_ms_per_query",
    "run_policy",
    "search_latency_ms",
    "shown_command",
    "support_shares",
    "supported_records",
    "versions",
    "write_report",
]

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"
"""The shared corpus and question sets beside the checkout."""

_SCRIPT = re.compile(r"\bpython3? ((?:benchmarks|studies)/[\w/]+)\.py\b")


def shown_command(command: str) -> str:
    """``command`` as the docs show it: a benchmark or study script run as a module from the
    repository root (``python -m benchmarks.x --n 3`` becomes ``python -m benchmarks.x --n 3``),
    the form in which it finds its sibling modules."""
    return _SCRIPT.sub(lambda m: "python -m " + m.group(1).replace("/", "."), command)


def _command() -> str:
    """The command line that runs this process: ``python -m NAME ARGS`` when run as a module."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    head = f"python -m {spec.name}" if spec is not None and spec.name else f"python {sys.argv[0]}"
    return " ".join([head, *sys.argv[1:]])


def supported_records(path: Path) -> list[dict]:
    """Question records that name at least one supporting passage."""
    from searchgym.retrieval.corpus import read_jsonl

    return [rec for _, rec in read_jsonl(path, "question file") if rec.get("supporting_passage_ids")]


def support_shares(retriever: Retriever, records: list[dict], ks: Sequence[int]) -> dict[int, list[float]]:
    """For each k, per question: the share of its supporting passages in the top k for its question text."""
    results = retriever.search([rec["question"] for rec in records], max(ks))
    shares: dict[int, list[float]] = {k: [] for k in ks}
    for rec, docs in zip(records, results, strict=True):
        gold = set(rec["supporting_passage_ids"])
        for k in ks:
            shares[k].append(len(gold & {d.id for d in docs[:k]}) / len(gold))
    return shares


def median_ms_per_query(call: Callable[[list[Any]], object], items: list[Any], batch: int) -> float:
    """Median milliseconds per item of ``call`` on consecutive chunks of ``batch`` items."""
    per_item = []
    for start in range(0, len(items), batch):
        chunk = items[start : start + batch]
        t0 = time.perf_counter()
        call(chunk)
        per_item.append((time.perf_counter() - t0) / len(chunk))
    return 1000 * statistics.median(per_item)


def search_latency_ms(
    retriever: Retriever, queries: list[str], k: int, batch: int, single: int | None = None
) -> tuple[float, float]:
    """Median milliseconds per query of ``retriever.search``, batched and one query per call.

    Batched calls hold ``batch`` queries each; single calls go over the first ``single``
    queries (None: all of them). Returns ``(batched, single)``.
    """

    def search(chunk: list[str]) -> object:
        return retriever.search(chunk, k)

    return median_ms_per_query(search, queries, batch), median_ms_per_query(search, queries[:single], 1)


def versions() -> dict[str, str]:
    """Versions of the packages that set the measured speed."""
    names = ("searchgym", "torch", "bm25s", "faiss-cpu", "sentence-transformers", "numpy")
    found = {}
    for name in names:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return found


def add_table_arguments(parser: Any) -> None:
    """``--out``, and ``--table``/``--doc`` to print or fill a table from a results file."""
    parser.add_argument("--out", type=Path, help="write the results here (JSON)")
    parser.add_argument("--table", type=Path, help="a results file: print its table instead of measuring")
    parser.add_argument(
        "--doc", type=Path, help="with --table: rewrite the table block of this Markdown file"
    )


def show_table(args: Any, table: Callable[[dict[str, Any]], str], begin: str, end: str) -> bool:
    """Print ``args.table``'s table, or fill it between ``begin`` and ``end`` in ``args.doc``;
    False when there is no ``--table`` (measure instead)."""
    if not args.table:
        return False
    body = table(json.loads(args.table.read_text(encoding="utf-8")))
    if not args.doc:
        print(body)
        return True
    text = args.doc.read_text(encoding="utf-8")
    if begin not in text or end not in text:
        raise SystemExit(f"{args.doc} has no {begin} ... {end} block to fill")
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    args.doc.write_text(f"{head}{begin}\n{body}\n{end}{tail}", encoding="utf-8")
    return True


def write_report(path: Path | None, report: dict[str, Any]) -> None:
    """Write ``report`` and the machine it ran on to ``path`` as indented JSON (nothing when None)."""
    if path is None:
        return
    machine = {
        "command": _command(),
        "python": platform.python_version(),
        "machine": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS", "unset"),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "versions": versions(),
    }
    path.write_text(json.dumps({**report, **machine}, indent=2) + "\n", encoding="utf-8")


def run_policy(run: Path, *, warm_start: bool = False) -> tuple[TrainConfig, Any, Any]:
    """A finished study run's config (its ``model.path`` set to the weights loaded), tokenizer
    and model: its last complete checkpoint, or with ``warm_start`` the warm start it began
    from. Exits with a message when ``run`` is not a run folder or has no such weights.
    Needs ``studies/frugal`` on ``sys.path`` (the study scripts insert it) for the run's config."""
    from searchgym.trainers.grpo.checkpoint import latest_checkpoint
    from searchgym.trainers.grpo.model import load_model, load_tokenizer_for
    from studies.frugal.tiny_lm.config import load_run_config

    if not (run / "config.yaml").is_file():
        raise SystemExit(f"{run} is not a run folder: it holds no config.yaml")
    config = load_run_config(run / "config.yaml")
    if warm_start:
        if config.model.path is None:
            raise SystemExit(f"{run} did not start from a warm start (its model.path is empty)")
        weights = Path(config.model.path)
    else:
        checkpoint = latest_checkpoint(run)
        if checkpoint is None:
            raise SystemExit(f"{run} holds no checkpoint")
        weights = checkpoint / "model"
    config = config.replace(model={**vars(config.model), "path": str(weights), "tiny": None})
    return config, load_tokenizer_for(config.model, weights), load_model(config.model, weights, "cpu")
