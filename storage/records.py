"""A store's records: JSON objects with a format version, encoded to text and checked on read.

A log with a schema adds ``"schema"``, the format version (:data:`SCHEMA_VERSION`), to every
record it writes; a reader refuses a newer version with an error that says to upgrade. A
record that does not decode, or that its log's :data:`Validator` refuses, is corrupt: the
reader skips it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from ..error import InvalidArgumentError

__all__ = ["SCHEMA_VERSION", "Validator", "NewerSchemaError", "encode_record", "decode_record"]

SCHEMA_VERSION = 1
"""Version of the record layout written by this searchgym."""

Validator = Callable[[dict[str, Any]], object]
"""Checks one decoded record, raising ``ValueError`` when it is not a record of its log's kind."""


class NewerSchemaError(ValueError):
    """A record written by a newer searchgym (its ``schema`` is above the reader's)."""

    def __init__(self, version: int):
        super().__init__(version)
        self.version = version


def encode_record(record: Mapping[str, Any], schema: int | None) -> str:
    """One record as compact JSON text, with ``schema`` added when given and absent.

    Raises:
        InvalidArgumentError: ``record`` is not a JSON-serialisable dict without NaN.
    """
    if not isinstance(record, Mapping):
        raise InvalidArgumentError(f"A record must be a dict, got {type(record).__name__}.")
    body = dict(record)
    if schema is not None:
        body.setdefault("schema", schema)
    try:
        return json.dumps(body, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise InvalidArgumentError(f"A record must be JSON-serialisable without NaN: {exc}.") from exc


def decode_record(text: str | bytes, schema: int | None, validate: Validator | None = None) -> dict[str, Any]:
    """One record, or ``ValueError`` with a plain reason (:class:`NewerSchemaError` for a newer schema)."""
    try:
        record = json.loads(text)
    except (ValueError, UnicodeDecodeError, TypeError) as exc:
        raise ValueError(f"not valid JSON ({exc})") from None
    if not isinstance(record, dict):
        raise ValueError(f"not a JSON object (got {type(record).__name__})")
    if schema is not None:
        version = record.get("schema")
        if isinstance(version, bool) or not isinstance(version, int):
            raise ValueError(f"no integer 'schema' field (got {version!r})")
        if version > schema:
            raise NewerSchemaError(version)
    if validate is not None:
        try:
            validate(record)
        except (KeyError, TypeError) as exc:
            raise ValueError(f"not a record of this kind ({type(exc).__name__}: {exc})") from None
    return record
