#!/usr/bin/env bash
# LightSearcher on 2 nodes x 8 GPUs: a Ray cluster, then `ray job submit` with the runtime env.
# Run the head part on the head node and the worker part on every other node; then submit from
# the head node, in the repository root.
#
#   ROLE=head bash examples/openrlhf/multi_node.sh              # on the head node
#   ROLE=worker HEAD=10.0.0.1 bash examples/openrlhf/multi_node.sh   # on each other node
#   ROLE=submit bash examples/openrlhf/multi_node.sh            # on the head node, once all joined
#   DRY_RUN=1 ROLE=submit bash examples/openrlhf/multi_node.sh  # print it and check the run file (CI)
#
# What must hold across nodes:
#   - the same Python environment (searchgym, openrlhf 0.11.2, vllm) on every node;
#   - the retrieval server on an address the other nodes reach (not 127.0.0.1);
#   - the checkpoint folder on a file system every node shares (NFS, Lustre); the run's stores
#     (memory, min_tool_calls.sqlite) live in a Ray actor on the head node (docs/openrlhf.md).
set -euo pipefail
ROLE=${ROLE:-submit}
HEAD=${HEAD:-$(hostname -I 2>/dev/null | awk '{print $1}')}
HEAD=${HEAD:-127.0.0.1}
SHARED=${SHARED:-$PWD}            # a folder every node shares: data and runs live here
REPO=$(cd "$(dirname "$0")/../.." && pwd)   # this checkout (on the shared folder too, or the same path on every node)
run() { if [[ -n "${DRY_RUN:-}" ]]; then echo "+ $*"; else "$@"; fi; }
if [[ -z "${DRY_RUN:-}" ]] && ! command -v ray >/dev/null 2>&1; then
    echo "multi_node.sh: the 'ray' command is missing: pip install 'openrlhf[vllm]==0.11.2' 'ray[default]' on every node (DRY_RUN=1 prints the commands without it)" >&2
    exit 2
fi

case "$ROLE" in
head)
    run ray start --head --port 6379 --dashboard-host 0.0.0.0 --num-gpus 8
    # Retrieval for every node: bind all interfaces (the default is loopback only).
    run searchgym serve --index "$SHARED/data/wiki18/e5_Flat.index" --corpus "$SHARED/data/wiki18/wiki-18.jsonl" \
        --model intfloat/e5-base-v2 --query-prefix "query: " --host 0.0.0.0 --port 8000
    ;;
worker)
    run ray start --address "$HEAD:6379" --num-gpus 8
    ;;
submit)
    # A run file for this cluster: LightSearcher's, with 16 GPUs, the server on the head node,
    # and `ray job submit` to the head's dashboard (openrlhf.launch.ray_address). The batch arithmetic
    # still holds: 2304 samples = 4 x 16 ranks x 36 accumulation steps; 16 vLLM engines.
    mkdir -p "$SHARED/runs"
    cat > "$SHARED/runs/lightsearcher_2nodes.yaml" <<YAML
backend: openrlhf
extends: $REPO/configs/openrlhf/lightsearcher.yaml
env:
  retriever: "http://$HEAD:8000"
  reward_kwargs: {store: runs/lightsearcher-2nodes/min_tool_calls.sqlite}
memory: {path: runs/lightsearcher-2nodes/memory}
openrlhf:
  launch: {ray_address: "http://$HEAD:8265"}
  actor: {num_nodes: 2, num_gpus_per_node: 8}
  ref: {num_nodes: 2, num_gpus_per_node: 8}
  vllm: {num_engines: 16}
  ckpt: {path: runs/lightsearcher-2nodes/ckpt, output_dir: runs/lightsearcher-2nodes/model}
YAML
    # Prints and runs: ray job submit --address http://HEAD:8265 --runtime-env-json '{"env_vars":
    # {...SEARCHGYM_AGENT_CONFIG...}, "worker_process_setup_hook": "..."}' -- python3 -m
    # openrlhf.cli.train_ppo_ray FLAGS. The runtime env carries the worker hook (memory steps,
    # store snapshots, TSAS) to every worker process of the job.
    searchgym train --backend openrlhf --config "$SHARED/runs/lightsearcher_2nodes.yaml" ${DRY_RUN:+--dry-run}
    ;;
*)
    echo "ROLE must be head, worker or submit, got $ROLE" >&2
    exit 2
    ;;
esac
