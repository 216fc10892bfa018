"""One generated turn, made fit for a searchgym episode: shared by the OpenRLHF and verl backends.

A rollout engine (vLLM behind OpenRLHF or verl) answers a turn with token ids. Two things
in those tokens need care before the env sees the turn and the trainer trains on it:

- End of sequence: a turn that ends at the model's EOS has the EOS token last, and its text
  (``...</answer><|im_end|>``) is not part of the action. :func:`split_end_of_sequence`
  takes it off for the env.
- Tokens past a stop string: vLLM stops at a stop string but keeps every token of the
  engine step that completed it (several with speculative decoding), and the token that
  completes it may carry text past it (SmolLM2 writes ``</search>.`` as ``</``,
  ``search``, ``>.``). :func:`cut_after_stop` says where the tokens end so that they read
  exactly up to the stop string.

:func:`settle_turn` puts both together for a backend that gets tokens only (verl's
``server_manager.generate``); the OpenRLHF backend, which also gets vLLM's text, applies
:func:`cut_after_stop` in :class:`searchgym.trainers.openrlhf.turns.TurnEngine`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "SettledTurn",
    "cut_after_stop",
    "first_stop",
    "settle_turn",
    "special_texts",
    "split_end_of_sequence",
    "stop_ends",
]

_COMMON_EOS = (
    "<|im_end|>",
    "<|endoftext|>",
    "</s>",
    "<|eot_id|>",
    "<|end_of_text|>",
    "<eos>",
    "<end_of_turn>",
)


def special_texts(tokenizer: Any) -> tuple[str, ...]:
    """The texts of ``tokenizer``'s special tokens, longest first (common EOS texts without one)."""
    if tokenizer is None:
        return _COMMON_EOS
    texts = set(getattr(tokenizer, "all_special_tokens", None) or ())
    added = getattr(tokenizer, "added_tokens_decoder", None) or {}
    texts |= {token.content for token in added.values() if getattr(token, "special", False)}
    return tuple(sorted((t for t in texts if isinstance(t, str) and t), key=len, reverse=True))


def split_end_of_sequence(text: str, tokenizer: Any = None) -> tuple[str, str]:
    """``text`` without the special tokens at its end (EOS, end of turn...), and their text.

    vLLM writes an EOS token's text into the output when special tokens are kept and the
    stop string is included, so an action that ends at EOS reads ``...</answer><|im_end|>``.
    The special tokens are ``tokenizer``'s, or common EOS texts without a tokenizer.
    """
    specials = special_texts(tokenizer)
    end = len(text)
    while True:
        special = next((sp for sp in specials if text.endswith(sp, 0, end)), None)
        if special is None:
            return text[:end], text[end:]
        end -= len(special)


def stop_ends(text: str, stop: str) -> list[int]:
    """Where each occurrence of ``stop`` in ``text`` ends, left to right (not overlapping)."""
    ends, at = [], text.find(stop)
    while at != -1:
        ends.append(at + len(stop))
        at = text.find(stop, at + len(stop))
    return ends


def first_stop(text: str, stops: Sequence[str]) -> str | None:
    """The stop string vLLM stops ``text`` at: the one that completes earliest (a tie goes to
    the first in ``stops``), as ``check_stop_strings`` in ``vllm/v1/engine/detokenizer.py``
    picks it; ``None`` when none occurs."""
    best: tuple[int, str] | None = None
    for stop in stops:
        at = text.find(stop) if stop else -1
        if at != -1 and (best is None or at + len(stop) < best[0]):
            best = (at + len(stop), stop)
    return None if best is None else best[1]


def cut_after_stop(ids: Sequence[int], stop: str, nth: int, tokenizer: Any) -> tuple[int, list[int]] | None:
    """Where the tokens ``ids`` end so that they read up to the ``nth`` occurrence of ``stop``.

    Returns ``(keep, tail)``: the tokens are ``ids[: keep - 1] + tail``, where ``tail`` stands
    for the token ``ids[keep - 1]`` that completes the occurrence: that token itself, or,
    when its text runs past the stop string, the tokens of the stop string's rest. Returns
    ``None`` when nothing is to change, or when the tokens hold fewer than ``nth``
    occurrences (a decoding that differs from vLLM's: nothing is cut then).
    """
    ids = list(ids)

    def occurrences(n: int) -> int:
        return len(stop_ends(tokenizer.decode(ids[:n], skip_special_tokens=False), stop))

    if nth < 1 or not stop or occurrences(len(ids)) < nth:
        return None
    keep = len(ids)
    while keep > 1 and occurrences(keep - 1) >= nth:
        keep -= 1
    head, last = ids[: keep - 1], ids[keep - 1 : keep]
    head_text = tokenizer.decode(head, skip_special_tokens=False)
    text = tokenizer.decode(head + last, skip_special_tokens=False)
    end = stop_ends(text, stop)[nth - 1]
    tail = last
    if len(head_text) < end < len(text) and text.startswith(head_text):  # the last token runs past it
        tail = list(tokenizer(text[len(head_text) : end], add_special_tokens=False)["input_ids"])
    if head + tail == ids:
        return None
    return keep, tail


@dataclass(frozen=True)
class SettledTurn:
    """One turn's tokens as trained on, and the text the env gets.

    Attributes:
        token_ids: The generated tokens, up to the end of the stop string that ended the turn
            (with the EOS token when the turn ended at EOS).
        logprobs: Their rollout log-probabilities (a token that replaced a straddling one
            keeps its log-probability, the rest of the replacement gets 0), or ``None``.
        action: The text the env steps on: the tokens' text without trailing special tokens.
        said: The text of the tokens past the action (the EOS text, or what a token past the
            stop string wrote where it could not be cut back), "" when nothing. The feedback
            that follows does not repeat it.
        stop: The stop string that ended the turn, or ``None`` (EOS or length).
    """

    token_ids: list[int]
    logprobs: list[float] | None
    action: str
    said: str
    stop: str | None


def settle_turn(
    token_ids: Sequence[int], logprobs: Sequence[float] | None, stops: Sequence[str], tokenizer: Any
) -> SettledTurn:
    """A turn from tokens alone (what verl's ``server_manager.generate`` returns).

    vLLM stopped at the stop string that completes first in the tokens' text (searching from
    the first token, as it does with ``min_tokens`` 0), at an EOS or stop token, or at the
    length limit; its answer does not say which. The tokens past the first stop string are
    dropped (:func:`cut_after_stop`); the action is the text up to the stop string's end, or
    the whole text without its trailing special tokens (:func:`split_end_of_sequence`).
    """
    ids = [int(t) for t in token_ids]
    probs = None if logprobs is None else [float(p) for p in logprobs]
    text = tokenizer.decode(ids, skip_special_tokens=False)
    stop = first_stop(text, stops)
    if stop is None:
        action, said = split_end_of_sequence(text, tokenizer)
        return SettledTurn(ids, probs, action, said, None)
    cut = cut_after_stop(ids, stop, 1, tokenizer)
    if cut is not None:
        keep, tail = cut
        ids = ids[: keep - 1] + tail
        if probs is not None:
            probs = probs[: keep - 1] + [probs[keep - 1]] + [0.0] * (len(tail) - 1)
        text = tokenizer.decode(ids, skip_special_tokens=False)
    end = stop_ends(text, stop)[0]
    return SettledTurn(ids, probs, text[:end], text[end:], stop)
