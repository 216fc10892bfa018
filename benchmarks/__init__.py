"""Benchmark scripts; each writes a JSON result file under ``benchmarks/results/``.

They use ``searchgym`` like any user's code. Run one as a module from the repository root
(``python -m benchmarks.grpo_step``), so that it finds its siblings (``benchmarks._common``)
and the studies (``studies.frugal.tiny_lm``).
"""

__all__: list[str] = []
