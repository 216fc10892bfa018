"""What vLLM hands back for one turn, made fit for a searchgym episode under OpenRLHF.

vLLM 0.29 answers OpenRLHF 0.11.2's rollout requests with a text and the token ids the
model sampled. Three things in that answer need care (see ``docs/gpu.md``):

- OpenRLHF keeps special tokens in the text, and the agent keeps the stop string, so a
  turn that ends at the model's EOS ends with its text (``...</answer><|im_end|>``).
  :func:`split_end_of_sequence` takes it off for the env.
- vLLM cuts the text at a stop string but keeps every token of the engine step that hit
  it. :class:`TurnEngine` drops the tokens after the one that completes the stop string,
  and cuts that token back to the stop string's end when it runs past it. The stop
  string that ended the turn is the last one in its text: vLLM does not search the first
  ``min_tokens`` token (OpenRLHF asks for 1), so a turn that opens with a whole stop string
  (Qwen2.5's one-token ``</tool_call>``) goes on past it.
- OpenRLHF's multi-turn loop sets ``max_tokens`` to the remaining context every turn.
  :class:`TurnEngine` applies a per-turn cap on top.

The token-level cut is :func:`searchgym.trainers.turns.cut_after_stop`, shared with the
verl backend. :attr:`TurnEngine.said` is what the turn's tokens wrote beyond the action the env sees
(the EOS text; a token's text past the stop string only where it could not be cut back),
so the agent does not repeat it in the feedback that follows.
"""

from __future__ import annotations

import copy
from typing import Any

from ..turns import cut_after_stop, split_end_of_sequence, stop_ends

__all__ = ["TurnEngine", "split_end_of_sequence"]


def _without_tokens_past_stop(request_output: Any, tokenizer: Any, include_stop: bool = True) -> Any:
    """``request_output`` with its tokens ending where the stop string that ended it ends.

    vLLM cuts ``text`` at the stop string (``stop_reason``) but keeps every token of the
    engine step that produced it, so the tokens after the one that completes the stop
    string are dropped. That stop string is not always the first occurrence in the
    tokens: vLLM does not search the text of the first ``min_tokens`` tokens (OpenRLHF
    asks for 1), so a turn whose first token is the whole stop string (Qwen2.5's
    ``</tool_call>`` is one token) goes on past it, and that occurrence stays in ``text``.
    The occurrence that ended the turn is the last one in ``text`` (with
    ``include_stop_str_in_output``, as the agent asks; the one after it without), and the
    tokens are cut after the token that completes that occurrence, so the tokens trained
    on read the same text as the action the env parses.

    That token itself may carry text past the stop string (SmolLM2 writes ``</search>.``
    as ``</``, ``search``, ``>.``): it is replaced by the tokens of the stop string's rest
    (``>``), so the tokens trained on read exactly the action the env parsed, as the
    built-in trainer and evaluation read it. The replacement takes the replaced token's
    logprob (the rest get 0), so the turn's rollout logprob is unchanged. Other outputs
    pass unchanged, and so does one whose tokens hold fewer occurrences than its text
    (a decoding that differs from vLLM's; nothing is cut then).
    """
    output = request_output.outputs[0]
    stop = getattr(output, "stop_reason", None)
    if not isinstance(stop, str) or not stop or tokenizer is None:
        return request_output
    nth = len(stop_ends(getattr(output, "text", None) or "", stop)) + (0 if include_stop else 1)
    ids = list(output.token_ids)
    cut = cut_after_stop(ids, stop, nth, tokenizer)
    if cut is None:
        return request_output
    keep, tail = cut
    logprobs = None if getattr(output, "logprobs", None) is None else list(output.logprobs)[:keep]
    if logprobs is not None and tail != ids[keep - 1 : keep]:
        logprobs = logprobs[:-1] + _moved_logprob(logprobs[-1].get(ids[keep - 1]), tail)
    head = ids[: keep - 1]
    trimmed = copy.copy(output)
    trimmed.token_ids = head + tail
    if logprobs is not None:
        trimmed.logprobs = logprobs
    result = copy.copy(request_output)
    result.outputs = [trimmed, *list(request_output.outputs)[1:]]
    return result


def _moved_logprob(sampled: Any, tokens: list[int]) -> list[dict[int, Any]]:
    """vLLM logprob entries for ``tokens`` that replace a sampled token: its logprob on the first, 0 on the rest."""
    entries = []
    for i, token in enumerate(tokens):
        entry = copy.copy(sampled)
        if entry is not None:
            entry.logprob = sampled.logprob if i == 0 else 0.0
        entries.append({token: entry} if entry is not None else {})
    return entries


class TurnEngine:
    """OpenRLHF's vLLM actor as one episode's turns see it (see the module docstring).

    Args:
        engine: The actor (anything with OpenRLHF's ``generate``).
        tokenizer: The policy's tokenizer, to find where a stop string ends in tokens.
        max_turn_tokens: The most tokens one turn may generate, or None for no cap beyond
            the remaining context.
    """

    def __init__(self, engine: Any, tokenizer: Any, max_turn_tokens: int | None = None):
        self.engine, self.tokenizer, self.max_turn_tokens = engine, tokenizer, max_turn_tokens
        self.said = ""
        """What the last turn's tokens wrote beyond the action the env sees: the EOS text
        (``<|im_end|>``), or the text of a token past the stop string where it could not be
        cut back; "" when nothing."""
        self.next_cap: int | None = None
        """A cap on the next turn only (1 for a sample that failed at ``reset``), then None."""

    async def generate(
        self, prompt_token_ids: Any, sampling_params: Any, multi_modal_data: Any = None
    ) -> Any:
        """The engine's answer, for at most ``max_turn_tokens`` tokens, with no tokens past a stop string."""
        caps = [c for c in (self.max_turn_tokens, self.next_cap) if c is not None]
        cap, self.next_cap = (min(caps) if caps else None), None
        if cap is not None and (sampling_params.max_tokens is None or sampling_params.max_tokens > cap):
            sampling_params = copy.copy(sampling_params)
            sampling_params.max_tokens = cap
        output = await self.engine.generate(
            prompt_token_ids, sampling_params, multi_modal_data=multi_modal_data
        )
        include = bool(getattr(sampling_params, "include_stop_str_in_output", False))
        output = _without_tokens_past_stop(output, self.tokenizer, include)
        self.said = _said_past_action(output.outputs[0], self.tokenizer)
        return output


def _said_past_action(output: Any, tokenizer: Any) -> str:
    """The text of ``output``'s tokens past its action: past its stop string, or its EOS/stop token."""
    ids = list(getattr(output, "token_ids", None) or [])
    if tokenizer is None or not ids or getattr(output, "finish_reason", None) != "stop":
        return ""
    stop = getattr(output, "stop_reason", None)
    if isinstance(stop, str):
        text = tokenizer.decode(ids, skip_special_tokens=False)
        at = text.rfind(stop)
        return text[at + len(stop) :] if at != -1 else ""
    return tokenizer.decode(ids[-1:], skip_special_tokens=False)  # the EOS or stop token
