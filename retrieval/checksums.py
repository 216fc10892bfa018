"""Checksums of index files: recorded when an index is built, verified when it is loaded.

A saved index records the size and SHA-256 digest of each of its files in its metadata
(``"files": {name: {"bytes": n, "sha256": hex}}``). Loading checks every size, always, and
every digest when the files together hold at most :data:`VERIFY_AUTO_BYTES` (hashing reads
them once, at disk speed); a larger index checks digests on request (``verify=True``). A
file that is missing, of another size or with another digest is a
:class:`~searchgym.error.DataFileError` that names it.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ..error import DataFileError

__all__ = ["VERIFY_AUTO_BYTES", "file_checksums", "verify_checksums"]

log = logging.getLogger("searchgym.retrieval")

VERIFY_AUTO_BYTES = 4 << 30
"""Largest index (all its recorded files together, in bytes) whose digests are verified by default."""


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def file_checksums(directory: Path, names: Iterable[str]) -> dict[str, dict[str, Any]]:
    """``{name: {"bytes": size, "sha256": hex digest}}`` of the files ``names`` in ``directory``."""
    return {
        name: {"bytes": (directory / name).stat().st_size, "sha256": _sha256(directory / name)}
        for name in sorted(names)
    }


def verify_checksums(
    directory: Path, recorded: object, *, verify: bool | None = None, rebuild: str = "rebuild the index"
) -> None:
    """Check the files of ``directory`` against their ``recorded`` sizes and digests.

    Args:
        directory: The index directory.
        recorded: The ``"files"`` entry of the index's metadata (None: an index saved before
            checksums were recorded, which is not checked).
        verify: True hashes every file, False checks sizes only, None hashes when the files
            hold at most :data:`VERIFY_AUTO_BYTES` together.
        rebuild: How to fix a damaged index, for the error message.

    Raises:
        DataFileError: A file is missing, or its size or digest is not the recorded one.
    """
    if recorded is None:
        return
    if not isinstance(recorded, Mapping) or not all(
        isinstance(entry, Mapping)
        and isinstance(entry.get("bytes"), int)
        and isinstance(entry.get("sha256"), str)
        for entry in recorded.values()
    ):
        raise DataFileError(
            f"The checksums recorded for the index in {str(directory)!r} are malformed; {rebuild}."
        )
    for name, entry in recorded.items():
        path = directory / name
        size = path.stat().st_size if path.is_file() else None
        if size is None:
            raise DataFileError(f"The index file {str(path)!r} is missing; {rebuild}.")
        if size != entry["bytes"]:
            raise DataFileError(
                f"The index file {str(path)!r} holds {size} bytes, not the {entry['bytes']} recorded when the "
                f"index was built: the file is corrupt; {rebuild}."
            )
    total = sum(int(entry["bytes"]) for entry in recorded.values())
    if verify is None:
        verify = total <= VERIFY_AUTO_BYTES
        if not verify:
            log.info(
                "index in %s: %.1f GB, sizes checked; pass verify=True to check its SHA-256 digests too",
                directory,
                total / 1e9,
            )
    if not verify:
        return
    for name, entry in recorded.items():
        if _sha256(directory / name) != entry["sha256"]:
            raise DataFileError(
                f"The index file {str(directory / name)!r} does not match the SHA-256 digest recorded when the "
                f"index was built: the file is corrupt; {rebuild}."
            )
