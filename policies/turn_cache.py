"""An episode's key/value cache kept from one turn to the next.

Each turn of a multi-turn episode extends the previous turn's context by the action the
model generated and the env's observation. Encoding that context whole repeats the work of
every earlier turn. A :class:`TurnCache` holds the keys and values of the tokens the model
has already encoded for one episode (its previous context and the tokens it generated),
so that the next turn encodes only what follows them.

**Only the common prefix of ids is reused.** The next context is a list of token ids that
need not extend the cached ids exactly: the trainer may replace the last sampled token
(a stop string merged with the text after it), and an evaluation policy re-tokenises the
whole context text, whose tokens can differ from the generated ones at the action's end.
:meth:`TurnCache.reusable` counts the leading ids the cache and the new context share;
the turn encodes everything from the first differing id on. At least the context's last
token is always encoded (``generate`` needs one input token per row to produce logits).

**Batches.** :func:`assemble` lays out a batch of contexts for ``generate`` as
``[pads][cached tokens][pads][new tokens]`` per row, with the cached keys and values
left-padded to the longest reused prefix of the batch and the padding masked out. Positions
come from the attention mask (as ``generate`` computes them), so every token sits where it
sits in its context encoded whole, and the logits agree with encoding every row whole up to
floating-point rounding. :func:`harvest` cuts each row's keys and values back out of the
cache ``generate`` returns.

Only a cache of full-attention layers (``DynamicLayer``) is reused; models with sliding
window layers, or another cache class, encode every context whole.

This module imports torch and transformers.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

__all__ = [
    "TurnCache",
    "common_prefix",
    "cache_argument",
    "supports_reuse",
    "assemble",
    "best_match",
    "harvest",
]


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading ids ``a`` and ``b`` share."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    left = torch.as_tensor(list(a[:n]))
    right = torch.as_tensor(list(b[:n]))
    differ = (left != right).nonzero()
    return n if differ.numel() == 0 else int(differ[0, 0])


def cache_argument(model: Any) -> str:
    """The name ``model.forward`` takes its key/value cache by: ``cache`` (recent
    transformers) or ``past_key_values`` (earlier)."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def supports_reuse(model: Any) -> bool:
    """Whether ``model``'s cache is made of full-attention layers only, which :func:`assemble`
    can lay out again (a sliding-window layer drops old tokens)."""
    try:
        cache = DynamicCache(config=model.config)
    except Exception:  # noqa: BLE001  (a config that transformers cannot build a cache for)
        return False
    layers = list(getattr(cache, "layers", None) or [])
    return bool(layers) and all(type(layer) is DynamicLayer for layer in layers)


class TurnCache:
    """The keys and values of one episode's tokens encoded so far.

    Attributes:
        ids: The tokens whose keys and values are held, in order.
        keys: Per layer, a tensor of shape ``(heads, len(ids), head_dim)``.
        values: Per layer, as ``keys``.
    """

    def __init__(self) -> None:
        self.ids: list[int] = []
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []

    def reusable(self, row: Sequence[int]) -> int:
        """How many leading tokens of ``row`` can come from the cache: the ids it shares
        with :attr:`ids`, leaving at least ``row``'s last token to encode."""
        if not self.ids:
            return 0
        return max(0, min(common_prefix(self.ids, row), len(row) - 1))

    def clear(self) -> None:
        """Drop the held tensors (the episode ended)."""
        self.ids, self.keys, self.values = [], [], []

    def __len__(self) -> int:
        return len(self.ids)

    def __repr__(self) -> str:
        return f"TurnCache({len(self.ids)} tokens, {len(self.keys)} layers)"


def assemble(
    model: Any,
    rows: Sequence[Sequence[int]],
    caches: Sequence[TurnCache | None],
    pad: int,
    device: torch.device,
) -> tuple[torch.Tensor, torch.Tensor, DynamicCache, list[int]] | None:
    """The inputs of one ``generate`` call on ``rows`` that reuse each row's cache.

    Returns the input ids ``[pads][cached ids][pads][new ids]``, their attention mask, the
    cache of the first part (one line per row) and how many tokens of each row came from
    its cache; None when no row reuses anything (then encode the rows as usual).
    """
    reused = [0 if c is None else c.reusable(r) for r, c in zip(rows, caches, strict=True)]
    width = max(reused)
    if width == 0:
        return None
    ref = next(c for c, n in zip(caches, reused, strict=True) if c is not None and n)
    cache = DynamicCache(config=model.config)
    for layer, sample in enumerate(ref.keys):
        heads, _, dim = sample.shape
        keys = torch.zeros((len(rows), heads, width, dim), dtype=sample.dtype, device=device)
        values = torch.zeros_like(keys)
        for i, (c, n) in enumerate(zip(caches, reused, strict=True)):
            if c is not None and n:
                keys[i, :, width - n :] = c.keys[layer][:, :n]
                values[i, :, width - n :] = c.values[layer][:, :n]
        cache.update(keys, values, layer)
    head = [[pad] * (width - n) + list(r[:n]) for r, n in zip(rows, reused, strict=True)]
    rests = [list(r[n:]) for r, n in zip(rows, reused, strict=True)]
    rest_width = max(len(r) for r in rests)
    ids = [h + [pad] * (rest_width - len(r)) + r for h, r in zip(head, rests, strict=True)]
    mask = [
        [0] * (width - n) + [1] * n + [0] * (rest_width - len(r)) + [1] * len(r)
        for n, r in zip(reused, rests, strict=True)
    ]
    return (
        torch.tensor(ids, device=device),
        torch.tensor(mask, device=device),
        cache,
        reused,
    )


def best_match(caches: Sequence[TurnCache], row: Sequence[int]) -> TurnCache | None:
    """The cache of ``caches`` that serves the most leading tokens of ``row`` (None when empty)."""
    return max(caches, key=lambda c: c.reusable(row), default=None)


def harvest(
    cache: Any,
    attention: torch.Tensor,
    rows: Sequence[Sequence[int]],
    generated: Sequence[Sequence[int]],
    kept: Sequence[int],
    into: Sequence[TurnCache],
) -> None:
    """Store in ``into[i]`` the keys and values of row ``i``'s tokens from the cache that
    ``generate`` returned.

    Args:
        cache: ``generate``'s ``past_key_values`` (its input, then the generated tokens it fed back).
        attention: The attention mask of ``generate``'s input (1 on each row's real tokens).
        rows: Each row's context ids (its real input tokens, in order).
        generated: Each row's generated ids.
        kept: How many generated ids of each row belong to its action (the rest, sampled
            after the row ended, are not kept).
        into: One :class:`TurnCache` per row, overwritten.
    """
    layers = getattr(cache, "layers", None)
    if not layers or not all(type(layer) is DynamicLayer for layer in layers) or not layers[0].is_initialized:
        for target in into:
            target.clear()
        return
    width = attention.shape[1]
    fed = layers[0].keys.shape[-2] - width  # generated tokens fed back (all but the last)
    device = layers[0].keys.device
    for i, (row, new, n, target) in enumerate(zip(rows, generated, kept, into, strict=True)):
        take = max(0, min(n, fed))
        where = torch.cat(
            [attention[i].nonzero()[:, 0].to(device), width + torch.arange(take, device=device)]
        )
        if where.numel() != len(row) + take:
            target.clear()  # the mask does not mark the row's tokens: nothing to trust
            continue
        target.ids = [int(t) for t in row] + [int(t) for t in new[:take]]
        target.keys = [layer.keys[i].index_select(1, where) for layer in layers]
        target.values = [layer.values[i].index_select(1, where) for layer in layers]
