"""Shared fixtures: the real benchmark samples in ../shared/data beside the checkout."""

from __future__ import annotations

from pathlib import Path

import pytest

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The ``../shared/data`` folder; tests that need it skip when it is absent."""
    if not (SHARED_DATA / "corpus.jsonl").is_file():
        pytest.skip(f"real benchmark samples not found at {SHARED_DATA}")
    return SHARED_DATA
