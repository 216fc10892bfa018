"""The real-LM study (studies/real_lm): its split, figures, page, and one cell end to end."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from searchgym.error import InvalidArgumentError
from studies.real_lm.data import DataSettings, prepare_data
from studies.real_lm.evaluation import figures, heuristic_answers, interval
from studies.real_lm.report import blocks, render_page
from studies.real_lm.study import aggregate, cell_order, load_study

REPO = Path(__file__).resolve().parents[2]

SHARED = REPO.parent / "shared" / "data"
needs_data = pytest.mark.skipif(
    not (SHARED / "questions" / "popqa.jsonl").exists(), reason="needs ../shared/data"
)


@needs_data
def test_split_is_disjoint_and_teaches_facts_on_both_sides(tmp_path):
    settings = DataSettings(
        questions=str(SHARED / "questions" / "popqa.jsonl"),
        corpus=str(SHARED / "corpus.jsonl"),
        train=40,
        heldout=20,
        passage_words=5,
    )
    data = prepare_data(settings, tmp_path)
    train_q = {q["question"] for q in data.train}
    held_q = {q["question"] for q in data.heldout}
    assert len(data.train) == 40 and len(data.heldout) == 20
    assert not train_q & held_q
    assert sum(q["id"] in data.taught for q in data.heldout) == 10
    assert sum(q["id"] in data.taught for q in data.train) == 20
    first = json.loads((tmp_path / "corpus.jsonl").read_text(encoding="utf-8").splitlines()[0])
    assert len(first["text"].split()) <= 5
    # read back, not rebuilt: the same split
    again = prepare_data(settings, tmp_path)
    assert again.taught == data.taught and [q["id"] for q in again.heldout] == [q["id"] for q in data.heldout]
    summary = data.summary()["overlap"]
    assert summary["question_pct"] == 0.0


def _small_study(tmp_path):
    """6 training and 4 held-out questions, the study file, and a tiny model's tokenizer."""
    import yaml

    from searchgym.policies.tiny import build_tiny_lm, load_tokenizer

    settings = DataSettings(
        questions=str(SHARED / "questions" / "popqa.jsonl"),
        corpus=str(SHARED / "corpus.jsonl"),
        train=6,
        heldout=4,
        passage_words=5,
    )
    data = prepare_data(settings, tmp_path)
    study = yaml.safe_load((REPO / "studies" / "real_lm" / "study.yaml").read_text(encoding="utf-8"))
    tokenizer = load_tokenizer(build_tiny_lm(tmp_path / "tiny", vocab_size=400, hidden_size=32, num_layers=1))
    return data, study, tokenizer


@needs_data
def test_agent_lessons_teach_each_taught_fact_in_the_probes_own_prompt(tmp_path):

    from studies.real_lm.evaluation import answer_prompts
    from studies.real_lm.study import _env_kwargs
    from studies.real_lm.warm_start import agent_lessons

    data, study, tokenizer = _small_study(tmp_path)
    kwargs = _env_kwargs(study, data, "search_r1")
    lessons = agent_lessons(data, kwargs, tokenizer)
    probe = dict(zip(answer_prompts(tokenizer, kwargs, str(data.heldout_path), 4), data.heldout, strict=True))
    taught = [q for q in [*data.train, *data.heldout] if q["id"] in data.taught]
    assert len(lessons) == len(taught) == 5
    for prompt, completion in lessons:
        assert prompt.endswith("<answer>") and completion.endswith(" </answer>")
    # a taught held-out fact is taught on exactly the input the probe gives the model
    for prompt, question in probe.items():
        taught_here = [c for p, c in lessons if p == prompt]
        expected = [f" {question['golden_answers'][0]} </answer>"] if question["id"] in data.taught else []
        assert taught_here == expected


def test_taught_share_must_leave_both_kinds():
    with pytest.raises(InvalidArgumentError, match="taught_share"):
        DataSettings(taught_share=1.0)


def test_figures_split_by_measured_known_flags():
    records = [
        {"qid": "a", "searches": 1, "em": 1.0, "f1": 1.0, "format_ok": True},
        {"qid": "b", "searches": 0, "em": 1.0, "f1": 1.0, "format_ok": True},
        {"qid": "c", "searches": 2, "em": 0.0, "f1": 0.5, "format_ok": False},
        {"qid": "d", "searches": 0, "em": 0.0, "f1": 0.0, "format_ok": True},
    ]
    known = {"a": True, "b": True, "c": False, "d": False}
    got = figures(records, known)
    # worked by hand: known a (searched), b (not) -> 50%; unknown c (searched), d (not) -> 50%
    assert got["sr_known"] == 50.0 and got["sr_unknown"] == 50.0
    assert got["st"] == 0.75 and got["em"] == 50.0 and got["f1"] == 62.5
    assert got["em_known"] == 100.0 and got["em_unknown"] == 0.0 and got["format_ok"] == 75.0


def test_cells_with_the_longest_contexts_run_first():
    study = load_study(REPO / "studies" / "real_lm" / "study.yaml")
    order = cell_order(study, ["f1", "lightsearcher", "otc"], [0, 1])
    assert order[:2] == [("lightsearcher", 0), ("lightsearcher", 1)]
    assert order[2:] == [("f1", 0), ("otc", 0), ("f1", 1), ("otc", 1)]


def test_interval_is_the_t_interval():
    # values 1, 2, 3: sd 1, n 3, t(2) = 4.303 -> 4.303 / sqrt(3)
    assert interval([1.0, 2.0, 3.0]) == pytest.approx(4.303 / 3**0.5)
    assert interval([5.0]) == 0.0


def test_aggregate_pairs_each_seed_with_f1():
    def cell(arm, seed, searched):
        rows = [
            {
                "qid": "k",
                "searches": searched,
                "answer": "x",
                "em": 1.0,
                "f1": 1.0,
                "format_ok": True,
                "reward": 1,
            },
            {"qid": "u", "searches": 1, "answer": "y", "em": 0.0, "f1": 0.0, "format_ok": True, "reward": 0},
        ]
        return {
            "arm": arm,
            "seed": seed,
            "greedy": rows,
            "sampled": rows,
            "steps": 1,
            "train_s": 1.0,
            "wall_s": 2.0,
            "median_step_s": 1.0,
        }

    cells = [cell("f1", 0, 1), cell("f1", 1, 1), cell("otc", 0, 0), cell("otc", 1, 1)]
    out = aggregate(cells, {"k": True, "u": False})
    # otc searched the known question on seed 1 only: sr_known 0 and 100 -> differences -100, 0
    assert out["otc"]["mean"]["sr_known"] == 50.0
    assert out["otc"]["vs_f1"]["sr_known"]["mean"] == -50.0
    assert out["otc"]["vs_f1"]["sr_known"]["n"] == 2
    assert out["otc"]["seeds"][0]["questions"][0] == {
        "qid": "k",
        "searches": 0,
        "answer": "x",
        "em": 1.0,
        "f1": 1.0,
        "format_ok": True,
        "reward": 1,
        "known": True,
        "sampled": {"searches": 0, "answer": "x", "em": 1.0, "f1": 1.0, "format_ok": True},
    }


def test_heuristic_reads_birthplace_and_occupation(tmp_path):
    from studies.real_lm.data import StudyData

    train = [
        {"id": "t1", "question": "q", "golden_answers": ["politician"], "metadata": {"prop": "occupation"}},
        {"id": "t2", "question": "q", "golden_answers": ["actor"], "metadata": {"prop": "occupation"}},
        {"id": "t3", "question": "q", "golden_answers": ["actor"], "metadata": {"prop": "occupation"}},
        {"id": "t4", "question": "q", "golden_answers": ["Paris"], "metadata": {"prop": "place of birth"}},
    ]
    data = StudyData(tmp_path, tmp_path, tmp_path, tmp_path, train, [], frozenset())
    questions = [
        {"id": "h1", "question": "q", "golden_answers": ["x"], "metadata": {"prop": "place of birth"}},
        {"id": "h2", "question": "q", "golden_answers": ["x"], "metadata": {"prop": "occupation"}},
        {"id": "h3", "question": "q", "golden_answers": ["x"], "metadata": {"prop": "occupation"}},
    ]
    passages = [
        "Jo Bloggs (born 3 May 1900 in Bad Ischl) was a singer.",
        "Ann Smith was an Australian soldier and politician.",
        "Nothing here.",
    ]
    assert heuristic_answers(data, questions, passages) == ["Bad Ischl", "politician", "actor"]


def _results(em_f1, em_otc):
    def arm(em, seeds):
        block = {
            k: 50.0 for k in ("f1", "sr", "sr_known", "sr_unknown", "em_known", "em_unknown", "format_ok")
        }
        block.update(em=em, st=0.5, ci95={k: 1.0 for k in ("em", "f1", "st", "sr_known", "sr_unknown")})
        block["sampled"] = dict(block)
        return {
            "mean": block,
            "seeds": [
                {
                    "seed": s,
                    "steps": 24,
                    "train_s": 60.0,
                    "median_step_s": 2.5,
                    "wall_s": 90.0,
                    "cpu_s": 80.0,
                    "train_cpu_s": 55.0,
                    "rollouts": [
                        {"step": k, "sr": 1.0 if k <= 12 else 0.5, "em": 0.5, "reward": 0.5}
                        for k in range(1, 25)
                    ],
                }
                for s in seeds
            ],
        }

    return {
        "arms": {
            "f1": arm(em_f1, [0, 1]),
            "otc": {
                **arm(em_otc, [0, 1]),
                "vs_f1": {
                    k: {"mean": -20.0, "ci95": 4.0, "n": 2} for k in ("em", "st", "sr_known", "sr_unknown")
                },
            },
        },
        "baselines": {
            "heuristic": {
                "em": 55.0,
                "f1": 56.0,
                "st": 1.0,
                "sr_known": 100.0,
                "sr_unknown": 100.0,
                "em_known": 60.0,
                "em_unknown": 50.0,
                "format_ok": 100.0,
            }
        },
        "known": {"pct": 45.0, "taught_pct": 80.0, "untaught_pct": 10.0},
        "timing": {"wall_s": 500.0, "workers": 2, "baselines_s": 30.0},
        "split": {
            "train": 160,
            "heldout": 100,
            "taught_train": 80,
            "taught_heldout": 50,
            "overlap": {"question_pct": 0.0, "subject_pct": 1.0, "answer_pct": 60.0},
        },
        "warm_start": {
            "steps": 72,
            "lessons": 520,
            "episode_actions": 628,
            "wall_s": 300.0,
            "torch_threads": 1,
            "loss_first": 2.5,
            "loss_last10": 0.4,
            "settings": {"direct_share": 0.3, "lr": 1.5e-4, "lr_schedule": "linear"},
        },
    }


def test_page_blocks_are_written_from_the_json_and_kept():
    page = "intro\n<!-- real-lm:arms-greedy -->\nstale\n<!-- end -->\nmiddle\n<!-- real-lm:paired -->\n<!-- end -->\n"
    first = render_page(page, _results(40.0, 38.5))
    # the numbers of the JSON, formatted by hand: EM 38.5 ± 1.0 for otc; its paired ΔEM -20.0 ± 4.0
    assert "| otc | 2 | 38.5 ± 1.0 |" in first and "| otc | 2 | -20.0 ± 4.0 |" in first
    assert "stale" not in first and first.startswith("intro\n") and "\nmiddle\n" in first
    assert render_page(first, _results(40.0, 38.5)) == first  # a rendered page is a fixed point
    assert render_page(first, _results(40.0, 12.0)) != first  # and changes with its JSON
    training = blocks(_results(40.0, 38.5))["training"]
    # steps 1-12 all searched, 13-24 half: windows of 4 steps read 100, 100, 100, 50, 50, 50
    assert "| otc | 1 | 100 | 100 | 100 | 50 | 50 | 50 |" in training and "Steps 21–24" in training
    # four cells of 80 CPU-s; with the warm start (300 s) and the baselines (30 s) on two cores
    assert blocks(_results(40.0, 38.5))["timing"].endswith(
        "- In all: 4 cells, 320 s of CPU time, 0.0 hours of two cores however they are packed. Before them, "
        "the warm start 300 s and its decision pass 0 s on 1 torch thread(s), the baselines 30 s; with them, "
        "about 0.1 hours of two cores."
    )
    with pytest.raises(KeyError, match="unknown block"):
        render_page("<!-- real-lm:nope -->\n<!-- end -->", _results(1.0, 1.0))


def test_targets_are_judged_on_the_mean_and_flag_an_interval_across_the_line():
    results = _results(40.0, 38.5)
    results["arms"]["f1"]["mean"].update(sr_known=90.0)  # half of it: 45
    results["arms"]["otc"]["mean"].update(sr_known=30.0, sr_unknown=79.5)  # interval ± 1 holds 80
    results["arms"]["otc"]["vs_f1"]["em"] = {"mean": -1.5, "ci95": 0.2, "n": 2}
    results["arms"]["otc"]["vs_f1"]["st"] = {"mean": -0.4, "ci95": 0.1, "n": 2}
    results["arms"]["light_search_eq2"] = results["arms"]["otc"]  # otc's figures under Light-Search's name
    targets = blocks(results)["targets"]
    assert "- f1 (2 seeds) searches at least 80% of known questions: 90.0 ± 1.0: met." in targets
    assert (
        "(2 seeds, paired) cuts searches per question (the paired difference against f1 below 0): -0.40 ± 0.10: met."
        in targets
    )
    assert (
        "| otc | 2 | 30.0 ± 1.0: met | -1.5 ± 0.2: met | 79.5 ± 1.0: missed, the interval crosses the line |"
        in targets
    )
    assert "(45.0)" in targets
    del results["arms"]["f1"]
    assert "No f1 arm" in blocks(results)["targets"]


def test_one_seed_gives_no_interval_and_compare_sets_two_warm_starts_side_by_side():
    def run(share: float, named: int, em_otc: float, seeds: list[int]) -> dict:
        results = _results(40.0, em_otc)
        for entry in results["arms"].values():
            entry["seeds"] = [{**entry["seeds"][0], "seed": s, "questions": []} for s in seeds]
        for paired in results["arms"]["otc"]["vs_f1"].values():
            paired["n"] = len(seeds)
        results["settings"] = {"data": {"taught_share": share}}
        # four unknown questions, ``named`` of them recalled with a name rather than `unknown`
        recalls = ["Paris"] * named + ["unknown"] * (4 - named)
        questions = [{"qid": f"q{i}", "known": False, "recall": r} for i, r in enumerate(recalls)]
        results["first_action"] = {"questions": [*questions, {"qid": "k", "known": True, "recall": "Rome"}]}
        results["known"]["probe"] = [
            {"qid": q["qid"], "known": q["known"]} for q in results["first_action"]["questions"]
        ]
        return results

    earlier, later = run(0.5, 3, 38.5, [0, 1]), run(0.3, 1, 39.0, [0])
    assert "| otc | 1 | 39.0 | 50.0 | 0.50 |" in blocks(later)["arms-greedy"]  # no "± 0.0" from one seed
    assert "| otc | 1 | -20.0 | -20.00 | -20.0 | -20.0 |" in blocks(later)["paired"]
    compare = blocks(later, earlier)["compare"]
    assert (
        "- Taught share 0.5: 45.0% of the held-out questions known; the warm start's recall names an answer on 3 of the 4 unknown ones (25.0% recalled as `unknown`)."
        in compare
    )
    assert "names an answer on 1 of the 4 unknown ones (75.0% recalled as `unknown`)" in compare
    assert "| otc | 0.5 | 2 | 38.5 ± 1.0 | 0.50 ± 1.00 | 50.0 ± 1.0 | 50.0 ± 1.0 | -20.0 ± 4.0 |" in compare
    assert compare.endswith("| otc | 0.3 | 1 | 39.0 | 0.50 | 50.0 | 50.0 | -20.0 |")
    assert (
        "| f1 | 0.5 | 2 | 40.0 ± 1.0 |" in compare
        and "| f1 | 0.3 | 1 | 40.0 | 0.50 | 50.0 | 50.0 | – |" in compare
    )
    assert "No earlier run" in blocks(later)["compare"]


RESULTS = REPO / "studies" / "real_lm" / "results" / "results.json"
EARLIER = REPO / "studies" / "real_lm" / "results" / "taught_share_0.5.json"


@pytest.mark.skipif(not RESULTS.exists(), reason="the calibration run is not committed yet")
def test_page_equals_its_json():
    results = json.loads(RESULTS.read_text(encoding="utf-8"))
    earlier = json.loads(EARLIER.read_text(encoding="utf-8"))
    page = (REPO / "docs" / "real_lm_study.md").read_text(encoding="utf-8")
    assert render_page(page, results, earlier) == page, "run: python -m studies.real_lm.report (see the page)"
    for name in blocks(results, earlier):
        assert f"<!-- real-lm:{name} -->" in page


@pytest.mark.skipif(not RESULTS.exists(), reason="the calibration run is not committed yet")
def test_merge_adds_a_folders_cells_only_when_both_warm_starts_split_alike():
    from studies.real_lm.merge import cells_of, merge_results

    results = json.loads(RESULTS.read_text(encoding="utf-8"))
    known = {p["qid"]: p["known"] for p in results["known"]["probe"]}
    cells = cells_of(results)
    # nothing is lost in the round trip
    assert json.loads(json.dumps(aggregate(cells, known))) == results["arms"]
    arms = list(results["arms"])
    last, rest = cells[-1], cells[:-1]
    fewer = {**results, "arms": aggregate(rest, known)}
    baselines = {
        "probe": results["known"]["probe"],
        "rows": {"warm_started": {"questions": results["baseline_questions"]["warm_started"]}},
    }
    first = results["first_action"]
    warm = {"loss_first": 1.9, "loss_last10": 0.2, "wall_s": 9.0, "torch_threads": 2, "decision": {}}
    merged = merge_results(fewer, [last], baselines, first, warm, arms, "more")
    assert json.loads(json.dumps(merged["arms"])) == results["arms"]
    assert merged["merged"][:-1] == results.get("merged", [])  # earlier merges are kept
    entry = merged["merged"][-1]
    assert entry["cells"] == [[last["arm"], last["seed"]]] and entry["folder"] == "more"
    n = len(known)
    assert entry["agreement"] == {
        "questions": n,
        "known_flags": n,
        "probe_answers": n,
        "warm_started_greedy": n,
        "recall": n,
        "p_search_max_change": 0.0,
    }
    assert "Cells from a second output folder" in blocks(merged)["split"]
    with pytest.raises(InvalidArgumentError, match="already in the results file"):
        merge_results(results, [last], baselines, first, warm, arms, "more")
    with pytest.raises(InvalidArgumentError, match="no finished cell"):
        merge_results(fewer, [], baselines, first, warm, arms, "more")
    flipped = [{**p, "known": not p["known"]} if i == 0 else p for i, p in enumerate(baselines["probe"])]
    with pytest.raises(InvalidArgumentError, match="split the held-out questions differently"):
        merge_results(fewer, [last], {**baselines, "probe": flipped}, first, warm, arms, "more")


@needs_data
def test_one_cell_end_to_end_with_a_tiny_model(tmp_path, monkeypatch, capsys):
    """1 arm x 1 seed x 1 step through ``searchgym study``'s runner; then a rerun keeps the cell."""
    from searchgym.policies.tiny import build_tiny_lm

    tiny = build_tiny_lm(tmp_path / "tiny", vocab_size=400, hidden_size=32, num_layers=1)
    study = yaml.safe_load((REPO / "studies" / "real_lm" / "study.yaml").read_text(encoding="utf-8"))
    study["model"] = str(tiny)
    study["workers"] = 1
    study["data"].update(
        questions=str(SHARED / "questions" / "popqa.jsonl"),
        corpus=str(SHARED / "corpus.jsonl"),
        train=8,
        heldout=6,
        passage_words=8,
    )
    study["warm_start"].update(epochs=1, fact_repeats=1, batch_size=8, decision_steps=2)
    study["base"]["steps"] = 1
    study["base"]["model"]["train_layers"] = 1  # the tiny model's one block
    study["base"]["rollout"].update(group_size=2, questions_per_step=2, max_new_tokens=8)
    config = tmp_path / "study.yaml"
    config.write_text(yaml.safe_dump(study), encoding="utf-8")
    (tmp_path / "runner.py").write_text((REPO / "studies" / "real_lm" / "runner.py").read_text())
    # a runner outside the study's package is loaded from its file; it imports
    # studies.real_lm from the repository root, which pytest puts on the path (pytest.ini)
    from searchgym.cli import main

    out = tmp_path / "out"
    assert (
        main(["study", "--config", str(config), "--output-dir", str(out), "--arms", "f1", "--seeds", "0"])
        == 0
    )
    results = json.loads((out / "results.json").read_text(encoding="utf-8"))
    f1 = results["arms"]["f1"]
    assert set(f1["mean"]) >= {"em", "sr_known", "sr_unknown", "ci95", "sampled"}
    (seed,) = f1["seeds"]
    assert seed["seed"] == 0 and seed["steps"] == 1
    assert [r["step"] for r in seed["rollouts"]] == [1] and 0.0 <= seed["rollouts"][0]["sr"] <= 1.0
    assert [q["qid"] for q in seed["questions"]] == [q["qid"] for q in results["known"]["probe"]]
    assert {"qid", "known", "searches", "answer", "em", "f1"} <= set(seed["questions"][0])
    assert results["split"]["heldout"] == 6 and len(results["known"]["probe"]) == 6
    first = results["first_action"]
    assert [q["qid"] for q in first["questions"]] == [q["qid"] for q in results["known"]["probe"]]
    assert all(0.0 < q["p_search"] < 1.0 for q in first["questions"]) and first["groups"]["all"]["n"] == 6
    assert set(results["baselines"]) >= {
        "no_retrieval",
        "naive_rag",
        "untrained",
        "warm_started",
        "answer_prior",
        "heuristic",
    }
    assert all("recall" in q and 0.0 < q["p_action"] <= 1.0 for q in first["questions"])  # recalls first
    assert results["warm_start"]["decision"]["steps"] == 2  # the cells start from the decision pass
    cell_config = yaml.safe_load((out / "cells" / "f1" / "seed0" / "config.yaml").read_text(encoding="utf-8"))
    assert Path(cell_config["model"]["path"]).name.startswith("decision_")
    cell = out / "cells" / "f1" / "seed0" / "cell.json"
    assert not (cell.parent / "checkpoints").exists()  # keep_checkpoints: false
    stamp = cell.stat().st_mtime_ns
    assert (
        main(["study", "--config", str(config), "--output-dir", str(out), "--arms", "f1", "--seeds", "0"])
        == 0
    )
    assert cell.stat().st_mtime_ns == stamp  # finished cells are kept
    from studies.real_lm.first_action import main as first_action

    stamp = (out / "first_action.json").stat().st_mtime_ns
    assert first_action(["--config", str(config), "--output-dir", str(out)]) == 0
    assert (
        out / "first_action.json"
    ).stat().st_mtime_ns == stamp  # the decision pass's model, as the study's
    (out / "results.json").unlink()
    out = out.rename(tmp_path / "moved")  # a moved output folder keeps its warm start, baselines and cells
    assert main(["study", "--config", str(config), "--output-dir", str(out), "--collect"]) == 0
    collected = json.loads((out / "results.json").read_text(encoding="utf-8"))
    assert list(collected["arms"]) == ["f1"] and collected["arms"]["f1"]["seeds"][0]["seed"] == 0
    # --collect never trains: other warm-start settings name the warm start it lacks
    study["warm_start"]["lr"] = 2e-4
    config.write_text(yaml.safe_dump(study), encoding="utf-8")
    stamp = (out / "results.json").stat().st_mtime_ns
    capsys.readouterr()
    assert main(["study", "--config", str(config), "--output-dir", str(out), "--collect"]) != 0
    assert "run the study without --collect" in capsys.readouterr().err
    assert (out / "results.json").stat().st_mtime_ns == stamp


def test_warm_start_batches_cover_every_example_once_and_pad_little():
    import numpy as np

    from studies.real_lm.warm_start import _batches

    lengths = [10, 100] * 32  # fact lessons and episodes, interleaved
    batches = _batches(lengths, 4, np.random.default_rng(0))
    assert sorted(i for b in batches for i in b) == list(range(64))
    assert all(1 <= len(b) <= 4 for b in batches)
    # pools of 8 batches are sorted by length: at most one batch per pool of 32 mixes the kinds
    mixed = [b for b in batches if len({lengths[i] for i in b}) > 1]
    assert len(mixed) <= 2


def test_warm_start_rate_warms_up_then_decays_to_zero():
    from studies.real_lm.warm_start import WarmStartSettings, lr_factor

    total = 100
    factors = [lr_factor("linear", step, total) for step in range(total)]
    assert factors[0] == pytest.approx(0.2) and factors[4] == 1.0  # 5 warmup steps
    assert all(a >= b for a, b in zip(factors[4:], factors[5:], strict=False))
    assert 0.0 < factors[-1] <= 1 / 95  # the last step moves the weights least
    assert {lr_factor("constant", step, total) for step in range(total)} == {1.0}
    with pytest.raises(InvalidArgumentError, match="lr_schedule.*linear, constant"):
        WarmStartSettings(lr_schedule="cosine")
    for bad in (0, 1.5, True):
        with pytest.raises(InvalidArgumentError, match="episode_repeats: got .*integer >= 1"):
            WarmStartSettings(episode_repeats=bad)


def test_searched_share_by_recall_groups_questions_by_what_the_warm_start_recalled():
    from studies.real_lm.report import _recall_table

    def question(qid, known, searches):
        return {"qid": qid, "known": known, "searches": searches}

    results = {
        "first_action": {
            "questions": [
                {"qid": "a", "recall": "unknown"},
                {"qid": "b", "recall": "Paris"},
                {"qid": "c", "recall": "Rome"},
            ]
        },
        "known": {
            "probe": [{"qid": "a", "known": False}, {"qid": "b", "known": True}, {"qid": "c", "known": True}]
        },
        "arms": {
            "otc": {
                "seeds": [
                    {"questions": [question("a", False, 1), question("b", True, 0), question("c", True, 1)]},
                    {"questions": [question("a", False, 2), question("b", True, 0), question("c", True, 0)]},
                ]
            }
        },
    }
    header, _, row = _recall_table(results).splitlines()
    assert header == (
        "| Arm | recalled unknown, known (0) | recalled unknown, unknown (1) | recalled a name, known (2) "
        "| recalled a name, unknown (0) |"
    )
    assert row == "| otc | – | 100 | 25 | – |"  # pooled over seeds: 1 of 4 name-recalled known searched


def test_decision_pass_batches_keep_each_kinds_share():
    """Every batch of the decision pass holds each kind of first action in its share."""
    import numpy as np

    from studies.real_lm.warm_start import _stratified_batches

    groups = ["direct"] * 24 + ["taught"] * 56 + ["untaught"] * 80
    batches = _stratified_batches(groups, 16, np.random.default_rng(0))
    assert sorted(i for batch in batches for i in batch) == list(range(len(groups)))
    for batch in batches:
        counts = {kind: sum(groups[i] == kind for i in batch) for kind in ("direct", "taught", "untaught")}
        assert counts["direct"] in (2, 3) and counts["taught"] in (5, 6) and counts["untaught"] == 8


def test_decision_settings_do_not_change_the_main_passs_key(tmp_path):
    """A decision pass reuses the cached main pass: its fields stay out of the main key."""
    import dataclasses

    from studies.real_lm.data import StudyData
    from studies.real_lm.warm_start import WarmStartSettings, _key

    data = StudyData(tmp_path, tmp_path / "t", tmp_path / "h", tmp_path / "c", [], [], frozenset())
    for path in (data.train_path, data.heldout_path, data.corpus_path):
        path.write_text("{}\n", encoding="utf-8")
    base = WarmStartSettings()
    decided = dataclasses.replace(base, decision_steps=20, decision_lr=1e-5)
    assert _key(decided, "m", {}, data) == _key(base, "m", {}, data)
    assert _key(dataclasses.replace(base, direct_share=0.5), "m", {}, data) != _key(base, "m", {}, data)


def test_the_warm_starts_key_follows_the_datas_content_not_its_folder(tmp_path):
    from studies.real_lm.data import StudyData
    from studies.real_lm.warm_start import WarmStartSettings, _key

    def data_in(folder, corpus="{}\n", taught=frozenset({"q1"})):
        folder.mkdir(exist_ok=True)
        paths = [folder / name for name in ("train.jsonl", "heldout.jsonl", "corpus.jsonl")]
        for path, text in zip(paths, ("{}\n", "{}\n", corpus), strict=True):
            path.write_text(text, encoding="utf-8")
        env = {
            "search_r1": {"protocol": "search_r1", "data_path": str(paths[0]), "corpus_path": str(paths[2])}
        }
        return StudyData(folder, *paths, [], [], taught), env

    here, env_here = data_in(tmp_path / "a")
    moved, env_moved = data_in(tmp_path / "b")
    settings = WarmStartSettings()
    assert _key(settings, "m", env_here, here) == _key(settings, "m", env_moved, moved)
    other_corpus, env_other = data_in(tmp_path / "c", corpus='{"id": 1}\n')
    assert _key(settings, "m", env_other, other_corpus) != _key(settings, "m", env_here, here)
    other_taught, env_taught = data_in(tmp_path / "d", taught=frozenset({"q2"}))
    assert _key(settings, "m", env_taught, other_taught) != _key(settings, "m", env_here, here)
    for bad in (-1, 1.5, True):
        with pytest.raises(InvalidArgumentError, match="decision_steps: got .*integer >= 0"):
            WarmStartSettings(decision_steps=bad)


def _tiny_model_and_prompt(tmp_path):
    """A tiny model's tokenizer and model (float32, eval) and one rendered question prompt."""
    import torch
    from transformers import AutoModelForCausalLM

    from searchgym.policies.tiny import build_tiny_lm, load_tokenizer

    folder = build_tiny_lm(tmp_path / "tiny", vocab_size=400, hidden_size=32, num_layers=1)
    tokenizer = load_tokenizer(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    prompt = (
        "<|im_start|>user\nQuestion: In what city was Jerry Best born?<|im_end|>\n<|im_start|>assistant\n"
    )
    return tokenizer, model, prompt


def test_first_action_probability_matches_step_by_step_decoding(tmp_path):
    """``p(search)`` from whole-sequence scoring equals one-token-at-a-time decoding with a cache."""
    import math

    import torch

    from studies.real_lm.first_action import OPENINGS, opening_probabilities, search_probabilities, summarise

    tokenizer, model, prompt = _tiny_model_and_prompt(tmp_path)

    def step_by_step(opening: str) -> float:
        head = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        tail = tokenizer(prompt + opening, add_special_tokens=False)["input_ids"][len(head) :]
        with torch.no_grad():
            out = model(torch.tensor([head]), use_cache=True)
            total = 0.0
            for token in tail:
                total += float(out.logits[0, -1].log_softmax(-1)[token])
                out = model(torch.tensor([[token]]), past_key_values=out.past_key_values, use_cache=True)
        return total

    search, answer = (step_by_step(o) for o in OPENINGS)
    (p,) = search_probabilities(model, tokenizer, [prompt])
    assert p == pytest.approx(1 / (1 + math.exp(answer - search)), rel=1e-4)
    ((p_search, p_answer),) = opening_probabilities(model, tokenizer, [prompt])
    assert (p_search, p_answer) == pytest.approx((math.exp(search), math.exp(answer)), rel=1e-4)
    rows = [
        {"known": True, "taught": True, "p_search": 0.2},
        {"known": True, "taught": False, "p_search": 0.4},
        {"known": False, "taught": False, "p_search": 0.9},
    ]
    groups = summarise(rows)
    assert groups["known"]["median"] == pytest.approx(0.3) and groups["unknown"]["n"] == 1
    assert groups["untaught"]["min"] == 0.4 and groups["all"]["max"] == 0.9


@needs_data
def test_demonstrated_actions_end_where_generation_stops(tmp_path):
    """search_r1 actions end at a stop string; SEM's answer turns end with the end token."""

    from studies.real_lm.study import _env_kwargs
    from studies.real_lm.warm_start import WarmStartSettings, episode_pairs, split_by_turn_end

    data, study, tokenizer = _small_study(tmp_path)
    warm = WarmStartSettings(direct_share=1.0)  # every taught question answers at once
    r1 = episode_pairs(data, _env_kwargs(study, data, "search_r1"), "search_r1", tokenizer, warm)
    at_stop, at_eos = split_by_turn_end(r1, "search_r1")
    assert len(at_stop) == len(r1) and not at_eos
    sem = episode_pairs(data, _env_kwargs(study, data, "sem"), "sem", tokenizer, warm)
    at_stop, at_eos = split_by_turn_end(sem, "sem")
    # 3 taught questions answer in one turn; the 3 others search (stops at </search>), then answer
    assert [a.endswith("</search>") for _, a in at_stop] == [True] * 3
    assert len(at_eos) == 6 and all(a.endswith("</answer>") for _, a in at_eos)


@needs_data
def test_recall_first_opens_each_first_action_with_what_the_agent_recalls(tmp_path):
    """Taught questions recall the answer, untaught ones ``unknown`` and always search; the env
    takes every demonstrated action; ``think`` lessons teach the facts where the recall is made."""
    from studies.real_lm.study import _env_kwargs
    from studies.real_lm.warm_start import (
        UNKNOWN,
        WarmStartSettings,
        agent_lessons,
        episode_pairs,
        first_actions,
    )

    data, study, tokenizer = _small_study(tmp_path)
    kwargs = _env_kwargs(study, data, "search_r1")
    warm = WarmStartSettings(direct_share=0.5, recall_first=True)
    pairs = episode_pairs(data, kwargs, "search_r1", tokenizer, warm)
    firsts = {
        q["id"]: a
        for q in data.train
        for c, a in pairs
        if c.rstrip().endswith(q["question"] + "<|im_end|>\n<|im_start|>assistant")
    }
    assert len(firsts) == len(data.train) == 6
    directs = 0
    for q in data.train:
        gold = q["golden_answers"][0]
        recall = gold if q["id"] in data.taught else UNKNOWN
        assert firsts[q["id"]].startswith(f"<think> {recall} </think><")
        if q["id"] not in data.taught:
            assert firsts[q["id"]].endswith("</search>")
        directs += firsts[q["id"]].endswith(f"<answer> {gold} </answer>")
    assert 0 < directs < len(data.taught & {q["id"] for q in data.train})
    kinds = first_actions(data, kwargs, "search_r1", tokenizer, warm)  # the decision pass's examples
    assert sorted(a for pairs in kinds.values() for _, a in pairs) == sorted(firsts.values())
    assert len(kinds["direct"]) == directs and all(a.endswith("</answer>") for _, a in kinds["direct"])
    assert all(a.endswith("</search>") for _, a in kinds["taught"] + kinds["untaught"])
    assert all(a.startswith(f"<think> {UNKNOWN} </think>") for _, a in kinds["untaught"])
    lessons = agent_lessons(data, kwargs, tokenizer, "think")
    assert lessons and all(p.endswith("<think>") and c.endswith(" </think>") for p, c in lessons)
    with pytest.raises(InvalidArgumentError, match="lesson_prompts"):
        WarmStartSettings(lesson_prompts=("chat", "recall"))
    with pytest.raises(InvalidArgumentError, match="recall_first"):
        WarmStartSettings(recall_first="yes")  # type: ignore[arg-type]


def test_greedy_recall_is_the_models_own_greedy_decoding(tmp_path):
    import torch

    from studies.real_lm.first_action import RECALL_TOKENS, greedy_recalls, summarise

    tokenizer, model, prompt = _tiny_model_and_prompt(tmp_path)
    ids = tokenizer(prompt + "<think>", add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        for _ in range(RECALL_TOKENS):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    expected = tokenizer.decode(ids[-RECALL_TOKENS:]).split("</think>")[0]
    assert greedy_recalls(model, tokenizer, [prompt]) == [expected]
    rows = [
        {"known": True, "taught": True, "p_search": 0.2, "recall": "Queens"},
        {"known": False, "taught": False, "p_search": 0.9, "recall": "unknown"},
        {"known": False, "taught": False, "p_search": 0.7, "recall": "Paris"},
    ]
    groups = summarise(rows)
    assert groups["known"]["recall_unknown_share"] == 0.0 and groups["unknown"]["recall_unknown_share"] == 0.5


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_killed_study_takes_its_cell_workers_with_it(tmp_path):
    """The study's pool workers end with the study's process, even on SIGKILL."""
    script = tmp_path / "parent.py"
    script.write_text(
        "import concurrent.futures as cf, multiprocessing as mp, os, sys, time\n"
        f"sys.path.insert(0, {str(REPO)!r})\n"
        "from studies.real_lm.study import die_with_parent\n"
        "if __name__ == '__main__':\n"
        "    context = mp.get_context('spawn')\n"
        "    with cf.ProcessPoolExecutor(1, mp_context=context, initializer=die_with_parent) as pool:\n"
        "        print(pool.submit(os.getpid).result(), flush=True)\n"
        "        pool.submit(time.sleep, 120).result()\n",
        encoding="utf-8",
    )
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        worker = int(parent.stdout.readline())
        parent.kill()
        parent.wait(30)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and _alive(worker):
            time.sleep(0.2)
        assert not _alive(worker), "the worker outlived the study's process"
    finally:
        parent.kill()


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")  # a zombie has ended; only its parent has not read its status
