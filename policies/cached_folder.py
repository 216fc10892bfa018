"""Build a folder once and publish it atomically: the cache pattern of model folders.

A build writes into a temporary folder beside the target, marks it done, and renames it
into place, so a folder with its done-file is always complete; a crashed build leaves
nothing behind, and two processes building the same folder both succeed.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["build_once"]


def build_once(target: Path, done_name: str, build: Callable[[Path], dict[str, Any]]) -> Path:
    """``target``, built by ``build(staging)`` unless its ``done_name`` file exists.

    ``build`` fills the staging folder and returns a report, written as JSON to
    ``done_name`` (the mark of a finished folder).
    """
    if (target / done_name).is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        report = build(staging)
        (staging / done_name).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
        try:
            os.replace(staging, target)
        except OSError:  # another process finished the same build first
            if not (target / done_name).is_file():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target
