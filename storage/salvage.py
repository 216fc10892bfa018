"""Read a store's rows straight from the pages of a damaged database and its WAL: :func:`salvage`.

SQLite's own ``.recover`` lives in its command-line shell, not in Python's ``sqlite3``. This
module does what it does for the two tables a store cannot lose, ``records`` and
``snapshots``: it reads every page of the database file and every intact frame of its
write-ahead log, and decodes the rows of each table leaf page it finds, following overflow
chains. No b-tree above a leaf is needed, so a file cut short, or an interior page
overwritten, loses only the leaves that are gone.

Which version of a page counts:

- A WAL frame counts when its salts are the log's and its checksum is right given the
  frame before it (SQLite chains the checksums; this checks each frame on its own, so the
  frames after a damaged one still count, where SQLite stops at the first bad one), and a
  committed transaction ends at or after it.
- Of the versions of one page, the newest that decodes counts; pages on the free list
  (as the newest page 1 gives it) are skipped, so deleted rows do not come back.

A row of ``records`` is told apart by its shape: three columns, the first ``NULL`` (the id
is the row id), the second text. A row of ``snapshots`` has three numbers.
"""

from __future__ import annotations

import mmap
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field

__all__ = ["Salvage", "salvage"]

_HEADER = b"SQLite format 3\x00"
_WAL_MAGIC = (0x377F0682, 0x377F0683)
_LEAF_TABLE = 0x0D


@dataclass
class Salvage:
    """The rows read from the pages of one database (and its WAL)."""

    records: dict[int, tuple[int, str, str | None]] = field(default_factory=dict)
    """``id -> (id, body, key)`` of each row of ``records`` found."""
    snapshots: list[tuple[int, int, float]] = field(default_factory=list)
    """``(step, last_id, time)`` of each row of ``snapshots``, in row order."""
    wal_frames: int = 0
    """WAL frames that counted."""
    wal_damaged: int = 0
    """WAL frames with the log's salts whose checksum was wrong."""


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value = 0
    for i in range(8):
        byte = data[at + i]
        value = (value << 7) | (byte & 0x7F)
        if byte < 0x80:
            return value, at + i + 1
    return (value << 8) | data[at + 8], at + 9


def _columns(payload: bytes) -> list[object] | None:
    """The values of one record (SQLite's record format), or ``None`` when it does not decode."""
    try:
        size, at = _varint(payload, 0)
        types = []
        while at < size:
            serial, at = _varint(payload, at)
            types.append(serial)
        at = size
        values: list[object] = []
        for serial in types:
            if serial == 0:
                values.append(None)
            elif serial in (8, 9):
                values.append(serial - 8)
            elif 1 <= serial <= 6:
                width = (1, 2, 3, 4, 6, 8)[serial - 1]
                values.append(int.from_bytes(payload[at : at + width], "big", signed=True))
                at += width
            elif serial == 7:
                values.append(struct.unpack(">d", payload[at : at + 8])[0])
                at += 8
            elif serial >= 12:
                width = (serial - 12) // 2
                chunk = payload[at : at + width]
                if len(chunk) != width:
                    return None
                values.append(chunk.decode("utf-8") if serial % 2 else bytes(chunk))
                at += width
            else:
                return None
        return values if at <= len(payload) else None
    except (IndexError, UnicodeDecodeError, struct.error):
        return None


class _Pages:
    """The newest counting version of each page of a database and its WAL."""

    def __init__(self, path: str, wal_paths: list[str]):
        self.main = _mapped(path)
        self.size = 4096
        self.reserved = 0
        if len(self.main) >= 100 and self.main[:16] == _HEADER:
            raw = int.from_bytes(self.main[16:18], "big")
            size = 65536 if raw == 1 else raw
            if size >= 512 and size & (size - 1) == 0:
                self.size = size
            self.reserved = self.main[20]
        self.wal: dict[int, list[bytes]] = {}
        self.frames = self.damaged = 0
        for wal in wal_paths:
            if os.path.exists(wal):
                self._read_wal(wal)

    def _read_wal(self, path: str) -> None:
        data = _mapped(path)
        if len(data) < 32:
            return
        magic, _, size = struct.unpack(">III", data[:12])
        if magic in _WAL_MAGIC and size == self.size:
            salts = data[16:24]
            order = ">" if magic & 1 else "<"
        else:  # a damaged header: the salts most frames carry, the byte order of this machine
            counts: dict[bytes, int] = {}
            for at in range(32, len(data) - 24, 24 + self.size):
                counts[data[at + 8 : at + 16]] = counts.get(data[at + 8 : at + 16], 0) + 1
            if not counts:
                return
            salts, order = max(counts, key=counts.__getitem__), "<"
        step = 24 + self.size
        pending: list[tuple[int, bytes]] = []
        previous = data[24:32]
        for at in range(32, len(data) - step + 1, step):
            header, page = data[at : at + 24], data[at + 24 : at + step]
            intact = header[8:16] == salts and header[16:24] == _checksum(previous, header[:8] + page, order)
            previous = header[16:24]
            if header[8:16] != salts:
                continue
            if not intact:
                self.damaged += 1
                continue
            pending.append((int.from_bytes(header[:4], "big"), page))
            if int.from_bytes(header[4:8], "big"):  # a commit frame: its transaction counts
                for number, content in pending:
                    self.wal.setdefault(number, []).append(content)
                self.frames += len(pending)
                pending = []

    def versions(self, number: int) -> list[bytes]:
        """The versions of page ``number``, newest first."""
        found = list(reversed(self.wal.get(number, [])))
        start = (number - 1) * self.size
        if start < len(self.main):
            found.append(self.main[start : start + self.size])
        return found

    def count(self) -> int:
        return max(len(self.main) // self.size + (len(self.main) % self.size > 0), max(self.wal, default=0))

    def newest(self, number: int) -> bytes | None:
        found = self.versions(number)
        return found[0] if found else None


def _mapped(path: str) -> bytes | mmap.mmap:
    """The file's bytes, mapped rather than read (a store can be larger than memory)."""
    with open(path, "rb") as handle:
        if os.fstat(handle.fileno()).st_size == 0:
            return b""
        return mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)


def _checksum(previous: bytes, data: bytes, order: str) -> bytes:
    """SQLite's WAL checksum of ``data``, continuing from the 8-byte ``previous``."""
    s0, s1 = struct.unpack(">II", previous)
    words = struct.unpack(f"{order}{len(data) // 4}I", data[: len(data) // 4 * 4])
    for i in range(0, len(words) - 1, 2):
        s0 = (s0 + words[i] + s1) & 0xFFFFFFFF
        s1 = (s1 + words[i + 1] + s0) & 0xFFFFFFFF
    return struct.pack(">II", s0, s1)


def _freelist(pages: _Pages) -> set[int]:
    """The pages on the free list, as far as the newest page 1 and trunk pages tell."""
    first = pages.newest(1)
    free: set[int] = set()
    if first is None or not first.startswith(_HEADER):
        return free
    trunk = int.from_bytes(first[32:36], "big")
    while trunk and trunk not in free and trunk <= pages.count():
        free.add(trunk)
        page = pages.newest(trunk)
        if page is None:
            break
        count = int.from_bytes(page[4:8], "big")
        if count > (pages.size - 8) // 4:
            break
        free.update(int.from_bytes(page[8 + 4 * i : 12 + 4 * i], "big") for i in range(count))
        trunk = int.from_bytes(page[:4], "big")
    return free


def _cells(pages: _Pages, page: bytes, number: int) -> Iterator[tuple[int, bytes]] | None:
    """``(rowid, payload)`` of each cell of a table leaf page, or ``None`` when it is not one."""
    base = 100 if number == 1 else 0
    if len(page) < base + 8 or page[base] != _LEAF_TABLE:
        return None
    usable = pages.size - pages.reserved
    count = int.from_bytes(page[base + 3 : base + 5], "big")
    if base + 8 + 2 * count > usable:
        return None
    cells: list[tuple[int, bytes]] = []
    for i in range(count):
        at = int.from_bytes(page[base + 8 + 2 * i : base + 10 + 2 * i], "big")
        try:
            size, at = _varint(page, at)
            rowid, at = _varint(page, at)
        except IndexError:
            continue
        local = _local(size, usable)
        payload = page[at : at + local]
        if local < size:
            payload += _overflow(
                pages, int.from_bytes(page[at + local : at + local + 4], "big"), size - local
            )
        if len(payload) == size:
            cells.append((rowid - (1 << 64) if rowid >= 1 << 63 else rowid, payload))
    return iter(cells)


def _local(size: int, usable: int) -> int:
    """Bytes of a table leaf cell's payload kept on its page (SQLite's file format, 1.6)."""
    most = usable - 35
    if size <= most:
        return size
    least = (usable - 12) * 32 // 255 - 23
    local = least + (size - least) % (usable - 4)
    return local if local <= most else least


def _overflow(pages: _Pages, number: int, left: int) -> bytes:
    """Up to ``left`` bytes of an overflow chain (fewer when a page of it is gone)."""
    chunks, seen = [], set()
    while number and left > 0 and number not in seen:
        seen.add(number)
        page = pages.newest(number)
        if page is None:
            break
        chunk = page[4 : pages.size - pages.reserved][:left]
        chunks.append(chunk)
        left -= len(chunk)
        number = int.from_bytes(page[:4], "big")
    return b"".join(chunks)


def salvage(path: str, wal_paths: list[str] | None = None) -> Salvage:
    """Every row of ``records`` and ``snapshots`` readable from the pages of ``path``.

    Args:
        path: The database file.
        wal_paths: Write-ahead logs to read frames from (default: ``<path>-wal``).
    """
    pages = _Pages(path, [path + "-wal"] if wal_paths is None else wal_paths)
    found = Salvage(wal_frames=pages.frames, wal_damaged=pages.damaged)
    free = _freelist(pages)
    snapshots: list[tuple[int, tuple[int, int, float]]] = []
    for number in range(1, pages.count() + 1):
        if number in free:
            continue
        for page in pages.versions(number):
            cells = _cells(pages, page, number)
            if cells is None:
                continue
            for rowid, payload in cells:
                values = _columns(payload)
                if values is None or len(values) != 3:
                    continue
                first, body, key = values
                if first is None and isinstance(body, str) and (key is None or isinstance(key, str)):
                    found.records.setdefault(rowid, (rowid, body, key))
                elif (
                    isinstance(first, int)
                    and isinstance(body, (int, float))
                    and isinstance(key, (int, float))
                ):
                    snapshots.append((rowid, (first, int(body), float(key))))
            break  # the newest version of a page that is a table leaf counts
    found.snapshots = [row for _, row in sorted(dict(snapshots).items())]
    return found
