"""What ``model.train_layers`` buys the built-in trainer's update on this CPU: the CPU time of
SmolLM2-135M-Instruct's update pass (token log-probabilities with gradient and their
backward pass, as a GRPO micro-batch does) when every parameter trains and when only the top
blocks do (:func:`searchgym.trainers.grpo.model.freeze_lower_layers`).

    searchgym models pull smollm2-135m-instruct
    OMP_NUM_THREADS=1 python -m benchmarks.train_layers_cpu --out benchmarks/results/train_layers_cpu.json

The settings alternate ``--repeats`` times; process CPU seconds are reported (medians), so
the ratio holds on a shared machine better than wall time does.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from benchmarks._common import write_report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=150)
    parser.add_argument(
        "--layers", type=int, nargs="+", default=[0, 10, 4], help="train_layers values (0: all)"
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from transformers import AutoModelForCausalLM

    from searchgym.models import resolve_model
    from searchgym.trainers.grpo.loss import token_logprobs
    from searchgym.trainers.grpo.model import freeze_lower_layers, transformer_blocks

    model = AutoModelForCausalLM.from_pretrained(resolve_model(args.model), dtype=torch.float32)
    ids = torch.randint(
        100, model.config.vocab_size, (args.batch, args.tokens), generator=torch.Generator().manual_seed(0)
    )
    mask = torch.ones_like(ids)
    cpu_s: dict[int, list[float]] = {k: [] for k in args.layers}
    for _ in range(args.repeats):
        for k in args.layers:
            model.requires_grad_(True)
            freeze_lower_layers(model, k)
            model.zero_grad(set_to_none=True)
            start = time.process_time()
            token_logprobs(model, ids, mask).sum().backward()
            cpu_s[k].append(round(time.process_time() - start, 3))
        print({k: v[-1] for k, v in cpu_s.items()}, flush=True)
    median = {str(k): statistics.median(v) for k, v in cpu_s.items()}
    write_report(
        args.out,
        {
            "model": args.model,
            "blocks": len(transformer_blocks(model)),
            "batch": args.batch,
            "tokens": args.tokens,
            "repeats": args.repeats,
            "torch_threads": args.threads,
            "update_cpu_s": {str(k): v for k, v in cpu_s.items()},
            "median_cpu_s": median,
            "speedup_vs_all": {k: round(median["0"] / v, 2) for k, v in median.items()}
            if "0" in median
            else {},
        },
    )


if __name__ == "__main__":
    main()
