"""How likely the warm-started agent is to search first, question by question.

The first action of a ``search_r1`` episode opens with ``<search>`` or ``<answer>``; this reads
the model's probability of each (teacher-forced, no sampling) on every held-out question and
reports ``p(search) = P(<search>) / (P(<search>) + P(<answer>))`` by known/unknown and
taught/untaught. A ``recall_first`` agent opens its first action with ``<think> recall
</think>``: its recall is decoded greedily first, and ``p(search)`` is read after it (the
share of ``unknown`` recalls is reported beside it). ``p_action = P(<search>) + P(<answer>)``
is the probability that an action opens at all: a warm start that ends its turn after the
recall instead leaves the episode malformed. RL can only prefer answering at once where
sampling sometimes tries it, so a warm start whose ``p(search)`` sits at 0 or 1 for every
question gives every scheme the same groups.

    python -m studies.real_lm.first_action --config studies/real_lm/study.yaml --output-dir DIR

``DIR`` is a study output folder with its warm start and ``baselines.json``; the figures go to
``DIR/first_action.json`` (the study itself writes them after its baselines, and into
``results.json``).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from searchgym.error import InvalidArgumentError

from .warm_start import UNKNOWN

__all__ = ["opening_probabilities", "search_probabilities", "greedy_recalls", "summarise", "main"]

OPENINGS = ("<search>", "<answer>")
RECALL_TOKENS = 16


def greedy_recalls(model: Any, tokenizer: Any, prompts: Sequence[str]) -> list[str]:
    """The text of the greedy ``<think>…</think>`` that opens the first action after each prompt."""
    import torch

    out = []
    for prompt in prompts:
        ids = tokenizer(prompt + "<think>", add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            new = model.generate(
                torch.tensor([ids]),
                max_new_tokens=RECALL_TOKENS,
                do_sample=False,
                pad_token_id=tokenizer.eos_token_id,
            )[0, len(ids) :]
        text = tokenizer.decode(new, skip_special_tokens=False)
        out.append(text.split("</think>")[0])
    return out


def opening_probabilities(model: Any, tokenizer: Any, prompts: Sequence[str]) -> list[tuple[float, float]]:
    """``(P(<search>), P(<answer>))``: the probability that the text after each prompt (the chat
    rendering, turn opened) begins with each opening tag."""
    import torch

    out = []
    for prompt in prompts:
        head = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        logps = []
        for opening in OPENINGS:
            ids = tokenizer(prompt + opening, add_special_tokens=False)["input_ids"]
            with torch.no_grad():
                logits = model(torch.tensor([ids])).logits[0].float().log_softmax(-1)
            logps.append(sum(float(logits[k - 1, ids[k]]) for k in range(len(head), len(ids))))
        out.append((math.exp(logps[0]), math.exp(logps[1])))
    return out


def search_probabilities(model: Any, tokenizer: Any, prompts: Sequence[str]) -> list[float]:
    """``p(search) = P(<search>) / (P(<search>) + P(<answer>))`` after each prompt."""
    return [s / (s + a) for s, a in opening_probabilities(model, tokenizer, prompts)]


def summarise(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Median and share above one half of ``p_search`` for all rows and each group."""

    def stats(values: list[float]) -> dict[str, Any]:
        if not values:
            return {"n": 0}
        return {
            "n": len(values),
            "median": round(statistics.median(values), 4),
            "min": round(min(values), 4),
            "max": round(max(values), 4),
            "mean": round(statistics.fmean(values), 4),
        }

    def group(members: list[dict[str, Any]]) -> dict[str, Any]:
        found = stats([r["p_search"] for r in members])
        if members and "p_action" in members[0]:
            found["p_action_median"] = round(statistics.median(r["p_action"] for r in members), 4)
        if members and "recall" in members[0]:
            found["recall_unknown_share"] = round(
                statistics.fmean(r["recall"] == UNKNOWN for r in members), 4
            )
        return found

    groups: dict[str, Any] = {"all": group(list(rows))}
    for key in ("known", "taught"):
        for value in (True, False):
            name = f"{'' if value else 'un'}{key}"
            groups[name] = group([r for r in rows if r[key] == value])
    return groups


def main(argv: Sequence[str] | None = None) -> int:
    from .data import prepare_data
    from .study import load_study, run_first_action, study_warm_start

    parser = argparse.ArgumentParser(prog="python -m studies.real_lm.first_action", description=__doc__)
    parser.add_argument("--config", required=True, help="the study file")
    parser.add_argument("--output-dir", required=True, help="the study's output folder")
    args = parser.parse_args(argv)
    study, out = load_study(args.config), Path(args.output_dir)
    baselines = out / "baselines.json"
    if not baselines.exists():
        parser.error(f"{out} has no baselines.json; run the study there first.")
    data = prepare_data(study["data"], out / "data")
    try:
        model_dir, _ = study_warm_start(study, out, data, reuse_only=True)
    except InvalidArgumentError as error:
        parser.error(str(error))
    known = {p["qid"]: p["known"] for p in json.loads(baselines.read_text(encoding="utf-8"))["probe"]}
    result = run_first_action(study, out, data, model_dir, known)
    for name, group in result["groups"].items():
        print(f"{name:>9}: " + ", ".join(f"{k} {v}" for k, v in group.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
