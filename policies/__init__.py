"""Policies: the batched interface, scripted baselines, language-model policies, and evaluation.

The language-model policies (``hf``, ``vllm``, ``openai``) import torch, transformers or
vLLM only when one is built, so importing this package stays light.
"""

from __future__ import annotations

import inspect
import json
from typing import Any

from ..envs.protocols import Protocol
from ..envs.synthetic import SyntheticWorld
from ..error import InvalidArgumentError, did_you_mean
from ..models import resolve_model
from .base import Policy, extract_doc_lines, split_context
from .chat import ChatFormatter, ContextTracker, stop_strings
from .evaluation import EvalResult, evaluate, format_table
from .hf import Completion, HFPolicy
from .openai_policy import EndpointError, OpenAIPolicy
from .reader import read_answer
from .scripted import (
    DirectPolicy,
    NaiveRAGPolicy,
    OracleSyntheticPolicy,
    good_and_bad_trajectories,
    synthetic_knowledge,
)
from .tiny import build_tiny_lm, load_tiny_lm, load_tokenizer
from .vllm_policy import VLLMPolicy

__all__ = [
    # interface
    "Policy",
    "make_policy",
    "POLICY_NAMES",
    # scripted baselines
    "DirectPolicy",
    "NaiveRAGPolicy",
    "OracleSyntheticPolicy",
    "synthetic_knowledge",
    "good_and_bad_trajectories",
    "read_answer",
    # language-model policies
    "LLM_POLICY_KINDS",
    "HFPolicy",
    "Completion",
    "VLLMPolicy",
    "OpenAIPolicy",
    "EndpointError",
    "ChatFormatter",
    "ContextTracker",
    "stop_strings",
    "build_tiny_lm",
    "load_tiny_lm",
    "load_tokenizer",
    # evaluation
    "EvalResult",
    "evaluate",
    "format_table",
    # helpers
    "split_context",
    "extract_doc_lines",
]

POLICY_NAMES = ("direct", "naive_rag", "oracle_synthetic")
"""The scripted policies, built by bare name."""

LLM_POLICY_KINDS = ("hf", "vllm", "openai")
"""Language-model policies, built as ``KIND:TARGET[?key=value&...]`` (see :func:`make_policy`)."""

_LLM_FORMS = ("hf:PATH", "vllm:PATH", "openai:MODEL@http://host:port/v1")


def make_policy(
    name: str,
    *,
    protocol: str | Protocol = "search_r1",
    world: SyntheticWorld | None = None,
    **options: Any,
) -> Policy:
    """Build a policy by name.

    Scripted policies go by bare name: ``direct``, ``naive_rag``, ``oracle_synthetic``.
    Language-model policies by a spec:

    * ``hf:PATH``: :class:`HFPolicy` on a local transformers model folder, or on a pulled
      offline model by name (``hf:smollm2-135m-instruct``, see ``searchgym models``);
    * ``vllm:PATH``: :class:`VLLMPolicy` (vLLM's offline engine; needs a GPU and vLLM);
    * ``openai:MODEL@URL``: :class:`OpenAIPolicy` on an OpenAI-compatible endpoint, e.g.
      ``openai:Qwen/Qwen2.5-7B-Instruct@http://127.0.0.1:8000/v1``.

    A spec may end with ``?key=value&key=value`` to set the class's keyword arguments, e.g.
    ``hf:/models/qwen?max_new_tokens=256&temperature=0.7``; values are read as JSON when
    they parse (numbers, true/false, null), else as text. ``options`` set them from Python
    (the spec's win).

    Args:
        name: A scripted name or an LLM spec.
        protocol: the env's protocol (the policy writes actions in its format).
        world: the SyntheticFacts world, when the env is one. ``direct`` then knows the
            world's "known" facts (its parametric memory); ``oracle_synthetic`` requires it.
            LLM policies ignore it.
        **options: keyword arguments of an LLM policy's class.

    Raises:
        UnknownNameError: for a name that is neither (with close matches).
        InvalidArgumentError: for a malformed spec or an option the class does not take.
    """
    kind, colon, target = name.partition(":") if isinstance(name, str) else ("", "", "")
    if colon and kind in LLM_POLICY_KINDS:
        return _make_llm_policy(name, kind, target, protocol, options)
    if options:
        raise InvalidArgumentError(
            f"Options {sorted(options)} only apply to language-model policies ({', '.join(_LLM_FORMS)}), "
            f"not to {name!r}."
        )
    if name == "direct":
        return DirectPolicy(protocol, knowledge=synthetic_knowledge(world) if world is not None else None)
    if name == "naive_rag":
        return NaiveRAGPolicy(protocol)
    if name == "oracle_synthetic":
        if world is None:
            raise InvalidArgumentError(
                "The oracle_synthetic policy needs a SyntheticFacts world: use it with "
                "searchgym/SyntheticFacts-v1."
            )
        return OracleSyntheticPolicy(world, protocol)
    raise did_you_mean("policy", name, POLICY_NAMES + _LLM_FORMS)


def _parse_options(spec: str, query: str) -> dict[str, Any]:
    options: dict[str, Any] = {}
    for pair in filter(None, query.split("&")):
        key, equals, text = pair.partition("=")
        if not equals or not key.strip():
            raise InvalidArgumentError(
                f"Policy spec {spec!r}: option {pair!r} is not key=value (e.g. ?max_new_tokens=256&temperature=0.7)."
            )
        try:
            value: Any = json.loads(text)
        except ValueError:
            value = text
        options[key.strip()] = value
    return options


def _make_llm_policy(
    spec: str, kind: str, target: str, protocol: str | Protocol, options: dict[str, Any]
) -> Policy:
    target, _, query = target.partition("?")
    options = {**options, **_parse_options(spec, query)}
    label = f"{kind}:{target}"
    args: tuple[Any, ...]
    if kind == "openai":
        at = max(target.find("@http://"), target.find("@https://"))
        if at <= 0:
            raise InvalidArgumentError(
                f"Policy spec {spec!r}: write openai:MODEL@URL, e.g. "
                "openai:Qwen/Qwen2.5-7B-Instruct@http://127.0.0.1:8000/v1."
            )
        cls: Any = OpenAIPolicy
        args = (target[:at], target[at + 1 :])
    else:
        if not target.strip():
            raise InvalidArgumentError(f"Policy spec {spec!r}: give the model folder after '{kind}:'.")
        cls = HFPolicy if kind == "hf" else VLLMPolicy
        args = (resolve_model(target),)  # a registered offline model name works like its folder
    accepted = [
        p.name
        for p in inspect.signature(cls.__init__).parameters.values()
        if p.kind is p.KEYWORD_ONLY and p.name != "protocol"
    ]
    unknown = sorted(set(options) - set(accepted))
    if unknown and cls is not VLLMPolicy:  # VLLMPolicy passes other keywords to vllm.LLM
        raise InvalidArgumentError(
            f"Policy spec {spec!r}: {cls.__name__} takes no option {', '.join(map(repr, unknown))}; "
            f"it takes {', '.join(accepted)}."
        )
    options.setdefault("name", label)
    return cls(*args, protocol=protocol, **options)
