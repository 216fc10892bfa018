"""Build a folder once and publish it atomically: the cache pattern of model folders.

A build writes into a temporary folder beside the target, marks it done, and renames it
into place, so a folder with its done-file is always complete. A build holds a lock file
beside the target (``.<name>.lock``, on POSIX; left in place, since deleting it would race
a process waiting on it), so a second process that needs the same folder waits for it
instead of building it again, and staging folders left by a build that was killed (a
signal skips the clean-up) are removed before the next one starts.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

__all__ = ["build_once"]


def build_once(
    target: Path,
    done_name: str,
    build: Callable[[Path], dict[str, Any]],
    is_current: Callable[[dict[str, Any]], bool] = lambda report: True,
) -> Path:
    """``target``, built by ``build(staging)`` unless it is finished and current.

    ``build`` fills the staging folder and returns a report, written as JSON to
    ``done_name`` (the mark of a finished folder). ``is_current`` receives a finished
    folder's report; a folder it rejects, or whose report is unreadable, is rebuilt.
    """
    if _finished(target / done_name, is_current):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with _locked(target.parent / f".{target.name}.lock"):
        if _finished(target / done_name, is_current):  # built by another process while this one waited
            return target
        if target.exists():  # outdated: moved aside, then removed with the stale staging folders
            os.replace(target, tempfile.mkdtemp(prefix=f".{target.name}.outdated.", dir=target.parent))
        for stale in target.parent.glob(f".{target.name}.*"):
            if stale.is_dir():
                shutil.rmtree(stale, ignore_errors=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
        try:
            report = build(staging)
            (staging / done_name).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
            try:
                os.replace(staging, target)
            except OSError:  # a finished folder is already there (a build without the lock)
                if not (target / done_name).is_file():
                    raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return target


def _finished(done: Path, is_current: Callable[[dict[str, Any]], bool]) -> bool:
    try:
        report = json.loads(done.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(report, dict) and is_current(report)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive ``flock`` on ``path`` while the block runs (no lock where fcntl is missing)."""
    try:
        import fcntl
    except ImportError:  # Windows: builds are not serialised
        yield
        return
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
