"""Tests for searchgym.envs.data: the question and corpus loaders and their error messages."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from searchgym.envs.data import load_questions
from searchgym.envs.records import Question
from searchgym.error import DataFileError
from searchgym.retrieval.corpus import load_corpus, read_jsonl
from searchgym.retrieval.records import Doc

DATA = Path(__file__).resolve().parents[3] / "shared" / "data"
needs_data = pytest.mark.skipif(
    not (DATA / "corpus.jsonl").is_file(),
    reason=f"shared data not found at {DATA} (expected ../shared/data beside the checkout)",
)

# Record counts from the table in shared/data/SOURCES.md.
QUESTION_COUNTS = {
    "hotpotqa": 500,
    "2wikimultihopqa": 500,
    "musique": 100,
    "popqa": 500,
    "nq": 500,
    "triviaqa": 500,
    "bamboogle": 50,
    "mmlu": 500,
    "gsm8k": 500,
}


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def q(qid: str = "q1", question: str = "Who?", answers: object = ("A",)) -> str:
    golden = list(answers) if isinstance(answers, tuple) else answers
    return json.dumps({"id": qid, "question": question, "golden_answers": golden})


# --- shared data ---------------------------------------------------------------------------


@needs_data
@pytest.mark.parametrize("name", sorted(QUESTION_COUNTS))
def test_load_shared_question_files(name: str) -> None:
    path = DATA / "questions" / f"{name}.jsonl"
    questions = load_questions(path)
    assert len(questions) == QUESTION_COUNTS[name]
    assert len({x.id for x in questions}) == len(questions)
    for question in questions:
        assert isinstance(question, Question)
        assert question.question.strip()
        assert question.golden_answers and all(isinstance(a, str) for a in question.golden_answers)
    # The first record, read independently with json.
    first = json.loads(path.read_text(encoding="utf-8").splitlines()[0])
    assert questions[0].id == first["id"]
    assert questions[0].question == first["question"]
    assert list(questions[0].golden_answers) == [str(a) for a in first["golden_answers"]]


@needs_data
def test_load_shared_corpus() -> None:
    docs = load_corpus(DATA / "corpus.jsonl")
    assert len(docs) == 11_153  # SOURCES.md
    assert docs[0] == Doc(
        id="pc8613c27c222d74b",
        title="John Winter (royalist)",
        text="Sir John Winter or Wintour( about 1600 – 1676) was an English ironmaster and landowner at "
        "Lydney in Gloucestershire, who was an ardent supporter of Charles I during the English Civil War.",
    )
    # SOURCES.md: id = "p" + sha1(title + "\t" + text)[:16]; checks that title and text were
    # read back exactly for every passage.
    for doc in docs:
        assert doc.id == "p" + hashlib.sha1(f"{doc.title}\t{doc.text}".encode()).hexdigest()[:16]


# --- question files ------------------------------------------------------------------------


def test_questions_blank_lines_and_answer_coercion(tmp_path: Path) -> None:
    path = write_lines(
        tmp_path / "q.jsonl",
        [
            q("a", "Capital of France?", ("Paris", "paris city")),
            "",
            "   ",
            q("b", "Six times seven?", 42),
            q("c", "One answer?", "solo"),
            q("d", "Mixed?", ["x", 3, 2.5]),
        ],
    )
    questions = load_questions(path)
    assert [x.id for x in questions] == ["a", "b", "c", "d"]
    assert questions[0].golden_answers == ("Paris", "paris city")
    assert questions[1].golden_answers == ("42",)
    assert questions[2].golden_answers == ("solo",)
    assert questions[3].golden_answers == ("x", "3", "2.5")
    assert questions[0].known is None and questions[0].hops is None


def test_questions_keep_synthetic_fields(tmp_path: Path) -> None:
    record = {"id": "s1", "question": "q?", "golden_answers": ["a"], "known": True, "hops": 2, "extra": 1}
    path = write_lines(tmp_path / "q.jsonl", [json.dumps(record)])
    assert load_questions(path) == [Question("s1", "q?", ("a",), known=True, hops=2)]


def test_missing_question_file_explains_format(tmp_path: Path) -> None:
    path = tmp_path / "nope.jsonl"
    with pytest.raises(DataFileError) as info:
        load_questions(path)
    message = str(info.value)
    for needle in (str(path), "does not exist", "golden_answers", "FlashRAG", "shared/data/questions"):
        assert needle in message


def test_directory_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(DataFileError, match="is a directory"):
        load_questions(tmp_path)
    with pytest.raises(DataFileError, match="is a directory"):
        load_corpus(tmp_path)


def test_bad_json_names_file_and_line(tmp_path: Path) -> None:
    # Line 1 good, line 2 blank, line 3 broken: the physical line number is 3.
    path = write_lines(tmp_path / "q.jsonl", [q("a"), "", '{"id": "b", "question": '])
    with pytest.raises(DataFileError) as info:
        load_questions(path)
    message = str(info.value)
    assert f"{path}:3:" in message
    assert "invalid JSON" in message


def test_line_that_is_not_an_object(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "q.jsonl", [q("a"), "[1, 2]"])
    with pytest.raises(DataFileError, match=r":2: .*JSON object, got list"):
        load_questions(path)


def test_non_utf8_file(tmp_path: Path) -> None:
    path = tmp_path / "q.jsonl"
    path.write_bytes(q("a").encode() + b"\n\xff\xfe\n")
    with pytest.raises(DataFileError, match=r":2: .*not UTF-8"):
        load_questions(path)


@pytest.mark.parametrize(
    ("record", "field"),
    [
        ({"question": "q?", "golden_answers": ["a"]}, "id"),
        ({"id": "x", "golden_answers": ["a"]}, "question"),
        ({"id": "x", "question": "q?"}, "golden_answers"),
        ({"id": ["x"], "question": "q?", "golden_answers": ["a"]}, "id"),
        ({"id": "x", "question": 7, "golden_answers": ["a"]}, "question"),
        ({"id": "x", "question": "  ", "golden_answers": ["a"]}, "question"),
        ({"id": "x", "question": "q?", "golden_answers": [["a"]]}, "golden_answers"),
        ({"id": "x", "question": "q?", "golden_answers": []}, "golden_answers"),
        ({"id": "x", "question": "q?", "golden_answers": None}, "golden_answers"),
        ({"id": "x", "question": "q?", "golden_answers": ["a"], "hops": "two"}, "hops"),
        ({"id": "x", "question": "q?", "golden_answers": ["a"], "known": "yes"}, "known"),
    ],
)
def test_bad_field_names_file_line_and_field(tmp_path: Path, record: dict, field: str) -> None:
    path = write_lines(tmp_path / "q.jsonl", [q("first"), json.dumps(record)])
    with pytest.raises(DataFileError) as info:
        load_questions(path)
    message = str(info.value)
    assert f"{path}:2:" in message
    assert f"field {field!r}" in message


@pytest.mark.parametrize("content", ["", "\n\n  \n"])
def test_empty_question_file(tmp_path: Path, content: str) -> None:
    path = tmp_path / "q.jsonl"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(DataFileError, match="is empty") as info:
        load_questions(path)
    assert str(path) in str(info.value)


def test_duplicate_question_ids(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "q.jsonl", [q("a"), q("b"), q("a")])
    with pytest.raises(DataFileError) as info:
        load_questions(path)
    message = str(info.value)
    assert f"{path}:3:" in message and "duplicate id 'a'" in message and "line 1" in message


def test_integer_question_id_becomes_str(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "q.jsonl", [json.dumps({"id": 7, "question": "q?", "golden_answers": "a"})])
    assert load_questions(path)[0].id == "7"


# --- corpus files --------------------------------------------------------------------------


def test_corpus_title_text_format(tmp_path: Path) -> None:
    path = write_lines(
        tmp_path / "c.jsonl",
        [
            json.dumps({"id": "d1", "title": "Paris", "text": "Capital of France."}),
            json.dumps({"id": 2, "text": "No title here."}),
        ],
    )
    assert load_corpus(path) == [Doc("d1", "Paris", "Capital of France."), Doc("2", "", "No title here.")]


def test_corpus_flashrag_contents_format(tmp_path: Path) -> None:
    path = write_lines(
        tmp_path / "c.jsonl",
        [
            # wiki-18 style: integer id, quoted title on the first line.
            json.dumps({"id": 0, "contents": '"Aaron"\nAaron is a prophet.\nSecond line.'}),
            json.dumps({"id": "1", "contents": "Unquoted\nbody"}),
            json.dumps({"id": "2", "contents": "Title only"}),
            json.dumps({"id": "3", "contents": '"Say "hi""\nquotes inside'}),
        ],
    )
    assert load_corpus(path) == [
        Doc("0", "Aaron", "Aaron is a prophet.\nSecond line."),
        Doc("1", "Unquoted", "body"),
        Doc("2", "Title only", ""),
        Doc("3", 'Say "hi"', "quotes inside"),
    ]


def test_missing_corpus_file_explains_format(tmp_path: Path) -> None:
    path = tmp_path / "corpus.jsonl"
    with pytest.raises(DataFileError) as info:
        load_corpus(path)
    message = str(info.value)
    for needle in (str(path), "does not exist", "contents", "title", "shared/data/corpus.jsonl"):
        assert needle in message


@pytest.mark.parametrize(
    ("record", "field"),
    [
        ({"title": "t", "text": "x"}, "id"),
        ({"id": "d", "title": "t"}, "text"),
        ({"id": "d", "title": "t", "text": 5}, "text"),
        ({"id": "d", "title": None, "text": "x"}, "title"),
        ({"id": "d", "contents": ["x"]}, "contents"),
        ({"id": True, "text": "x"}, "id"),
    ],
)
def test_corpus_bad_field(tmp_path: Path, record: dict, field: str) -> None:
    path = write_lines(
        tmp_path / "c.jsonl", [json.dumps({"id": "ok", "text": "fine"}), "", json.dumps(record)]
    )
    with pytest.raises(DataFileError) as info:
        load_corpus(path)
    assert f"{path}:3:" in str(info.value) and f"field {field!r}" in str(info.value)


def test_empty_corpus(tmp_path: Path) -> None:
    path = tmp_path / "c.jsonl"
    path.write_text("\n", encoding="utf-8")
    with pytest.raises(DataFileError, match="corpus file .* is empty"):
        load_corpus(path)


def test_duplicate_corpus_ids(tmp_path: Path) -> None:
    # 1 and "1" are the same id once converted to str.
    path = write_lines(
        tmp_path / "c.jsonl", [json.dumps({"id": 1, "text": "a"}), json.dumps({"id": "1", "text": "b"})]
    )
    with pytest.raises(DataFileError, match=r":2: duplicate id '1'.*line 1"):
        load_corpus(path)


def test_read_jsonl_returns_line_numbers(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "x.jsonl", ['{"a": 1}', "", '{"b": 2}'])
    assert read_jsonl(path, "test file") == [(1, {"a": 1}), (3, {"b": 2})]
