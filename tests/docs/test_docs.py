"""Every runnable code block of README.md and docs/*.md runs as written.

Each page gets a fresh copy of the checkout's tracked files in a temporary folder, with
``../shared`` beside it (as on a reader's machine), and its ```python, ```bash, ```sh and
```console blocks run there in order, so a later block may use an earlier block's output.
``.venv/bin/`` in the copy holds the commands of the environment running the tests, so
``.venv/bin/searchgym`` works as written. The line directly before a block may say:

- ``<!-- docs-test: skip REASON -->``: not run (installs, GPU launches, hour-long runs);
- ``<!-- docs-test: dry-run -->``: run with ``--dry-run`` added to each ``searchgym train``
  and ``python`` command and ``DRY_RUN=1`` set (the recipes' dry-run mode);
- ``<!-- docs-test: output -->`` (before a ```text block): the output the page shows; each of
  its lines must be a line of what the last block run before it printed.

A Python block whose last line is ``print(...)  # TEXT`` must print TEXT as its last line.
Output blocks (```text and unlabelled ones) are never run. A page's commands must leave
no file in the checkout that ``.gitignore`` does not cover, and change no tracked file.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT.parent / "shared"
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])
RUNNABLE = {"python", "bash", "sh", "console"}
MARKER = re.compile(r"<!--\s*docs-test:\s*(skip|dry-run|output)\b\s*(.*?)\s*-->")
PRINTED = re.compile(r"^print\(.*\)\s+#\s*(.+)$")
FENCE = re.compile(r"^(`{3,})\s*([\w+-]*)")
BLOCK_TIMEOUT_S = 600
COMMANDS = ("python", "python3", "searchgym", "pytest")  # never pip: a block must not install
# Files a page's blocks write that must equal a committed file (the output the page shows).
SAME_AS_COMMITTED = {
    "README.md": [("runs/quickstart/results.json", "studies/frugal/quickstart/results.json")],
}


@dataclass(frozen=True)
class Block:
    page: str
    line: int  # of the opening fence, 1-based
    language: str
    code: str
    mode: str  # "run", "skip" or "dry-run"
    reason: str = ""

    def where(self) -> str:
        return f"{self.page}:{self.line} ({self.language} block)"


def collect(text: str, page: str) -> list[Block]:
    """The fenced blocks of a Markdown page, with the docs-test marker before each."""
    blocks: list[Block] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        fence = FENCE.match(lines[i])
        if not fence:
            i += 1
            continue
        start, ticks, language = i, fence.group(1), fence.group(2).lower()
        i += 1
        body = []
        while i < len(lines) and not lines[i].startswith(ticks):
            body.append(lines[i])
            i += 1
        i += 1
        before = next((lines[j] for j in range(start - 1, -1, -1) if lines[j].strip()), "")
        marker = MARKER.search(before)
        mode, reason = (marker.group(1), marker.group(2)) if marker else ("run", "")
        if mode == "skip" and not reason:
            raise ValueError(f"{page}:{start + 1}: a docs-test skip marker needs a reason")
        blocks.append(Block(page, start + 1, language, "\n".join(body) + "\n", mode, reason))
    return blocks


def _logical_lines(code: str) -> list[str]:
    out: list[str] = []
    for line in code.splitlines():
        if out and out[-1].endswith("\\"):
            out[-1] = out[-1][:-1].rstrip() + " " + line.strip()
        else:
            out.append(line)
    return out


def as_dry_run(code: str) -> str:
    """The block with ``--dry-run`` added to each ``searchgym train`` and ``python`` command."""
    lines = []
    for line in _logical_lines(code):
        if re.match(r"\s*(searchgym train|python3? )", line) and "--dry-run" not in line:
            command, hash_, comment = line.partition("  #")
            line = command.rstrip() + " --dry-run" + (f"  #{comment}" if hash_ else "")
        lines.append(line)
    return "\n".join(lines) + "\n"


def script(block: Block) -> str:
    """The shell or Python source that runs the block."""
    code = block.code
    if block.language == "console":
        code = "\n".join(line[2:] for line in code.splitlines() if line.startswith("$ ")) + "\n"
    if block.mode == "dry-run":
        code = as_dry_run(code)
    return code


def _checkout(tmp: Path) -> Path:
    """A plain copy of the tracked files at ``tmp/searchgym`` with ``tmp/shared`` beside it."""
    tracked = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.decode()
    copy = tmp / "searchgym"
    for name in filter(None, tracked.split("\0")):
        source = ROOT / name
        if source.is_file():
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, copy / name)
    (tmp / "shared").symlink_to(SHARED, target_is_directory=True)
    bin_dir = copy / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    here = Path(sys.executable).parent
    for name in COMMANDS:
        target = sys.executable if name.startswith("python") else here / name
        wrapper = bin_dir / name
        wrapper.write_text(f'#!/bin/sh\nexec "{target}" "$@"\n')
        wrapper.chmod(0o755)
    return copy


def _digests(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in folder.rglob("*")
        if p.is_file() and ".venv" not in p.relative_to(folder).parts
    }


def _not_ignored(paths: list[str]) -> list[str]:
    """The paths (relative to the checkout) that the checkout's .gitignore does not cover."""
    if not paths:
        return []
    ignored = subprocess.run(
        ["git", "check-ignore", "--no-index", "--stdin"],
        cwd=ROOT,
        input="\n".join(paths) + "\n",
        capture_output=True,
        text=True,
    ).stdout.split("\n")
    return sorted(set(paths) - set(ignored))


def _run(block: Block, copy: Path, env: dict[str, str]) -> str:
    code = script(block)
    if block.language == "python":
        command = [sys.executable, "-c", code]
    else:
        command = ["bash", "-e", "-o", "pipefail", "-c", code]
    if block.mode == "dry-run":
        env = {**env, "DRY_RUN": "1"}
    # Output goes to files, not pipes, and the block runs in its own process group: a server
    # a block left running is stopped here and cannot hold the test open.
    with open(copy.parent / "stdout", "w+") as out, open(copy.parent / "stderr", "w+") as err:
        process = subprocess.Popen(command, cwd=copy, env=env, stdout=out, stderr=err, start_new_session=True)
        try:
            returncode = process.wait(timeout=BLOCK_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            returncode = None
        finally:
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            process.wait()
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    if returncode is None:
        pytest.fail(f"{block.where()} ran past {BLOCK_TIMEOUT_S} s:\n{code}")
    if returncode != 0:
        pytest.fail(
            f"{block.where()} exited {returncode}:\n{code}\n"
            f"--- stdout (last 3000 chars) ---\n{stdout[-3000:]}\n"
            f"--- stderr (last 3000 chars) ---\n{stderr[-3000:]}"
        )
    return stdout


def check_output(block: Block, stdout: str) -> None:
    """The block's promised output: a ``print(...)  # TEXT`` last line, or a following output block."""
    printed = stdout.strip().splitlines()
    last = PRINTED.match(block.code.strip().splitlines()[-1]) if block.language == "python" else None
    if last and (not printed or printed[-1].strip() != last.group(1).strip()):
        pytest.fail(f"{block.where()} promises {last.group(1)!r}, printed {printed[-1:]!r}")


def _table(text: str) -> list[dict[str, str]]:
    """The rows of the first Markdown table in ``text``, as {column: cell}."""
    lines = [line for line in text.splitlines() if line.startswith("|")]
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    return [
        dict(zip(header, (c.strip() for c in line.strip("|").split("|")), strict=True)) for line in lines[2:]
    ]


def check_eval_table(page_text: str, block: Block, stdout: str) -> None:
    """A Markdown table right after an eval block holds the printed rows (split ``all``), column by column."""
    after = page_text.split(block.code, 1)[1].split("```", 2)[1]  # past the block's closing fence
    if "| Policy |" not in after:
        return
    printed = {row["Policy"]: row for row in _table(stdout) if row.get("Split", "all") == "all"}
    for row in _table(after[after.index("| Policy |") :]):
        got = printed.get(row["Policy"])
        assert got is not None, f"{block.where()}: no printed row for {row['Policy']}"
        differ = {k: (v, got[k]) for k, v in row.items() if got[k] != v}
        assert not differ, (
            f"{block.where()}: the page's {row['Policy']} row differs from the output: {differ}"
        )


def check_shown_output(shown: Block, ran: Block, stdout: str) -> None:
    lines = {line.rstrip() for line in stdout.splitlines()}
    missing = [line for line in shown.code.splitlines() if line.strip() and line.rstrip() not in lines]
    if missing:
        pytest.fail(f"{shown.where()} shows lines that {ran.where()} did not print: {missing[:5]}")


# -- the collector itself --------------------------------------------------------------------


def test_collect_reads_languages_markers_and_lines():
    page = "\n".join(
        [
            "# Title",  # 1
            "```bash",  # 2
            "echo run",
            "```",
            "<!-- docs-test: skip installs packages -->",  # 5
            "```bash",  # 6
            "pip install x",
            "```",
            "<!-- docs-test: dry-run -->",
            "",
            "```sh",  # 11
            "searchgym train --config c.yaml \\",
            "  --backend openrlhf  # launch",
            "```",
            "```text",  # 15
            "output",
            "```",
        ]
    )
    blocks = collect(page, "page.md")
    assert [(b.line, b.language, b.mode) for b in blocks] == [
        (2, "bash", "run"),
        (6, "bash", "skip"),
        (11, "sh", "dry-run"),
        (15, "text", "run"),
    ]
    assert blocks[1].reason == "installs packages"
    assert script(blocks[2]) == "searchgym train --config c.yaml --backend openrlhf --dry-run  # launch\n"
    shown = collect("<!-- docs-test: output -->\n```text\n| a |\n```\n", "page.md")[0]
    assert shown.mode == "output"
    check_shown_output(shown, blocks[0], "x\n| a |\n")
    with pytest.raises(pytest.fail.Exception, match="did not print"):
        check_shown_output(shown, blocks[0], "| b |\n")
    promise = Block("page.md", 1, "python", "x = 1\nprint(x)  # 1\n", "run")
    check_output(promise, "noise\n1\n")
    with pytest.raises(pytest.fail.Exception, match="promises '1', printed \\['0.0'\\]"):
        check_output(promise, "0.0\n")
    with pytest.raises(ValueError, match="page.md:2: .* needs a reason"):
        collect("<!-- docs-test: skip -->\n```bash\nls\n```\n", "page.md")


def test_every_page_has_blocks_to_run():
    runnable = [b for p in PAGES for b in collect(p.read_text(), p.name) if b.language in RUNNABLE]
    assert sum(b.mode != "skip" for b in runnable) >= 10, "the docs test would run almost nothing"


# -- the pages -------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_page_blocks_run_as_written(page: Path, tmp_path: Path):
    blocks = collect(page.read_text(), str(page.relative_to(ROOT)))
    to_run = [b for b in blocks if b.language in RUNNABLE and b.mode != "skip"]
    if not to_run:
        pytest.skip(f"{page.name}: no block to run")
    if not (SHARED / "data").is_dir():
        pytest.skip(f"the docs' examples read ../shared/data beside the checkout; {SHARED} is absent")
    copy = _checkout(tmp_path)
    before = _digests(copy)
    env = {
        **os.environ,
        "PATH": f"{copy / '.venv' / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
    }
    last: tuple[Block, str] | None = None
    for block in blocks:
        if block.mode == "output":
            assert last is not None, f"{block.where()}: an output block needs a block run before it"
            check_shown_output(block, *last)
        elif block in to_run:
            stdout = _run(block, copy, env)
            check_output(block, stdout)
            if block.code.startswith("searchgym eval"):
                check_eval_table(page.read_text(), block, stdout)
            last = (block, stdout)
    after = _digests(copy)
    changed = sorted(name for name in before if after.get(name) != before[name])
    assert not changed, f"{page.name}'s blocks changed tracked files: {changed}"
    left = _not_ignored(sorted(set(after) - set(before)))
    assert not left, f"{page.name}'s blocks left files that .gitignore does not cover: {left[:20]}"
    for written, committed in SAME_AS_COMMITTED.get(str(page.relative_to(ROOT)), []):
        assert (copy / written).read_text() == (ROOT / committed).read_text(), (
            f"{page.name}: {written} differs from the committed {committed}, whose table the page shows"
        )


def test_readme_quick_start_table_is_the_committed_one():
    """The README shows the quick start's printed table as generated from the committed results."""
    import json

    from studies.frugal.report import render_summary

    results = json.loads((ROOT / "studies" / "frugal" / "quickstart" / "results.json").read_text())
    readme = ROOT.joinpath("README.md").read_text()
    assert render_summary(results) in readme


def test_eval_table_check_compares_the_all_rows():
    block = Block("page.md", 1, "bash", "searchgym eval --episodes 3\n", "run")
    printed = (
        "| Policy | Split | N | EM | Reward | Time (s) |\n|---|---|---|---|---|---|\n"
        "| direct | all | 3 | 33.33 | 0.33 | 0.01 |\n| direct | known | 1 | 100.00 | 1.00 |  |\n"
    )
    page = "```bash\nsearchgym eval --episodes 3\n```\n\n| Policy | N | EM |\n|---|---|---|\n| direct | 3 | {} |\n"
    check_eval_table(page.format("33.33"), block, printed)
    with pytest.raises(AssertionError, match="direct row differs"):
        check_eval_table(page.format("100.00"), block, printed)


LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _slug(heading: str) -> str:
    """GitHub's anchor for a Markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return {_slug(line.lstrip("#")) for line in text.splitlines() if line.startswith("#")}


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_links_point_at_files_and_headings_that_exist(page: Path):
    broken = []
    for target in LINK.findall(re.sub(r"```.*?```", "", page.read_text(), flags=re.S)):
        if re.match(r"[a-z]+:", target):
            continue  # http(s), mailto
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(
                f"{target} (no file {file.relative_to(ROOT) if file.is_relative_to(ROOT) else file})"
            )
        elif anchor and file.suffix == ".md" and anchor not in _anchors(file):
            broken.append(f"{target} (no heading #{anchor} in {file.name})")
    assert not broken, f"{page.relative_to(ROOT)}: broken links: {broken}"
