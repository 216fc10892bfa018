"""Load question sets from JSON Lines files.

A question file follows the FlashRAG convention, so FlashRAG's released files load as they
are: one object per line with ``id``, ``question`` and ``golden_answers``. Passage corpora load
with :func:`searchgym.retrieval.corpus.load_corpus`.

Every problem with a file raises :class:`~searchgym.error.DataFileError` with the file's path
and, where it applies, the 1-based line number and the field at fault.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..retrieval.corpus import as_id, check_unique, field_error, read_jsonl, require_field
from .records import Question

__all__ = ["load_questions"]

_QUESTIONS_HELP = (
    "A question file is JSON Lines: one object per line with 'id' (str), 'question' (str) and "
    "'golden_answers' (list of str), the FlashRAG convention. FlashRAG's dataset releases use this "
    "format; in this project, sample files live in ../shared/data/questions/*.jsonl beside the checkout."
)


def _as_answers(value: object, path: Path, line: int) -> tuple[str, ...]:
    """A list of answers; a lone string or number is wrapped, numbers become str."""
    items = value if isinstance(value, list) else [value]
    answers = []
    for item in items:
        if isinstance(item, str):
            answers.append(item)
        elif isinstance(item, (int, float)) and not isinstance(item, bool):
            answers.append(str(item))
        else:
            raise field_error(path, line, "golden_answers", "must be a list of strings", value)
    if not answers:
        raise field_error(path, line, "golden_answers", "must hold at least one answer", value)
    return tuple(answers)


def _question(record: dict[str, Any], path: Path, line: int) -> Question:
    qid = as_id(require_field(record, "id", path, line), path, line)
    text = require_field(record, "question", path, line)
    if not isinstance(text, str) or not text.strip():
        raise field_error(path, line, "question", "must be a non-empty string", text)
    answers = _as_answers(require_field(record, "golden_answers", path, line), path, line)
    known = record.get("known")
    if known is not None and not isinstance(known, bool):
        raise field_error(path, line, "known", "must be true, false or absent", known)
    hops = record.get("hops")
    if hops is not None and (not isinstance(hops, int) or isinstance(hops, bool) or hops < 1):
        raise field_error(path, line, "hops", "must be a positive integer or absent", hops)
    return Question(id=qid, question=text, golden_answers=answers, known=known, hops=hops)


def load_questions(path: str | os.PathLike[str]) -> list[Question]:
    """Load a question set in the FlashRAG JSON Lines format.

    Each line needs ``id`` (a string; an integer is converted), ``question`` (a non-empty
    string) and ``golden_answers`` (a list of strings; a single string or number is wrapped
    and numbers are converted to strings). The optional SyntheticFacts fields ``known``
    (bool) and ``hops`` (int) are kept; every other field is ignored.

    Args:
        path: The ``.jsonl`` file.

    Returns:
        The questions in file order.

    Raises:
        DataFileError: The file is missing, a directory, empty or not valid JSON Lines; a
            field is missing or has the wrong type; or two questions share an id.
    """
    path = Path(path)
    questions: list[Question] = []
    ids: list[tuple[int, str]] = []
    for line, record in read_jsonl(path, "question file", _QUESTIONS_HELP):
        question = _question(record, path, line)
        questions.append(question)
        ids.append((line, question.id))
    check_unique(ids, path, "question file")
    return questions
