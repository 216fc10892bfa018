"""Batched sampling from a transformers causal LM, one action per context, with stop strings.

The trainer needs the exact tokens the policy sampled (their log-probabilities enter the
loss), so generation works on token ids rather than text: each context is a list of ids,
contexts are left-padded into one batch, and :class:`ActionStop` ends each row at the
first of

* a token that completes one of the protocol's stop strings (``</search>``, ``</answer>``,
  ``</tool_call>``, …) in the decoded action,
* an end-of-sequence token (kept: the model learns to stop),
* the row's own token budget (``max_new_tokens``, or less when the episode's context
  budget is nearly spent).

This module imports torch and transformers.

The env receives the decoded action without special tokens, cut right after the stop
string, exactly as :class:`searchgym.policies.hf.HFPolicy` cuts it at evaluation time.

**One encoded prompt per group.** The rollouts of a GRPO group share their prompt (with
experience memory, a prompt of several hundred tokens). Given each context's prompt length
(``prefix_lengths``), :func:`sample_actions` encodes each distinct prompt of a batch once,
copies its key/value cache to the rows that share it, and encodes only the rest of each
context: the same tokens at the same positions under the same masks, so the logits agree
with encoding every row whole up to floating-point rounding (tested: same tokens, same
log-probabilities to 1e-5).

**One encoding per token of an episode.** Given each context's
:class:`~searchgym.policies.turn_cache.TurnCache` (``turn_caches``), :func:`sample_actions`
reuses the keys and values of the tokens that context shares with what the episode's
previous turn encoded (its context and the tokens it generated), encodes only the rest
(the observation, and any sampled token the episode's ids replaced), and stores the new
keys and values back for the next turn. The reused prefix is the common prefix of ids, so
a context that differs from the cached tokens is encoded from the first differing token on,
never read from a stale cache. Same tokens, same log-probabilities to float rounding
(``tests/policies/test_turn_cache.py``). The caches of all running episodes stay on the model's
device between turns (the rollout collector clears each when its episode ends).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers import GenerationConfig, StoppingCriteria, StoppingCriteriaList

from ...policies.hf import cut_at_stop
from ...policies.turn_cache import TurnCache, assemble, harvest, supports_reuse
from .prefix import cache_argument, encode_prefixes, shared_prefixes

__all__ = [
    "Sampled",
    "ActionStop",
    "SamplingSettings",
    "sample_actions",
    "generate_batch",
    "finish_action",
    "eos_token_ids",
]


@dataclass(frozen=True)
class SamplingSettings:
    """How actions are sampled.

    Attributes:
        temperature: Softmax temperature (1.0 samples the policy itself; 0 decodes greedily).
        top_p: Nucleus threshold (1.0 = off).
        batch_size: Contexts per ``generate`` call.
        share_prefix: Encode a prompt that several contexts of a batch share once (see the
            module docstring); off encodes every context whole.
        reuse_cache: Keep each episode's key/value cache from one turn to the next, so a
            turn encodes only its new tokens (see the module docstring); off encodes every
            turn's context whole.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    batch_size: int = 64
    share_prefix: bool = True
    reuse_cache: bool = True


@dataclass(frozen=True)
class Sampled:
    """One sampled action.

    Attributes:
        ids: The sampled tokens, up to and including the one that ended the action.
        text: What the env receives: ``ids`` decoded without special tokens, cut after the stop string.
        finish: ``"stop"`` (a stop string), ``"eos"`` or ``"length"`` (the row's budget).
    """

    ids: list[int]
    text: str
    finish: str


def eos_token_ids(model: Any, tokenizer: Any) -> list[int]:
    """End-of-sequence ids of the model's generation config and of the tokenizer."""
    ids: set[int] = set()
    configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    for value in (configured, getattr(tokenizer, "eos_token_id", None)):
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, (list, tuple)):
            ids.update(int(v) for v in value)
    return sorted(ids)


class ActionStop(StoppingCriteria):
    """A transformers stopping criterion that ends each row of a batch on its own terms.

    Built by :func:`sample_actions`; records in :attr:`kept` how many generated tokens of
    each row belong to its action and in :attr:`finish` why it ended.

    Args:
        tokenizer: Decodes the tail of each row to look for stop strings.
        stops: Stop strings.
        eos_ids: End-of-sequence token ids.
        prompt_width: Width of the (left-padded) input; generated tokens start there.
        budgets: Most tokens each row may generate.
    """

    def __init__(
        self,
        tokenizer: Any,
        stops: Sequence[str],
        eos_ids: Sequence[int],
        prompt_width: int,
        budgets: Sequence[int],
    ):
        self.tokenizer = tokenizer
        self.stops = list(stops)
        self.eos_ids = set(eos_ids)
        self.prompt_width = prompt_width
        self.budgets = list(budgets)
        self.kept: list[int | None] = [None] * len(budgets)
        self.finish: list[str] = ["length"] * len(budgets)
        # A stop string of L characters lies within its last L tokens (every token is >= 1 byte).
        self.window = max((len(s.encode("utf-8")) for s in self.stops), default=0) + 2

    def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
        generated = input_ids.shape[1] - self.prompt_width
        done = []
        for row in range(input_ids.shape[0]):
            if self.kept[row] is None and generated > 0:
                last = int(input_ids[row, -1])
                if last in self.eos_ids:
                    self.kept[row], self.finish[row] = generated, "eos"
                elif self.stops and self._stopped(input_ids[row], generated):
                    self.kept[row], self.finish[row] = generated, "stop"
                elif generated >= self.budgets[row]:
                    self.kept[row], self.finish[row] = generated, "length"
            done.append(self.kept[row] is not None)
        return torch.tensor(done, dtype=torch.bool, device=input_ids.device)

    def _stopped(self, row: Any, generated: int) -> bool:
        tail = row[-min(generated, self.window) :].tolist()
        text = self.tokenizer.decode(tail, skip_special_tokens=True)
        return any(s in text for s in self.stops)


def finish_action(tokenizer: Any, ids: Sequence[int], stops: Sequence[str], finish: str) -> Sampled:
    """The action of the generated tokens ``ids``: their text cut after the stop string.

    A real tokenizer may merge the end of a stop string with what follows (SmolLM2 writes
    ``</search>.`` as ``</``, ``search``, ``>.``), so the token that completes the stop
    string can carry text past it. That token is then replaced by the tokens of the stop
    string's rest, so the episode's tokens read exactly the text the env received, as the
    evaluation context does. The loss's log-probabilities are computed on these tokens, so
    the update stays consistent.
    """
    ids = [int(i) for i in ids]
    full = tokenizer.decode(ids, skip_special_tokens=True)
    text, stopped = cut_at_stop(full, stops)
    if stopped and text != full and ids:
        head = ids[:-1]
        head_text = tokenizer.decode(head, skip_special_tokens=True)
        if text.startswith(head_text):
            ids = head + list(tokenizer(text[len(head_text) :], add_special_tokens=False)["input_ids"])
    return Sampled(ids=ids, text=text, finish=finish)


def sample_actions(
    model: Any,
    tokenizer: Any,
    contexts: Sequence[Sequence[int]],
    budgets: Sequence[int],
    stops: Sequence[str],
    settings: SamplingSettings,
    *,
    prefix_lengths: Sequence[int] | None = None,
    turn_caches: Sequence[TurnCache] | None = None,
) -> list[Sampled]:
    """Sample one action per context (token ids), each within its budget of new tokens.

    Sampling uses torch's global generator: seed it (``torch.manual_seed``) for
    reproducible rollouts. Sampling ignores the model's own generation defaults
    (``top_k``, repetition penalties…): tokens are drawn from the temperature-scaled
    softmax, with nucleus filtering only when ``top_p < 1``.

    Args:
        model: A transformers causal LM.
        tokenizer: Its tokenizer.
        contexts: Token ids of each context.
        budgets: Most new tokens per context (>= 1 each).
        stops: Stop strings.
        settings: Temperature, top-p, batch size and prefix sharing.
        prefix_lengths: Per context, how many leading tokens (its prompt) other contexts
            may share; contexts of a batch whose prefixes are the same tokens encode them
            once (with ``settings.share_prefix``). None encodes every context whole.
        turn_caches: Per context, its episode's cache (with ``settings.reuse_cache``): read
            for the tokens it shares with the context, then overwritten with the
            context's and the generated tokens' keys and values. None keeps no cache.

    Returns:
        One :class:`Sampled` per context, in order.
    """
    out: list[Sampled] = []
    was_training = model.training
    model.eval()
    try:
        for first in range(0, len(contexts), settings.batch_size):
            batch = slice(first, first + settings.batch_size)
            rows = [list(c) for c in contexts[batch]]
            row_budgets = [int(b) for b in budgets[batch]]
            shared = (
                list(prefix_lengths[batch]) if prefix_lengths is not None and settings.share_prefix else None
            )
            caches = list(turn_caches[batch]) if turn_caches is not None and settings.reuse_cache else None
            new, stop, _ = generate_batch(
                model, tokenizer, rows, row_budgets, stops, settings, shared, turn_caches=caches
            )
            for row, ids in enumerate(new):
                kept = stop.kept[row] if stop.kept[row] is not None else min(len(ids), row_budgets[row])
                out.append(finish_action(tokenizer, ids[:kept], stops, stop.finish[row]))
    finally:
        model.train(was_training)
    return out


def generate_batch(
    model: Any,
    tokenizer: Any,
    rows: Sequence[Sequence[int]],
    budgets: Sequence[int],
    stops: Sequence[str],
    settings: SamplingSettings,
    prefix_lengths: Sequence[int] | None = None,
    *,
    turn_caches: Sequence[TurnCache] | None = None,
    **generate_kwargs: Any,
) -> tuple[list[list[int]], ActionStop, Any]:
    """One ``generate`` call on ``rows``: the new tokens of each row, the stop criterion
    (its ``kept`` and ``finish``) and ``generate``'s own output. ``generate_kwargs`` go to
    ``generate`` (a test reads the logits with them); the rest as :func:`sample_actions`.
    With ``turn_caches``, rows that share tokens with their cache reuse them (the shared
    prompts are then in those caches), and every cache is overwritten after the call."""
    eos = eos_token_ids(model, tokenizer)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (eos[0] if eos else 0)
    device = next(model.parameters()).device
    if turn_caches is not None and not supports_reuse(model):
        turn_caches = None
    reused = None if turn_caches is None else assemble(model, rows, turn_caches, pad, device)
    groups = shared_prefixes(rows, prefix_lengths) if prefix_lengths is not None and reused is None else None
    if reused is not None:
        input_ids, attention, turn_cache, _ = reused
        cache: dict[str, Any] = {cache_argument(model): turn_cache}
        width = input_ids.shape[1]
    elif groups is None:
        width = max(len(r) for r in rows)
        input_ids = torch.tensor([[pad] * (width - len(r)) + list(r) for r in rows], device=device)
        attention = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], device=device)
        cache = {}
    else:
        with torch.inference_mode():
            prefix_ids, prefix_mask, prefix_cache, _ = encode_prefixes(model, groups, pad, device)
        # [pads][prefix][pads][rest of the row]: positions come from the mask, so every token
        # sits where it sits in the row encoded whole
        rests = [list(row[len(groups[0][g]) :]) for row, g in zip(rows, groups[1], strict=True)]
        rest_width = max(len(r) for r in rests)
        rest_ids = torch.tensor([[pad] * (rest_width - len(r)) + r for r in rests], device=device)
        rest_mask = torch.tensor([[0] * (rest_width - len(r)) + [1] * len(r) for r in rests], device=device)
        input_ids = torch.cat([prefix_ids, rest_ids], dim=1)
        attention = torch.cat([prefix_mask, rest_mask], dim=1)
        cache = {cache_argument(model): prefix_cache}
        width = input_ids.shape[1]
    stop = ActionStop(tokenizer, stops, eos, width, budgets)
    greedy = settings.temperature == 0
    config = GenerationConfig(
        do_sample=not greedy,
        temperature=None if greedy else settings.temperature,
        top_p=None if greedy else settings.top_p,
        top_k=None if greedy else 0,
        max_new_tokens=max(budgets),
        pad_token_id=pad,
        eos_token_id=eos or None,
        return_dict_in_generate=bool(generate_kwargs.pop("return_dict_in_generate", False))
        or turn_caches is not None,
    )
    with torch.inference_mode():
        output = model.generate(
            input_ids=input_ids,
            attention_mask=attention,
            generation_config=config,
            stopping_criteria=StoppingCriteriaList([stop]),
            **cache,
            **generate_kwargs,
        )
    sequences = output if isinstance(output, torch.Tensor) else output.sequences
    new = sequences[:, width:].tolist()
    if turn_caches is not None:
        kept = [
            k if k is not None else min(len(ids), b)
            for k, ids, b in zip(stop.kept, new, budgets, strict=True)
        ]
        harvest(output.past_key_values, attention, rows, new, kept, turn_caches)
    return new, stop, output
