"""``python -m searchgym.trainers.verl.data IN.jsonl OUT.parquet [--eval]``: verl's parquet rows from ``searchgym prepare``'s.

verl's ``RLHFDataset`` reads parquet files whose ``prompt`` column is a chat (a list of
messages) and hands every other column to the agent loop. Each ``searchgym prepare`` row
(``{"prompt", "label", "datasource"}``) becomes::

    {"data_source": "musique",
     "prompt": [{"role": "user", "content": <the protocol's prompt>}],
     "agent_name": "searchgym",
     "extra_info": {"label": <the JSON label>, "index": i, "searchgym_eval": <--eval>}}

The agent loop starts each episode from ``extra_info.label`` and renders its own prompt (with
the chat template and any memory); ``prompt`` is what verl filters by length. ``--eval`` marks
the rows of a validation file (``data.val_files``), whose episodes write nothing into the
experience memory or the minimum tool-call store.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from ...error import DataFileError, InvalidArgumentError

__all__ = ["convert_rows", "main", "parser", "read_rows", "write_parquet"]


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of a ``searchgym prepare`` JSON Lines file.

    Raises:
        DataFileError: the file cannot be read or a line is not a JSON object with ``prompt`` and ``label``.
    """
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise DataFileError(
            f"Cannot read {path}: {exc}. Write it with `searchgym prepare ... --out {path}`."
        ) from None
    rows = []
    for n, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataFileError(f"{path}:{n} is not JSON ({exc.msg}).") from None
        if (
            not isinstance(row, dict)
            or not isinstance(row.get("prompt"), str)
            or not isinstance(row.get("label"), str)
        ):
            raise DataFileError(
                f"{path}:{n} needs a string prompt and a JSON string label, as `searchgym prepare` writes them."
            )
        rows.append(row)
    if not rows:
        raise DataFileError(f"{path} holds no rows.")
    return rows


def convert_rows(rows: list[dict[str, Any]], evaluate: bool = False) -> list[dict[str, Any]]:
    """verl rows of ``searchgym prepare`` rows (see the module docstring)."""
    return [
        {
            "data_source": str(row.get("datasource") or "searchgym"),
            "prompt": [{"role": "user", "content": row["prompt"]}],
            "agent_name": "searchgym",
            "extra_info": {"label": row["label"], "index": i, "searchgym_eval": bool(evaluate)},
        }
        for i, row in enumerate(rows)
    ]


def write_parquet(rows: list[dict[str, Any]], out: Path) -> None:
    """Write ``rows`` to the parquet file ``out`` (its folder made when missing)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), out)


def parser() -> argparse.ArgumentParser:
    """The command's argument parser."""
    p = argparse.ArgumentParser(
        prog="python -m searchgym.trainers.verl.data",
        description="verl parquet rows (agent_name searchgym) from searchgym prepare's JSON Lines rows",
    )
    p.add_argument("input", type=Path, help="rows written by searchgym prepare")
    p.add_argument("out", type=Path, help="the parquet file to write (data.train_files / data.val_files)")
    p.add_argument(
        "--eval", action="store_true", help="mark the rows as evaluation rows (they write no memory or store)"
    )
    return p


def main(argv: list[str] | None = None) -> int:
    """Convert, and print one line saying what was written."""
    args = parser().parse_args(argv)
    if args.out.suffix != ".parquet":
        raise InvalidArgumentError(f"out must be a .parquet file, got {args.out}.")
    rows = convert_rows(read_rows(args.input), args.eval)
    write_parquet(rows, args.out)
    print(f"wrote {len(rows)} {'evaluation' if args.eval else 'training'} rows to {args.out}")
    return 0


if __name__ == "__main__":
    from ...error import SearchGymError

    try:
        sys.exit(main())
    except SearchGymError as exc:
        print(f"searchgym: error: {exc}", file=sys.stderr)
        sys.exit(2)
