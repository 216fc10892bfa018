"""Passages of a corpus file read back by byte offset, so the corpus never has to fit in memory.

A dense index maps vector row ``i`` to the ``i``-th non-blank line of a JSON Lines corpus. The
helpers here find where each of those lines starts (:func:`scan_line_offsets`, a numpy pass over
the raw bytes), identify a corpus file cheaply (:func:`file_fingerprint`), and read passages back
on demand (:class:`JsonlPassages`, one ``os.pread`` per passage, safe to share between threads).
:class:`DocListPassages` is the in-memory counterpart for a corpus given as a list of
:class:`~searchgym.retrieval.records.Doc`.
"""

from __future__ import annotations

import hashlib
import json
import os
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

from ..error import DataFileError
from .corpus import record_to_doc
from .records import Doc

__all__ = [
    "DocListPassages",
    "JsonlPassages",
    "OFFSETS_CACHE",
    "PassageStore",
    "cached_line_offsets",
    "check_line_offsets",
    "file_fingerprint",
    "iter_passages",
    "line_number_at",
    "passage_text",
    "scan_line_offsets",
    "write_docs_jsonl",
]

OFFSETS_CACHE = "corpus_offsets.i64"
"""File name of cached line offsets (see :func:`cached_line_offsets`)."""
_SCAN_BLOCK = 1 << 26  # 64 MiB per read while scanning for line starts
_FULL_HASH_LIMIT = 1 << 30  # files up to 1 GiB are hashed whole; larger ones by samples
_SAMPLES = 64
_SAMPLE_BYTES = 1 << 16
_WHITESPACE = np.array([9, 10, 13, 32], dtype=np.uint8)


def passage_text(doc: Doc) -> str:
    """The text a passage is encoded from: ``title`` and ``text`` on two lines (FlashRAG's ``contents``)."""
    return f"{doc.title}\n{doc.text}" if doc.title else doc.text


def scan_line_offsets(path: str | os.PathLike[str], *, progress: bool = False) -> np.ndarray:
    """Byte offsets of the non-blank lines of ``path``, plus the file size as a last entry.

    Entry ``i`` is where the ``i``-th non-blank line starts; line ``i`` ends before entry
    ``i + 1``. Blank (whitespace-only) lines are skipped, as :func:`searchgym.retrieval.corpus.read_jsonl`
    skips them, so row numbers agree with the loaders. Runs in blocks of 64 MiB, so memory stays
    flat for any file size (8 bytes per line for the result).

    Raises:
        DataFileError: The file is missing, unreadable, or holds no non-blank line.
    """
    path = Path(path)
    try:
        size = path.stat().st_size
        handle = path.open("rb")
    except OSError as exc:
        raise DataFileError(f"Cannot read the corpus file {str(path)!r}: {exc}.") from exc
    parts: list[np.ndarray] = []
    bar = _bar(progress, size, f"scanning {path.name}", unit="B")
    with handle:
        base, carry = 0, b""  # base: file offset of carry[0]
        while True:
            block = handle.read(_SCAN_BLOCK)
            data = carry + block
            if not data:
                break
            end = data.rfind(b"\n") + 1 if block else len(data)  # at EOF the last line needs no newline
            if end:
                parts.append(base + _nonblank_starts(np.frombuffer(data, np.uint8, count=end)))
            base, carry = base + end, data[end:]
            if bar is not None:
                bar.update(len(block))
            if not block:
                break
    if bar is not None:
        bar.close()
    starts = np.concatenate(parts) if parts else np.empty(0, np.int64)
    if starts.size == 0:
        raise DataFileError(f"The corpus file {str(path)!r} is empty: it holds no passages.")
    return np.append(starts.astype(np.int64), np.int64(size))


def _nonblank_starts(buf: np.ndarray) -> np.ndarray:
    """Starts of the lines in ``buf`` (whole lines) that hold a non-whitespace byte.

    A line that starts with a non-whitespace byte (every JSON object line does) is kept at once;
    only lines that start with whitespace, rare in a corpus, are checked byte by byte.
    """
    newlines = np.flatnonzero(buf == 10)
    starts = np.concatenate(([0], newlines + 1))
    ends = np.concatenate((newlines, [buf.size]))
    keep = starts < ends  # drops empty lines and the empty tail after a final newline
    starts, ends = starts[keep], ends[keep]
    doubtful = np.flatnonzero(np.isin(buf[starts], _WHITESPACE))
    if doubtful.size:
        blank = [not buf[starts[i] : ends[i]].tobytes().strip() for i in doubtful]
        starts = np.delete(starts, doubtful[np.array(blank, dtype=bool)])
    return starts.astype(np.int64)


def cached_line_offsets(corpus: Path, cache_dir: str | os.PathLike[str] | None) -> np.ndarray:
    """Line offsets of ``corpus``, cached in ``cache_dir`` (keyed by the corpus fingerprint) when given."""
    if not corpus.is_file():
        raise DataFileError(f"The corpus file {str(corpus)!r} does not exist (or is a directory).")
    if cache_dir is None:
        return scan_line_offsets(corpus)
    cache = Path(cache_dir)
    cache.mkdir(parents=True, exist_ok=True)
    tag_path, fingerprint = cache / (OFFSETS_CACHE + ".json"), file_fingerprint(corpus)
    try:
        if json.loads(tag_path.read_text(encoding="utf-8")) == fingerprint:
            return np.memmap(cache / OFFSETS_CACHE, dtype=np.int64, mode="r")
    except (OSError, ValueError):
        pass
    offsets = scan_line_offsets(corpus, progress=True)
    offsets.tofile(cache / OFFSETS_CACHE)
    tag_path.write_text(json.dumps(fingerprint), encoding="utf-8")
    return offsets


def write_docs_jsonl(docs: Sequence[Doc], path: Path) -> None:
    """Write ``docs`` as JSON Lines to ``path`` unless it already holds exactly these bytes."""
    data = "".join(json.dumps({"id": d.id, "title": d.title, "text": d.text}) + "\n" for d in docs).encode()
    if path.is_file() and path.stat().st_size == len(data) and path.read_bytes() == data:
        return
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    tmp.replace(path)


def line_number_at(path: str | os.PathLike[str], offset: int) -> int:
    """The 1-based line number of the byte ``offset`` of ``path`` (for error messages only)."""
    count, done = 1, 0
    with Path(path).open("rb") as handle:
        while done < offset:
            block = handle.read(min(_SCAN_BLOCK, offset - done))
            if not block:
                break
            count += block.count(b"\n")
            done += len(block)
    return count


def check_line_offsets(offsets: np.ndarray, corpus: Path, offsets_path: Path) -> None:
    """Check that ``offsets`` (from ``offsets_path``) can be line starts of ``corpus``: they rise
    from 0 or more and end at the corpus size. Reads the offsets in blocks (no n-sized copy).

    Raises:
        DataFileError: Naming ``offsets_path``, when they cannot be.
    """
    size = corpus.stat().st_size
    block = 1 << 20
    problem = None
    if len(offsets) < 2 or offsets[0] < 0 or int(offsets[-1]) != size:
        problem = f"its last offset is not the corpus size {size}" if len(offsets) >= 2 else "it is too short"
    else:
        for start in range(0, len(offsets) - 1, block):
            part = np.asarray(offsets[start : start + block + 1])
            if np.any(part[1:] <= part[:-1]):
                problem = f"its offsets do not rise near row {start}"
                break
    if problem is not None:
        raise DataFileError(
            f"The offsets file {str(offsets_path)!r} does not hold the line starts of {str(corpus)!r}: {problem}. "
            "It is damaged: delete the index directory and build it again."
        )


def file_fingerprint(path: str | os.PathLike[str]) -> dict[str, object]:
    """Size and SHA-256 of ``path``: of the whole file up to 1 GiB, else of 64 evenly spaced 64 KiB blocks.

    Sampling keeps loading a 13 GB Wikipedia corpus fast; it detects a replaced, truncated or
    extended file, and an edit that changes line lengths is caught when a passage fails to parse.
    """
    path = Path(path)
    size = path.stat().st_size
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        if size <= _FULL_HASH_LIMIT:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
            return {"size": size, "sha256": digest.hexdigest(), "sampled": False}
        for i in range(_SAMPLES):
            handle.seek((size - _SAMPLE_BYTES) * i // (_SAMPLES - 1))
            digest.update(handle.read(_SAMPLE_BYTES))
    return {"size": size, "sha256": digest.hexdigest(), "sampled": True}


def _parse(path: Path, raw: bytes, row: int, offset: int) -> Doc:
    line = raw.split(b"\n", 1)[0]
    try:
        record = json.loads(line.decode("utf-8"))
        if not isinstance(record, dict):
            raise ValueError(f"a JSON {type(record).__name__}, not an object")
    except (UnicodeDecodeError, ValueError) as exc:
        raise DataFileError(
            f"{path}:{line_number_at(path, offset)}: passage row {row} is not a JSON object ({exc}). If the corpus "
            "changed after the index was built, rebuild the index."
        ) from exc
    try:
        return record_to_doc(record, path, 0)
    except DataFileError:  # raise again, now with the real line number (costly, so only on failure)
        return record_to_doc(record, path, line_number_at(path, offset))


def iter_passages(path: str | os.PathLike[str], offsets: np.ndarray, start: int, stop: int) -> Iterator[Doc]:
    """The passages of rows ``start`` to ``stop - 1``, read sequentially from ``path``.

    Raises:
        DataFileError: A line is not a JSON object or lacks the corpus fields (the message names
            the file and line).
    """
    path = Path(path)
    with path.open("rb") as handle:
        handle.seek(int(offsets[start]))
        for row in range(start, stop):
            raw = handle.read(int(offsets[row + 1] - offsets[row]))
            yield _parse(path, raw, row, int(offsets[row]))


class PassageStore(ABC):
    """Passages by row number: what a vector index's row ``i`` stands for."""

    @abstractmethod
    def __len__(self) -> int:
        """Number of passages."""

    @abstractmethod
    def get(self, row: int) -> Doc:
        """The passage of ``row`` (0-based)."""

    def get_many(self, rows: Sequence[int]) -> list[Doc]:
        """The passages of ``rows``, in order."""
        return [self.get(int(r)) for r in rows]


class DocListPassages(PassageStore):
    """Passages held in memory."""

    def __init__(self, docs: Sequence[Doc]) -> None:
        self.docs = list(docs)

    def __len__(self) -> int:
        return len(self.docs)

    def get(self, row: int) -> Doc:
        return self.docs[row]


class JsonlPassages(PassageStore):
    """Passages read on demand from a JSON Lines corpus at known byte offsets.

    Args:
        path: The corpus file.
        offsets: ``n + 1`` int64 offsets from :func:`scan_line_offsets` (a memory map is fine).
    """

    def __init__(self, path: str | os.PathLike[str], offsets: np.ndarray) -> None:
        self.path = Path(path)
        self.offsets = offsets
        self._fd = -1
        try:
            self._fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_BINARY", 0))
        except OSError as exc:
            raise DataFileError(f"Cannot open the corpus file {str(self.path)!r}: {exc}.") from exc

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def get(self, row: int) -> Doc:
        start, end = int(self.offsets[row]), int(self.offsets[row + 1])
        raw = os.pread(self._fd, end - start, start) if hasattr(os, "pread") else self._read(start, end)
        return _parse(self.path, raw, row, start)

    def _read(self, start: int, end: int) -> bytes:  # pragma: no cover - platforms without pread
        with self.path.open("rb") as handle:
            handle.seek(start)
            return handle.read(end - start)

    def close(self) -> None:
        """Close the file descriptor (also done when the store is garbage-collected)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __del__(self) -> None:
        try:
            self.close()
        except OSError:
            pass


def _bar(enabled: bool, total: int, desc: str, unit: str = "it"):  # noqa: ANN202 - tqdm or None
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit=unit, unit_scale=unit == "B", dynamic_ncols=True)
