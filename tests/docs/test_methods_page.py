"""docs/methods.md is the one place the repository explains its methods, and it stays true.

- No file in the repository points readers at a methods digest that is not in it.
- Every ``methods.md#<heading>`` reference, in code, configs, docs or tests, names a heading
  the page has (GitHub's anchor for it).
- Every default the page's parameter tables state equals the default in the code: the line
  ``<!-- defaults: DOTTED.PATH -->`` before a table names a class, function or module, and
  each row's first cell names one of its parameters (or, for a module, an attribute), whose
  value the row's third cell gives as a Python literal.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
import subprocess
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "methods.md"
DIGEST = "PAPERS" + ".md"  # spelled in two parts so this file does not mention it
REFERENCE = re.compile(r"methods\.md#([A-Za-z0-9_-]+)")
DEFAULTS_MARKER = re.compile(r"^<!--\s*defaults:\s*([\w.]+)\s*-->\s*$")
SKIP_DIRS = {".git", ".venv", "__pycache__", ".mypy_cache", ".ruff_cache", ".pytest_cache"}


def _repository_files() -> list[Path]:
    """Tracked and new (not ignored) files of the checkout; every file when git is unavailable."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT,
            capture_output=True,
            check=True,
        ).stdout
        files = [ROOT / name for name in out.decode().split("\0") if name]
    except (OSError, subprocess.CalledProcessError):
        files = [p for p in ROOT.rglob("*") if not SKIP_DIRS.intersection(p.relative_to(ROOT).parts)]
    return [f for f in files if f.is_file()]


def _text(path: Path) -> str:
    return path.read_bytes().decode("utf-8", errors="replace")


def slug(heading: str) -> str:
    """GitHub's anchor for a Markdown heading (as in tests/docs/test_docs.py)."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def page_anchors(text: str) -> set[str]:
    """The anchors of the headings of a Markdown page (headings inside code blocks do not count)."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    return {slug(line.lstrip("#")) for line in text.splitlines() if line.startswith("#")}


def test_slug_is_githubs():
    assert slug(" LightSearcher's adaptive tool reward") == "lightsearchers-adaptive-tool-reward"
    assert slug("Light-Search: two stages (TSAS)") == "light-search-two-stages-tsas"
    assert page_anchors("# A\n```\n# not a heading\n```\n## B c\n") == {"a", "b-c"}


def test_no_file_mentions_the_digest_that_is_not_in_the_repository():
    hits = [
        f"{path.relative_to(ROOT)}:{n}"
        for path in _repository_files()
        for n, line in enumerate(_text(path).splitlines(), 1)
        if DIGEST in line
    ]
    assert not hits, (
        f"{len(hits)} lines mention {DIGEST}, which is not in the repository, so a reader cannot "
        f"follow them: {hits}. Point each at the matching section of docs/methods.md instead "
        "(e.g. docs/methods.md#lightsearcher)."
    )


def broken_references(files: list[Path], anchors: set[str]) -> list[str]:
    """``file:line: #anchor`` for each reference into the page in ``files`` whose anchor is not in ``anchors``."""
    return [
        f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}:{n}: #{anchor}"
        for path in files
        for n, line in enumerate(_text(path).splitlines(), 1)
        for anchor in REFERENCE.findall(line)
        if anchor not in anchors
    ]


def test_broken_references_are_found(tmp_path: Path):
    code = tmp_path / "scheme.py"
    wrong = "methods.md" + "#sem_rewards"  # in two parts, so this file holds no broken reference
    code.write_text(f'"""A scheme (docs/methods.md#sem-reward; see also {wrong})."""\n')
    assert broken_references([code], {"sem", "sem-reward"}) == [f"{code}:1: #sem_rewards"]


def test_every_methods_page_reference_names_a_heading_it_has():
    anchors = page_anchors(PAGE.read_text())
    broken = broken_references(_repository_files(), anchors)
    assert not broken, (
        f"References to headings docs/methods.md does not have: {broken}. Its anchors are "
        f"{sorted(anchors)}; fix the reference or the heading."
    )


def test_the_methods_are_referenced_from_the_code():
    """The page is where the code sends readers: each reward module points at its section."""
    for module, anchor in [
        ("envs/rewards/lightsearcher.py", "lightsearcher"),
        ("envs/rewards/tsas.py", "light-search"),
        ("envs/rewards/sem.py", "sem"),
        ("memory/hiexp/hierarchical.py", "hiexp"),
    ]:
        assert f"docs/methods.md#{anchor}" in (ROOT / module).read_text(), module


def _resolve(dotted: str) -> object:
    """The module, or the attribute of the longest importable module prefix, named ``dotted``."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            obj = getattr(obj, name)
        return obj
    raise ImportError(f"nothing importable in {dotted!r}")


def _code_default(target: object, name: str) -> object:
    if isinstance(target, ModuleType):
        return getattr(target, name)
    func = target.__init__ if inspect.isclass(target) else target
    params = inspect.signature(func).parameters
    if name not in params or params[name].default is inspect.Parameter.empty:
        raise KeyError(f"{name} is not a parameter with a default of {target!r}")
    return params[name].default


def defaults_tables(text: str) -> list[tuple[str, int, list[tuple[str, str]]]]:
    """Each ``(target, line, [(name, default cell)])`` of the page's marked parameter tables."""
    lines = text.splitlines()
    tables = []
    for i, line in enumerate(lines):
        marker = DEFAULTS_MARKER.match(line)
        if not marker:
            continue
        rows = []
        for row in lines[i + 1 :]:
            if not row.startswith("|"):
                break
            cells = [c.strip() for c in row.strip().strip("|").split("|")]
            if set(cells[0]) <= set("-: "):
                continue  # the separator line
            rows.append((cells[0], cells[2]))
        tables.append((marker.group(1), i + 1, rows[1:]))  # rows[0] is the header
    return tables


def test_defaults_tables_are_read_as_written():
    page = (
        "<!-- defaults: x.Y -->\n| parameter | symbol | default | meaning |\n|---|---|---|---|\n"
        "| `lam` | λ | `0.75` | decay |\n| `gate` | | `'hard'` | when |\n\nafter\n"
    )
    assert defaults_tables(page) == [("x.Y", 1, [("`lam`", "`0.75`"), ("`gate`", "`'hard'`")])]


def default_mismatches(text: str) -> list[str]:
    """Where the marked parameter tables of ``text`` disagree with the code, one line each."""
    wrong = []
    for target_name, line, rows in defaults_tables(text):
        target = _resolve(target_name)
        if not rows:
            wrong.append(f"docs/methods.md:{line}: the table for {target_name} has no rows")
        for name_cell, default_cell in rows:
            name, written = name_cell.strip("`"), default_cell.strip("`")
            try:
                actual = _code_default(target, name)
            except (KeyError, AttributeError) as exc:
                wrong.append(f"docs/methods.md:{line} {target_name}.{name}: {exc}")
                continue
            stated = ast.literal_eval(written)
            if stated != actual or type(stated) is not type(actual):
                wrong.append(
                    f"docs/methods.md:{line} {target_name}.{name}: page says {written}, code {actual!r}"
                )
    return wrong


def test_a_wrong_or_unknown_default_is_reported():
    head = "<!-- defaults: searchgym.envs.rewards.SEMReward -->\n| parameter | paper | default | meaning |\n|---|---|---|---|\n"
    assert default_mismatches(head + "| `tau` | τ | `0.8` | threshold |\n") == []
    assert default_mismatches(head + "| `tau` | τ | `0.7` | threshold |\n") == [
        "docs/methods.md:1 searchgym.envs.rewards.SEMReward.tau: page says 0.7, code 0.8"
    ]
    assert default_mismatches(head + "| `tau` | τ | `1` | threshold |\n")  # an int is not the float 1.0
    (unknown,) = default_mismatches(head + "| `theta` | τ | `0.8` | threshold |\n")
    assert "theta is not a parameter with a default" in unknown
    module = "<!-- defaults: searchgym.envs.rewards.otc -->\n| name | symbol | value | meaning |\n|---|---|---|---|\n"
    assert default_mismatches(module + "| `DEFAULT_C` | c | `1.0` | smoothing |\n") == []


def test_every_default_the_page_states_is_the_codes():
    text = PAGE.read_text()
    assert len(defaults_tables(text)) >= 6, "expected the page's parameter tables"
    wrong = default_mismatches(text)
    assert not wrong, "docs/methods.md disagrees with the code:\n" + "\n".join(wrong)


@pytest.mark.parametrize(
    "page", ["README.md", "docs/environments.md", "docs/training.md", "docs/memory.md", "docs/openrlhf.md"]
)
def test_pages_that_explain_schemes_link_the_methods_page(page: str):
    assert re.search(r"\]\((?:docs/)?methods\.md(?:#[\w-]+)?\)", (ROOT / page).read_text()), (
        f"{page} explains reward or memory schemes but does not link docs/methods.md"
    )
