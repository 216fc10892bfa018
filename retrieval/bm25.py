"""Sparse lexical retrieval with BM25 (the ``bm25s`` library, numpy backend).

``bm25s`` is imported with JAX hidden from it (:mod:`.jax_guard`): its import would
otherwise start JAX, which takes most of a GPU's memory.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..error import DataFileError, InvalidArgumentError, RetrievalError
from .base import Retriever
from .checksums import file_checksums, verify_checksums
from .corpus import load_corpus
from .jax_guard import import_without_jax
from .records import Doc

if TYPE_CHECKING:
    import bm25s
else:
    bm25s = import_without_jax("bm25s")

__all__ = [
    "MAX_QUERY_CHARS",
    "BM25Retriever",
    "check_search_args",
    "corpus_fingerprint",
    "make_bm25_retriever",
    "read_index_meta",
]

MAX_QUERY_CHARS = 10_000
"""Queries longer than this are cut to their first ``MAX_QUERY_CHARS`` characters."""

_META_FILE = "searchgym_bm25.json"
_DOCS_FILE = "docs.jsonl"
_FORMAT = "searchgym-bm25/1"
_META_KEYS = {"format", "num_docs", "fingerprint", "k1", "b", "stopwords"}

Stopwords = str | Sequence[str] | None


def corpus_fingerprint(docs: Sequence[Doc]) -> str:
    """A SHA-256 digest of the ids, titles and texts of ``docs``, in order (scores are ignored)."""
    digest = hashlib.sha256()
    for doc in docs:
        digest.update(f"{doc.id}\x1f{doc.title}\x1f{doc.text}\x1e".encode("utf-8", "surrogatepass"))
    return digest.hexdigest()


def _check_params(k1: object, b: object, stopwords: object) -> Stopwords:
    if isinstance(k1, bool) or not isinstance(k1, (int, float)) or not k1 >= 0:
        raise InvalidArgumentError(f"k1 must be a number >= 0 (BM25 term-frequency saturation), got {k1!r}.")
    if isinstance(b, bool) or not isinstance(b, (int, float)) or not 0 <= b <= 1:
        raise InvalidArgumentError(f"b must be a number in [0, 1] (BM25 length normalisation), got {b!r}.")
    if isinstance(stopwords, (list, tuple)) and all(isinstance(w, str) for w in stopwords):
        return list(stopwords)
    if stopwords is not None and not isinstance(stopwords, str):
        raise InvalidArgumentError(
            f"stopwords must be a language name such as 'en', a list of words, or None, got {stopwords!r}."
        )
    try:
        bm25s.tokenize([], stopwords=stopwords, show_progress=False)
    except ValueError as exc:
        raise InvalidArgumentError(f"stopwords={stopwords!r} is not a language bm25s knows: {exc}") from exc
    return stopwords


def check_search_args(queries: object, k: object) -> None:
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise InvalidArgumentError(f"k must be a positive integer (documents per query), got {k!r}.")
    if isinstance(queries, str):
        raise InvalidArgumentError(f"queries must be a list of strings; wrap one query as [{queries!r:.60}].")
    if not isinstance(queries, (list, tuple)):
        raise InvalidArgumentError(
            f"queries must be a list or tuple of strings, got {type(queries).__name__}."
        )
    for i, query in enumerate(queries):
        if not isinstance(query, str):
            raise InvalidArgumentError(
                f"queries[{i}] must be a string, got {type(query).__name__}: {query!r:.60}."
            )


class BM25Retriever(Retriever):
    """BM25 (Lucene variant) over ``title + " " + text`` of every passage.

    Text is lower-cased and split into words of two or more letters or digits; stop words
    are dropped; there is no stemming. Scores come from ``bm25s`` with its numpy backend. A
    passage d scores, summed over the query words t it contains (``N`` passages, ``df(t)``
    of them holding t, ``tf`` occurrences of t in d, ``dl`` words in d, ``avgdl`` the mean)::

        idf(t)  = ln(1 + (N - df(t) + 0.5) / (df(t) + 0.5))
        s(t, d) = idf(t) * tf / (tf + k1 * (1 - b + b * dl / avgdl))

    Args:
        docs: The passages to index (at least one).
        k1: Term-frequency saturation, >= 0.
        b: Document-length normalisation, in [0, 1].
        stopwords: A ``bm25s`` language name (``"en"``, ``"de"``, ...), a list of words, or None.

    Raises:
        InvalidArgumentError: A parameter is out of range, ``docs`` is empty or holds
            something other than :class:`Doc`, or no passage has a single indexable word.
    """

    name = "bm25"

    def __init__(
        self, docs: Sequence[Doc], *, k1: float = 1.5, b: float = 0.75, stopwords: Stopwords = "en"
    ) -> None:
        stopwords = _check_params(k1, b, stopwords)
        if isinstance(docs, (str, bytes)) or not isinstance(docs, Sequence) or len(docs) == 0:
            raise InvalidArgumentError(f"docs must be a non-empty sequence of Doc, got {docs!r:.80}.")
        bad = next((d for d in docs if not isinstance(d, Doc)), None)
        if bad is not None:
            raise InvalidArgumentError(
                f"docs must hold only Doc records, found {type(bad).__name__}: {bad!r:.80}."
            )
        tokens = bm25s.tokenize(
            [f"{d.title} {d.text}" for d in docs], stopwords=stopwords, show_progress=False
        )
        if not tokens.vocab:
            raise InvalidArgumentError(
                f"None of the {len(docs)} docs holds an indexable word (two or more letters or digits that "
                "is not a stop word); BM25 cannot rank them."
            )
        index = bm25s.BM25(k1=k1, b=b, backend="numpy", csc_backend="numpy")
        index.index(tokens, show_progress=False)
        self._setup(list(docs), index, float(k1), float(b), stopwords, corpus_fingerprint(docs))

    def _setup(
        self, docs: list[Doc], index: bm25s.BM25, k1: float, b: float, stopwords: Stopwords, fingerprint: str
    ) -> None:
        self._docs = docs
        self._index = index
        self.k1, self.b, self.stopwords = k1, b, stopwords
        self.fingerprint = fingerprint
        """SHA-256 of the indexed corpus (see :func:`corpus_fingerprint`)."""

    @property
    def params(self) -> dict[str, Any]:
        """The scoring parameters, as saved in the index metadata."""
        return {"k1": self.k1, "b": self.b, "stopwords": self.stopwords}

    def __len__(self) -> int:
        return len(self._docs)

    def search(self, queries: Sequence[str], k: int) -> list[list[Doc]]:
        """Top-``k`` passages for each query, best first, with their BM25 scores.

        All non-empty queries go through one batched tokenise-and-score call. ``k`` is capped
        at the corpus size. Passages scoring 0 (no query word in common) are left out, so a
        query of only unknown words or stop words gets ``[]``, as does an empty or
        whitespace-only query. A query longer than :data:`MAX_QUERY_CHARS` characters is cut
        to its first :data:`MAX_QUERY_CHARS`. No query string makes this raise.

        Raises:
            InvalidArgumentError: ``k`` is not a positive int, or ``queries`` is not a list or
                tuple of strings.
            RetrievalError: ``bm25s`` failed unexpectedly.
        """
        check_search_args(queries, k)
        results: list[list[Doc]] = [[] for _ in queries]
        live = [i for i, q in enumerate(queries) if q.strip()]
        if not live:
            return results
        texts = [queries[i][:MAX_QUERY_CHARS] for i in live]
        try:
            tokens = bm25s.tokenize(texts, stopwords=self.stopwords, return_ids=False, show_progress=False)
            all_scores = [self._index.get_scores(query) if query else None for query in tokens]
        except Exception as exc:  # the contract of Retriever: backend failures surface as RetrievalError
            raise RetrievalError(f"BM25 search failed for a batch of {len(texts)} queries: {exc!r}") from exc
        for i, scores in zip(live, all_scores, strict=True):
            if scores is not None:
                docs = ((self._docs[j], float(scores[j])) for j in top_k(scores, k))
                results[i] = [Doc(id=d.id, title=d.title, text=d.text, score=s) for d, s in docs]
        return results

    def save(self, directory: str | os.PathLike[str]) -> None:
        """Write the index, the corpus and a metadata file into ``directory`` (created if needed).

        The metadata file is written last, so an interrupted save leaves a directory that
        :meth:`load` rejects rather than a silently partial index.
        """
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        (directory / _META_FILE).unlink(missing_ok=True)
        self._index.save(str(directory), show_progress=False)
        with (directory / _DOCS_FILE).open("w", encoding="utf-8") as handle:
            for d in self._docs:
                # ASCII escapes keep lone surrogates (legal in JSON strings) writable.
                handle.write(json.dumps({"id": d.id, "title": d.title, "text": d.text}))
                handle.write("\n")
        meta = {
            "format": _FORMAT,
            "num_docs": len(self._docs),
            "fingerprint": self.fingerprint,
            **self.params,
            "files": file_checksums(directory, _index_files(directory)),
        }
        tmp = directory / (_META_FILE + ".tmp")
        tmp.write_text(json.dumps(meta, indent=2), encoding="utf-8")
        tmp.replace(directory / _META_FILE)

    @classmethod
    def load(cls, directory: str | os.PathLike[str], *, verify: bool | None = None) -> BM25Retriever:
        """Load an index written by :meth:`save`, checking its files against their recorded checksums.

        Args:
            directory: The index directory.
            verify: True checks every file's SHA-256 digest, False only its size, None the
                digests when the index holds at most 4 GB (see :mod:`.checksums`).

        Raises:
            DataFileError: ``directory`` is missing, is not a saved index, or its files are
                corrupt or disagree with each other (the message names the file).
        """
        directory = Path(directory)
        meta = read_index_meta(directory, strict=True) or {}
        verify_checksums(
            directory,
            meta.get("files"),
            verify=verify,
            rebuild="delete the directory and build the index again",
        )
        try:
            docs = load_corpus(directory / _DOCS_FILE)
            index = bm25s.BM25.load(str(directory), show_progress=False, mmap=False)
        except Exception as exc:  # bm25s raises OSError, ValueError, KeyError... on damaged files
            raise DataFileError(
                f"The BM25 index in {str(directory)!r} is corrupt ({exc}); delete it and rebuild."
            ) from exc
        fingerprint = corpus_fingerprint(docs)
        if fingerprint != meta["fingerprint"] or index.scores.get("num_docs") != len(docs):
            raise DataFileError(
                f"The BM25 index in {str(directory)!r} does not match its saved corpus "
                f"({len(docs)} docs, index built for {index.scores.get('num_docs')}); delete it and rebuild."
            )
        retriever = cls.__new__(cls)
        retriever._setup(docs, index, float(meta["k1"]), float(meta["b"]), meta["stopwords"], fingerprint)
        return retriever


def _index_files(directory: Path) -> list[str]:
    """The files of a saved index: bm25s's ``*.index.*`` files and the corpus."""
    return [_DOCS_FILE] + [p.name for p in directory.iterdir() if p.is_file() and ".index." in p.name]


def is_bm25_index_dir(directory: str | os.PathLike[str]) -> bool:
    """Whether ``directory`` holds a searchgym BM25 index's metadata file (readable or not)."""
    return (Path(directory) / _META_FILE).is_file()


def read_index_meta(directory: str | os.PathLike[str], *, strict: bool = False) -> dict[str, Any] | None:
    """The metadata of a saved BM25 index: format, num_docs, fingerprint, k1, b, stopwords.

    Args:
        directory: The index directory.
        strict: Raise instead of returning None when there is no readable index.

    Raises:
        DataFileError: Only with ``strict``: the directory or its metadata is missing or unreadable.
    """
    directory = Path(directory)
    path = directory / _META_FILE
    problem = None
    if not directory.is_dir():
        problem = "does not exist or is not a directory"
    elif not path.is_file():
        problem = f"holds no {_META_FILE}, so it is not a complete searchgym BM25 index"
    else:
        try:
            meta = json.loads(path.read_text(encoding="utf-8"))
            if isinstance(meta, dict) and meta.get("format") == _FORMAT and _META_KEYS <= meta.keys():
                return meta
            problem = f"has a {_META_FILE} of an unknown format or with missing fields"
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            problem = f"has an unreadable {_META_FILE} ({exc})"
    if strict:
        raise DataFileError(
            f"The BM25 index directory {str(directory)!r} {problem}. Build one with BM25Retriever(docs).save(dir)."
        )
    return None


def top_k(scores: np.ndarray, k: int) -> list[int]:
    """The indices of the ``k`` highest positive scores, highest first, ties broken by the lower index.

    The order is the same on every machine. (bm25s's own selection breaks ties with numpy's
    ``argpartition`` and ``argsort``, whose order among equal scores differs between CPUs.)
    """
    positive = np.flatnonzero(scores > 0)
    if len(positive) > k:
        kth = np.partition(scores[positive], len(positive) - k)[len(positive) - k]
        positive = positive[scores[positive] >= kth]
    order = np.lexsort((positive, -scores[positive]))
    return positive[order][:k].tolist()


def make_bm25_retriever(
    *,
    corpus_path: str | os.PathLike[str] | None = None,
    docs: Sequence[Doc] | None = None,
    index_dir: str | os.PathLike[str] | None = None,
    k1: float = 1.5,
    b: float = 0.75,
    stopwords: Stopwords = "en",
) -> BM25Retriever:
    """The ``"bm25"`` factory: build (or load from ``index_dir``) a BM25 retriever.

    Exactly one of ``corpus_path`` and ``docs`` gives the corpus. With ``index_dir``, an index
    saved there from the same corpus and parameters is loaded; otherwise one is built and
    saved there (replacing whatever was there).

    Raises:
        InvalidArgumentError: Both or neither of ``corpus_path`` and ``docs`` were given.
        DataFileError: The corpus file cannot be read.
    """
    if (corpus_path is None) == (docs is None):
        raise InvalidArgumentError(
            "The bm25 retriever needs exactly one corpus: pass corpus_path=<corpus .jsonl> or docs=<list of Doc>, "
            f"got corpus_path={corpus_path!r} and docs={'None' if docs is None else f'<{len(docs)} docs>'}."
        )
    stopwords = _check_params(k1, b, stopwords)
    corpus: Sequence[Doc] = load_corpus(corpus_path) if corpus_path is not None else (docs or [])
    if index_dir is not None:
        meta = read_index_meta(index_dir)
        wanted = {
            "fingerprint": corpus_fingerprint(corpus),
            "k1": float(k1),
            "b": float(b),
            "stopwords": stopwords,
        }
        if meta is not None and all(meta.get(key) == value for key, value in wanted.items()):
            try:
                return BM25Retriever.load(index_dir)
            except DataFileError:
                pass  # damaged: rebuild below, overwriting it
    retriever = BM25Retriever(corpus, k1=k1, b=b, stopwords=stopwords)
    if index_dir is not None:
        retriever.save(index_dir)
    return retriever
