"""``searchgym data download``: FlashRAG's question files and Search-R1's corpus and index, from the hub."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

NAME = "data"
HELP = "download benchmark question files (FlashRAG) and Search-R1's wiki-18 corpus and E5 index"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", required=True)
    download = actions.add_parser(
        "download",
        help="fetch a source from the Hugging Face hub (HF_ENDPOINT and HF_TOKEN apply)",
        description="flashrag: RUC-NLPIR/FlashRAG_datasets -> OUT/questions/<dataset>.jsonl (the layout "
        "$SEARCHGYM_DATA_DIR names); wiki18-corpus: PeterJinGo/wiki-18-corpus -> OUT/wiki18/wiki-18.jsonl "
        "(about 14 GB); wiki18-index: PeterJinGo/wiki-18-e5-index -> OUT/wiki18/e5_Flat.index (about 65 GB).",
    )
    download.add_argument("source", help="flashrag, wiki18-corpus or wiki18-index")
    download.add_argument(
        "--dataset",
        action="append",
        help="flashrag: a dataset folder (nq, triviaqa, popqa, hotpotqa, 2wikimultihopqa, musique, bamboogle, "
        "...); repeat for more (default: nq and hotpotqa)",
    )
    download.add_argument(
        "--split",
        help="flashrag: train, dev or test (default: test for nq/triviaqa/popqa/bamboogle, dev for "
        "hotpotqa/2wikimultihopqa/musique)",
    )
    download.add_argument(
        "--out",
        type=Path,
        help="the data folder (default: $SEARCHGYM_DATA_DIR, else ./data)",
    )
    download.add_argument("--revision", help="a commit or branch of the hub repository (default: main)")
    download.add_argument(
        "--keep-archive",
        action="store_true",
        help="keep the downloaded .gz and index parts beside the result",
    )


def run(args: argparse.Namespace) -> int:
    from searchgym.envs import download
    from searchgym.envs.benchmarks import DATA_DIR_VARIABLE

    source = download.check_source(args.source)
    out = args.out or Path(os.environ.get(DATA_DIR_VARIABLE) or "data")

    def log(line: str) -> None:
        print(line, file=sys.stderr)

    if source == "flashrag":
        files = download.download_flashrag(
            args.dataset or ["nq", "hotpotqa"], out, split=args.split, revision=args.revision, log=log
        )
        print(
            f"wrote {len(files)} question file(s) under {out / 'questions'}; use them with "
            f"{DATA_DIR_VARIABLE}={out} (the benchmark envs' corpus.jsonl goes beside questions/)"
        )
    elif source == "wiki18-corpus":
        print(
            download.download_wiki18_corpus(
                out, revision=args.revision, keep_archive=args.keep_archive, log=log
            )
        )
    else:
        print(
            download.download_wiki18_index(out, revision=args.revision, keep_parts=args.keep_archive, log=log)
        )
    return 0
