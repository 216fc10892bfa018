"""LightSearcher's contrastive experience memory (docs/methods.md#lightsearcher-memory)."""

from .bank import ExperienceBank, Summarizer, SummarizerError, TrajectorySummary, summarise_trajectory
from .bank_history import BankRecord, read_bank_history
from .experience import ExperienceMemory, UpdateResult
from .lm_summarizers import OpenAISummarizer, TransformersSummarizer
from .rule_summarizer import RuleBasedSummarizer
from .summarizers import make_summarizer

__all__ = [
    "ExperienceMemory",
    "UpdateResult",
    "BankRecord",
    "read_bank_history",
    "ExperienceBank",
    "TrajectorySummary",
    "Summarizer",
    "SummarizerError",
    "RuleBasedSummarizer",
    "TransformersSummarizer",
    "OpenAISummarizer",
    "make_summarizer",
    "summarise_trajectory",
]
