"""``searchgym eval``: run policies on an env and print the papers' metrics."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

NAME = "eval"
HELP = "run policies on an env and print the papers' metrics"


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON ({exc}): {text!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--env", default="searchgym/SyntheticFacts-v1", help="env id (default: %(default)s)")
    parser.add_argument(
        "--config",
        type=Path,
        help="evaluate on the env of a run file (its env section, as training builds it); "
        "--env, --reward, --reward-kwargs, --protocol, --data-path, --corpus-path, --topk and --max-turns are then not used",
    )
    parser.add_argument(
        "--policy",
        default="direct,naive_rag,oracle_synthetic",
        help="policy name(s), comma-separated: direct, naive_rag, oracle_synthetic, hf:PATH, vllm:PATH, openai:MODEL@URL; LLM specs take ?key=value&... options (default: %(default)s)",
    )
    parser.add_argument("--reward", default="f1", help="reward scheme (default: %(default)s)")
    parser.add_argument(
        "--reward-kwargs", type=_json_object, default={}, help="JSON object, e.g. '{\"lam\": 0.2}'"
    )
    parser.add_argument("--protocol", default="search_r1", help="tag protocol (default: %(default)s)")
    parser.add_argument(
        "--episodes", type=int, default=200, help="episodes per policy (default: %(default)s)"
    )
    parser.add_argument("--data-path", help="questions JSONL (real-benchmark envs)")
    parser.add_argument("--corpus-path", help="passage corpus JSONL (real-benchmark envs)")
    parser.add_argument("--topk", type=int, default=3, help="documents per search (default: %(default)s)")
    parser.add_argument("--max-turns", type=int, default=4, help="actions per episode (default: %(default)s)")
    parser.add_argument(
        "--seed", type=int, default=0, help="seed of the question order (default: %(default)s)"
    )
    parser.add_argument(
        "--batch-size", type=int, default=16, help="episodes run side by side (default: %(default)s)"
    )
    parser.add_argument("--out", type=Path, help="write the figures as JSON to this file")
    parser.add_argument(
        "--wandb",
        nargs="?",
        const="searchgym",
        metavar="PROJECT",
        help="also log the figures to Weights & Biases (project default: searchgym; honours WANDB_MODE)",
    )
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")


def _check_data_flags(env_id: str, args: argparse.Namespace) -> None:
    """A real-benchmark env needs its files from the flags or from $SEARCHGYM_DATA_DIR."""
    import os

    from searchgym.envs.benchmarks import DATA_DIR_VARIABLE
    from searchgym.error import DataFileError

    missing = [
        flag
        for flag, value in (("--data-path", args.data_path), ("--corpus-path", args.corpus_path))
        if not value
    ]
    given = [value for value in (args.data_path, args.corpus_path) if value]
    if any(not os.path.exists(value) for value in given):
        return  # the env names the file that is not there
    if missing and not os.environ.get(DATA_DIR_VARIABLE):
        raise DataFileError(
            f"{env_id} reads local files: give {' and '.join(missing)} (the questions JSONL with id, question, "
            "golden_answers; the passage corpus JSONL with id/title/text), e.g. --data-path "
            "../shared/data/questions/hotpotqa.jsonl --corpus-path ../shared/data/corpus.jsonl in the searchgym "
            f"repo, or set {DATA_DIR_VARIABLE} to a folder holding questions/<dataset>.jsonl and corpus.jsonl."
        )


def fast_bf16_flags(cpuinfo: str = "/proc/cpuinfo") -> list[str]:
    """This CPU's flags for fast bfloat16 matrix arithmetic (``amx_bf16``, ``avx512_bf16``); none where
    the file cannot be read (not Linux)."""
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as handle:
            flags = next((line.split(":", 1)[1].split() for line in handle if line.startswith("flags")), [])
    except OSError:
        return []
    return [flag for flag in ("amx_bf16", "avx512_bf16") if flag in flags]


def hf_defaults(name: str) -> tuple[dict[str, Any], str | None]:
    """Options for an ``hf:`` policy that fit this machine, and the line that says what was chosen.

    On a CPU with fast bfloat16 (:func:`fast_bf16_flags`), the weights load in bfloat16
    unless the spec sets ``dtype``: such a CPU runs a small model several times faster in
    bfloat16 than in float32 (docs/real_model.md). Other policies get nothing and no line.
    """
    from urllib.parse import parse_qs

    if not name.startswith("hf:"):
        return {}, None
    target, _, query = name[3:].partition("?")
    given = parse_qs(query)
    import importlib.util

    cuda = False
    if importlib.util.find_spec("torch") is not None:
        import torch

        cuda = torch.cuda.is_available()
    options: dict[str, Any] = {}
    flags = [] if cuda else fast_bf16_flags()
    if "dtype" in given:
        dtype = f"{given['dtype'][0]} (from the spec)"
    elif flags:
        options["dtype"] = "bfloat16"
        dtype = f"bfloat16 (this CPU has fast bfloat16: {', '.join(flags)})"
    else:
        dtype = "the folder's dtype" + ("" if cuda else " (this CPU has no fast bfloat16)")
    tokens = given.get("max_new_tokens", ["512 (the default)"])[0]
    line = (
        f"{name.split('?')[0]}: {dtype} on {'cuda' if cuda else 'cpu'}, up to {tokens} new tokens a turn; "
        f"set them with hf:{target}?dtype=float32&max_new_tokens=N"
    )
    return options, line


def _run_file_env(path: Path) -> tuple[str, dict[str, Any]]:
    """The env id and ``gym.make`` keyword arguments of a run file's env section; the reward's
    shared store is left out, so evaluation writes into no training store."""
    from searchgym.trainers import build
    from searchgym.trainers.run_spec import load_run

    env = load_run(path).env
    kwargs = env.kwargs()
    shared = build.shared_store(env.id, kwargs)
    if shared is not None and isinstance(kwargs.get("reward_kwargs"), dict):
        kwargs["reward_kwargs"] = {k: v for k, v in kwargs["reward_kwargs"].items() if k != shared[0]}
    kwargs.setdefault("protocol", env.protocol_name)
    kwargs.setdefault("reward", env.reward_name)
    return env.id, kwargs


def run(args: argparse.Namespace) -> int:
    import gymnasium as gym

    import searchgym  # noqa: F401  (registers the ids)
    from searchgym.envs import check_env_id
    from searchgym.policies import evaluate, format_table, make_policy
    from searchgym.trainers import build

    if args.wandb:
        from searchgym.commands.extras import require

        require("wandb")  # before the episodes, not after them
    if args.config is not None:
        env_id, env_kwargs = _run_file_env(args.config)
        args.protocol = env_kwargs["protocol"]
        args.reward, args.reward_kwargs = env_kwargs["reward"], env_kwargs.get("reward_kwargs")
        args.topk = env_kwargs.get("topk", args.topk)
    else:
        env_id = check_env_id(args.env)
        env_kwargs = {
            "protocol": args.protocol,
            "reward": args.reward,
            "reward_kwargs": args.reward_kwargs,
            "topk": args.topk,
            "max_turns": args.max_turns,
        }
        if not env_id.endswith("SyntheticFacts-v1"):
            _check_data_flags(env_id, args)
            env_kwargs.update(data_path=args.data_path, corpus_path=args.corpus_path)
        elif args.data_path or args.corpus_path:
            print(
                "note: SyntheticFacts generates its own data; --data-path/--corpus-path are ignored.",
                file=sys.stderr,
            )

    def make_env() -> gym.Env:
        return build.build_env(env_id, env_kwargs)

    probe = make_env()
    world = getattr(probe.unwrapped, "world", None)
    probe.close()
    names = [p.strip() for p in args.policy.split(",") if p.strip()]
    policies = []
    for name in names:  # all built before the first episode, so a bad spec fails early
        options, line = hf_defaults(name)
        policies.append(make_policy(name, protocol=args.protocol, world=world, **options))
        if line:  # once the policy is built: a missing extra stays one line
            print(line, file=sys.stderr)
    results = []
    for policy in policies:
        result = evaluate(
            make_env,
            policy,
            args.episodes,
            seed=args.seed,
            batch_size=args.batch_size,
            progress=not args.no_progress,
        )
        result.settings = {
            "env": env_id,
            "reward": args.reward,
            "reward_kwargs": args.reward_kwargs,
            "protocol": args.protocol,
            "seed": args.seed,
            "topk": args.topk,
        }
        results.append(result)
    reward = f"{args.reward} {json.dumps(args.reward_kwargs)}" if args.reward_kwargs else args.reward
    print(f"\n{env_id} · reward={reward} · protocol={args.protocol} · {args.episodes} episodes\n")
    print(format_table(results))
    if args.out:
        payload = results[0].to_dict() if len(results) == 1 else [r.to_dict() for r in results]
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
        print(f"\nwrote {args.out}")
    if args.wandb:
        from searchgym.trainers.wandb_logger import WandbLogger

        settings = dict(results[0].settings, policies=names, episodes=args.episodes)
        with WandbLogger(args.wandb, config=settings, job_type="eval") as logger:
            logger.log_eval(results)
            print(f"\nlogged to W&B project {args.wandb!r} (run {logger.run_id})")
    return 0
