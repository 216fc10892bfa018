"""What ``model.autocast: bfloat16`` buys the built-in trainer on this CPU: SmolLM2-135M-Instruct's
sampling and its update pass, in float32 and under bfloat16 autocast (float32 weights).

    searchgym models pull smollm2-135m-instruct
    OMP_NUM_THREADS=1 python -m benchmarks.autocast_cpu --out benchmarks/results/autocast_cpu.json
    python -m benchmarks.render_docs    # the table in docs/train-cli.md

Two measurements per setting, alternated ``--repeats`` times (medians reported):

* sampling: ``generate`` of ``--new-tokens`` tokens (top-k off, temperature 1) from a batch
  of ``--batch`` prompts of ``--prompt-tokens`` tokens, as a rollout turn does;
* update: the token log-probabilities of the same batch with gradient, and their backward
  pass, as a GRPO micro-batch does.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from benchmarks._common import write_report


def cpu_flags() -> list[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return []
    wanted = ("amx_bf16", "avx512_bf16", "avx512f")
    return [flag for flag in wanted if f" {flag}" in text]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--prompt-tokens", type=int, default=300)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from transformers import AutoModelForCausalLM

    from searchgym.models import resolve_model
    from searchgym.trainers.grpo.loss import token_logprobs

    model = AutoModelForCausalLM.from_pretrained(resolve_model(args.model), dtype=torch.float32).eval()
    ids = torch.randint(
        100,
        model.config.vocab_size,
        (args.batch, args.prompt_tokens),
        generator=torch.Generator().manual_seed(0),
    )
    mask = torch.ones_like(ids)
    settings = ("float32", "bfloat16 autocast")

    def context(name: str):
        return (
            torch.autocast("cpu", enabled=False)
            if name == "float32"
            else torch.autocast("cpu", dtype=torch.bfloat16)
        )

    def sample() -> None:
        with torch.inference_mode():
            model.generate(
                ids,
                attention_mask=mask,
                max_new_tokens=args.new_tokens,
                min_new_tokens=args.new_tokens,
                do_sample=True,
                top_k=0,
                pad_token_id=0,
            )

    def update() -> None:
        model.zero_grad(set_to_none=True)
        token_logprobs(model, ids, mask).sum().backward()

    times: dict[str, dict[str, list[float]]] = {name: {"sampling": [], "update": []} for name in settings}
    for name in settings:  # warm-up
        with context(name):
            sample()
            update()
    for _ in range(args.repeats):
        for name in settings:
            for part, work in (("sampling", sample), ("update", update)):
                with context(name):
                    start = time.perf_counter()
                    work()
                    times[name][part].append(round(time.perf_counter() - start, 3))
            print(name, {part: values[-1] for part, values in times[name].items()}, flush=True)
    write_report(
        args.out,
        {
            "model": args.model,
            "batch": args.batch,
            "prompt_tokens": args.prompt_tokens,
            "new_tokens": args.new_tokens,
            "repeats": args.repeats,
            "torch_threads": torch.get_num_threads(),
            "cpu_flags": cpu_flags(),
            "seconds": times,
            "median_s": {
                n: {p: statistics.median(v) for p, v in parts.items()} for n, parts in times.items()
            },
        },
    )


if __name__ == "__main__":
    main()
