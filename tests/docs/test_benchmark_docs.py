"""The measured tables of docs/benchmarks.md, docs/retrieval.md and docs/benchmarks-env.md are what
benchmarks/render_docs.py (env_overhead.py for the last) makes of the committed JSON."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "benchmarks.md"


def load_renderer():
    spec = importlib.util.spec_from_file_location("render_docs", ROOT / "benchmarks" / "render_docs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def marked_names(page: str) -> list[str]:
    return re.findall(r"^<!-- table:([\w-]+) -->$", page, re.M)


@pytest.mark.parametrize(
    "path", [PAGE, ROOT / "docs" / "retrieval.md", ROOT / "docs" / "evaluation.md"], ids=lambda p: p.name
)
def test_every_marked_table_is_its_rendering_from_the_committed_json(path: Path):
    render = load_renderer()
    page = path.read_text(encoding="utf-8")
    names = marked_names(page)
    assert names, f"{path.name} has no marked table"
    for name in names:
        assert render.TABLES[name][0] == path, f"{name} is rendered into another page"
        shown = render.block(name).search(page)
        assert shown is not None, f"<!-- table:{name} --> has no matching end marker"
        assert shown.group(2) == render.render_table(name), "rerun: python -m benchmarks.render_docs"
    assert sorted(names) == sorted(n for n, (where, _) in render.TABLES.items() if where == path)


def test_no_table_lies_outside_the_markers():
    render = load_renderer()
    page = PAGE.read_text(encoding="utf-8")
    for name in marked_names(page):
        page = render.block(name).sub("", page)
    loose = [line for line in page.splitlines() if line.lstrip().startswith("|")]
    assert not loose, f"table lines typed by hand in docs/benchmarks.md: {loose[:3]}"


def test_the_env_overhead_page_is_its_rendering_from_the_committed_json():
    import json

    spec = importlib.util.spec_from_file_location("env_overhead", ROOT / "benchmarks" / "env_overhead.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    result = json.loads((ROOT / "benchmarks" / "results" / "env_overhead.json").read_text(encoding="utf-8"))
    page = (ROOT / "docs" / "benchmarks-env.md").read_text(encoding="utf-8")
    assert page == module.render([result]), "rerun the --render command on docs/benchmarks-env.md"


def test_a_recorded_script_command_is_shown_in_its_module_form_and_that_form_runs():
    import subprocess
    import sys

    from benchmarks._common import shown_command

    recorded = "OMP_NUM_THREADS=1 python benchmarks/real_model_eval.py --questions 16 --modes naive_rag"
    shown = shown_command(recorded)
    assert shown == "OMP_NUM_THREADS=1 python -m benchmarks.real_model_eval --questions 16 --modes naive_rag"
    assert shown_command("python studies/frugal/tiny_lm/train.py --config x.yaml") == (
        "python -m studies.frugal.tiny_lm.train --config x.yaml"
    )
    assert shown_command("searchgym eval --episodes 3") == "searchgym eval --episodes 3"
    # the shown form runs from the repository root: the module finds its siblings
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.real_model_eval", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0 and "--questions" in done.stdout, done.stderr[-2000:]
