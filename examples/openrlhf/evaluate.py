"""Evaluate a model trained by the OpenRLHF recipe: the papers' metrics on a held-out question set.

The env is the training env of the run file (protocol, reward, top-k, turns, the retrieval
server), with the held-out questions; the policy is the saved Hugging Face model under vLLM's
offline engine (one GPU). Without memory: this measures what the weights learned.

    python examples/openrlhf/evaluate.py --model runs/lightsearcher/model --data data/musique_dev.jsonl \\
        --retriever http://127.0.0.1:8000 --episodes 1000 --out runs/lightsearcher/eval_musique_dev.json
    python examples/openrlhf/evaluate.py ... --policy hf   # transformers instead of vLLM (a CPU, no vLLM)
    python examples/openrlhf/evaluate.py ... --dry-run   # check the run file and print the plan (CI)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def build_parser() -> argparse.ArgumentParser:
    """The script's command line (the recipe tests parse the recipes' calls with it)."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--config", default="configs/openrlhf/lightsearcher.yaml", help="the run file trained"
    )
    parser.add_argument("--model", required=True, help="the saved model folder (openrlhf.ckpt.output_dir)")
    parser.add_argument(
        "--policy",
        default="vllm",
        help="vllm (vLLM's offline engine, one GPU; the default), hf (transformers, runs on a CPU), or a "
        "full policy spec such as hf:PATH?max_new_tokens=256 (then --model only labels the plan)",
    )
    parser.add_argument("--data", required=True, help="held-out questions (FlashRAG JSONL)")
    parser.add_argument("--retriever", default="http://127.0.0.1:8000", help="the retrieval server")
    parser.add_argument("--episodes", type=int, default=1000, help="questions to evaluate")
    parser.add_argument("--out", type=Path, help="write the figures as JSON")
    parser.add_argument(
        "--dry-run", action="store_true", help="check the run file, print the plan, run nothing"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the script; a searchgym error (no vLLM here, a bad flag) is one line and exit code 2."""
    args = build_parser().parse_args(argv)
    from searchgym.error import SearchGymError

    try:
        _evaluate(args)
    except SearchGymError as exc:
        print(f"evaluate.py: error: {exc}", file=sys.stderr)
        return 2
    return 0


def _evaluate(args: argparse.Namespace) -> None:

    from searchgym.trainers import build
    from searchgym.trainers.run_spec import load_run

    env = load_run(args.config).env  # the run file's env section, as training reads it
    env_kwargs = {**env.kwargs(), "data_path": args.data, "retriever": args.retriever}
    # Evaluation writes to no training store: the reward's shared store stays in memory.
    shared = build.shared_store(env.id, env_kwargs)
    if shared is not None and isinstance(env_kwargs.get("reward_kwargs"), dict):
        env_kwargs["reward_kwargs"] = {k: v for k, v in env_kwargs["reward_kwargs"].items() if k != shared[0]}
    spec = args.policy if ":" in args.policy else f"{args.policy}:{args.model}"
    plan = {
        "env_id": env.id,
        "env_kwargs": env_kwargs,
        "policy": spec,
        "episodes": args.episodes,
    }
    print(json.dumps(plan, indent=2, default=str))
    if args.dry_run:
        return

    from searchgym.policies import make_policy
    from searchgym.policies.evaluation import evaluate

    policy = make_policy(spec, protocol=env.protocol_name)
    result = evaluate(lambda: build.build_env(env.id, env_kwargs), policy, args.episodes, batch_size=64)
    figures = result.to_dict()
    print(json.dumps(figures, indent=2))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"plan": plan, "result": figures}, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    sys.exit(main())
