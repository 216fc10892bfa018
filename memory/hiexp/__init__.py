"""HiExp's hierarchical experience (docs/methods.md#hiexp)."""

from .build import BuildReport
from .encode import MiniLMEncoder
from .hierarchical import HierarchicalExperience
from .record import CaseSummarizer, ExperienceRecord
from .summary import RuleCaseSummarizer

__all__ = [
    "HierarchicalExperience",
    "ExperienceRecord",
    "BuildReport",
    "MiniLMEncoder",
    "CaseSummarizer",
    "RuleCaseSummarizer",
]
