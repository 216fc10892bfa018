#!/usr/bin/env bash
# Training rows for the OpenRLHF recipes, from the two formats in use:
#   - Search-R1's parquet files (nq_hotpotqa_train: NQ + HotpotQA, Search-R1's training mix);
#   - FlashRAG JSONL question files (MuSiQue, 2WikiMultihopQA: LightSearcher's mix).
# `searchgym prepare` writes one JSON row per question: the protocol's prompt and the label
# {"id", "question", "golden_answers"} that the searchgym agent reads (--data.label_key label).
#
#   bash examples/openrlhf/prepare_data.sh            # DATA=data by default
#   DRY_RUN=1 bash examples/openrlhf/prepare_data.sh  # print the commands instead (CI runs this)
set -euo pipefail
DATA=${DATA:-data}
run() { if [[ -n "${DRY_RUN:-}" ]]; then echo "+ $*"; else "$@"; fi; }

run mkdir -p "$DATA"

# 1. Search-R1's parquet, as published on the Hugging Face hub (needs the network once).
#    Its rows keep FlashRAG's id/question/golden_answers next to Search-R1's own columns;
#    `prepare` reads either, and each row keeps its data_source (nq or hotpotqa).
run hf download PeterJinGo/nq_hotpotqa_train --repo-type dataset --local-dir "$DATA/nq_hotpotqa_train"
run searchgym prepare --dataset nq --data-path "$DATA/nq_hotpotqa_train/train.parquet" \
    --protocol search_r1 --out "$DATA/nq_hotpotqa_train.jsonl"

# 2. FlashRAG JSONL (RUC-NLPIR/FlashRAG_datasets: musique/train.jsonl, 2wikimultihopqa/train.jsonl).
#    LightSearcher's training set: 3,000 MuSiQue + 4,000 2Wiki questions, tool-call protocol.
run hf download RUC-NLPIR/FlashRAG_datasets --repo-type dataset \
    --include "musique/*" --include "2wikimultihopqa/*" --local-dir "$DATA/flashrag"
run searchgym prepare --dataset musique:3000 --dataset 2wikimultihopqa:4000 --protocol tool_call \
    --data-path "$DATA/flashrag/musique/train.jsonl" --data-path "$DATA/flashrag/2wikimultihopqa/train.jsonl" \
    --out "$DATA/lightsearcher_train.jsonl"
# The configs' env reads its own question file too (only its constructor does; the questions
# come from each row's label): the MuSiQue train file.
run cp "$DATA/flashrag/musique/train.jsonl" "$DATA/musique_train.jsonl"
# A held-out set for evaluate.py: MuSiQue's dev split.
run cp "$DATA/flashrag/musique/dev.jsonl" "$DATA/musique_dev.jsonl"
