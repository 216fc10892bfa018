"""A vLLM-faithful stand-in for OpenRLHF's rollout actor, for tests without a GPU.

:class:`FakeVLLMEngine` answers ``await engine.generate(prompt_token_ids, sampling_params)``
the way OpenRLHF 0.11.2's ``RolloutRayActor.generate`` does with vLLM 0.29 (V1 engine)
behind it, returning the last ``RequestOutput``. Which tokens come out is decided by a
pluggable *generator*; what vLLM makes of them is reproduced here:

- The engine core (``vllm/v1/core/sched/utils.py: check_stop``), after every token:
  nothing before ``min_tokens`` tokens; then the EOS token (``tokenizer.eos_token_id``,
  unless ``ignore_eos``) -> ``finish_reason="stop"`` with ``stop_reason=None``; else one
  of ``stop_token_ids`` (which include the generation config's other EOS ids) ->
  ``"stop"`` with that id as ``stop_reason``; else ``max_tokens`` or ``max_model_len``
  reached -> ``"length"``. So an EOS sampled as the last allowed token is a ``"stop"``.
  Tokens a step produced after the stopping one are dropped.
- The detokenizer (``vllm/v1/engine/detokenizer.py``), once per engine step: text is
  decoded incrementally (primed with the end of the prompt) with ``skip_special_tokens``.
  When the engine stopped at an EOS or stop token and ``include_stop_str_in_output`` is
  off, that last token's text is left out; with it on (and special tokens kept, as
  OpenRLHF asks), the text ends with the EOS text, e.g. ``<|im_end|>``. Stop strings are
  then searched in the new text (``check_stop_strings``: the one that completes
  earliest wins, a tie goes to the first in ``stop``); a hit cuts ``text`` before the stop string,
  or after it with ``include_stop_str_in_output``, and finishes with ``stop_reason`` the
  string. ``token_ids`` keep every token of the step, including any text past the stop
  string (a token that straddles it, or later tokens of a multi-token step).
  Stop strings are searched only once more than ``min_tokens`` tokens are out, and a
  match must end past the text of the first ``min_tokens`` tokens
  (``BaseIncrementalDetokenizer.update`` starts its search there): a first token that
  is a whole stop string (Qwen2.5's ``</tool_call>``) does not end the request.
- ``logprobs``: with ``sampling_params.logprobs`` set, one ``{token_id: Logprob}`` per
  output token (OpenRLHF reads ``logprobs[i][token_ids[i]].logprob``).

A generator is any callable ``(prompt_token_ids, sampling_params) -> iterable of token
ids`` (or of ``(token_id, logprob)`` pairs). It may yield more tokens than will be kept:
the engine stops reading when vLLM would stop. Like vLLM's ``MinTokensLogitsProcessor``,
a real model must not sample an EOS within ``min_tokens``; scripted ones simply don't.
:class:`ScriptedText` turns intended texts into such a generator; a real model (for
instance SmolLM2 sampled with transformers) plugs in with the same signature.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import types
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "CompletionOutput",
    "FakeVLLMEngine",
    "Logprob",
    "RequestOutput",
    "SamplingParams",
    "TokenGenerator",
    "ScriptedText",
    "vllm_modules",
]

TokenGenerator = Callable[[list[int], Any], Iterable[int | tuple[int, float]]]
"""``(prompt_token_ids, sampling_params) -> token ids`` (or ``(id, logprob)`` pairs)."""

_PRIME_MIN, _PRIME_MAX = 4, 24  # vLLM primes its decode stream with 4..23 prompt tokens


@dataclass
class SamplingParams:
    """The fields of ``vllm.SamplingParams`` that OpenRLHF and searchgym set or read (vLLM defaults)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_tokens: int | None = 16
    min_tokens: int = 0
    skip_special_tokens: bool = True
    logprobs: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        # vllm/sampling_params.py (0.29): `if 0 < self.temperature < _MAX_TEMP:` (1e-2) the
        # temperature is raised to _MAX_TEMP; 0 stays 0 (greedy).
        if 0 < self.temperature < 1e-2:
            self.temperature = 1e-2

    @classmethod
    def openrlhf(cls, max_new_tokens: int | None = None, temperature: float = 1.0, logprobs: bool = False):
        """What ``SamplesGenerator._dispatch_prompts_to_vllm`` builds (openrlhf 0.11.2)."""
        return cls(
            temperature=temperature,
            top_p=1.0,
            top_k=-1,
            max_tokens=max_new_tokens,
            min_tokens=1,
            skip_special_tokens=False,
            logprobs=1 if logprobs else None,
        )


@dataclass
class Logprob:
    logprob: float
    rank: int | None = 1
    decoded_token: str | None = None


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: list[dict[int, Logprob]] | None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


@dataclass
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool = True


def _check_stop_strings(
    text: str, new_chars: int, stops: Sequence[str], include: bool
) -> tuple[str, int] | None:
    """vLLM's ``check_stop_strings`` (``vllm/v1/engine/detokenizer.py``): (stop string, cut or -1) or None.

    Of the stop strings found in the new text (or straddling its start), the one that
    completes earliest wins; a tie goes to the one first in ``stops``.
    """
    if not new_chars or not stops:
        return None
    best: tuple[int, int, str] | None = None  # (end, start, stop)
    for stop in stops:
        at = text.find(stop, 1 - new_chars - len(stop))
        if at != -1 and (best is None or at + len(stop) < best[0]):
            best = (at + len(stop), at, stop)
    if best is None:
        return None
    end, at, stop = best
    if include:
        return stop, -1 if end >= len(text) else end
    return stop, at


class _Detokenizer:
    """Incremental decoding as vLLM's fast detokenizer does it (a decode stream primed with the prompt)."""

    def __init__(self, tokenizer: Any, prompt_ids: list[int], skip_special_tokens: bool):
        self.tokenizer, self.skip = tokenizer, skip_special_tokens
        prime = prompt_ids
        if len(prompt_ids) > _PRIME_MIN:
            for n in range(_PRIME_MIN, min(len(prompt_ids) + 1, _PRIME_MAX)):
                if "\ufffd" not in tokenizer.decode(prompt_ids[-n:]):
                    prime = prompt_ids[-n:]
                    break
        self.prime = list(prime)
        self.ids: list[int] = []
        self.base = self._decode([])

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(self.prime + ids, skip_special_tokens=self.skip)

    def text(self, ids: list[int]) -> str:
        """The text of the generated ``ids`` (an incomplete UTF-8 character at the end is held back)."""
        full = self._decode(ids)
        while full.endswith("\ufffd"):
            full = full[:-1]
        return full[len(self.base) :] if full.startswith(self.base) else full


def _as_pair(item: int | tuple[int, float]) -> tuple[int, float]:
    if isinstance(item, tuple):
        return int(item[0]), float(item[1])
    return int(item), -1.0


class FakeVLLMEngine:
    """``generate`` as OpenRLHF's vLLM actor answers it; see the module docstring.

    Args:
        tokenizer: A Hugging Face tokenizer (the policy's).
        generator: Decides the tokens (see :data:`TokenGenerator`).
        stop_token_ids: Other EOS ids of the model's generation config (vLLM adds them to
            every request's stop token ids), e.g. ``<|endoftext|>`` next to ``<|im_end|>``.
        tokens_per_step: Tokens the engine core produces per step before the detokenizer
            sees them (1 normally; more with speculative decoding).
        max_model_len: The context limit (prompt + output), or None for none.
    """

    def __init__(
        self,
        tokenizer: Any,
        generator: TokenGenerator,
        *,
        stop_token_ids: Sequence[int] = (),
        tokens_per_step: int = 1,
        max_model_len: int | None = None,
    ):
        if tokens_per_step < 1:
            raise ValueError(f"tokens_per_step must be >= 1, got {tokens_per_step}")
        self.tokenizer = tokenizer
        self.generator = generator
        self.extra_stop_ids = list(stop_token_ids)
        self.tokens_per_step = tokens_per_step
        self.max_model_len = max_model_len
        self.requests: list[tuple[list[int], Any]] = []
        """Every request: (prompt token ids, a copy of its sampling params)."""
        self.outputs: list[CompletionOutput] = []
        """Every answer, in order."""

    async def generate(self, prompt_token_ids, sampling_params, multi_modal_data=None) -> RequestOutput:
        prompt = list(prompt_token_ids)
        params = copy.deepcopy(sampling_params)
        self.requests.append((prompt, params))
        output = self._run(prompt, params)
        self.outputs.append(output)
        await asyncio.sleep(0)  # a real engine yields to the event loop while it generates
        return RequestOutput(
            request_id=f"fake-{len(self.requests)}", prompt_token_ids=prompt, outputs=[output]
        )

    def _run(self, prompt: list[int], params: Any) -> CompletionOutput:
        max_tokens = params.max_tokens
        if max_tokens is None:  # vLLM: the rest of the context
            if self.max_model_len is None:
                raise ValueError(
                    "max_tokens=None needs max_model_len (vLLM fills in the rest of the context)"
                )
            max_tokens = self.max_model_len - len(prompt)
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {max_tokens}")  # vLLM rejects it too
        stops = [params.stop] if isinstance(params.stop, str) else list(params.stop or [])
        stop_ids = set(params.stop_token_ids or []) | set(self.extra_stop_ids)
        eos = self.tokenizer.eos_token_id
        min_tokens = params.min_tokens or 0
        include = bool(params.include_stop_str_in_output)
        detok = _Detokenizer(self.tokenizer, prompt, params.skip_special_tokens)

        ids: list[int] = []
        logprobs: list[float] = []
        decoded: list[int] = []  # the ids whose text is in `text` (the EOS may be left out)
        text = ""
        finish: str | None = None
        reason: int | str | None = None
        stream = iter(self.generator(prompt, params))
        while finish is None:
            step = [_as_pair(t) for t in itertools.islice(stream, self.tokens_per_step)]
            if not step:
                raise RuntimeError("the generator ran out of tokens before vLLM would have stopped")
            # engine core: append token by token, stop at the first token that ends the request
            new: list[int] = []
            engine_stop: str | None = None
            for token, logprob in step:
                ids.append(token)
                logprobs.append(logprob)
                new.append(token)
                total = len(prompt) + len(ids)
                if len(ids) < min_tokens:
                    pass  # check_stop: nothing ends a request before min_tokens
                elif not params.ignore_eos and token == eos:
                    engine_stop, reason = "stop", None
                elif token in stop_ids:
                    engine_stop, reason = "stop", token
                elif len(ids) >= max_tokens or (
                    self.max_model_len is not None and total >= self.max_model_len
                ):
                    engine_stop = "length"
                if engine_stop:
                    break
            # detokenizer: the step's new tokens, then the stop strings in the new text
            stop_terminated = engine_stop == "stop"
            to_decode = new[:-1] if stop_terminated and not include else new
            offset = len(text)
            for token in to_decode:
                decoded.append(token)
                text = detok.text(decoded)
                if min_tokens and len(decoded) <= min_tokens:
                    offset = len(text)
            finish = engine_stop
            if stops and len(ids) > min_tokens:
                hit = _check_stop_strings(text, len(text) - offset, stops, include)
                if hit is not None:
                    stop, cut = hit
                    if cut != -1:
                        text = text[:cut]
                    finish, reason = "stop", stop
        top = [{t: Logprob(lp, 1, None)} for t, lp in zip(ids, logprobs, strict=True)]
        return CompletionOutput(
            index=0,
            text=text,
            token_ids=ids,
            cumulative_logprob=sum(logprobs) if params.logprobs is not None else None,
            logprobs=top if params.logprobs is not None else None,
            finish_reason=finish,
            stop_reason=reason if finish == "stop" else None,
        )


@dataclass
class ScriptedText:
    """A generator that "writes" the next of ``turns`` (texts) per request, then the EOS token.

    Each turn is encoded with ``tokenizer`` (no special tokens added), followed by
    ``after`` token ids (default: the tokenizer's EOS). A turn may also be a callable
    ``context_text -> text`` (the decoded prompt), for policies that read the context.
    The last turn is repeated when the script runs out.
    """

    tokenizer: Any
    turns: list[Any]
    after: list[int] | None = None
    calls: int = field(default=0, init=False)

    def __call__(self, prompt_token_ids: list[int], sampling_params: Any) -> list[int]:
        turn = self.turns[min(self.calls, len(self.turns) - 1)]
        self.calls += 1
        if callable(turn):
            turn = turn(self.tokenizer.decode(prompt_token_ids, skip_special_tokens=False))
        ids = self.tokenizer(turn, add_special_tokens=False)["input_ids"]
        tail = self.after if self.after is not None else [self.tokenizer.eos_token_id]
        return list(ids) + list(tail)


def vllm_modules() -> dict[str, types.ModuleType]:
    """Stand-in ``vllm`` modules (by name, for ``sys.modules``) with what OpenRLHF 0.11.2's rollout modules import.

    ``openrlhf/trainer/ray/vllm_engine.py`` and ``ppo_utils/samples_generator.py`` import
    ``vllm`` (``__version__``, ``SamplingParams``, ``inputs.TokensPrompt``,
    ``utils.random_uuid``) at the top; with this in ``sys.modules`` they import on a CPU,
    so tests can drive their real code (``RolloutRayActor.generate_responses`` gathering
    a prompt's samples, ``SamplesGenerator._process_response_into_experience``).
    """
    vllm = types.ModuleType("vllm")
    vllm.__version__ = "0.29.0"
    vllm.SamplingParams = SamplingParams
    inputs = types.ModuleType("vllm.inputs")
    inputs.TokensPrompt = dict
    utils = types.ModuleType("vllm.utils")
    utils.random_uuid = lambda: uuid.uuid4().hex
    vllm.inputs, vllm.utils = inputs, utils
    return {"vllm": vllm, "vllm.inputs": inputs, "vllm.utils": utils}
