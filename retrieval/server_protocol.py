"""The wire format of the retrieval server: Search-R1's ``/retrieve`` API, its caps and errors.

Search-R1 (``search_r1/search/retrieval_server.py``) takes a POST to ``/retrieve`` with::

    {"queries": ["q1", "q2"], "topk": 3, "return_scores": true}

and answers ``{"result": [...]}`` with one list per query, best first. With
``return_scores`` each item is ``{"document": {"id": ..., "contents": ...}, "score": s}``;
without it, each item is the document alone. ``contents`` is FlashRAG's layout: the title in
double quotes on the first line, then the text (``"Title"\\ntext``). A missing or null
``topk`` means the server's default, and unknown keys are ignored, as in Search-R1.

This module holds what the plain server (:mod:`.server`), the Ray Serve deployment
(:mod:`searchgym.trainers.ray_serve`) and the client (:mod:`.http_client`) share: request
parsing with size caps, response formatting, reading documents back from a response, and the
small checks and URL formatting all three need. Beyond the standard library it imports only
searchgym's records and corpus reader.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from ..checks import check_int
from .corpus import split_contents
from .records import Doc

__all__ = [
    "RequestError",
    "RequestLimits",
    "RetrieveRequest",
    "body_too_large",
    "JSON_BYTES_PER_DOC",
    "check_body_size",
    "check_response_size",
    "doc_contents",
    "doc_from_item",
    "doc_payload",
    "error_payload",
    "format_response",
    "host_port",
    "parse_response",
    "parse_retrieve_request",
]


def host_port(host: str, port: int) -> str:
    """``host:port``, with an IPv6 address in brackets (``[::1]:8000``)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


@dataclass(frozen=True)
class RequestLimits:
    """Caps on one ``/retrieve`` request; a request over a cap gets a 4xx answer naming it.

    Attributes:
        max_body_bytes: Size of the request body in bytes.
        max_queries: Number of queries in one request.
        max_query_chars: Characters in one query (BM25 reads no further than this either).
        max_topk: Largest ``topk``.
        max_results: Documents one request may ask for: queries × ``topk``. It bounds the
            work and the answer of one request.
        max_response_bytes: Size of one answer, counted before it is encoded as the
            characters of its documents plus :data:`JSON_BYTES_PER_DOC` per document.
    """

    max_body_bytes: int = 4 * 1024 * 1024
    max_queries: int = 1024
    max_query_chars: int = 10_000
    max_topk: int = 100
    max_results: int = 16_384
    max_response_bytes: int = 32 * 1024 * 1024

    def __post_init__(self) -> None:
        for name in (
            "max_body_bytes",
            "max_queries",
            "max_query_chars",
            "max_topk",
            "max_results",
            "max_response_bytes",
        ):
            check_int(f"RequestLimits.{name}", getattr(self, name), 1)


@dataclass(frozen=True)
class RetrieveRequest:
    """A validated ``/retrieve`` request."""

    queries: list[str]
    topk: int
    return_scores: bool


class RequestError(Exception):
    """A request the server refuses: the HTTP status and the JSON body to answer with."""

    def __init__(self, status: int, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.status = status
        self.payload = error_payload(message, **extra)


def error_payload(message: str, **extra: Any) -> dict[str, Any]:
    """The JSON body of an error answer: ``{"error": message, ...extra}``."""
    return {"error": message, **extra}


JSON_BYTES_PER_DOC = 100
"""What one document adds to an answer beyond its id, title and text (keys, quotes, score)."""


def _cap_error(
    status: int, cap: str, limit: int, received: int | None, what: str, fix: str = "Split the request"
) -> RequestError:
    """The answer to a request over ``cap`` (``received``: the value, when known)."""
    seen = "" if received is None else f" (received {received})"
    extra = {} if received is None else {"received": received}
    return RequestError(
        status,
        f"{what} is over the server's cap {cap}={limit}{seen}. {fix}, "
        f"or restart the server with a larger --{cap.replace('_', '-')}.",
        cap=cap,
        limit=limit,
        **extra,
    )


def body_too_large(limits: RequestLimits, size: int | None = None) -> RequestError:
    """The 413 answer to a body over ``limits.max_body_bytes`` (``size``: its length, when known)."""
    return _cap_error(413, "max_body_bytes", limits.max_body_bytes, size, "The request body")


def check_body_size(size: int | None, limits: RequestLimits) -> None:
    """Refuse a body of ``size`` bytes over ``limits.max_body_bytes`` (None: size unknown, allowed).

    Raises:
        RequestError: 413, naming the cap ``max_body_bytes``.
    """
    if size is not None and size > limits.max_body_bytes:
        raise body_too_large(limits, size)


def parse_retrieve_request(body: bytes, limits: RequestLimits, default_topk: int) -> RetrieveRequest:
    """Validate the body of a POST to ``/retrieve``.

    Args:
        body: The raw request body.
        limits: The server's caps.
        default_topk: The ``topk`` used when the request has none (or null).

    Returns:
        The validated request.

    Raises:
        RequestError: 413 for a body, query count or query length over its cap; 400 for
            anything else (not JSON, not an object, a missing or mistyped field, ``topk``
            out of range). The message names the field, the value received and the fix.
    """
    check_body_size(len(body), limits)
    try:
        data = json.loads(body)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError; deep nesting
        raise RequestError(
            400,
            f"The request body is not valid UTF-8 JSON ({exc}). Send "
            '{"queries": ["..."], "topk": 3, "return_scores": true}.',
        ) from None
    if not isinstance(data, dict):
        raise RequestError(
            400,
            f"The request body must be a JSON object, got {type(data).__name__}. Send "
            '{"queries": ["..."], "topk": 3, "return_scores": true}.',
        )
    if "queries" not in data:
        raise RequestError(
            400, f"The field 'queries' (a list of strings) is missing; keys received: {sorted(data)}."
        )
    queries = data["queries"]
    if not isinstance(queries, list):
        raise RequestError(
            400,
            f"'queries' must be a list of strings, got {type(queries).__name__}: {json.dumps(queries)[:80]}.",
        )
    if len(queries) > limits.max_queries:
        raise _cap_error(413, "max_queries", limits.max_queries, len(queries), "The number of queries")
    for i, query in enumerate(queries):
        if not isinstance(query, str):
            raise RequestError(
                400, f"queries[{i}] must be a string, got {type(query).__name__}: {json.dumps(query)[:80]}."
            )
        if len(query) > limits.max_query_chars:
            raise _cap_error(
                413,
                "max_query_chars",
                limits.max_query_chars,
                len(query),
                f"queries[{i}]",
                "Shorten the query",
            )
    topk = data.get("topk")
    if topk is None:
        topk = default_topk
    elif isinstance(topk, bool) or not isinstance(topk, int) or topk < 1:
        raise RequestError(400, f"'topk' must be a positive integer or null, got {json.dumps(topk)[:80]}.")
    elif topk > limits.max_topk:
        raise _cap_error(400, "max_topk", limits.max_topk, topk, "'topk'", "Ask for fewer documents")
    if len(queries) * topk > limits.max_results:
        raise _cap_error(
            413,
            "max_results",
            limits.max_results,
            len(queries) * topk,
            f"{len(queries)} queries × topk {topk}",
            "Ask for fewer queries or documents per request",
        )
    return_scores = data.get("return_scores", False)
    if not isinstance(return_scores, bool):
        raise RequestError(
            400, f"'return_scores' must be true or false, got {json.dumps(return_scores)[:80]}."
        )
    return RetrieveRequest(queries=queries, topk=topk, return_scores=return_scores)


def check_response_size(results: list[list[Doc]], limits: RequestLimits) -> None:
    """Refuse an answer over ``limits.max_response_bytes``, estimated before it is encoded.

    Raises:
        RequestError: 413, naming the cap ``max_response_bytes``.
    """
    size = sum(len(d.id) + len(d.title) + len(d.text) + JSON_BYTES_PER_DOC for docs in results for d in docs)
    if size > limits.max_response_bytes:
        raise _cap_error(
            413,
            "max_response_bytes",
            limits.max_response_bytes,
            size,
            "The answer",
            "Ask for fewer queries or documents per request",
        )


def doc_contents(doc: Doc) -> str:
    """FlashRAG's ``contents`` of a document: ``"Title"`` on the first line, then the text."""
    return f'"{doc.title}"\n{doc.text}'


def doc_payload(doc: Doc) -> dict[str, str]:
    """The ``document`` object of Search-R1's answer: ``{"id", "contents"}``."""
    return {"id": doc.id, "contents": doc_contents(doc)}


def format_response(results: list[list[Doc]], return_scores: bool) -> dict[str, Any]:
    """Search-R1's answer ``{"result": [...]}`` for one list of documents per query."""
    if return_scores:
        return {
            "result": [[{"document": doc_payload(d), "score": d.score} for d in docs] for docs in results]
        }
    return {"result": [[doc_payload(d) for d in docs] for docs in results]}


def doc_from_item(item: object) -> Doc:
    """Read one result item back into a :class:`Doc`.

    Accepts ``{"document": {...}, "score": s}`` (``return_scores``) or a bare document. A
    document needs ``contents`` (split as FlashRAG writes it) or ``text`` (with an optional
    ``title``); ``id`` may be missing (Search-R1's BM25 server leaves it out) and then is ``""``.

    Raises:
        ValueError: The item has none of these shapes.
    """
    score: object = 0.0
    document = item
    if isinstance(item, dict) and "document" in item:
        document, score = item["document"], item.get("score", 0.0)
    if not isinstance(document, dict):
        raise ValueError(f"a result item must be a JSON object, got {json.dumps(document)[:80]}")
    value = math.nan
    if isinstance(score, (int, float)) and not isinstance(score, bool):
        try:  # a JSON integer can be too large for a float: 1 followed by 400 zeros
            value = float(score)
        except OverflowError:
            pass
    if not math.isfinite(value):
        raise ValueError(f"a score must be a finite number, got {str(score)[:80]}")
    doc_id = document.get("id", "")
    if isinstance(doc_id, int) and not isinstance(doc_id, bool):
        doc_id = str(doc_id)
    if not isinstance(doc_id, str):
        raise ValueError(f"a document id must be a string or integer, got {json.dumps(doc_id)[:80]}")
    if isinstance(document.get("text"), str):
        title = document.get("title", "")
        if not isinstance(title, str):
            raise ValueError(f"a document title must be a string, got {json.dumps(title)[:80]}")
        return Doc(id=doc_id, title=title, text=document["text"], score=value)
    contents = document.get("contents")
    if not isinstance(contents, str):
        raise ValueError(
            f"a document needs 'contents' or 'text' as a string, got keys {sorted(map(str, document))}"
        )
    title, text = split_contents(contents)  # as load_corpus reads FlashRAG's corpus lines
    return Doc(id=doc_id, title=title, text=text, score=value)


def parse_response(body: bytes, num_queries: int) -> list[list[Doc]]:
    """Read a ``/retrieve`` answer for ``num_queries`` queries back into documents.

    Raises:
        ValueError: The body is not JSON, not ``{"result": [...]}``, has a number of lists
            other than ``num_queries``, or holds an item :func:`doc_from_item` cannot read.
    """
    try:
        data = json.loads(body)
    except (ValueError, RecursionError) as exc:  # also integers over Python's digit limit
        raise ValueError(f"the body is not JSON ({exc}): {body[:80]!r}") from None
    if not isinstance(data, dict) or not isinstance(data.get("result"), list):
        raise ValueError(f'expected {{"result": [...]}}, got {json.dumps(data)[:80]}')
    result = data["result"]
    if len(result) != num_queries:
        raise ValueError(f"expected {num_queries} result lists (one per query), got {len(result)}")
    out: list[list[Doc]] = []
    for i, items in enumerate(result):
        if not isinstance(items, list):
            raise ValueError(f"result[{i}] must be a list of documents, got {json.dumps(items)[:80]}")
        out.append([doc_from_item(item) for item in items])
    return out
