#!/usr/bin/env bash
# A Search-R1-style run with verl on Qwen2.5-3B-Instruct, one node with 8 GPUs, from nothing:
# retrieval server, data, training. The LightSearcher reward scores each episode; verl trains on it.
# Run it from the repository root.
#
#   bash examples/verl/one_node_8gpu.sh
#   DRY_RUN=1 bash examples/verl/one_node_8gpu.sh   # print the steps and check the run file with
#                                                    # verl's own config schema (no GPU needed)
#
# Needs: pip install 'verl[vllm]==0.9.1' -e '.[retrieval,serve,verl]' (docs/verl.md). The server keeps
# the index (~65 GB, Flat) in CPU memory. Disk: ~60 GB for the index and corpus, plus verl's checkpoints.
set -euo pipefail
DATA=${DATA:-data}
INDEX=${INDEX:-$DATA/wiki18}
CONFIG=${CONFIG:-configs/verl/search_r1_lightsearcher.yaml}
run() { if [[ -n "${DRY_RUN:-}" ]]; then echo "+ $*"; else "$@"; fi; }

# 1. The retrieval corpus and index in Search-R1's layout: wiki-18 and its E5 Flat FAISS index.
run mkdir -p "$INDEX"
run hf download PeterJinGo/wiki-18-corpus --repo-type dataset --local-dir "$INDEX"
run hf download PeterJinGo/wiki-18-e5-index --repo-type dataset --local-dir "$INDEX"
if [[ -z "${DRY_RUN:-}" ]]; then
    [[ -f "$INDEX/e5_Flat.index" ]] || cat "$INDEX"/part_* > "$INDEX/e5_Flat.index"
    [[ -f "$INDEX/wiki-18.jsonl" ]] || gzip -dk "$INDEX/wiki-18.jsonl.gz"
fi

# 2. The retrieval server: Search-R1's /retrieve API on port 8000 (the run file points there).
if [[ -z "${DRY_RUN:-}" ]]; then
    searchgym serve --index "$INDEX/e5_Flat.index" --corpus "$INDEX/wiki-18.jsonl" --model intfloat/e5-base-v2 \
        --query-prefix "query: " --port 8000 > "$DATA/serve.log" 2>&1 &
    SERVER=$!
    trap 'kill $SERVER' EXIT
    until curl -sf -X POST http://127.0.0.1:8000/retrieve -H 'Content-Type: application/json' \
        -d '{"queries": ["warm up"], "topk": 1}' > /dev/null; do sleep 10; done   # loading takes minutes
else
    echo "+ searchgym serve --index $INDEX/e5_Flat.index --corpus $INDEX/wiki-18.jsonl --model intfloat/e5-base-v2 --query-prefix 'query: ' --port 8000 &"
fi

# 3. Data: Search-R1's NQ + HotpotQA parquet, as searchgym rows (search_r1 protocol), then as verl's
#    parquet rows (agent_name searchgym; the test split marked as evaluation rows, which write no
#    store). The env's constructor reads a question file of its own: FlashRAG's NQ train split.
run hf download PeterJinGo/nq_hotpotqa_train --repo-type dataset --local-dir "$DATA/nq_hotpotqa_train"
run hf download RUC-NLPIR/FlashRAG_datasets --repo-type dataset --include "nq/*" --local-dir "$DATA/flashrag"
run searchgym prepare --dataset nq --data-path "$DATA/nq_hotpotqa_train/train.parquet" \
    --protocol search_r1 --out "$DATA/nq_hotpotqa_train.jsonl"
run searchgym prepare --dataset nq --data-path "$DATA/nq_hotpotqa_train/test.parquet" \
    --protocol search_r1 --out "$DATA/nq_hotpotqa_test.jsonl"
run python -m searchgym.trainers.verl.data "$DATA/nq_hotpotqa_train.jsonl" "$DATA/verl/nq_hotpotqa_train.parquet"
run python -m searchgym.trainers.verl.data "$DATA/nq_hotpotqa_test.jsonl" "$DATA/verl/nq_hotpotqa_test.parquet" --eval

# 4. Train. The launcher checks every verl key against verl's ppo_trainer.yaml and config classes,
#    then runs verl's main_ppo with the searchgym agent loop, its worker hook (stores follow the
#    checkpoints) and the run file in the Ray runtime env. Run the same command again to resume.
searchgym train --backend verl --config "$CONFIG" ${DRY_RUN:+--dry-run}
