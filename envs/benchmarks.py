"""Real search-QA benchmarks (NQ, HotpotQA, ...) read from local JSONL files."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..error import DataFileError, InvalidArgumentError, did_you_mean, keyword_checked
from ..retrieval import Retriever, make_retriever
from .data import load_questions
from .registration import BENCHMARKS
from .search_env import EpisodeOptions, SearchQAEnv, check_retriever_kwargs, takes_episode_options

if TYPE_CHECKING:
    from typing_extensions import Unpack  # typing.Unpack from Python 3.11

__all__ = ["BenchmarkQAEnv", "DATA_DIR_VARIABLE"]

DATA_DIR_VARIABLE = "SEARCHGYM_DATA_DIR"
"""Environment variable naming a folder laid out as ``questions/<key>.jsonl`` + ``corpus.jsonl``."""


def _resolve(keyword: str, given: str | os.PathLike | None, default_name: str, what: str) -> Path:
    if given is not None:
        if not isinstance(given, (str, os.PathLike)):
            raise InvalidArgumentError(f"{keyword} must be a path, got {given!r} ({type(given).__name__}).")
        return Path(given)
    data_dir = os.environ.get(DATA_DIR_VARIABLE)
    if data_dir:
        return Path(data_dir) / default_name
    raise DataFileError(
        f"No {keyword} given. Pass {keyword}=PATH to gym.make: {what}. Such files come from "
        f"FlashRAG's dataset releases (or, in the searchgym repo, ../shared/data); you can also set "
        f"{DATA_DIR_VARIABLE} to a folder holding questions/<dataset>.jsonl and corpus.jsonl."
    )


def _needs_corpus(backend: object) -> bool:
    """Whether a retriever backend reads the passage corpus (a server or a generator does not)."""
    if isinstance(backend, str) and backend.startswith(("http://", "https://")):
        return False
    return backend != "simulated"


class BenchmarkQAEnv(SearchQAEnv):
    """A :class:`SearchQAEnv` over a real benchmark's questions and a passage corpus.

    ## Arguments
    dataset: the dataset key (``hotpotqa``, ``nq``, ...); set by the registered id.
    data_path: JSONL of questions with at least ``id``, ``question`` and ``golden_answers``
        (the FlashRAG convention). Defaults to ``$SEARCHGYM_DATA_DIR/questions/<dataset>.jsonl``.
    corpus_path: JSONL passages with ``id``/``title``/``text``, or FlashRAG's ``id``/``contents``
        (title on the first line). Defaults to ``$SEARCHGYM_DATA_DIR/corpus.jsonl``. Not needed
        when ``retriever`` is a :class:`Retriever` object, a server URL or ``"simulated"``.
    retriever: a backend name (``bm25``) or a :class:`Retriever`. retriever_kwargs: options
        of the backend (e.g. ``{"k1": 1.2}``, or the generator of ``"simulated"``). index_dir:
        where the backend saves and reloads its index. Other arguments (``instructions``,
        ``max_searches``, ...) as :class:`SearchQAEnv`.

    ## Version History
    * v1: an action with nested tags or nested boxes (a protocol tag inside a search or
          answer block, an action inside ``<think>``, ``\\boxed{}`` in ``\\boxed{}``) and a
          search query without a letter or digit are malformed (``info["error"]``), never
          searched for; under ``sem`` the model may search again after its first answer.
    * v0: initial version.
    """

    @keyword_checked
    @takes_episode_options
    def __init__(
        self,
        dataset: str,
        *,
        data_path: str | os.PathLike | None = None,
        corpus_path: str | os.PathLike | None = None,
        retriever: str | Retriever = "bm25",
        retriever_kwargs: Mapping[str, Any] | None = None,
        index_dir: str | os.PathLike | None = None,
        **episode: Unpack[EpisodeOptions],
    ):
        if dataset not in BENCHMARKS.values():
            raise did_you_mean("dataset", dataset, BENCHMARKS.values())
        self.dataset = dataset
        questions_file = _resolve(
            "data_path",
            data_path,
            f"questions/{dataset}.jsonl",
            "a JSONL file with one question per line and at least the keys id, question, golden_answers",
        )
        questions = load_questions(questions_file)
        options = check_retriever_kwargs(retriever, retriever_kwargs)
        if not isinstance(retriever, Retriever):
            corpus_file = None
            if _needs_corpus(retriever):
                corpus_file = _resolve(
                    "corpus_path",
                    corpus_path,
                    "corpus.jsonl",
                    "a JSONL passage corpus with id/title/text (or FlashRAG's id/contents) per line",
                )
            retriever = make_retriever(retriever, corpus_path=corpus_file, index_dir=index_dir, **options)
        super().__init__(questions, retriever, **episode)
