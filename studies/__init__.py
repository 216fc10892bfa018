"""Studies built on ``searchgym``: each folder holds one study's code, files and results.

Run a study with ``searchgym study --config studies/<folder>/<file>.yaml``, and a study's
scripts as modules from the repository root (``python -m studies.frugal.report``).
"""

__all__: list[str] = []
