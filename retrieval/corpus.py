"""Load a passage corpus from a JSON Lines file, and the JSON Lines reading it is built on.

A corpus file follows the FlashRAG convention, so FlashRAG's released corpora load as they
are: one object per line with ``id``, ``title`` and ``text``, or FlashRAG's ``id`` and
``contents``, where the first line of ``contents`` is the title. Every problem with a file
raises :class:`~searchgym.error.DataFileError` with the file's path and, where it applies, the
1-based line number and the field at fault. :func:`read_jsonl` and the field helpers also read
the env's question files (:func:`searchgym.envs.data.load_questions`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ..error import DataFileError
from .records import Doc

__all__ = [
    "load_corpus",
    "record_to_doc",
    "split_contents",
    # JSON Lines reading, shared with the question loader
    "read_jsonl",
    "field_error",
    "require_field",
    "as_id",
    "check_unique",
]

_CORPUS_HELP = (
    "A corpus file is JSON Lines: one object per line with 'id', 'title' and 'text', or FlashRAG's "
    "'id' and 'contents' (title on the first line). FlashRAG's corpus releases (e.g. wiki-18) use "
    "this format; in this project, a sample lives at ../shared/data/corpus.jsonl beside the checkout."
)


def read_jsonl(
    path: str | os.PathLike[str], what: str, help_text: str = ""
) -> list[tuple[int, dict[str, Any]]]:
    """Read a JSON Lines file of objects, skipping blank lines.

    Args:
        path: The file to read.
        what: What the file holds, for error messages (e.g. ``"question file"``).
        help_text: Appended to the messages for a missing or empty file: the expected format
            and where such files come from.

    Returns:
        ``(line_number, record)`` pairs, with 1-based line numbers.

    Raises:
        DataFileError: The path is missing or a directory, the file is not UTF-8, a line is not
            valid JSON or not a JSON object, or the file holds no records.
    """
    path = Path(path)
    suffix = f" {help_text}" if help_text else ""
    if not path.exists():
        raise DataFileError(f"The {what} {str(path)!r} does not exist.{suffix}")
    if path.is_dir():
        raise DataFileError(
            f"The {what} {str(path)!r} is a directory; pass the path of a .jsonl file.{suffix}"
        )
    records: list[tuple[int, dict[str, Any]]] = []
    with path.open("rb") as handle:
        for line_number, raw in enumerate(handle, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise DataFileError(f"{path}:{line_number}: the {what} is not UTF-8 text ({exc}).") from exc
            line = line.rstrip("\r\n")
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataFileError(
                    f"{path}:{line_number}: invalid JSON in the {what}: {exc.msg} at column {exc.colno}. "
                    "Each line must hold one complete JSON object."
                ) from exc
            if not isinstance(record, dict):
                raise DataFileError(
                    f"{path}:{line_number}: each line of the {what} must be a JSON object, "
                    f"got {type(record).__name__}."
                )
            records.append((line_number, record))
    if not records:
        raise DataFileError(f"The {what} {str(path)!r} is empty: it holds no records.{suffix}")
    return records


def field_error(path: Path, line: int, field: str, problem: str, value: object = None) -> DataFileError:
    """The error for a bad field: ``PATH:LINE: field 'NAME' PROBLEM, got VALUE.``"""
    shown = "" if value is None else f", got {value!r:.80}"
    return DataFileError(f"{path}:{line}: field {field!r} {problem}{shown}.")


def require_field(record: dict[str, Any], field: str, path: Path, line: int) -> Any:
    """``record[field]``, or a :class:`DataFileError` that lists the keys the record has."""
    if field not in record:
        keys = ", ".join(sorted(map(str, record))) or "none"
        raise field_error(path, line, field, f"is missing (keys present: {keys})")
    return record[field]


def as_id(value: object, path: Path, line: int) -> str:
    """Ids may be strings or integers (FlashRAG's wiki-18 uses integers); both become str."""
    if isinstance(value, str) and value:
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    raise field_error(path, line, "id", "must be a non-empty string or an integer", value)


def check_unique(ids: list[tuple[int, str]], path: Path, what: str) -> None:
    """Raise :class:`DataFileError` at the first id of ``(line, id)`` pairs seen twice."""
    seen: dict[str, int] = {}
    for line, item_id in ids:
        if item_id in seen:
            raise DataFileError(
                f"{path}:{line}: duplicate id {item_id!r} in the {what} (first seen on line {seen[item_id]}). "
                "Ids must be unique."
            )
        seen[item_id] = line


def split_contents(contents: str) -> tuple[str, str]:
    """FlashRAG's ``contents``: the title on the first line (often in double quotes), then the text."""
    title, _, text = contents.partition("\n")
    title = title.strip()
    if len(title) >= 2 and title.startswith('"') and title.endswith('"'):
        title = title[1:-1]
    return title, text


def record_to_doc(record: dict[str, Any], path: Path, line: int) -> Doc:
    """One corpus record (``id`` with ``title``/``text`` or FlashRAG's ``contents``) as a :class:`Doc`."""
    doc_id = as_id(require_field(record, "id", path, line), path, line)
    if "text" in record:
        text, title = record["text"], record.get("title", "")
        if not isinstance(text, str):
            raise field_error(path, line, "text", "must be a string", text)
        if not isinstance(title, str):
            raise field_error(path, line, "title", "must be a string", title)
        return Doc(id=doc_id, title=title, text=text)
    if "contents" in record:
        contents = record["contents"]
        if not isinstance(contents, str):
            raise field_error(path, line, "contents", "must be a string", contents)
        title, text = split_contents(contents)
        return Doc(id=doc_id, title=title, text=text)
    keys = ", ".join(sorted(map(str, record))) or "none"
    raise field_error(
        path, line, "text", f"is missing: give 'title' and 'text', or 'contents' (keys present: {keys})"
    )


def load_corpus(path: str | os.PathLike[str]) -> list[Doc]:
    """Load a passage corpus in JSON Lines.

    Each line needs ``id`` (string or integer, converted to str) and either ``text`` (with an
    optional ``title``, default ``""``) or FlashRAG's ``contents``. In ``contents`` the first
    line is the title, with surrounding double quotes removed (wiki-18 writes
    ``"Title"\\ntext``), and the rest is the text. When a line has both ``text`` and
    ``contents``, ``title``/``text`` win.

    Args:
        path: The ``.jsonl`` file.

    Returns:
        The passages in file order, each with score 0.

    Raises:
        DataFileError: The file is missing, a directory, empty or not valid JSON Lines; a
            field is missing or has the wrong type; or two passages share an id.
    """
    path = Path(path)
    docs: list[Doc] = []
    ids: list[tuple[int, str]] = []
    for line, record in read_jsonl(path, "corpus file", _CORPUS_HELP):
        doc = record_to_doc(record, path, line)
        docs.append(doc)
        ids.append((line, doc.id))
    check_unique(ids, path, "corpus file")
    return docs
