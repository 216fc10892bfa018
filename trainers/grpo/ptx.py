"""Replay of supervised examples during GRPO (PPO-ptx), against forgetting.

InstructGPT's PPO-ptx, and OpenRLHF's ``--pretrain_data`` / ``--ptx_coef``, add to every
policy update a language-model loss on examples from before RL, so that the policy keeps
what it knew while the reward moves its behaviour::

    L = L_GRPO + γ · NLL(completion | prompt)

averaged over the completion tokens of ``ptx_batch_size`` examples drawn for each optimizer
step. The examples are a JSON-lines file, one ``{"prompt": ..., "completion": ...}``
object per line; only the completion (and an end token) is trained. ``"eos": false`` on a
line trains its completion without the end token, for the first part of an action (a
thought the model goes on from).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ...error import DataFileError
from ...storage.atomic import write_atomically
from .loss import pad_batch

__all__ = ["PtxExample", "load_ptx_examples", "write_ptx_examples", "ptx_nll", "ptx_backward", "sample_ptx"]


@dataclass(frozen=True)
class PtxExample:
    """One replayed sequence: token ids, and how many leading ones are the (untrained) prompt."""

    token_ids: tuple[int, ...]
    prompt_len: int


def write_ptx_examples(
    path: str | os.PathLike[str], pairs: Iterable[tuple[str, str]], *, eos: bool = True
) -> int:
    """Write ``(prompt, completion)`` pairs as a ptx JSON-lines file (atomically); returns the
    count. ``eos=False`` marks every line to be trained without the end token."""
    extra = {} if eos else {"eos": False}
    lines = [json.dumps({"prompt": p, "completion": c, **extra}) for p, c in pairs]
    write_atomically(path, ("\n".join(lines) + "\n").encode("utf-8"))
    return len(lines)


def load_ptx_examples(path: str | os.PathLike[str], tokenizer: Any) -> list[PtxExample]:
    """Read and tokenise a ptx file (see the module docstring).

    Raises:
        DataFileError: the file is missing, unreadable, empty, or a line is not an object
            with string ``prompt`` and non-empty string ``completion`` (the line is named).
    """
    try:
        with open(path, encoding="utf-8") as handle:
            lines = handle.read().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise DataFileError(f"cannot read the ptx data {os.fspath(path)!r}: {exc}") from None
    examples = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            record = None
        ok = isinstance(record, dict) and isinstance(record.get("prompt"), str)
        ok = ok and isinstance(record.get("eos", True), bool)
        if not ok or not isinstance(record.get("completion"), str) or not record["completion"]:
            raise DataFileError(
                f"{os.fspath(path)}, line {number}: expected a JSON object with a string 'prompt', a "
                f"non-empty string 'completion' and optionally a boolean 'eos', got {line[:120]!r}."
            )
        head = tokenizer(record["prompt"], add_special_tokens=False)["input_ids"]
        tail = tokenizer(record["completion"], add_special_tokens=False)["input_ids"]
        end = [tokenizer.eos_token_id] if record.get("eos", True) else []
        examples.append(PtxExample(tuple(head + tail + end), len(head)))
    if not examples:
        raise DataFileError(f"the ptx data {os.fspath(path)!r} holds no examples.")
    return examples


def sample_ptx(examples: Sequence[PtxExample], size: int, rng: np.random.Generator) -> list[PtxExample]:
    """``size`` examples drawn uniformly with replacement."""
    return [examples[int(i)] for i in rng.integers(0, len(examples), size)]


def ptx_nll(model: Any, batch: Sequence[PtxExample], pad_id: int, device: torch.device | str) -> torch.Tensor:
    """Mean negative log-likelihood of the completion tokens of ``batch`` (with gradient).

    The output layer runs on the completion positions only: a prompt of hundreds of tokens
    costs no (positions × vocabulary) logits, which dominate time and memory otherwise.
    """
    ids, attention = pad_batch([e.token_ids for e in batch], pad_id, device)
    hidden = model.base_model(input_ids=ids, attention_mask=attention, use_cache=False).last_hidden_state
    # Position t - 1 predicts token t: train the tokens from prompt_len to the end.
    rows = [b for b, e in enumerate(batch) for _ in range(max(e.prompt_len, 1), len(e.token_ids))]
    cols = [t for e in batch for t in range(max(e.prompt_len, 1), len(e.token_ids))]
    if not rows:
        return hidden.sum() * 0.0
    at = torch.tensor(rows, device=hidden.device), torch.tensor(cols, device=hidden.device)
    logits = model.get_output_embeddings()(hidden[at[0], at[1] - 1]).float()
    picked = logits.gather(-1, ids[at[0], at[1]][:, None]).squeeze(-1)
    return -(picked - torch.logsumexp(logits, dim=-1)).mean()


def ptx_backward(
    model: Any,
    batch: Sequence[PtxExample],
    pad_id: int,
    device: torch.device | str,
    micro_batch_size: int = 0,
) -> float:
    """Back-propagate :func:`ptx_nll` of ``batch`` in micro-batches of ``micro_batch_size``
    examples (0: one pass), each weighted by its share of the completion tokens, so the
    gradient is the whole batch's; returns the batch's mean NLL. Peak memory follows the
    micro-batch: long examples under eager attention need it on a small machine."""
    size = micro_batch_size or len(batch)
    tokens = [len(e.token_ids) - max(e.prompt_len, 1) for e in batch]
    total = max(1, sum(tokens))
    loss = 0.0
    for first in range(0, len(batch), size):
        share = sum(tokens[first : first + size]) / total
        if share == 0:
            continue
        part = ptx_nll(model, batch[first : first + size], pad_id, device) * share
        part.backward()
        loss += float(part.detach())
    return loss
