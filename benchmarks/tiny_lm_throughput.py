"""How fast the study's tiny model trains on this CPU, and how much faster it could.

Times a forward and backward pass of the tiny Llama model of a study file (built
offline, random weights: the arithmetic does not depend on them) on batches of the
shapes the study trains on, in float32, under bfloat16 autocast and, with
``--compile``, under ``torch.compile``. Prints the median time, tokens per second and
the achieved GFLOP/s, counted from the model's shapes (see :func:`flops_per_token`),
beside what one large float32 matrix multiply reaches on the same threads::

    python -m benchmarks.tiny_lm_throughput [--config studies/frugal/tiny_lm/study.yaml]
        [--threads 1] [--batch 32] [--lengths 40 100 200] [--repeats 10] [--compile] [--out tput.json]

It answers whether the study's time goes to overhead (Python, padding, small kernels)
that engineering could remove, or to the arithmetic itself.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks._common import write_report


def flops_per_token(config: Any, length: int) -> float:
    """Forward FLOPs per token of a Llama model: 2 per weight of every matrix multiply
    (the tied embedding counts once, as the output layer) plus the attention scores and
    their weighted sum over a sequence of ``length`` tokens (on average half of it is
    attended, causally). Backward costs about twice the forward."""
    d, f, layers = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    head = config.head_dim if getattr(config, "head_dim", None) else d // config.num_attention_heads
    q, kv = config.num_attention_heads * head, config.num_key_value_heads * head
    weights = layers * (d * q + 2 * d * kv + q * d + 3 * d * f) + d * config.vocab_size
    attention = layers * 2 * q * length / 2
    return 2.0 * (weights + attention)


def median_seconds(call: Callable[[], object], repeats: int, warmup: int = 3) -> float:
    """Median seconds of ``call()`` over ``repeats`` timed calls, after ``warmup`` untimed ones."""
    for _ in range(warmup):
        call()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def time_pass(model: Any, ids: Any, autocast: bool, repeats: int) -> float:
    """Median seconds of one forward and backward pass."""
    import torch

    def once() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            logits = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
        logits.float().sum().backward()

    return median_seconds(once, repeats)


def matmul_gflops(repeats: int, size: int = 2048) -> float:
    """GFLOP/s of one large float32 matrix multiply: what this CPU reaches at best."""
    import torch

    a, b = torch.randn(size, size), torch.randn(size, size)
    return 2 * size**3 / median_seconds(lambda: a @ b, repeats, warmup=1) / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--config", default="studies/frugal/tiny_lm/study.yaml", help="study file (default: %(default)s)"
    )
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default: %(default)s)")
    parser.add_argument("--batch", type=int, default=32, help="sequences per pass (default: %(default)s)")
    parser.add_argument("--lengths", type=int, nargs="+", default=[40, 100, 200], help="tokens per sequence")
    parser.add_argument("--repeats", type=int, default=10, help="timed passes per setting")
    parser.add_argument("--compile", action="store_true", help="also time torch.compile (10-80 s to compile)")
    parser.add_argument("--out", type=Path, help="write the figures as JSON")
    args = parser.parse_args()
    logging.disable(logging.INFO)

    import torch

    from searchgym.policies import load_tiny_lm
    from searchgym.trainers.grpo.model import model_source
    from studies.frugal.tiny_lm.study import arm_config, load_study

    torch.set_num_threads(args.threads)
    study = load_study(args.config)
    config = arm_config(
        study, next(iter(study["arms"])), study["seeds"][0]
    )  # every arm starts from one model
    folder = model_source(config.model)
    model, _ = load_tiny_lm(folder)
    params = sum(p.numel() for p in model.parameters())
    print(
        f"model: {folder.name}, {params / 1e6:.2f} M parameters, {args.threads} thread(s), batch {args.batch}"
    )

    modes: list[tuple[str, Any, bool]] = [("float32", model, False), ("bfloat16 autocast", model, True)]
    if args.compile:
        start = time.perf_counter()
        compiled = torch.compile(model, dynamic=True)
        time_pass(
            compiled, torch.randint(3, model.config.vocab_size, (args.batch, args.lengths[0])), False, 1
        )
        print(f"torch.compile: {time.perf_counter() - start:.0f} s to compile")
        modes.append(("float32, torch.compile", compiled, False))

    rows = []
    print("| mode | tokens/seq | fwd+bwd ms | tokens/s | GFLOP/s |\n|---|---:|---:|---:|---:|")
    for length in args.lengths:
        ids = torch.randint(3, model.config.vocab_size, (args.batch, length))
        flops = 3 * flops_per_token(model.config, length) * ids.numel()
        for name, module, autocast in modes:
            seconds = time_pass(module, ids, autocast, args.repeats)
            row = {
                "mode": name,
                "length": length,
                "ms": 1000 * seconds,
                "tokens_per_s": ids.numel() / seconds,
                "gflops": flops / seconds / 1e9,
            }
            rows.append(row)
            print(
                f"| {name} | {length} | {row['ms']:.1f} | {row['tokens_per_s']:.0f} | {row['gflops']:.1f} |"
            )
    ceiling = matmul_gflops(args.repeats)
    print(
        f"reference: a 2048 x 2048 float32 matrix multiply runs at {ceiling:.1f} GFLOP/s on this core count"
    )
    report = {"threads": args.threads, "batch": args.batch, "parameters": params, "rows": rows}
    write_report(args.out, {**report, "matmul_gflops": ceiling})


if __name__ == "__main__":
    main()
