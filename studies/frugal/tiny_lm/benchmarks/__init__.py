"""The tiny-LM study's measurement scripts, run as modules from the repository root
(``python -m studies.frugal.tiny_lm.benchmarks.study_probe``)."""

__all__: list[str] = []
