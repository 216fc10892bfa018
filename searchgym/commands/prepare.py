"""``searchgym prepare``: training rows for OpenRLHF from searchgym question sets.

Each output line is one JSON object::

    {"prompt": "<instructions>\\n\\nQuestion: ...\\n",
     "label": "{\\"id\\": ..., \\"question\\": ..., \\"golden_answers\\": [...]}",
     "datasource": "musique"}

``prompt`` is the question rendered by the protocol, exactly what the env's ``reset``
returns without memory (OpenRLHF's loader needs a prompt column; the searchgym agent
renders its own from the label, with the chat template and any memory blocks). ``label``
is a JSON *string*, the form ``--data.label_key label`` hands to the agent. ``datasource``
is what OpenRLHF groups its evaluation metrics by.

Examples::

    searchgym prepare --dataset musique --data-path musique_train.jsonl --protocol tool_call --out train.jsonl
    searchgym prepare --dataset musique:3000 --dataset 2wikimultihopqa:4000 \\
        --data-path musique_train.jsonl --data-path 2wiki_train.jsonl --protocol tool_call --out train.jsonl
    searchgym prepare --mix sem --data-path musique_train.jsonl --data-path mmlu_train.jsonl --out sem_train.jsonl
    searchgym prepare --dataset nq --data-path nq_hotpotqa_train/train.parquet --out train.jsonl

A ``.parquet`` data path is read in Search-R1's layout (:func:`read_parquet_questions`);
its rows keep their own ``data_source`` (``nq``, ``hotpotqa``) as the datasource.

``--mix sem`` is SEM's training mix: MuSiQue (questions that need a search) and MMLU
(questions that usually do not), the same number of each (the smaller set's size, or
``:COUNT``), shuffled together, in SEM's protocol unless ``--protocol`` says otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

NAME = "prepare"
HELP = "write OpenRLHF training rows (prompt + JSON label) from searchgym question sets"

MIXES = {"sem": ("musique", "mmlu")}
"""Named mixes: the datasets they balance."""

SYNTHETIC = "synthetic"


@dataclass(frozen=True)
class DatasetSpec:
    """One ``--dataset NAME[:COUNT]``: a dataset key and an optional number of questions."""

    key: str
    count: int | None = None


def parse_dataset(text: str) -> DatasetSpec:
    """``NAME[:COUNT]`` → :class:`DatasetSpec` (NAME: a benchmark key or env name, or ``synthetic``).

    Raises:
        UnknownNameError: an unknown dataset (with close matches).
        InvalidArgumentError: a COUNT that is not a positive integer.
    """
    from searchgym.envs.registration import BENCHMARKS
    from searchgym.error import InvalidArgumentError, did_you_mean

    name, _, count_text = text.partition(":")
    names = {k.lower(): v for k, v in BENCHMARKS.items()} | {v: v for v in BENCHMARKS.values()}
    names |= {SYNTHETIC: SYNTHETIC, "syntheticfacts": SYNTHETIC}
    key = names.get(re.sub(r"-v\d+$", "", name.strip().lower()).removeprefix("searchgym/"))
    if key is None:
        raise did_you_mean("dataset", name, sorted(set(BENCHMARKS.values())) + [SYNTHETIC])
    count = None
    if count_text:
        if not count_text.isdigit() or int(count_text) < 1:
            raise InvalidArgumentError(
                f"The count in --dataset {text!r} must be a positive integer, got {count_text!r}."
            )
        count = int(count_text)
    return DatasetSpec(key, count)


def _questions(spec: DatasetSpec, data_path: Path | None, world_seed: int) -> list[tuple[Any, str]]:
    """The questions of ``spec``, each with its datasource (the dataset key, or a parquet row's ``data_source``)."""
    if spec.key == SYNTHETIC:
        from searchgym.envs.synthetic import generate_world

        return [(q, spec.key) for q in generate_world(world_seed).questions]
    from searchgym.envs.benchmarks import DATA_DIR_VARIABLE
    from searchgym.envs.data import load_questions
    from searchgym.error import InvalidArgumentError

    if data_path is None:
        data_dir = os.environ.get(DATA_DIR_VARIABLE)
        if not data_dir:
            raise InvalidArgumentError(
                f"No --data-path for dataset {spec.key!r}: give its question file (FlashRAG JSONL: id, question, "
                f"golden_answers, or Search-R1's parquet) or set {DATA_DIR_VARIABLE} to a folder holding "
                f"questions/{spec.key}.jsonl."
            )
        data_path = Path(data_dir) / "questions" / f"{spec.key}.jsonl"
    if data_path.suffix == ".parquet":
        return read_parquet_questions(data_path, spec.key)
    return [(q, spec.key) for q in load_questions(data_path)]


def read_parquet_questions(path: Path, default_source: str) -> list[tuple[Any, str]]:
    """Questions from a parquet file in Search-R1's layout (``nq_hotpotqa_train/train.parquet``).

    Search-R1's rows keep FlashRAG's ``id``, ``question`` and ``golden_answers`` next to its
    own ``data_source``, ``prompt`` (the question inside its template) and
    ``reward_model.ground_truth.target``. The answers come from ``golden_answers`` (else the
    target), the id from ``id`` (else ``<data_source>_<extra_info.index>``), the datasource
    from ``data_source`` (else ``default_source``).

    Raises:
        DataFileError: the file is not readable parquet, or a row lacks a question or answers.
        SearchGymError: pyarrow is not installed.
    """
    from searchgym.envs.data import _question
    from searchgym.error import DataFileError, SearchGymError

    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise SearchGymError(
            f"Reading {path} needs pyarrow: pip install pyarrow (OpenRLHF's own dependencies bring it)."
        ) from None
    try:
        rows = pq.read_table(path).to_pylist()
    except (OSError, ValueError) as exc:  # pyarrow's ArrowInvalid is a ValueError
        raise DataFileError(f"The question file {str(path)!r} is not readable parquet: {exc}") from exc
    if not rows:
        raise DataFileError(f"The question file {str(path)!r} holds no rows.")
    out = []
    for number, row in enumerate(rows, start=1):
        answers = row.get("golden_answers")
        if answers is None:
            answers = ((row.get("reward_model") or {}).get("ground_truth") or {}).get("target")
        source = row.get("data_source") or default_source
        qid = row.get("id")
        if qid is None:
            qid = f"{source}_{(row.get('extra_info') or {}).get('index', number - 1)}"
        record = {"id": qid, "question": row.get("question"), "golden_answers": answers}
        out.append((_question(record, path, number), str(source)))
    return out


def build_rows(
    datasets: list[DatasetSpec],
    data_paths: list[Path],
    *,
    protocol: str = "search_r1",
    mix: str | None = None,
    seed: int = 0,
    shuffle: bool = True,
    world_seed: int = 0,
) -> list[dict[str, str]]:
    """The training rows for ``datasets`` (see the module docstring).

    Args:
        datasets: The datasets, in order; with ``mix`` they default to the mix's datasets.
        data_paths: Question files, matched in order to the datasets other than ``synthetic``;
            none means ``$SEARCHGYM_DATA_DIR/questions/<key>.jsonl``.
        protocol: The protocol that renders the prompt.
        mix: ``"sem"``: balance MuSiQue and MMLU.
        seed: Seed of the sampling and the shuffle.
        shuffle: Sample each dataset's questions at random and shuffle the rows (else the
            first COUNT of each, in file order).
        world_seed: The SyntheticFacts world, for ``synthetic``.

    Raises:
        SearchGymError: unknown names, a wrong number of data paths, unreadable files.
    """
    from searchgym.envs.protocols import make_protocol
    from searchgym.error import InvalidArgumentError, did_you_mean

    proto = make_protocol(protocol)
    if mix is not None:
        if mix not in MIXES:
            raise did_you_mean("mix", mix, MIXES)
        wanted = MIXES[mix]
        datasets = datasets or [DatasetSpec(k) for k in wanted]
        if sorted(d.key for d in datasets) != sorted(wanted):
            raise InvalidArgumentError(
                f"--mix {mix} balances {' and '.join(wanted)}; got --dataset {[d.key for d in datasets]}."
            )
    if not datasets:
        raise InvalidArgumentError("Give at least one --dataset (or --mix sem).")
    needs_file = [d for d in datasets if d.key != SYNTHETIC]
    if data_paths and len(data_paths) != len(needs_file):
        raise InvalidArgumentError(
            f"{len(data_paths)} --data-path given for {len(needs_file)} dataset(s) that read a file "
            f"({', '.join(d.key for d in needs_file)}): give one per dataset, in the same order."
        )
    paths = iter(data_paths)
    rng = random.Random(seed)
    pools = []
    for spec in datasets:
        questions = _questions(spec, next(paths, None) if spec.key != SYNTHETIC else None, world_seed)
        if shuffle:
            questions = rng.sample(questions, len(questions))
        pools.append((spec, questions))
    if mix is not None:
        size = min(len(q) for _, q in pools)
        counts = [d.count for d, _ in pools if d.count is not None]
        size = min([size, *counts])
        pools = [(spec, questions[:size]) for spec, questions in pools]
    rows = []
    for spec, questions in pools:
        for q, source in questions[: spec.count] if spec.count is not None else questions:
            label = {"id": q.id, "question": q.question, "golden_answers": list(q.golden_answers)}
            rows.append(
                {
                    "prompt": proto.render_prompt(q.question),
                    "label": json.dumps(label, ensure_ascii=False),
                    "datasource": source,
                }
            )
    if shuffle:
        rng.shuffle(rows)
    return rows


def write_rows(rows: list[dict[str, str]], out: Path) -> None:
    """Write ``rows`` as JSON Lines to ``out`` (through a temporary file, then renamed)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        with tmp.open("w", encoding="utf-8") as handle:
            for row in rows:
                handle.write(json.dumps(row, ensure_ascii=False) + "\n")
        os.replace(tmp, out)
    finally:
        if tmp.exists():
            tmp.unlink()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--dataset",
        action="append",
        default=[],
        metavar="NAME[:COUNT]",
        help="a question set (hotpotqa, musique, mmlu, ..., or synthetic), optionally capped; repeatable",
    )
    parser.add_argument(
        "--data-path",
        action="append",
        type=Path,
        default=[],
        help="question file for each non-synthetic --dataset, in order: FlashRAG JSONL or Search-R1's .parquet "
        "(default: $SEARCHGYM_DATA_DIR/questions/KEY.jsonl)",
    )
    parser.add_argument("--out", type=Path, required=True, help="the training JSONL to write")
    parser.add_argument(
        "--protocol", help="protocol of the rendered prompt (default: search_r1; sem with --mix sem)"
    )
    parser.add_argument("--mix", choices=sorted(MIXES), help="a named mix: sem = MuSiQue + MMLU, balanced")
    parser.add_argument(
        "--seed", type=int, default=0, help="seed of sampling and shuffling (default: %(default)s)"
    )
    parser.add_argument("--no-shuffle", action="store_true", help="keep file order and take the first COUNT")
    parser.add_argument(
        "--world-seed", type=int, default=0, help="SyntheticFacts world seed (default: %(default)s)"
    )


def run(args: argparse.Namespace) -> int:
    datasets = [parse_dataset(text) for text in args.dataset]
    protocol = args.protocol or ("sem" if args.mix == "sem" else "search_r1")
    rows = build_rows(
        datasets,
        list(args.data_path),
        protocol=protocol,
        mix=args.mix,
        seed=args.seed,
        shuffle=not args.no_shuffle,
        world_seed=args.world_seed,
    )
    write_rows(rows, args.out)
    counts: dict[str, int] = {}
    for row in rows:
        counts[row["datasource"]] = counts.get(row["datasource"], 0) + 1
    summary = ", ".join(f"{k}: {v}" for k, v in counts.items())
    print(f"wrote {len(rows)} rows ({summary}) in the {protocol} protocol to {args.out}", file=sys.stderr)
    return 0
