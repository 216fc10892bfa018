"""Policies: the batched interface, scripted baselines, and evaluation."""

from __future__ import annotations

from ..envs.errors import InvalidArgumentError, did_you_mean
from ..envs.protocols import Protocol
from ..envs.synthetic import SyntheticWorld
from .base import Policy, extract_doc_lines, split_context
from .evaluation import EvalResult, evaluate, format_table
from .reader import read_answer
from .scripted import DirectPolicy, NaiveRAGPolicy, OracleSyntheticPolicy, synthetic_knowledge

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
    "read_answer",
    # evaluation
    "EvalResult",
    "evaluate",
    "format_table",
    # helpers
    "split_context",
    "extract_doc_lines",
]

POLICY_NAMES = ("direct", "naive_rag", "oracle_synthetic")


def make_policy(
    name: str, *, protocol: str | Protocol = "search_r1", world: SyntheticWorld | None = None
) -> Policy:
    """Build a scripted policy by name.

    Args:
        name: ``direct``, ``naive_rag`` or ``oracle_synthetic``.
        protocol: the env's protocol (the policy writes actions in its format).
        world: the SyntheticFacts world, when the env is one. ``direct`` then knows the
            world's "known" facts (its parametric memory); ``oracle_synthetic`` requires it.
    """
    if name == "direct":
        return DirectPolicy(protocol, knowledge=synthetic_knowledge(world) if world is not None else None)
    if name == "naive_rag":
        return NaiveRAGPolicy(protocol)
    if name == "oracle_synthetic":
        if world is None:
            raise InvalidArgumentError(
                "The oracle_synthetic policy needs a SyntheticFacts world: use it with "
                "searchgym/SyntheticFacts-v0."
            )
        return OracleSyntheticPolicy(world, protocol)
    raise did_you_mean("policy", name, POLICY_NAMES)
