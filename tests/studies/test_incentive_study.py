"""The incentive study (studies/frugal): its agent, its determinism, and its committed results."""

from __future__ import annotations

import json
import math
import random
import sys
from pathlib import Path

import pytest
import yaml

from searchgym.envs.synthetic_env import SyntheticFactsEnv
from studies.frugal.agent import DecisionPolicy, Recollector, SkillAgent, Skills
from studies.frugal.incentive import load_study, mean_ci, run_one
from studies.frugal.report import render_findings_block, render_markdown, render_summary

FOLDER = Path(__file__).resolve().parents[2] / "studies" / "frugal"
RESULTS = FOLDER / "results"
ARMS = ("f1", "otc", "naive_cost", "lightsearcher", "lightsearcher_no_adaptive", "light_search",
        "light_search_no_stage2", "light_search_eq2", "sem")  # fmt: skip


@pytest.fixture(scope="module")
def study():
    return load_study(FOLDER / "incentive.yaml")


@pytest.fixture(scope="module")
def committed():
    with open(RESULTS / "results.json") as f:
        return json.load(f)


def _env(protocol="search_r1", reward="f1", noise=0.0):
    return SyntheticFactsEnv(
        world_seed=0,
        world_kwargs={"known_two_hop": False},
        retriever="simulated",
        retriever_kwargs={"noise_prob": noise, "seed": 0},
        topk=1,
        protocol=protocol,
        reward=reward,
    )


# -- the agent -------------------------------------------------------------------------------


def test_policy_update_by_hand():
    # Uniform start π = (1/3, 1/3, 1/3). One sample (state 1, action 2, A = 1), lr = 1:
    # θ[1] += 1 · (onehot(2) − π) = (−1/3, −1/3, 2/3); other states unchanged.
    policy = DecisionPolicy()
    policy.update([(1, 2, 1.0)], lr=1.0)
    assert policy.logits[1] == pytest.approx([-1 / 3, -1 / 3, 2 / 3])
    assert policy.logits[0] == [0.0, 0.0, 0.0]
    # softmax(−1/3, −1/3, 2/3) = (1, 1, e) / (2 + e) = (0.211942, 0.211942, 0.576117)
    assert policy.probs(1) == pytest.approx([0.211942, 0.211942, 0.576117], abs=1e-6)
    assert policy.greedy(1) == 2 and policy.greedy(0) == 0  # ties go to fewer searches


def test_recollection_rates_follow_the_skills():
    world = _env().unwrapped.world
    skills = Skills(recall=0.7, says_unknown=0.6, hallucination=0.5)
    memory = Recollector(world, skills, random.Random(1), greedy=False, seed=0)
    known = [f for f in world.facts if f.known]
    unknown = [f for f in world.facts if not f.known]
    n = 20
    right = sum(memory.recall(f) == f.object for f in known for _ in range(n)) / (n * len(known))
    silent = sum(memory.recall(f) is None for f in unknown for _ in range(n)) / (n * len(unknown))
    named_wrong_known = sum(
        (r := memory.recall(f)) is not None and r != f.object for f in known for _ in range(n)
    ) / (n * len(known))
    assert right == pytest.approx(0.7, abs=0.02)
    assert silent == pytest.approx(0.6, abs=0.02)
    assert named_wrong_known == pytest.approx(0.3 * 0.5, abs=0.02)
    greedy = Recollector(world, skills, random.Random(2), greedy=True, seed=0)
    assert [greedy.recall(f) for f in known[:50]] == [greedy.recall(f) for f in known[:50]]  # fixed per fact


def test_perfect_skills_answer_every_question_right_through_the_env():
    env = _env(noise=0.0)
    perfect = Skills(
        recall=1, recall_greedy=1, says_unknown=1, says_unknown_greedy=1, chain=1, retrieval_noise=0
    )
    rng = random.Random(0)
    agent = SkillAgent(env, Recollector(env.unwrapped.world, perfect, rng, greedy=False, seed=0), rng)
    questions = env.unwrapped.questions
    for index in range(0, len(questions), 7):
        state, recalled, chain = agent.observe(index)
        known = questions[index].known
        _, info = agent.play(index, 2, recalled, chain)  # searching everything: always right
        assert info["em"] == 1.0 and info["format_ok"]
        assert info["num_searches"] == 2
        _, info = agent.play(index, 0, recalled, chain)  # from memory: right exactly when known
        assert info["num_searches"] == 0 and info["em"] == float(known)


def test_sem_agent_searches_several_times_after_its_first_answer():
    env = _env(protocol="sem", reward="sem")
    perfect = Skills(recall=1, recall_greedy=1, says_unknown=1, says_unknown_greedy=1, chain=1)
    rng = random.Random(0)
    agent = SkillAgent(env, Recollector(env.unwrapped.world, perfect, rng, greedy=False, seed=0), rng)
    questions = env.unwrapped.questions
    index = next(i for i, q in enumerate(questions) if q.hops == 2 and not q.known)
    state, recalled, chain = agent.observe(index)
    reward, info = agent.play(index, 2, recalled, chain)
    assert info["num_searches"] == 2 and info["format_ok"]
    # a1 (from memory) is wrong on an unknown question, the searches find the answer: R = F1(a2) = 1.
    assert reward == 1.0


# -- the study -------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_run_is_a_pure_function_of_arm_and_seed(study):
    small = {**study, "train": {**study["train"], "steps": 15}, "eval": {"samples": 1}}
    first = run_one(small, "lightsearcher", 3)
    run_one(small, "f1", 4)  # another run in between shares the process's caches
    assert run_one(small, "lightsearcher", 3) == first


def test_mean_ci_by_hand():
    # values 1, 2, 3: mean 2, s = 1, t(0.975, 2) = 4.302653; half-width = 4.302653 / sqrt(3) = 2.484138
    mean, half = mean_ci([1.0, 2.0, 3.0])
    assert mean == 2.0 and half == pytest.approx(2.484138, abs=1e-6)
    assert mean_ci([5.0]) == (5.0, 0.0)
    assert all(math.isnan(x) for x in mean_ci([]))


def test_committed_results_have_the_issue_schema(committed, study):
    assert set(ARMS) <= set(committed["arms"])
    for name, arm in committed["arms"].items():
        assert {"em", "sr_known", "sr_unknown"} <= set(arm["mean"]), name
        assert [s["seed"] for s in arm["seeds"]] == study["seeds"], name
        for seed in arm["seeds"]:
            assert {"seed", "em", "sr_known", "sr_unknown"} <= set(seed)
            assert 0 <= seed["sr_known"] <= 100 and 0 <= seed["em"] <= 100
    assert all(t["met"] in (True, False) for t in committed["targets"])


def test_committed_tables_match_the_committed_json(committed):
    assert (RESULTS / "results.md").read_text() == render_markdown(committed)
    assert (RESULTS / "sweep.png").is_file()
    # the findings page quotes the same tables, generated too
    assert render_findings_block(committed) in (FOLDER / "README.md").read_text()


@pytest.mark.slow
@pytest.mark.parametrize("arm, seed", [("sem", 0), ("light_search_eq2", 7)])
def test_a_committed_seed_is_reproduced_bit_for_bit(committed, study, arm, seed):
    rerun = run_one(study, arm, seed)
    assert rerun == next(s for s in committed["arms"][arm]["seeds"] if s["seed"] == seed)


@pytest.mark.slow
def test_searchgym_study_runs_a_study_folder(tmp_path, study):
    from searchgym.cli import main

    small = {k: v for k, v in study.items() if k != "_dir"}
    small.update(runner=str(FOLDER / "incentive.py"), workers=1, train={**study["train"], "steps": 5})
    small["eval"] = {"samples": 1}
    config = tmp_path / "small.yaml"
    config.write_text(yaml.safe_dump(small))
    out = tmp_path / "out"
    assert (
        main(
            [
                "study",
                "--config",
                str(config),
                "--output-dir",
                str(out),
                "--arms",
                "f1",
                "sem",
                "--seeds",
                "0",
            ]
        )
        == 0
    )
    results = json.loads((out / "results.json").read_text())
    assert list(results["arms"]) == ["f1", "sem"] and results["arms"]["sem"]["seeds"][0]["seed"] == 0
    assert "sweep" not in results  # a subset runs no sweep
    assert (out / "results.md").read_text() == render_markdown(results)


def test_searchgym_study_names_a_missing_runner(tmp_path):
    from searchgym.cli import main

    config = tmp_path / "study.yaml"
    config.write_text("runner: nowhere.py\narms: {f1: {}}\n")
    with pytest.raises(SystemExit, match="nowhere.py"):
        main(["study", "--config", str(config)])


# -- the quick start (studies/frugal/quickstart.yaml, README's first command) ----------------

QUICKSTART = FOLDER / "quickstart"


def test_quickstart_committed_tables_match_its_json():
    results = json.loads((QUICKSTART / "results.json").read_text())
    assert (QUICKSTART / "results.md").read_text() == render_markdown(results)
    assert results["settings"]["config"] == "studies/frugal/quickstart.yaml"
    assert (QUICKSTART / "learning.png").is_file()
    quick = load_study(FOLDER / "quickstart.yaml")
    assert list(results["arms"]) == list(quick["arms"])
    assert all(len(arm["seeds"][0]["curve"]) == 200 // 10 for arm in results["arms"].values())


def test_summary_table_is_the_greedy_means():
    results = json.loads((QUICKSTART / "results.json").read_text())
    lines = render_summary(results).splitlines()
    f1 = results["arms"]["f1"]["mean"]
    row = f"| f1 | {f1['em']:.1f} | {f1['st']:.2f} | {f1['sr_known']:.1f} | {f1['sr_unknown']:.1f} |"
    assert row in lines and len([line for line in lines if line.startswith("| ")]) == 1 + len(results["arms"])


def test_curve_is_recorded_only_when_asked(study):
    small = {**study, "train": {**study["train"], "steps": 6}, "eval": {"samples": 1}}
    assert "curve" not in run_one(small, "otc", 0)  # the full study's results stay as committed
    curved = {**small, "train": {**small["train"], "curve_every": 3}}
    run = run_one(curved, "otc", 0)
    assert [point["step"] for point in run["curve"]] == [3, 6]
    for point in run["curve"]:
        assert set(point) == {"step", "sr_known", "sr_unknown"}
        assert 0 <= point["sr_known"] <= 100 and 0 <= point["sr_unknown"] <= 100
    # the curve only observes: the trained policy is the same as without it
    assert run["policy"] == run_one(small, "otc", 0)["policy"]


def test_the_study_runs_without_torch():
    """The quick start installs searchgym[study] only: the study must not import torch."""
    import subprocess

    code = f"""
import sys
class NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "transformers"):
            raise ImportError("torch is not installed")
sys.meta_path.insert(0, NoTorch())
from studies.frugal.incentive import load_study, run_one
study = load_study({str(FOLDER / "quickstart.yaml")!r})
small = {{**study, "train": {{**study["train"], "steps": 2, "curve_every": 1}}, "eval": {{"samples": 1}}}}
print(len(run_one(small, "light_search", 0)["curve"]))
from searchgym.trainers.grpo import group_advantages  # the package itself loads lazily

"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=FOLDER.parents[1])
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "2"


def test_the_study_shows_a_bar_over_its_runs(study, capsys):
    from studies.frugal.incentive import run_study

    small = {**study, "workers": 1, "train": {**study["train"], "steps": 2}, "eval": {"samples": 1}}
    run_study(small, ["f1", "sem"], [0, 1], progress=True)
    err = capsys.readouterr().err
    assert "study: 100%" in err and "4/4" in err  # two arms x two seeds, each counted as it ends
    run_study(small, ["f1"], [0], progress=False)
    assert "study:" not in capsys.readouterr().err


# -- every deterministic rule, the says-"unknown" sweep, the ablations -----------------------


def test_fixed_rules_by_hand():
    from studies.frugal.fixed_policies import FixedPolicy, every_rule, learned_rule, rule_name

    rules = every_rule()
    assert len(rules) == len(set(rules)) == 3**4
    policy = FixedPolicy((1, 0, 2, 2))
    rng = random.Random(5)
    assert [policy.greedy(s) for s in range(4)] == [1, 0, 2, 2]
    assert [policy.sample(s, rng) for s in range(4)] == [1, 0, 2, 2]
    reference = random.Random(5)
    assert rng.random() == [reference.random() for _ in range(5)][-1]  # one draw per decision
    assert rule_name((1, 0, 2, 2)) == "1 0 2 2"
    table = {"1-hop, unknown": [0.1, 0.8, 0.1], "1-hop, name": [0.4, 0.4, 0.2],
             "2-hop, unknown": [0.2, 0.3, 0.5], "2-hop, name": [0.0, 0.5, 0.5]}  # fmt: skip
    assert learned_rule(table) == (1, 0, 2, 1)  # ties go to fewer searches
    with pytest.raises(ValueError, match="one of"):
        FixedPolicy((3, 0, 0, 0))


def test_each_learned_policy_scores_what_its_rule_scores(committed, study):
    """Greedy evaluation depends on a learned table only through its argmax per state, so a
    committed seed of every arm has exactly the greedy figures of the rule it learned,
    evaluated afresh as a fixed rule."""
    from studies.frugal.agent import Skills
    from studies.frugal.fixed_policies import FixedPolicy, learned_rule
    from studies.frugal.incentive import evaluate

    skills = Skills(**study["skills"])
    for name, arm in committed["arms"].items():
        seed = arm["seeds"][0]
        rule = FixedPolicy(learned_rule(seed["policy"]))
        fixed = evaluate(study, study["arms"][name] or {}, seed["seed"], skills, rule, greedy=True)  # type: ignore[arg-type]
        for key in ("em", "st", "sr_known", "sr_unknown"):
            assert seed[key] == pytest.approx(fixed[key], abs=1e-5), (name, key)


@pytest.mark.slow
def test_the_says_unknown_sweep_sets_the_skill(study):
    from studies.frugal.incentive import run_study

    small = {**study, "arms": {"otc": study["arms"]["otc"]}, "seeds": [0], "workers": 1, "rules": False,
             "train": {**study["train"], "steps": 3}, "eval": {"samples": 1},
             "sweep": {"says_unknown": [0.0, 1.0], "arms": ["otc"], "seeds": [0]}}  # fmt: skip
    results = run_study(small)
    rows = {row["says_unknown"]: row for row in results["sweep_says_unknown"]}
    assert "sweep" not in results and "rules" not in results
    # the share of unknown one-hop questions the model names somebody for: all of them when it
    # never says "unknown", none when it always does (greedy and sampled alike)
    assert rows[0.0]["named_unknown"] == 100.0 and rows[0.0]["sampled"]["named_unknown"] == 100.0
    assert rows[1.0]["named_unknown"] == 0.0 and rows[1.0]["sampled"]["named_unknown"] == 0.0


def test_the_ablation_table_is_the_paired_differences(committed):
    from scipy.stats import t

    from studies.frugal.report import _ablation_rows

    def paired(arm: str, base: str, key: str, sampled: bool) -> str:
        value = {s["seed"]: (s["sampled"] if sampled else s)[key] for s in committed["arms"][base]["seeds"]}
        diffs = [
            (s["sampled"] if sampled else s)[key] - value[s["seed"]] for s in committed["arms"][arm]["seeds"]
        ]
        n = len(diffs)
        mean = sum(diffs) / n
        sd = (sum((d - mean) ** 2 for d in diffs) / (n - 1)) ** 0.5
        digits = 2 if key == "st" else 1
        return f"{mean:.{digits}f} ± {t.ppf(0.975, n - 1) * sd / n**0.5:.{digits}f}"

    rows = _ablation_rows(committed["arms"])
    row = next(r for r in rows if "`lightsearcher_no_adaptive` − `lightsearcher`" in r)
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1:5] == [paired("lightsearcher_no_adaptive", "lightsearcher", "em", False),
                          paired("lightsearcher_no_adaptive", "lightsearcher", "em", True),
                          paired("lightsearcher_no_adaptive", "lightsearcher", "st", False),
                          paired("lightsearcher_no_adaptive", "lightsearcher", "st", True)]  # fmt: skip
