"""``searchgym index``: build a retrieval index (dense FAISS or BM25) from a corpus file."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

NAME = "index"
HELP = "build a dense (FAISS) or BM25 index from a corpus JSONL; an interrupted dense build resumes"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--corpus", type=Path, required=True, help="corpus JSONL (id/title/text or id/contents)"
    )
    parser.add_argument(
        "--backend", choices=("dense", "bm25"), default="dense", help="(default: %(default)s)"
    )
    parser.add_argument(
        "--out", type=Path, required=True, help="index directory (created; resumed if unfinished)"
    )
    dense = parser.add_argument_group("dense")
    dense.add_argument(
        "--model", help="sentence-transformers model dir or hub name (default: all-MiniLM-L6-v2)"
    )
    dense.add_argument(
        "--index-type", choices=("flat", "hnsw", "ivfpq"), default="flat", help="(default: %(default)s)"
    )
    dense.add_argument(
        "--batch-size", type=int, default=64, help="texts per forward pass (default: %(default)s)"
    )
    dense.add_argument("--chunk-size", type=int, help="passages per resumable step (default: 4096)")
    dense.add_argument("--device", help="torch device, e.g. cpu or cuda (default: a GPU if there is one)")
    dense.add_argument("--e5", action="store_true", help="E5 prefixes: 'query: ' and 'passage: '")
    dense.add_argument("--nlist", type=int, help="ivfpq: inverted lists (default: about 4*sqrt(n))")
    dense.add_argument("--pq-m", type=int, help="ivfpq: sub-quantisers (default: dim/8)")
    dense.add_argument("--nbits", type=int, help="ivfpq: bits per code (default: 8)")
    dense.add_argument("--hnsw-m", type=int, help="hnsw: neighbours per node (default: 32)")
    bm25 = parser.add_argument_group("bm25")
    bm25.add_argument("--k1", type=float, default=1.5, help="(default: %(default)s)")
    bm25.add_argument("--b", type=float, default=0.75, help="(default: %(default)s)")
    parser.add_argument("--no-progress", action="store_true", help="hide progress bars")


def _dense(args: argparse.Namespace) -> int:
    from searchgym.commands.extras import require

    require("torch", "sentence_transformers", "faiss")  # before hours of encoding, not after
    from searchgym.retrieval.dense_build import build_dense_index

    options: dict[str, Any] = {
        key: getattr(args, key)
        for key in ("nlist", "pq_m", "nbits", "hnsw_m")
        if getattr(args, key) is not None
    }
    report = build_dense_index(
        args.corpus,
        args.out,
        model=args.model,
        index_type=args.index_type,
        e5=args.e5,
        batch_size=args.batch_size,
        chunk_size=args.chunk_size,
        device=args.device,
        progress=not args.no_progress,
        **options,
    )
    speed = f", {report.passages_per_second:.1f} passages/s" if report.encoded_now else ""
    print(
        f"dense index ({report.index_type}) of {report.num_docs} passages, dim {report.dim}, in {report.index_dir}: "
        f"encoded {report.encoded_now} now in {report.encode_seconds:.1f} s{speed}; "
        f"index built in {report.index_seconds:.1f} s"
    )
    return 0


def _bm25(args: argparse.Namespace) -> int:
    import time

    from searchgym.retrieval.bm25 import make_bm25_retriever

    ignored = [
        flag
        for flag, value in (
            ("--model", args.model),
            ("--e5", args.e5),
            ("--index-type", args.index_type != "flat"),
        )
        if value
    ]
    if ignored:
        print(f"note: {', '.join(ignored)} only apply to --backend dense.", file=sys.stderr)
    start = time.perf_counter()
    retriever = make_bm25_retriever(corpus_path=args.corpus, index_dir=args.out, k1=args.k1, b=args.b)
    print(f"bm25 index of {len(retriever)} passages in {args.out} ({time.perf_counter() - start:.1f} s)")
    return 0


def run(args: argparse.Namespace) -> int:
    return _dense(args) if args.backend == "dense" else _bm25(args)
