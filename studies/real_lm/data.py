"""The real-LM study's data: a PopQA split into RL-training and held-out questions, the taught
facts, and a corpus of short passages for BM25.

Everything here is a pure function of the shared data files and :class:`DataSettings`, so
every seed and arm sees the same questions, facts and corpus. :func:`prepare_data` writes
them once into the study's output folder (``data/``) and reads them back on later calls.
"""

from __future__ import annotations

import json
import random
import re
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from searchgym.error import DataFileError, InvalidArgumentError

__all__ = ["DataSettings", "StudyData", "prepare_data", "overlap", "short_passage", "answer_prior"]


@dataclass(frozen=True)
class DataSettings:
    """Which questions the study uses and how it cuts the corpus.

    Attributes:
        questions: JSON-lines file of PopQA-style questions (``metadata.subj``/``prop``).
        corpus: JSON-lines passages (``id``, ``title``, ``text``) to search.
        train: RL-training questions.
        heldout: Held-out questions (never trained on by RL, never demonstrated).
        taught_share: Share of each side whose fact the warm start teaches.
        passage_words: Words kept of each passage (short contexts keep a CPU step short).
        seed: Seed of the split (the same for every run seed, so runs are paired).
    """

    questions: str = "../shared/data/questions/popqa.jsonl"
    corpus: str = "../shared/data/corpus.jsonl"
    train: int = 200
    heldout: int = 100
    taught_share: float = 0.5
    passage_words: int = 32
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("train", "heldout", "passage_words"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise InvalidArgumentError(f"data.{name} must be an int >= 1, got {value!r}.")
        if not 0.0 < float(self.taught_share) < 1.0:
            raise InvalidArgumentError(
                f"data.taught_share must lie strictly between 0 and 1, got {self.taught_share!r}: "
                "the study needs taught and untaught facts on both sides."
            )


@dataclass(frozen=True)
class StudyData:
    """The files and splits :func:`prepare_data` wrote.

    Attributes:
        folder: Where the files are.
        train_path: RL-training questions (JSON lines, the env's ``data_path``).
        heldout_path: Held-out questions.
        corpus_path: The short-passage corpus.
        train: RL-training question records.
        heldout: Held-out question records.
        taught: Ids of the questions whose fact the warm start teaches (both sides).
    """

    folder: Path
    train_path: Path
    heldout_path: Path
    corpus_path: Path
    train: list[dict[str, Any]]
    heldout: list[dict[str, Any]]
    taught: frozenset[str]

    def summary(self) -> dict[str, Any]:
        """Counts and the overlap report, for ``results.json``."""
        return {
            "train": len(self.train),
            "heldout": len(self.heldout),
            "taught_train": sum(q["id"] in self.taught for q in self.train),
            "taught_heldout": sum(q["id"] in self.taught for q in self.heldout),
            "overlap": overlap(self.train, self.heldout),
        }


def short_passage(text: str, words: int) -> str:
    """The first ``words`` words of ``text`` (white space collapsed)."""
    return " ".join(text.split()[:words])


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise DataFileError(
            f"Cannot read {str(path)!r}: {exc}. The study reads the shared samples; run it from the "
            "repository root with ../shared/data beside it, or set data.questions / data.corpus."
        ) from None
    return [json.loads(line) for line in lines if line.strip()]


def _norm(text: str) -> str:
    return re.sub(r"\s+", " ", text.lower()).strip()


def overlap(train: list[dict[str, Any]], heldout: list[dict[str, Any]]) -> dict[str, Any]:
    """How much the held-out questions share with the training ones.

    Returns shares (percent of held-out questions) whose normalised question text, subject
    or first gold answer also occurs among the training questions.
    """
    questions = {_norm(q["question"]) for q in train}
    subjects = {_norm(q.get("metadata", {}).get("subj", "")) for q in train}
    answers = {_norm(q["golden_answers"][0]) for q in train}
    n = max(len(heldout), 1)
    return {
        "question_pct": 100.0 * sum(_norm(q["question"]) in questions for q in heldout) / n,
        "subject_pct": 100.0
        * sum(_norm(q.get("metadata", {}).get("subj", "")) in subjects for q in heldout)
        / n,
        "answer_pct": 100.0 * sum(_norm(q["golden_answers"][0]) in answers for q in heldout) / n,
    }


def _split(records: list[dict[str, Any]], settings: DataSettings) -> tuple[list, list, set[str]]:
    """Held-out and training questions (distinct texts) and the taught ids, seeded."""
    seen: set[str] = set()
    unique = []
    for q in sorted(records, key=lambda q: q["id"]):
        key = _norm(q["question"])
        if key not in seen:
            seen.add(key)
            unique.append(q)
    need = settings.train + settings.heldout
    if len(unique) < need:
        raise InvalidArgumentError(
            f"{settings.questions} has {len(unique)} distinct questions; data.train + data.heldout "
            f"needs {need}. Lower them."
        )
    rng = random.Random(settings.seed)
    rng.shuffle(unique)
    heldout, train = unique[: settings.heldout], unique[settings.heldout : need]
    taught: set[str] = set()
    for side in (heldout, train):
        ids = [q["id"] for q in side]
        taught.update(rng.sample(ids, round(settings.taught_share * len(ids))))
    return heldout, train, taught


def prepare_data(settings: DataSettings, folder: str | Path) -> StudyData:
    """Write (or read back) the study's questions, facts and corpus under ``folder``."""
    folder = Path(folder)
    meta_path = folder / "split.json"
    files = {
        "train_path": folder / "train.jsonl",
        "heldout_path": folder / "heldout.jsonl",
        "corpus_path": folder / "corpus.jsonl",
    }
    if meta_path.exists():
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
        if meta.get("settings") == asdict(settings) and all(p.exists() for p in files.values()):
            return StudyData(
                folder=folder,
                train=_read_jsonl(files["train_path"]),
                heldout=_read_jsonl(files["heldout_path"]),
                taught=frozenset(meta["taught"]),
                **files,
            )
    records = [q for q in _read_jsonl(Path(settings.questions)) if q.get("golden_answers")]
    heldout, train, taught = _split(records, settings)
    folder.mkdir(parents=True, exist_ok=True)
    for path, side in ((files["train_path"], train), (files["heldout_path"], heldout)):
        path.write_text("".join(json.dumps(_slim(q)) + "\n" for q in side), encoding="utf-8")
    with open(files["corpus_path"], "w", encoding="utf-8") as out:
        for passage in _read_jsonl(Path(settings.corpus)):
            text = short_passage(passage["text"], settings.passage_words)
            out.write(json.dumps({"id": passage["id"], "title": passage["title"], "text": text}) + "\n")
    meta_path.write_text(
        json.dumps({"settings": asdict(settings), "taught": sorted(taught)}, indent=1) + "\n",
        encoding="utf-8",
    )
    return StudyData(
        folder=folder,
        train=[_slim(q) for q in train],
        heldout=[_slim(q) for q in heldout],
        taught=frozenset(taught),
        **files,
    )


def _slim(q: dict[str, Any]) -> dict[str, Any]:
    """The fields the env and the study read (no inline passages)."""
    meta = q.get("metadata", {})
    return {
        "id": q["id"],
        "question": q["question"],
        "golden_answers": list(q["golden_answers"]),
        "metadata": {"subj": meta.get("subj", ""), "prop": meta.get("prop", "")},
    }


def answer_prior(train: list[dict[str, Any]]) -> dict[str, str]:
    """The most frequent first gold answer of the training questions, per relation (``prop``)."""
    counts: dict[str, Counter[str]] = {}
    for q in train:
        counts.setdefault(q["metadata"].get("prop", ""), Counter())[q["golden_answers"][0]] += 1
    return {prop: c.most_common(1)[0][0] for prop, c in counts.items()}
