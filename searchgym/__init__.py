"""searchgym: Gymnasium environments for training frugal LLM search agents."""

__version__ = "0.1.0"
