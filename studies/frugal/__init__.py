"""The incentive study (``incentive.py``) and the tiny-LM study (``tiny_lm``) on SyntheticFacts."""

__all__: list[str] = []
