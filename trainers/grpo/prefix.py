"""One encoded prompt per group: the key/value cache of a prompt that several sequences share.

The rollouts of a GRPO group share their prompt (with experience memory, several hundred
tokens). Sampling (:mod:`.generation`) and the update's log-probabilities (:mod:`.loss`)
encode each distinct prompt of a batch once and copy its cache to the rows that share it,
then encode only the rest of each row, at the positions it has in the whole row and
under the same masks. The result equals encoding every row whole up to floating-point
rounding (``tests/trainers/test_grpo.py``: the same tokens, log-probabilities and gradients).

This module imports torch and transformers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from transformers import DynamicCache

from ...policies.turn_cache import cache_argument

__all__ = ["shared_prefixes", "encode_prefixes", "cache_argument", "sequence_logprobs"]

Groups = tuple[list[tuple[int, ...]], list[int]]


def shared_prefixes(rows: Sequence[Sequence[int]], prefix_lengths: Sequence[int]) -> Groups | None:
    """The distinct prefixes to encode once, each without its last token (a model call after
    the cache must get at least one token per row), and each row's prefix; None when no two
    rows share one or a row has no prefix to cache.

    ``prefix_lengths[i]`` is how many leading tokens row ``i`` shares with other rows.
    """
    prefixes: dict[tuple[int, ...], int] = {}
    index = []
    for row, length in zip(rows, prefix_lengths, strict=True):
        if not 2 <= length <= len(row):
            return None
        index.append(prefixes.setdefault(tuple(row[: length - 1]), len(prefixes)))
    if len(prefixes) == len(rows):
        return None
    return list(prefixes), index


def encode_prefixes(
    model: Any, groups: Groups, pad: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, Any, torch.Tensor | None]:
    """Encode the distinct prefixes, left-padded into one batch, in one forward pass.

    Returns the prefixes' ids and mask as every row sees them (one line per row), the cache
    with one line per row (a copy of its prefix's), and the prefixes' logits (one line per
    prefix; None for a base model, which has no output layer). Runs under the caller's grad
    mode, so gradients flow back through the copies.
    """
    prefixes, index = groups
    width = max(len(p) for p in prefixes)
    ids = torch.tensor([[pad] * (width - len(p)) + list(p) for p in prefixes], device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prefixes], device=device)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    cache = DynamicCache(config=model.config)
    out = model(
        input_ids=ids,
        attention_mask=mask,
        position_ids=positions,
        use_cache=True,
        **{cache_argument(model): cache},
    )
    rows = torch.tensor(index, device=device)
    cache.batch_select_indices(rows)
    return ids[rows], mask[rows], cache, getattr(out, "logits", None)


def sequence_logprobs(
    model: Any,
    rows: Sequence[Sequence[int]],
    pad_id: int,
    device: torch.device,
    temperature: float = 1.0,
    prefix_lengths: Sequence[int] | None = None,
    wanted: Sequence[Sequence[int]] | None = None,
) -> torch.Tensor:
    """:func:`~.loss.token_logprobs` of the right-padded ``rows``, shape (B, T − 1), with the
    prefixes that rows share (``prefix_lengths``, as :func:`shared_prefixes`) encoded once.

    Entry ``[b, t]`` is log p(row_b[t + 1] | row_b[: t + 1]); entries past a row's end
    are padding (0 where a prefix is shared). With ``wanted`` (per row, a 0/1 flag for each
    of its T − 1 entries, like the loss mask), only the flagged entries are computed and the
    others are 0 (:func:`~.loss.selected_logprobs`); a flagged entry must lie after the
    row's shared prefix.
    """
    from .loss import pad_batch, pad_values, selects_positions, token_logprobs

    groups = shared_prefixes(rows, prefix_lengths) if prefix_lengths is not None else None
    if groups is None:
        ids, attention = pad_batch(rows, pad_id, device)
        flags = None if wanted is None else pad_values(wanted, ids.shape[1] - 1, device)
        return token_logprobs(model, ids, attention, temperature, flags)
    prefixes, index = groups
    if wanted is not None and selects_positions(model):
        return _selected_after_prefixes(model, rows, groups, pad_id, device, temperature, wanted)
    prefix_logits, out, rests, _ = _encode_after_prefixes(model, rows, groups, pad_id, device)
    logits = out.logits
    assert prefix_logits is not None  # a causal LM's forward returns logits
    prefix_lp = _scaled(prefix_logits, temperature)  # (G, Wp, V)
    rest_lp = _scaled(logits, temperature)  # (B, Wr, V)
    width = max(len(r) for r in rows) - 1
    out = []
    for b, g in enumerate(index):
        prefix, rest = prefixes[g], rests[b]
        start = prefix_lp.shape[1] - len(prefix)  # the prefix is left-padded
        inside = prefix_lp[g, start:-1].gather(-1, torch.tensor(prefix[1:], device=device)[:, None])[:, 0]
        first = prefix_lp[g, -1, rest[0]].reshape(1)
        after = rest_lp[b, : len(rest) - 1].gather(-1, torch.tensor(rest[1:], device=device)[:, None])[:, 0]
        line = torch.cat([inside, first, after])
        out.append(torch.nn.functional.pad(line, (0, width - line.shape[0])))
    return torch.stack(out)


def _encode_after_prefixes(
    net: Any, rows: Sequence[Sequence[int]], groups: Groups, pad_id: int, device: torch.device
) -> tuple[torch.Tensor | None, Any, list[list[int]], torch.Tensor]:
    """Run ``net`` (a causal LM or its base model) on the distinct prefixes once, then on each
    row's rest after its prefix's cache, at the positions the rest has in the whole row.

    Returns the prefixes' logits (None for a base model), the rests' output, the rests and
    their right-padded ids.
    """
    from .loss import pad_batch

    prefixes, index = groups
    _, prefix_mask, cache, prefix_logits = encode_prefixes(net, groups, pad_id, device)
    rests = [list(row[len(prefixes[g]) :]) for row, g in zip(rows, index, strict=True)]
    rest_ids, rest_mask = pad_batch(rests, pad_id, device)
    lengths = torch.tensor([len(prefixes[g]) for g in index], device=device)
    positions = lengths[:, None] + torch.arange(rest_ids.shape[1], device=device)[None, :]
    out = net(
        input_ids=rest_ids,
        attention_mask=torch.cat([prefix_mask, rest_mask], dim=1),
        position_ids=positions,
        use_cache=True,
        **{cache_argument(net): cache},
    )
    return prefix_logits, out, rests, rest_ids


def _selected_after_prefixes(
    model: Any,
    rows: Sequence[Sequence[int]],
    groups: Groups,
    pad_id: int,
    device: torch.device,
    temperature: float,
    wanted: Any,
) -> torch.Tensor:
    """:func:`sequence_logprobs` with shared prefixes, at the ``wanted`` entries only."""
    from .loss import pad_values, selected_logprobs

    prefixes, index = groups
    starts = [len(prefixes[g]) for g in index]
    for start, flags in zip(starts, wanted, strict=True):
        if any(list(flags)[:start]):
            raise ValueError("sequence_logprobs: a wanted entry lies inside the row's shared prefix")
    _, out, _, rest_ids = _encode_after_prefixes(model.base_model, rows, groups, pad_id, device)
    hidden = out.last_hidden_state
    # rest position j predicts rest token j + 1, which is row entry start + j
    width = max(len(r) for r in rows) - 1
    flags = pad_values(
        [list(f)[start:] for f, start in zip(wanted, starts, strict=True)], rest_ids.shape[1] - 1, device
    )
    part = selected_logprobs(model, hidden[:, :-1], rest_ids[:, 1:], flags, temperature)
    # shift each line right by its prefix; a negative right pad crops entries past the row's end
    return torch.stack(
        [
            torch.nn.functional.pad(line, (start, width - start - line.shape[0]))
            for line, start in zip(part, starts, strict=True)
        ]
    )


def _scaled(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """Log-softmax of ``logits`` (float32) at ``temperature``."""
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    return torch.log_softmax(logits, dim=-1)
