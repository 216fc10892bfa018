"""Download the public data the benchmark envs and the retrieval server read, from the Hugging Face hub.

Three sources, each a dataset repository on the hub, fetched with ``huggingface_hub``'s
``hf_hub_download`` (which honours ``HF_ENDPOINT``, ``HF_TOKEN`` and resumes broken downloads):

==================  ===================================  ==================================================
source              repository                           written under ``out``
==================  ===================================  ==================================================
``flashrag``        ``RUC-NLPIR/FlashRAG_datasets``      ``questions/<dataset>.jsonl`` (one split of each
                                                         dataset: the ``$SEARCHGYM_DATA_DIR`` layout the
                                                         benchmark envs read)
``wiki18-corpus``   ``PeterJinGo/wiki-18-corpus``        ``wiki18/wiki-18.jsonl`` (Search-R1's 21M-passage
                                                         Wikipedia 2018 corpus, about 14 GB unpacked)
``wiki18-index``    ``PeterJinGo/wiki-18-e5-index``      ``wiki18/e5_Flat.index`` (its E5-base-v2 FAISS
                                                         flat index, about 65 GB, from two parts)
==================  ===================================  ==================================================

The corpus and the index are what ``searchgym serve --index data/wiki18/e5_Flat.index --corpus
data/wiki18/wiki-18.jsonl --model intfloat/e5-base-v2 --query-prefix "query: "`` serves, as
Search-R1 does. FlashRAG's question files have the keys the envs read (``id``, ``question``,
``golden_answers``).
"""

from __future__ import annotations

import functools
import gzip
import os
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..error import DataFileError, SearchGymError, did_you_mean

__all__ = [
    "FLASHRAG_REPO",
    "WIKI18_CORPUS_REPO",
    "WIKI18_INDEX_REPO",
    "DEFAULT_SPLITS",
    "SOURCES",
    "download_flashrag",
    "download_wiki18_corpus",
    "download_wiki18_index",
]

FLASHRAG_REPO = "RUC-NLPIR/FlashRAG_datasets"
"""FlashRAG's benchmark files: ``<dataset>/<split>.jsonl``."""
WIKI18_CORPUS_REPO = "PeterJinGo/wiki-18-corpus"
"""Search-R1's corpus: ``wiki-18.jsonl.gz``."""
WIKI18_INDEX_REPO = "PeterJinGo/wiki-18-e5-index"
"""Search-R1's E5 flat index, split in ``part_aa`` and ``part_ab`` (joined in that order)."""
_INDEX_PARTS = ("part_aa", "part_ab")

DEFAULT_SPLITS = {
    "nq": "test",
    "triviaqa": "test",
    "popqa": "test",
    "bamboogle": "test",
    "hotpotqa": "dev",
    "2wikimultihopqa": "dev",
    "musique": "dev",
}
"""The split Search-R1 and FlashRAG report each dataset on (others: ``test``)."""

SOURCES = ("flashrag", "wiki18-corpus", "wiki18-index")
"""What ``searchgym data download`` fetches."""

Log = Callable[[str], None]


@dataclass(frozen=True)
class _Hub:
    """``hf_hub_download`` for one dataset repository, with one-line errors."""

    repo_id: str
    revision: str | None = None

    def fetch(self, filename: str, local_dir: Path) -> Path:
        """Download ``filename`` into ``local_dir`` (kept with its folders) and return its path."""
        try:
            from huggingface_hub import errors, hf_hub_download
        except ImportError as exc:
            raise SearchGymError(
                f"Downloading from the Hugging Face hub needs huggingface_hub ({exc}): pip install "
                "'huggingface_hub>=0.23' (searchgym[train] brings it)."
            ) from exc
        try:
            return Path(
                hf_hub_download(
                    self.repo_id,
                    filename,
                    repo_type="dataset",
                    revision=self.revision,
                    local_dir=local_dir,
                )
            )
        except getattr(errors, "RemoteEntryNotFoundError", errors.EntryNotFoundError):
            raise DataFileError(
                f"The hub's dataset {self.repo_id} has no file {filename!r} (at revision "
                f"{self.revision or 'main'}); see https://huggingface.co/datasets/{self.repo_id}/tree/main "
                "for the files it has."
            ) from None
        except errors.RepositoryNotFoundError:
            raise DataFileError(
                f"The hub has no dataset {self.repo_id} (or it is private: log in with `hf auth login`)."
            ) from None
        except (errors.HfHubHTTPError, errors.EntryNotFoundError, OSError) as exc:  # the network, a disk
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise DataFileError(
                f"Downloading {filename} from {self.repo_id} failed ({first}). Check the network (or "
                "HF_ENDPOINT), then run the command again: finished files are not downloaded again."
            ) from None


def download_flashrag(
    datasets: Sequence[str],
    out: str | os.PathLike[str],
    *,
    split: str | None = None,
    revision: str | None = None,
    log: Log = print,
) -> list[Path]:
    """FlashRAG's question files, each as ``out/questions/<dataset>.jsonl``.

    Args:
        datasets: FlashRAG dataset folders (``nq``, ``hotpotqa``, ``musique``, ...).
        out: The data folder (what ``$SEARCHGYM_DATA_DIR`` then names).
        split: ``train``, ``dev`` or ``test`` for every dataset (default: each dataset's
            :data:`DEFAULT_SPLITS` entry).
        revision: A commit or branch of the repository (default ``main``).
        log: Where progress lines go.

    Returns:
        The question files written.

    Raises:
        DataFileError: a dataset or split the repository does not have, or a failed download.
    """
    root = Path(out)
    hub = _Hub(FLASHRAG_REPO, revision)
    written = []
    for dataset in datasets:
        chosen = split or DEFAULT_SPLITS.get(dataset, "test")
        filename = f"{dataset}/{chosen}.jsonl"
        log(f"{FLASHRAG_REPO}: {filename}")
        source = hub.fetch(filename, root / "flashrag")
        target = root / "questions" / f"{dataset}.jsonl"
        target.parent.mkdir(parents=True, exist_ok=True)
        _replace_with(target, functools.partial(shutil.copyfile, source))
        log(f"  -> {target} ({_count_lines(target):,} questions, {chosen} split)")
        written.append(target)
    return written


def download_wiki18_corpus(
    out: str | os.PathLike[str], *, revision: str | None = None, keep_archive: bool = False, log: Log = print
) -> Path:
    """Search-R1's wiki-18 corpus, unpacked to ``out/wiki18/wiki-18.jsonl``."""
    folder = Path(out) / "wiki18"
    log(f"{WIKI18_CORPUS_REPO}: wiki-18.jsonl.gz")
    archive = _Hub(WIKI18_CORPUS_REPO, revision).fetch("wiki-18.jsonl.gz", folder)
    target = folder / "wiki-18.jsonl"

    def unpack(tmp: Path) -> None:
        try:
            with gzip.open(archive, "rb") as src, open(tmp, "wb") as dst:
                shutil.copyfileobj(src, dst, 2**20)
        except (OSError, EOFError) as exc:
            raise DataFileError(
                f"{str(archive)!r} is not a complete gzip file ({exc}); delete it and run the command again."
            ) from None

    _replace_with(target, unpack)
    if not keep_archive:
        archive.unlink()
    log(f"  -> {target} ({target.stat().st_size:,} bytes)")
    return target


def download_wiki18_index(
    out: str | os.PathLike[str], *, revision: str | None = None, keep_parts: bool = False, log: Log = print
) -> Path:
    """Search-R1's E5 flat index, its parts joined into ``out/wiki18/e5_Flat.index``."""
    folder = Path(out) / "wiki18"
    hub = _Hub(WIKI18_INDEX_REPO, revision)
    parts = []
    for name in _INDEX_PARTS:
        log(f"{WIKI18_INDEX_REPO}: {name}")
        parts.append(hub.fetch(name, folder))
    target = folder / "e5_Flat.index"

    def join(tmp: Path) -> None:
        with open(tmp, "wb") as dst:
            for part in parts:
                with open(part, "rb") as src:
                    shutil.copyfileobj(src, dst, 2**20)

    _replace_with(target, join)
    if not keep_parts:
        for part in parts:
            part.unlink()
    log(f"  -> {target} ({target.stat().st_size:,} bytes)")
    return target


def check_source(name: str) -> str:
    """``name`` if it is one of :data:`SOURCES`, else a did-you-mean error."""
    if name not in SOURCES:
        raise did_you_mean("data source", name, SOURCES)
    return name


def _replace_with(target: Path, write: Callable[[Path], object]) -> None:
    """Write ``target`` through a temporary file beside it, renamed into place when complete."""
    tmp = target.with_name(f".{target.name}.partial")
    try:
        write(tmp)
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


def _count_lines(path: Path) -> int:
    with open(path, "rb") as handle:
        return sum(1 for line in handle if line.strip())
