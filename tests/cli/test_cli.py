"""The ``searchgym`` command line, in-process through ``main`` and once as a subprocess."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from searchgym.cli import main
from searchgym.envs.benchmarks import DATA_DIR_VARIABLE

FIGURE_KEYS = {
    "em",
    "f1",
    "cover_em",
    "st",
    "sd",
    "sr",
    "format_ok",
    "action_chars",
    "reward",
    "wall_time_s",
    "splits",
}
EXPECTED_IDS = [
    "searchgym/SyntheticFacts-v1",
    "searchgym/NQ-v1",
    "searchgym/TriviaQA-v1",
    "searchgym/PopQA-v1",
    "searchgym/HotpotQA-v1",
    "searchgym/2WikiMultihopQA-v1",
    "searchgym/MuSiQue-v1",
    "searchgym/Bamboogle-v1",
    "searchgym/MMLU-v1",
    "searchgym/GSM8K-v1",
]


def test_envs_lists_the_ten_ids(capsys):
    assert main(["envs"]) == 0
    assert capsys.readouterr().out.splitlines() == EXPECTED_IDS


def test_eval_compares_the_three_policies_under_the_cost_reward(tmp_path, capsys):
    out = tmp_path / "figures" / "cost.json"
    argv = ["eval", "--reward", "cost", "--episodes", "40", "--no-progress", "--out", str(out)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "reward=cost" in printed and f"wrote {out}" in printed
    payload = json.loads(out.read_text(encoding="utf-8"))
    assert [r["policy"] for r in payload] == ["direct", "naive_rag", "oracle_synthetic"]
    for result in payload:
        assert FIGURE_KEYS <= set(result)
        assert result["episodes"] == 40
        assert set(result["splits"]) == {"known", "unknown", "1-hop", "2-hop"}
        assert result["settings"]["reward"] == "cost"
        # SyntheticFacts answers are single entities, so F1 is 0 or 1 and equals EM here
        assert result["f1"] == pytest.approx(result["em"])
        # every row of the table starts with the policy name
        assert f"| {result['policy']} | all | 40 |" in printed
    direct, naive, oracle = payload
    # The cost reward's defaults: λ = 0.1, price 1 per search, hard gate at θ = 0.8, so an
    # episode scores F1 - 0.1·searches when F1 >= 0.8 and F1 otherwise. With F1 in {0, 1}:
    # direct never searches: reward = mean F1 = EM
    assert direct["reward"] == pytest.approx(direct["em"])
    # naive_rag searches once in every episode and pays only when right: reward = EM - 0.1·EM
    assert naive["st"] == 1.0
    assert naive["reward"] == pytest.approx(0.9 * naive["em"])
    # the oracle is always right here, so it pays for every search: reward = 1 - 0.1·ST
    assert oracle["em"] == 1.0
    assert oracle["reward"] == pytest.approx(1.0 - 0.1 * oracle["st"])
    assert oracle["reward"] > naive["reward"] > 0.0


def test_eval_on_hotpotqa_with_naive_rag(shared_data, tmp_path, capsys):
    out = tmp_path / "hotpot.json"
    argv = [
        "eval",
        "--env", "searchgym/HotpotQA-v1",
        "--data-path", str(shared_data / "questions" / "hotpotqa.jsonl"),
        "--corpus-path", str(shared_data / "corpus.jsonl"),
        "--policy", "naive_rag",
        "--episodes", "20",
        "--no-progress",
        "--out", str(out),
    ]  # fmt: skip
    assert main(argv) == 0
    capsys.readouterr()
    result = json.loads(out.read_text(encoding="utf-8"))  # one policy: one object, not a list
    assert FIGURE_KEYS <= set(result)
    assert (result["policy"], result["episodes"]) == ("naive_rag", 20)
    # one search per question: ST = 1 (SD = 0) and SR = 1
    assert (result["st"], result["sd"], result["sr"]) == (1.0, 0.0, 1.0)
    assert 0.0 <= result["em"] <= 1.0
    assert result["em"] <= result["cover_em"]  # an exact match is also covered
    assert result["splits"] == {}  # HotpotQA has no known/hops fields
    assert result["settings"]["env"] == "searchgym/HotpotQA-v1"


def test_eval_short_env_name_is_accepted(capsys):
    argv = ["eval", "--env", "SyntheticFacts-v1", "--policy", "direct", "--episodes", "5", "--no-progress"]
    assert main(argv) == 0
    assert "searchgym/SyntheticFacts-v1" in capsys.readouterr().out


def test_eval_notes_that_synthetic_facts_ignores_data_paths(capsys):
    argv = ["eval", "--policy", "direct", "--episodes", "3", "--no-progress", "--data-path", "x.jsonl"]
    assert main(argv) == 0
    assert "ignored" in capsys.readouterr().err


@pytest.mark.slow
def test_python_dash_m_searchgym_eval_runs_as_a_subprocess(tmp_path):
    out = tmp_path / "run.json"
    completed = subprocess.run(
        [sys.executable, "-m", "searchgym", "eval", "--policy", "direct,naive_rag", "--episodes", "10",
         "--protocol", "sem", "--no-progress", "--out", str(out)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr
    payload = json.loads(out.read_text(encoding="utf-8"))
    assert [r["policy"] for r in payload] == ["direct", "naive_rag"]
    assert all(r["settings"]["protocol"] == "sem" and r["episodes"] == 10 for r in payload)
    assert "protocol=sem" in completed.stdout


# -- Bad input: exit code 2 and one line on stderr -----------------------------------------------


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (
            ["eval", "--env", "searchgym/SyntheticFact-v1"],
            "Unknown env id 'searchgym/SyntheticFact-v1'. Did you mean 'searchgym/SyntheticFacts-v1'",
        ),
        (["eval", "--reward", "bogus"], "Unknown reward scheme 'bogus'."),
        (["eval", "--policy", "naiv_rag"], "Unknown policy 'naiv_rag'. Did you mean 'naive_rag'?"),
        (["eval", "--protocol", "search_r2"], "search_r2"),
        (["eval", "--env", "searchgym/HotpotQA-v1"], "reads local files: give --data-path and --corpus-path"),
        (["eval", "--episodes", "0"], "episodes must be an int >= 1, got 0."),
        (["eval", "--topk", "0"], "topk must be an int >= 1, got 0."),
    ],
)
def test_bad_input_exits_2_with_one_line_on_stderr(argv, expected, monkeypatch, capsys):
    monkeypatch.delenv(DATA_DIR_VARIABLE, raising=False)
    assert main([*argv, "--no-progress"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith("searchgym: error: ")
    assert expected in lines[0]


def test_a_missing_hotpotqa_file_exits_2(tmp_path, capsys):
    missing = tmp_path / "nope.jsonl"
    argv = ["eval", "--env", "searchgym/HotpotQA-v1", "--data-path", str(missing), "--no-progress"]
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert len(captured.err.splitlines()) == 1
    assert "nope.jsonl" in captured.err


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("{bad", "argument --reward-kwargs: not valid JSON"),
        ("[1]", "argument --reward-kwargs: expected a JSON object"),
    ],
)
def test_reward_kwargs_that_is_not_a_json_object_is_an_argparse_error(value, expected, capsys):
    with pytest.raises(SystemExit) as caught:
        main(["eval", "--reward-kwargs", value, "--no-progress"])
    assert caught.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    # argparse prints its usage, then one error line
    last = captured.err.strip().splitlines()[-1]
    assert last.startswith("searchgym eval: error: ")
    assert expected in last


def test_reward_kwargs_reach_the_reward_scheme(tmp_path, capsys):
    # with λ = 0.5 the naive_rag reward is EM - 0.5·EM = 0.5·EM (one search, hard gate)
    out = tmp_path / "lam.json"
    argv = ["eval", "--reward", "cost", "--reward-kwargs", '{"lam": 0.5}', "--policy", "naive_rag",
            "--episodes", "20", "--no-progress", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    capsys.readouterr()
    result = json.loads(out.read_text(encoding="utf-8"))
    assert result["settings"]["reward_kwargs"] == {"lam": 0.5}
    assert result["em"] > 0
    assert result["f1"] == pytest.approx(result["em"])  # F1 in {0, 1} on SyntheticFacts
    assert result["reward"] == pytest.approx(0.5 * result["em"])


def test_no_command_is_an_argparse_error(capsys):
    with pytest.raises(SystemExit) as caught:
        main([])
    assert caught.value.code == 2


# -- searchgym study: a runner inside a package ----------------------------------------------------

_HELPER = """
import os


def square(x):
    return x * x, os.getpid()
"""

_RUNNER = """
import json
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from labstudy.inner.helper import square  # the study's own package, not a path of the runner's


def run(config, output_dir, arms, seeds):
    with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn")) as pool:
        results = list(pool.map(square, [2, 3]))
    Path(output_dir).mkdir(parents=True, exist_ok=True)
    (Path(output_dir) / "out.json").write_text(json.dumps({"squares": [r[0] for r in results], "module": __name__}))
    return 0
"""


def test_study_imports_a_runner_inside_a_package_by_its_module_name(tmp_path):
    """A study's runner imports its own package and its spawned workers import it too, with no
    path set up by the study or the caller: the command imports the runner as ``python -m`` would."""
    package = tmp_path / "lab" / "labstudy" / "inner"
    package.mkdir(parents=True)
    (tmp_path / "lab" / "labstudy" / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "helper.py").write_text(_HELPER)
    (package / "runner.py").write_text(_RUNNER)
    (package / "study.yaml").write_text("runner: runner.py\n")
    out = tmp_path / "out"
    code = (
        "import sys; from searchgym.cli import main; "
        f"sys.exit(main(['study', '--config', {str(package / 'study.yaml')!r}, '--output-dir', {str(out)!r}]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads((out / "out.json").read_text()) == {
        "squares": [4, 9],
        "module": "labstudy.inner.runner",
    }


def test_study_runner_shadowed_by_another_package_of_the_same_name_says_so(tmp_path, monkeypatch):
    for root in ("lab", "other"):
        package = tmp_path / root / "labstudy2"
        package.mkdir(parents=True)
        (package / "__init__.py").write_text("")
        (package / "runner.py").write_text("def run(config, output_dir, arms, seeds):\n    return 0\n")
        (package / "study.yaml").write_text("runner: runner.py\n")
    monkeypatch.syspath_prepend(str(tmp_path / "other"))  # another checkout's package, already imported
    __import__("labstudy2")
    try:
        with pytest.raises(SystemExit, match="imports from .*other.*labstudy2"):
            main(["study", "--config", str(tmp_path / "lab" / "labstudy2" / "study.yaml")])
    finally:
        for name in [n for n in sys.modules if n.split(".")[0] == "labstudy2"]:
            del sys.modules[name]
