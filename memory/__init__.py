"""Experience memory: LightSearcher's contrastive bank and HiExp's hierarchy, as env wrappers.

- :class:`ExperienceMemory` (LightSearcher): Good/Bad contrast every ``update_every``
  training steps, a versioned experience bank, a few-shot pool.
- :class:`HierarchicalExperience` (HiExp): offline levels of experience records, retrieved
  by similarity (imported on first use: ``searchgym.memory.hierarchical``).
- :class:`ExperienceWrapper`: builds the augmented prompt and records finished episodes.
- Summarisers (rule-based by default, local transformers, OpenAI-compatible HTTP) and the
  on-disk store (a folder of JSON-lines logs shared by many processes).

Nothing here imports torch, transformers or sentence-transformers at import time.
"""

from typing import Any

from .experience import BankRecord, ExperienceMemory, UpdateResult, read_bank_history
from .serialize import trajectory_from_dict, trajectory_to_dict
from .store import KINDS, SCHEMA_VERSION, JsonlLog, MemoryStore, RepairReport
from .summarizers import (
    ExperienceBank,
    OpenAISummarizer,
    RuleBasedSummarizer,
    Summarizer,
    SummarizerError,
    TrajectorySummary,
    TransformersSummarizer,
    make_summarizer,
    summarise_trajectory,
)
from .wrapper import ExperienceWrapper, MemorySpan, render_example

_LAZY = {"HierarchicalExperience": "hierarchical", "ExperienceRecord": "hiexp_summary"}

__all__ = [
    # LightSearcher
    "ExperienceMemory",
    "UpdateResult",
    "BankRecord",
    "read_bank_history",
    # HiExp (lazy)
    "HierarchicalExperience",  # noqa: F822 - resolved by __getattr__
    "ExperienceRecord",  # noqa: F822 - resolved by __getattr__
    # the wrapper
    "ExperienceWrapper",
    "MemorySpan",
    "render_example",
    # summarisers
    "ExperienceBank",
    "TrajectorySummary",
    "Summarizer",
    "SummarizerError",
    "RuleBasedSummarizer",
    "TransformersSummarizer",
    "OpenAISummarizer",
    "make_summarizer",
    "summarise_trajectory",
    # storage
    "MemoryStore",
    "JsonlLog",
    "RepairReport",
    "KINDS",
    "SCHEMA_VERSION",
    "trajectory_to_dict",
    "trajectory_from_dict",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
