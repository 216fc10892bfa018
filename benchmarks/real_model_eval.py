"""SmolLM2-135M-Instruct on NQ, HotpotQA and PopQA: without retrieval, naive RAG, and the
multi-turn protocols with BM25 search over the shared corpus.

    searchgym models pull smollm2-135m-instruct
    OMP_NUM_THREADS=1 python -m benchmarks.real_model_eval --questions 12 --max-new-tokens 96
    python -m benchmarks.real_model_table   # writes the table into docs/real_model.md

Modes (greedy decoding, chat template, generation in batches of ``--batch-size`` contexts
sorted by length; the multi-turn modes run every episode side by side):

* ``no_retrieval`` and ``naive_rag``: one turn with FlashRAG's standard instructions (its
  ``direct`` and ``naive`` generation prompts), the question as the user turn and, for
  naive RAG, the top 3 BM25 passages for the question in the system turn; the reply is the
  answer. Well formed: the reply ends with the end-of-turn token within the budget.
* ``search_r1`` and ``tool_call``: :func:`searchgym.policies.evaluate` on the benchmark env
  with that protocol's own instructions, BM25 top 3 per search, at most 4 actions; well
  formed is the env's ``format_ok``.

Every mode sees the same questions per dataset (the first ``--questions`` of
``evaluate``'s seeded order). Tokens per episode are the tokens the model generated. Each
row also records its CPU time and its forward passes (prompt tokens with and without
padding, decoding steps and rows), which is where the time goes. The
JSON is rewritten after each (dataset, mode) cell, so a stopped run keeps what it finished.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks._common import REPO, SHARED_DATA

DATASETS = {"nq": "searchgym/NQ-v1", "hotpotqa": "searchgym/HotpotQA-v1", "popqa": "searchgym/PopQA-v1"}
MODES = ("no_retrieval", "naive_rag", "search_r1", "tool_call")
# FlashRAG's default generation prompts (flashrag/prompt/base_prompt.py), unchanged.
DIRECT_SYSTEM = "Answer the question based on your own knowledge. Only give me the answer and do not output any other words."
RAG_SYSTEM = (
    "Answer the question based on the given document. Only give me the answer and do not output any "
    "other words.\n\nThe following are given documents.\n\n{reference}"
)


class CountingPolicy:
    """Wraps an :class:`HFPolicy` to count the tokens it generates."""

    def __init__(self, policy: Any):
        self.policy, self.name, self.generated = policy, policy.name, 0

    def act(self, contexts: list[str]) -> list[str]:
        splits = [self.policy.tracker.split(c) for c in contexts]
        completions = self.policy.complete([self.policy.formatter.render(s) for s in splits])
        self.generated += sum(len(c.completion_ids) for c in completions)
        for context, segments, c in zip(contexts, splits, completions, strict=True):
            self.policy.tracker.record(context, c.text, segments)
        return [c.text for c in completions]


class ForwardTally:
    """Counts the model's forward passes: prompt tokens (real and padded) and decoding steps."""

    def __init__(self, model: Any):
        self.reset()
        model.register_forward_pre_hook(self._count, with_kwargs=True)

    def reset(self) -> None:
        self.prompt_tokens = self.padded_tokens = self.decode_steps = self.decode_rows = 0

    def _count(self, module: Any, args: Any, kwargs: dict[str, Any]) -> None:
        ids, mask = kwargs.get("input_ids"), kwargs.get("attention_mask")
        if ids is None:
            return
        if ids.shape[1] > 1:  # a prompt (prefill) pass
            self.padded_tokens += ids.numel()
            self.prompt_tokens += int(mask[:, -ids.shape[1] :].sum()) if mask is not None else ids.numel()
        else:
            self.decode_steps += 1
            self.decode_rows += ids.shape[0]

    def figures(self) -> dict[str, int]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "prompt_tokens_padded": self.padded_tokens,
            "decode_steps": self.decode_steps,
            "decode_rows": self.decode_rows,
        }


def question_indices(count: int, total: int, seed: int) -> list[int]:
    """The questions ``evaluate`` runs first for ``seed`` (its seeded permutation)."""
    return [int(i) for i in np.random.default_rng(seed).permutation(total)[:count]]


def single_turn(policy: Any, questions: list[Any], retriever: Any | None, topk: int) -> dict[str, Any]:
    from searchgym import cover_exact_match, exact_match, f1_score

    texts = []
    docs = retriever.search([q.question for q in questions], topk) if retriever is not None else None
    for i, q in enumerate(questions):
        if docs is None:
            system = DIRECT_SYSTEM
        else:
            reference = "\n".join(f"Doc {j + 1}(Title: {d.title}) {d.text}" for j, d in enumerate(docs[i]))
            system = RAG_SYSTEM.format(reference=reference)
        policy.formatter.system = system
        texts.append(policy.formatter.render([f"Question: {q.question}"]))
    start = time.perf_counter()
    completions = policy.complete(texts)
    wall = time.perf_counter() - start
    answers = [c.text.strip() for c in completions]
    golds = [q.golden_answers for q in questions]
    searches = 0.0 if retriever is None else 1.0
    return {
        "em": float(np.mean([exact_match(a, g) for a, g in zip(answers, golds, strict=True)])),
        "f1": float(np.mean([f1_score(a, g) for a, g in zip(answers, golds, strict=True)])),
        "cover_em": float(np.mean([cover_exact_match(a, g) for a, g in zip(answers, golds, strict=True)])),
        "st": searches,
        "sr": searches,
        "format_ok": float(np.mean([c.finish == "eos" for c in completions])),
        "tokens": float(np.mean([len(c.completion_ids) for c in completions])),
        "wall_time_s": wall,
        "examples": [
            {"question": q.question, "answer": a} for q, a in zip(questions[:3], answers[:3], strict=True)
        ],
    }


EPISODE_KEYS = (
    "question_id",
    "queries",
    "retrieved_ids",
    "answer",
    "em",
    "f1",
    "cover_em",
    "num_searches",
    "format_ok",
)
"""The env's ``info`` keys kept per episode by :func:`multi_turn` with ``episodes``."""


def episode_log(env: Any, log: list[dict[str, Any]]) -> Any:
    """``env`` wrapped so that each finished episode appends its :data:`EPISODE_KEYS` to ``log``."""
    import gymnasium as gym

    class EpisodeLog(gym.Wrapper):
        def step(self, action: Any) -> Any:
            observation, reward, terminated, truncated, info = self.env.step(action)
            if terminated or truncated:
                log.append({key: info.get(key) for key in EPISODE_KEYS} | {"reward": float(reward)})
            return observation, reward, terminated, truncated, info

    return EpisodeLog(env)


def multi_turn(
    policy: Any,
    env_id: str,
    env_kwargs: dict[str, Any],
    count: int,
    seed: int,
    episodes: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The figures of ``count`` greedy episodes; with ``episodes``, each episode's record is appended to it."""
    import gymnasium as gym

    from searchgym.policies import evaluate

    counting = CountingPolicy(policy)

    def make_env() -> Any:
        env = gym.make(env_id, **env_kwargs)
        return env if episodes is None else episode_log(env, episodes)

    # every episode side by side: each turn hands all running contexts to the policy, which
    # generates from them in length-sorted batches of --batch-size
    result = evaluate(make_env, counting, count, seed=seed, batch_size=count, progress=False)  # type: ignore[arg-type]
    return {
        "em": result.em,
        "f1": result.f1,
        "cover_em": result.cover_em,
        "st": result.st,
        "sr": result.sr,
        "format_ok": result.format_ok,
        "tokens": counting.generated / count,
        "wall_time_s": result.wall_time_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="smollm2-135m-instruct", help="model name or folder")
    parser.add_argument("--datasets", default=",".join(DATASETS))
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--questions", type=int, default=200, help="questions per dataset")
    parser.add_argument("--batch-size", type=int, default=16, help="contexts per generate call")
    parser.add_argument("--max-new-tokens", type=int, default=128, help="tokens per turn at most")
    parser.add_argument("--max-turns", type=int, default=4, help="actions per multi-turn episode")
    parser.add_argument("--topk", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--dtype",
        default="float32",
        choices=("float32", "bfloat16"),
        help="weights' dtype (bfloat16 is several times faster on CPUs with AMX or AVX-512 BF16)",
    )
    parser.add_argument(
        "--threads", type=int, default=1, help="torch CPU threads (1 is fastest on a shared machine)"
    )
    parser.add_argument("--data-dir", type=Path, default=SHARED_DATA)
    parser.add_argument("--index-dir", type=Path, default=REPO / "benchmarks" / ".cache" / "bm25_shared")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "real_model_eval.json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    import gymnasium as gym

    import searchgym  # noqa: F401  (registers the ids)
    from searchgym.models import resolve_model
    from searchgym.policies import HFPolicy

    corpus = args.data_dir / "corpus.jsonl"
    report: dict[str, Any] = {
        "command": f"OMP_NUM_THREADS={args.threads} python -m benchmarks.real_model_eval "
        + " ".join(sys.argv[1:]),
        "model": args.model,
        "settings": {
            k: (str(v) if isinstance(v, Path) else v)
            for k, v in vars(args).items()
            if k not in ("out", "data_dir", "index_dir")
        },
        "torch_threads": torch.get_num_threads(),
        "results": [],
    }
    base = HFPolicy(
        resolve_model(args.model), device="cpu", dtype=args.dtype, name=args.model
    )  # loaded once, shared by the modes
    tally = ForwardTally(base.model)
    start = time.perf_counter()
    for dataset in args.datasets.split(","):
        env_kwargs: dict[str, Any] = {
            "data_path": str(args.data_dir / "questions" / f"{dataset}.jsonl"),
            "corpus_path": str(corpus),
            "index_dir": str(args.index_dir),
            "topk": args.topk,
            "max_turns": args.max_turns,
            "reward": "f1",
        }
        probe = gym.make(DATASETS[dataset], **env_kwargs)
        all_questions = probe.unwrapped.questions
        retriever = probe.unwrapped.retriever
        questions = [
            all_questions[i] for i in question_indices(args.questions, len(all_questions), args.seed)
        ]
        for mode in args.modes.split(","):
            protocol = mode if mode in ("search_r1", "tool_call") else "search_r1"
            policy = HFPolicy(
                base.model,
                tokenizer=base.tokenizer,
                protocol=protocol,
                max_new_tokens=args.max_new_tokens,
                batch_size=args.batch_size,
                name=args.model,
                **({"stop_strings": []} if protocol != mode else {}),
            )
            tally.reset()
            cpu = time.process_time()
            if mode in ("no_retrieval", "naive_rag"):
                row = single_turn(policy, questions, retriever if mode == "naive_rag" else None, args.topk)
            else:
                row = multi_turn(
                    policy,
                    DATASETS[dataset],
                    dict(env_kwargs, protocol=mode),
                    args.questions,
                    args.seed,
                )
            row["cpu_time_s"] = round(time.process_time() - cpu, 1)
            row["forward"] = tally.figures()
            row = {"dataset": dataset, "mode": mode, "questions": len(questions), **row}
            report["results"].append(row)
            report["wall_time_s"] = round(time.perf_counter() - start, 1)
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
            print(
                f"{dataset:9s} {mode:13s} EM {100 * row['em']:5.1f} F1 {100 * row['f1']:5.1f} "
                f"CoverEM {100 * row['cover_em']:5.1f} ST {row['st']:.2f} well-formed {100 * row['format_ok']:5.1f} "
                f"tokens {row['tokens']:6.1f} ({row['wall_time_s']:.0f} s)",
                flush=True,
            )
        probe.close()
    print(f"wrote {args.out} ({report['wall_time_s']} s)")


if __name__ == "__main__":
    main()
