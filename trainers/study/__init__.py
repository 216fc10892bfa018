"""The CPU study: warm start a tiny policy on SyntheticFacts, train it with GRPO, evaluate it.

================  ====================================================================
``demos``         warm-start data: fact statements and scripted demonstrations
``sft``           the supervised warm start, cached per seed and settings
``evaluation``    evaluating a trained model on held-out questions
``pipeline``      one arm: warm start, GRPO, evaluation (``searchgym train`` with ``sft``/``eval``)
================  ====================================================================

Importing this package imports torch and transformers.
"""

from .evaluation import evaluate_model
from .pipeline import run_pipeline
from .sft import warm_start

__all__ = ["warm_start", "evaluate_model", "run_pipeline"]
