"""A local transformers causal LM as a searchgym policy (``--policy hf:PATH``)."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..checks import check_int, check_number
from ..envs.protocols import Protocol, make_protocol
from ..error import InvalidArgumentError, SearchGymError
from .base import Policy
from .chat import ChatFormatter, ContextTracker, resolve_stop_strings

__all__ = ["HFPolicy", "Completion", "cut_at_stop"]

logger = logging.getLogger("searchgym.policies")


@dataclass(frozen=True)
class Completion:
    """One generated action.

    Attributes:
        text: The action as the env receives it: decoded without special tokens and cut
            right after the first stop string.
        prompt_ids: The tokens of the model input (chat-formatted context).
        completion_ids: The generated tokens, up to and including the token that completed
            the stop string or the end-of-sequence token (which ``text`` leaves out).
        finish: ``"stop"`` (a stop string), ``"eos"`` (an end-of-sequence token),
            ``"length"`` (``max_new_tokens`` reached) or ``"overflow"`` (the context leaves
            no room to generate; ``text`` is empty and nothing was generated).
    """

    text: str
    prompt_ids: list[int]
    completion_ids: list[int]
    finish: str


def cut_at_stop(text: str, stops: Sequence[str]) -> tuple[str, bool]:
    """``text`` up to the end of the stop string that completes first, and whether one did."""
    ends = [i + len(s) for s in stops if (i := text.find(s)) >= 0]
    if not ends:
        return text, False
    return text[: min(ends)], True


class HFPolicy(Policy):
    """Batched generation with a transformers causal LM, through the tokenizer's chat template.

    Each context handed to :meth:`act` is split into turns (:class:`ContextTracker`),
    rendered with :class:`ChatFormatter` (the same text the trainers use), and generated
    from ``batch_size`` at a time with left padding, until a protocol stop string, an
    end-of-sequence token or ``max_new_tokens``. A context that leaves no room for
    ``max_new_tokens`` within the model's window gets an empty action (a format error in
    the env) and a logged warning, so an evaluation goes on. Generation settings not set
    here (``repetition_penalty``, ...) come from the model's
    ``generation_config``.

    Each context's key/value cache is kept until the next call (``reuse_cache``): a context
    that starts with the tokens of an earlier one and its generated action (the next turn
    of the same episode) encodes only the tokens after their common prefix, the
    observation and whatever of the action's end the re-tokenised text writes differently
    (:mod:`searchgym.policies.turn_cache`). The tokens and log-probabilities are those of
    encoding the context whole, up to float rounding. Caches that the next call does not
    continue (episodes that ended) are dropped then.

    Args:
        model_or_path: A model folder saved with ``save_pretrained`` (loaded with
            ``AutoModelForCausalLM``), or a loaded ``PreTrainedModel`` (then pass ``tokenizer``).
        tokenizer: The tokenizer; loaded from the folder when omitted
            (``PreTrainedTokenizerFast`` when it was saved as one, as the tiny LM is).
        protocol: The env's protocol; it sets the stop strings.
        max_new_tokens: Tokens generated per action at most.
        temperature: 0 for greedy decoding, else the sampling temperature.
        top_p: Nucleus sampling threshold (sampling only).
        top_k: Sample from the ``top_k`` likeliest tokens only; 0 (the default) samples from
            all of them, as the built-in trainer does, whatever the model's
            ``generation_config`` says (sampling only).
        batch_size: Contexts per ``generate`` call.
        seed: Seed of sampling: the ``n``-th ``generate`` call (0-based) uses ``seed + n``.
        stop_strings: Replace the protocol's stop strings.
        device: Torch device (default: CUDA when available, else CPU); ignored for a
            model object, which stays where it is.
        dtype: Weight dtype for a loaded folder (``"bfloat16"``, ``"auto"``, ...).
        system: System message before the first user turn.
        observation_role: ``"user"`` or ``"tool"`` (see :class:`ChatFormatter`).
        max_context_tokens: The model's window (default: ``config.max_position_embeddings``).
        name: Policy name in result tables (default ``hf:<path>``).
        reuse_cache: Keep each context's key/value cache for the next turn (see above);
            False encodes every context whole.
    """

    def __init__(
        self,
        model_or_path: Any,
        *,
        tokenizer: Any = None,
        protocol: str | Protocol = "search_r1",
        max_new_tokens: int = 512,
        temperature: float = 0.0,
        top_p: float = 1.0,
        top_k: int = 0,
        batch_size: int = 8,
        seed: int = 0,
        stop_strings: Sequence[str] | None = None,
        device: str | None = None,
        dtype: str | None = None,
        system: str | None = None,
        observation_role: str = "user",
        max_context_tokens: int | None = None,
        name: str | None = None,
        reuse_cache: bool = True,
    ):
        self.protocol = make_protocol(protocol)
        self.max_new_tokens = check_int("max_new_tokens", max_new_tokens, 1)
        self.temperature = check_number("temperature", temperature, 0)
        self.top_p = check_number("top_p", top_p, high=1, above=0)
        self.top_k = check_int("top_k", top_k, 0)
        self.batch_size = check_int("batch_size", batch_size, 1)
        self.seed = check_int("seed", seed, 0)
        self.stop_strings = resolve_stop_strings(stop_strings, self.protocol)
        self.model, self.tokenizer, label = _load(model_or_path, tokenizer, device, dtype)
        self.name = name or f"hf:{label}"
        self.formatter = ChatFormatter(self.tokenizer, system=system, observation_role=observation_role)
        self.tracker = ContextTracker()
        window = max_context_tokens or getattr(self.model.config, "max_position_embeddings", None)
        self.max_context_tokens = None if window is None else check_int("max_context_tokens", window, 1)
        self._eos_ids = _eos_ids(self.model, self.tokenizer)
        self._calls = 0
        self._warned = False
        if not isinstance(reuse_cache, bool):
            raise InvalidArgumentError(
                f"reuse_cache must be true or false, got {reuse_cache!r} (e.g. hf:PATH?reuse_cache=false)."
            )
        self.reuse_cache = reuse_cache
        self._turn_caches: list[Any] = []

    def act(self, observations: Sequence[str]) -> list[str]:
        """One action per context, in order (see the class docstring)."""
        if isinstance(observations, str) or not all(isinstance(c, str) for c in observations):
            raise InvalidArgumentError(
                f"act expects a list of context strings, got {type(observations).__name__}."
            )
        splits = [self.tracker.split(context) for context in observations]
        completions = self.complete([self.formatter.render(segments) for segments in splits])
        actions = [c.text for c in completions]
        for context, segments, action in zip(observations, splits, actions, strict=True):
            self.tracker.record(context, action, segments)
        return actions

    def complete(self, texts: Sequence[str]) -> list[Completion]:
        """Generate from model inputs that are already chat-formatted, in order.

        The inputs are batched by token length (shortest first), so a batch pads little.
        """
        if not texts:
            return []
        add_special = not self.formatter.uses_template
        encoded = [
            list(ids) for ids in self.tokenizer(list(texts), add_special_tokens=add_special)["input_ids"]
        ]
        order = sorted(range(len(encoded)), key=lambda i: len(encoded[i]))
        results: list[Completion | None] = [None] * len(encoded)
        previous, self._turn_caches = self._turn_caches, []
        for start in range(0, len(order), self.batch_size):
            chunk = order[start : start + self.batch_size]
            batch = self._complete_batch([encoded[i] for i in chunk], previous)
            for i, completion in zip(chunk, batch, strict=True):
                results[i] = completion
        return [r for r in results if r is not None]

    def _complete_batch(self, encoded: list[list[int]], previous: Sequence[Any] = ()) -> list[Completion]:
        """Generate from one batch of encoded contexts, reusing the best-matching caches of
        ``previous`` and keeping each row's new cache in ``_turn_caches``."""
        import torch

        from .turn_cache import TurnCache, assemble, best_match, cache_argument, harvest, supports_reuse

        tok = self.tokenizer
        room = [
            self.max_context_tokens is None or len(ids) + self.max_new_tokens <= self.max_context_tokens
            for ids in encoded
        ]
        results: list[Completion | None] = [
            None if fits else Completion("", list(ids), [], "overflow")
            for ids, fits in zip(encoded, room, strict=True)
        ]
        if not all(room) and not self._warned:
            self._warned = True
            logger.warning(
                "%s: a context of %d tokens leaves no room for %d new tokens in the model's window of %d; "
                "it gets an empty action (further cases are not reported).",
                self.name,
                max(len(ids) for ids, fits in zip(encoded, room, strict=True) if not fits),
                self.max_new_tokens,
                self.max_context_tokens,
            )
        todo = [i for i, fits in enumerate(room) if fits]
        if not todo:
            return [r for r in results if r is not None]
        pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        rows = [encoded[i] for i in todo]
        keep = self.reuse_cache and supports_reuse(self.model)
        matched = [best_match(previous, r) for r in rows] if keep else []
        reused = assemble(self.model, rows, matched, pad, self.model.device) if keep else None
        batch: dict[str, Any]
        if reused is not None:
            input_ids, mask, cache, _ = reused
            batch = {"input_ids": input_ids, "attention_mask": mask, cache_argument(self.model): cache}
        else:
            width = max(len(r) for r in rows)
            input_ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows])
            mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
            batch = {
                "input_ids": input_ids.to(self.model.device),
                "attention_mask": mask.to(self.model.device),
            }
        options: dict[str, Any] = {
            "max_new_tokens": self.max_new_tokens,
            "pad_token_id": pad,
            "eos_token_id": self._eos_ids,
            "do_sample": self.temperature > 0,
        }
        if self.stop_strings:
            options.update(stop_strings=self.stop_strings, tokenizer=tok)
        if self.temperature > 0:
            options.update(temperature=self.temperature, top_p=self.top_p, top_k=self.top_k)
        if keep:
            options["return_dict_in_generate"] = True
        devices = [self.model.device.index or 0] if self.model.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices), torch.inference_mode():
            torch.manual_seed(self.seed + self._calls)
            self._calls += 1
            output = self.model.generate(**batch, **options)
        sequences = output if isinstance(output, torch.Tensor) else output.sequences
        new = sequences[:, batch["input_ids"].shape[1] :].tolist()
        for i, ids in zip(todo, new, strict=True):
            results[i] = self._finish(encoded[i], ids)
        if keep:
            fresh = [TurnCache() for _ in todo]
            kept = [len(c.completion_ids) for i in todo if (c := results[i]) is not None]
            harvest(output.past_key_values, batch["attention_mask"], rows, new, kept, fresh)
            self._turn_caches.extend(fresh)
        return [r for r in results if r is not None]

    def _finish(self, prompt_ids: list[int], ids: list[int]) -> Completion:
        tok = self.tokenizer
        eos_at = next((j for j, t in enumerate(ids) if t in self._eos_ids), None)
        if eos_at is not None:
            ids = ids[: eos_at + 1]
        text, stopped = cut_at_stop(tok.decode(ids, skip_special_tokens=True), self.stop_strings)
        if stopped:  # keep the tokens up to the one that completed the stop string
            low, high = 1, len(ids)  # "the first j tokens contain a stop string" is monotone in j
            while low < high:
                mid = (low + high) // 2
                if cut_at_stop(tok.decode(ids[:mid], skip_special_tokens=True), self.stop_strings)[1]:
                    high = mid
                else:
                    low = mid + 1
            return Completion(text, list(prompt_ids), ids[:low], "stop")
        finish = "eos" if eos_at is not None else "length"
        return Completion(text, list(prompt_ids), ids, finish)

    def __repr__(self) -> str:
        return (
            f"HFPolicy({self.name!r}, protocol={self.protocol.name!r}, max_new_tokens={self.max_new_tokens}, "
            f"temperature={self.temperature})"
        )


def _eos_ids(model: Any, tokenizer: Any) -> list[int]:
    ids: list[int] = []
    configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    for value in (configured, tokenizer.eos_token_id):
        if isinstance(value, int):
            ids.append(value)
        elif isinstance(value, (list, tuple)):
            ids.extend(int(v) for v in value)
    return sorted(set(ids))


def _load(model_or_path: Any, tokenizer: Any, device: str | None, dtype: str | None) -> tuple[Any, Any, str]:
    try:
        import torch
        from transformers import AutoModelForCausalLM
    except ImportError as exc:
        raise SearchGymError(
            f"HFPolicy needs torch and transformers ({exc}): pip install 'searchgym[train]' "
            "(on a CPU machine, pip install torch==2.13.0 first)."
        ) from exc
    from .tiny import load_tokenizer

    if isinstance(model_or_path, (str, os.PathLike)):
        folder = Path(model_or_path)
        if not (folder / "config.json").is_file():
            raise InvalidArgumentError(
                f"hf policy: {str(model_or_path)!r} is not a model folder (no config.json). Pass a folder "
                "saved with save_pretrained, e.g. --policy hf:/path/to/Qwen2.5-3B-Instruct."
            )
        tokenizer = tokenizer if tokenizer is not None else load_tokenizer(folder)
        try:
            model: Any = AutoModelForCausalLM.from_pretrained(folder, **({"dtype": dtype} if dtype else {}))
        except (OSError, ValueError) as exc:
            raise InvalidArgumentError(f"Cannot load a causal LM from {str(folder)!r}: {exc}") from exc
        model = model.to(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        label = str(model_or_path)
    elif hasattr(model_or_path, "generate") and hasattr(model_or_path, "config"):
        if tokenizer is None:
            raise InvalidArgumentError(
                "HFPolicy got a model object without tokenizer=: pass its tokenizer too."
            )
        model = model_or_path
        label = type(model).__name__
    else:
        raise InvalidArgumentError(
            f"HFPolicy expects a model folder or a transformers model, got {type(model_or_path).__name__}."
        )
    if tokenizer.pad_token_id is None and tokenizer.eos_token_id is None:
        raise InvalidArgumentError(
            "The tokenizer has neither a pad nor an eos token: set tokenizer.pad_token."
        )
    return model.eval(), tokenizer, label
