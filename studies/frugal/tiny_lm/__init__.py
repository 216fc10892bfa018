"""The tiny-LM study: warm start a tiny policy on SyntheticFacts, train it with GRPO, evaluate it.

User code on top of ``searchgym``, imported as ``studies.frugal.tiny_lm`` from the
repository root (``python -m studies.frugal.tiny_lm.train``).

================  ====================================================================
``demos``         warm-start data: fact statements and scripted demonstrations
``sft``           the supervised warm start's protocol stage, cached per seed and settings
``topup``         recall top-ups on top of it
``warm_start``    the whole warm start: protocol stage, then top-ups
``evaluation``    evaluating a trained model on held-out questions
``pipeline``      one arm: warm start, GRPO, evaluation (``train.py``)
``study``         every arm for every seed, the table and plot (``runner.py``)
================  ====================================================================

Importing this package imports torch and transformers.
"""

from .evaluation import evaluate_model
from .pipeline import run_pipeline
from .warm_start import warm_start

__all__ = ["warm_start", "evaluate_model", "run_pipeline"]
