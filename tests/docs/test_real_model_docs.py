"""docs/real_model.md's tables are what benchmarks/real_model_table.py makes of the committed JSON."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def load_table_script():
    spec = importlib.util.spec_from_file_location(
        "real_model_table", ROOT / "benchmarks" / "real_model_table.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_page_holds_the_tables_of_the_committed_results():
    table = load_table_script()
    page = table.DOC.read_text(encoding="utf-8")
    assert table.main_text(page) == page, "rerun: python -m benchmarks.real_model_table"


def test_the_readme_holds_the_evaluation_table_of_the_committed_results():
    table = load_table_script()
    readme = table.README.read_text(encoding="utf-8")
    assert "<!-- real-model-eval -->" in readme
    assert table.readme_text(readme) == readme, "rerun: python -m benchmarks.real_model_table"
