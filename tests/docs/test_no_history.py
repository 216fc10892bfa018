"""Docs and docstrings say what is true now; history lives in git, study results in the studies.

Each pattern below is a way a page or a docstring narrates the project's past (a commit to
compare with, an issue to read, "before, ...") or a library module quotes a study. A hit
names the file and line, so the sentence can be rewritten to say what holds now.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LIBRARY = ("envs", "memory", "policies", "trainers", "configs", "searchgym")

HISTORY = {
    "a commit to compare with": re.compile(r"\bat (an earlier |the )?commit\b|\bat `[0-9a-f]{7,40}`", re.I),
    "an issue to read": re.compile(r"\b(see|as) the (\w+ )?issue\b", re.I),
    "a narrated past": re.compile(
        r"(^|[.:] )Before, |\b[Pp]reviously\b|\bused to (be|run|read|write|take)\b"
    ),
    "a section of the studies overview that it does not have": re.compile(r"docs/study\.md,? \*"),
    "a pointer to a notebook in git history": re.compile(r"in git history|\bgit show\b"),
}
STUDY_IN_LIBRARY = re.compile(r"tiny-LM study|\bCPU study\b|studies/frugal/tiny_lm", re.I)


def _pages() -> list[Path]:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    pages += sorted((ROOT / "studies").rglob("*.md")) + sorted((ROOT / "benchmarks").glob("*.md"))
    return [p for p in pages if "results" not in p.relative_to(ROOT).parts]


def _sources() -> list[Path]:
    files = [p for folder in LIBRARY for p in sorted((ROOT / folder).rglob("*.py"))]
    files += sorted((ROOT / "studies").rglob("*.py")) + sorted((ROOT / "studies").rglob("*.yaml"))
    return files + sorted((ROOT / "benchmarks").glob("*.py"))


def _hits(paths: list[Path], patterns: dict[str, re.Pattern[str]]) -> list[str]:
    found = []
    for path in paths:
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for what, pattern in patterns.items():
                if pattern.search(line):
                    found.append(f"{path.relative_to(ROOT)}:{number}: {what}: {line.strip()[:120]}")
    return found


def test_the_patterns_catch_what_they_are_for():
    # each pattern against a sentence it must catch and one it must leave alone
    assert HISTORY["a commit to compare with"].search("runs the script at an earlier commit")
    assert HISTORY["a commit to compare with"].search("| CPU s at `dea8e1d` |")
    assert not HISTORY["a commit to compare with"].search("--base dea8e1d --questions 16")
    assert HISTORY["an issue to read"].search("Trainers: see the trainers issue.")
    assert not HISTORY["an issue to read"].search("a tracker issue number in a URL field")
    assert HISTORY["a narrated past"].search("Before, episodes ran a batch at a time")
    assert not HISTORY["a narrated past"].search("before any forward pass")
    assert HISTORY["a section of the studies overview that it does not have"].search(
        "docs/study.md, *Warm start*"
    )
    assert STUDY_IN_LIBRARY.search("eval: belongs to the tiny-LM study; run it")


@pytest.mark.parametrize("kind", ["pages", "sources"])
def test_no_history_narration(kind):
    paths = _pages() if kind == "pages" else _sources()
    assert _hits(paths, HISTORY) == []


def test_the_library_quotes_no_study():
    library = [p for folder in LIBRARY for p in sorted((ROOT / folder).rglob("*.py"))]
    assert _hits(library, {"a study named in the library": STUDY_IN_LIBRARY}) == []
