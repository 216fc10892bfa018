#!/usr/bin/env bash
# LightSearcher on Qwen2.5-3B-Instruct with OpenRLHF, one node with 8 GPUs, from nothing:
# retrieval server, data, training, evaluation. Run it from the repository root.
#
#   bash examples/openrlhf/one_node_8gpu.sh
#   DRY_RUN=1 bash examples/openrlhf/one_node_8gpu.sh   # print the steps; check the run file against
#                                                       # the training rows prepare_data.sh wrote (CI runs this)
#
# Needs: pip install 'openrlhf[vllm]==0.11.2' -e '.[retrieval,serve,openrlhf,wandb]'. The server keeps
# the index (~65 GB, Flat) in CPU memory; with faiss-gpu, `serve --index-device N` puts it on GPU N. Disk: ~60 GB for the index and corpus, ~40 GB per
# checkpoint (DeepSpeed ZeRO-3 states of a 3B model; the last 3 are kept).
set -euo pipefail
DATA=${DATA:-data}
INDEX=${INDEX:-$DATA/wiki18}
CONFIG=${CONFIG:-configs/openrlhf/lightsearcher.yaml}
run() { if [[ -n "${DRY_RUN:-}" ]]; then echo "+ $*"; else "$@"; fi; }

# 1. The retrieval corpus and index in Search-R1's layout: wiki-18 (21M passages) and its E5
#    Flat FAISS index (e5-base-v2, inner product), as Search-R1 publishes them.
run mkdir -p "$INDEX"
run hf download PeterJinGo/wiki-18-corpus --repo-type dataset --local-dir "$INDEX"
run hf download PeterJinGo/wiki-18-e5-index --repo-type dataset --local-dir "$INDEX"
if [[ -z "${DRY_RUN:-}" ]]; then
    [[ -f "$INDEX/e5_Flat.index" ]] || cat "$INDEX"/part_* > "$INDEX/e5_Flat.index"
    [[ -f "$INDEX/wiki-18.jsonl" ]] || gzip -dk "$INDEX/wiki-18.jsonl.gz"
fi

# 2. The retrieval server: Search-R1's /retrieve API on port 8000, the E5 encoder on a GPU of its
#    own share (colocated with training, it takes ~1 GB). The configs point at http://127.0.0.1:8000.
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

# 3. Training rows (FlashRAG JSONL here; prepare_data.sh also shows Search-R1's parquet).
DATA="$DATA" DRY_RUN="${DRY_RUN:-}" bash "$(dirname "$0")/prepare_data.sh"

# 4. Train. The launcher checks the flags with OpenRLHF's own parser and DeepSpeed's batch
#    arithmetic, refuses a store an earlier run wrote, and starts Ray with the worker hook that
#    runs the memory and TSAS in the trainer. A checkpoint every 20 steps (with a snapshot of
#    the memory and minimum tool-call stores); after a crash, run the same command again to
#    resume. Set WANDB_API_KEY and openrlhf.logger.wandb.key (see docs/openrlhf.md for what
#    the first hour shows).
searchgym train --backend openrlhf --config "$CONFIG" ${DRY_RUN:+--dry-run}   # --dry-run: check, print

# 5. Evaluate the saved Hugging Face model on MuSiQue's dev split through the same server.
python examples/openrlhf/evaluate.py --model runs/lightsearcher/model --data "$DATA/musique_dev.jsonl" \
    --retriever http://127.0.0.1:8000 --episodes 1000 --out runs/lightsearcher/eval_musique_dev.json ${DRY_RUN:+--dry-run}
