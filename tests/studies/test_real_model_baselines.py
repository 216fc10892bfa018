"""benchmarks/real_model_baselines.py: the same held-out questions as the GRPO run, its rules,
its committed result file, and the per-episode records of the real-model evaluation."""

from __future__ import annotations

import collections
import dataclasses
import json
from pathlib import Path

import pytest

import benchmarks.real_model_baselines as baselines

ROOT = Path(__file__).resolve().parents[2]

COMMITTED = ROOT / "benchmarks" / "results" / "real_model_baselines.json"


def _warm_config(shared_data: Path, tmp_path: Path):
    from searchgym.trainers.run_spec import load_config

    config = load_config(ROOT / "configs" / "grpo_smollm2_cpu_warm.yaml")
    kwargs = {
        **config.env.kwargs,
        "data_path": str(shared_data / "questions" / "popqa.jsonl"),
        "corpus_path": str(shared_data / "corpus.jsonl"),
        "index_dir": str(ROOT / "benchmarks" / ".cache" / "bm25_shared"),
    }
    env = dataclasses.replace(config.env, kwargs=kwargs)
    return dataclasses.replace(config, env=env, output_dir=str(tmp_path / "run"))


def test_the_baselines_answer_the_questions_the_grpo_run_held_out(shared_data, tmp_path):
    pytest.importorskip("torch")
    from benchmarks import real_model_train

    config = _warm_config(shared_data, tmp_path)
    trained_on, held = real_model_train.hold_out(config, 100)
    heldout, train = baselines.split(dict(config.env.kwargs), 100)
    all_ids = [json.loads(line)["id"] for line in (shared_data / "questions" / "popqa.jsonl").open()]
    assert [q.id for q in heldout] == [all_ids[i] for i in held]
    written = Path(trained_on.env.kwargs["data_path"]).read_text().splitlines()
    assert [q.id for q in train] == [json.loads(line)["id"] for line in written]
    assert not {q.id for q in heldout} & {q.id for q in train}


def test_the_rules_by_hand():
    answers = collections.Counter({"actor": 5, "politician": 3, "singer": 1})
    places = collections.Counter({"London": 2, "Paris": 4})
    # place of birth: the words after "born ... in", skipping a month
    text = "Jane Roe\nJane Roe (born in May 1950 in New York City, New York) is a singer."
    assert baselines.extract(text, "place of birth", places) == ("New York City", "born in")
    # no "born in": the training answer the passage names first, not the most frequent one
    text = "John Doe was a British singer and politician, the son of an actor from London."
    assert baselines.extract(text, "occupation", answers) == ("singer", "training answer in passage")
    assert baselines.extract(text, "place of birth", places) == ("London", "training answer in passage")
    # nothing in the passage: the template's most frequent training answer
    assert baselines.extract("Nothing here.", "occupation", answers) == ("actor", "prior")
    # a word inside another is no match ("actor" in "factory")
    assert baselines.extract(
        "He ran a factory.", "occupation", collections.Counter({"actor": 1, "x": 2})
    ) == (
        "x",
        "prior",
    )
    assert baselines.template("In what city was Ann O'Neil born?") == ("place of birth", "Ann O'Neil")
    with pytest.raises(SystemExit, match="no PopQA template"):
        baselines.template("Who wrote Hamlet?")


def test_the_committed_figures_follow_from_the_rows_and_the_data(shared_data):
    from searchgym.envs.metrics import exact_match, normalize_answer

    report = json.loads(COMMITTED.read_text())
    rows = report["rows"]
    assert len(rows) == report["questions"] == 100
    for name in ("heuristic", "prior"):
        ems = [exact_match(r[name]["answer"], r["golds"]) for r in rows]
        assert ems == [r[name]["em"] for r in rows]
        assert report["results"][name]["em"] == pytest.approx(sum(ems) / len(ems))
    # the overlap with the training answers, recomputed from the data file alone
    records = [json.loads(line) for line in (shared_data / "questions" / "popqa.jsonl").open()]
    held = {r["question_id"] for r in rows}
    train_golds = {
        normalize_answer(a) for rec in records if rec["id"] not in held for a in rec["golden_answers"]
    }
    overlap = sum(
        any(normalize_answer(a) in train_golds for a in rec["golden_answers"])
        for rec in records
        if rec["id"] in held
    )
    assert overlap == report["gold_in_training_answers"]
    props = collections.Counter(rec["metadata"]["prop"] for rec in records if rec["id"] in held)
    assert dict(props) == {"occupation": 41, "place of birth": 59} == report["relations"]


def test_episode_log_keeps_each_finished_episode():
    from benchmarks.real_model_eval import episode_log
    from searchgym.envs.synthetic_env import SyntheticFactsEnv

    log: list[dict] = []
    env = episode_log(SyntheticFactsEnv(world_seed=0, retriever="simulated", topk=1), log)
    env.reset(options={"index": 3})
    question = env.unwrapped.questions[3]
    _, _, done, _, _ = env.step("<search> who is it </search>")
    assert not done and log == []
    _, reward, done, _, info = env.step(f"<answer> {question.golden_answers[0]} </answer>")
    assert done and len(log) == 1
    assert log[0]["question_id"] == question.id == info["question_id"]
    assert log[0]["answer"] == question.golden_answers[0]
    assert log[0]["em"] == 1.0 and log[0]["num_searches"] == 1 and log[0]["queries"] == ["who is it"]
    assert log[0]["reward"] == reward
