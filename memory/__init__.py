"""Experience memory: LightSearcher's contrastive bank and HiExp's hierarchy, as env wrappers.

- :class:`ExperienceMemory` (LightSearcher): Good/Bad contrast every ``update_every``
  training steps, a versioned experience bank, a few-shot pool.
- :class:`HierarchicalExperience` (HiExp): offline levels of experience records, retrieved
  by similarity.
- :class:`ExperienceWrapper`: builds the augmented prompt and records finished episodes.
- Summarisers (rule-based by default, local transformers, OpenAI-compatible HTTP) and the
  on-disk store (a folder of SQLite logs shared by many processes).

The folder: ``lightsearcher/`` (the bank, its summarisers and history, the memory),
``hiexp/`` (records, case summaries, encoding and clustering, the levels file, the
hierarchy), and beside them what both use: ``store`` (the store folder), ``wrapper``
(the env wrapper) and ``serialize`` (trajectories as JSON).

Nothing here imports torch, transformers, scikit-learn or sentence-transformers at import
time; they are imported when a model is first used.
"""

from ..storage import SCHEMA_VERSION, RepairReport, SqliteLog
from .hiexp.build import BuildReport
from .hiexp.encode import MiniLMEncoder
from .hiexp.hierarchical import HierarchicalExperience
from .hiexp.record import CaseSummarizer, ExperienceRecord
from .hiexp.summary import RuleCaseSummarizer
from .lightsearcher.bank import (
    ExperienceBank,
    Summarizer,
    SummarizerError,
    TrajectorySummary,
    summarise_trajectory,
)
from .lightsearcher.bank_history import BankRecord, read_bank_history
from .lightsearcher.experience import ExperienceMemory, UpdateResult
from .lightsearcher.lm_summarizers import OpenAISummarizer, TransformersSummarizer
from .lightsearcher.rule_summarizer import RuleBasedSummarizer
from .lightsearcher.summarizers import make_summarizer
from .serialize import trajectory_from_dict, trajectory_to_dict
from .store import KINDS, MemoryStore
from .wrapper import ExperienceWrapper, MemorySpan, render_example

__all__ = [
    # LightSearcher
    "ExperienceMemory",
    "UpdateResult",
    "BankRecord",
    "read_bank_history",
    # HiExp
    "HierarchicalExperience",
    "ExperienceRecord",
    "BuildReport",
    "MiniLMEncoder",
    "CaseSummarizer",
    "RuleCaseSummarizer",
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
    "SqliteLog",
    "RepairReport",
    "KINDS",
    "SCHEMA_VERSION",
    "trajectory_to_dict",
    "trajectory_from_dict",
]
