"""Evaluation episodes are told from training ones by the temperature vLLM samples at.

vLLM 0.29's ``SamplingParams.__post_init__`` raises a temperature in (0, 0.01) to 0.01
(``tests/fake_vllm.py`` does the same), so a configured ``eval.temperature`` of 0.005 reaches
the agent as 0.01; and equal temperatures make every episode look like training. Both are
refused when the run file is loaded, before any model loads.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("openrlhf.utils.agent", reason="needs openrlhf==0.11.2 (--no-deps) and aiohttp")

from fake_vllm import SamplingParams  # noqa: E402

from searchgym.error import InvalidArgumentError  # noqa: E402
from searchgym.trainers.openrlhf import load_run_config  # noqa: E402
from searchgym.trainers.openrlhf.eval_split import EvalSign, vllm_temperature  # noqa: E402

RUN = """\
backend: openrlhf
env: {{id: searchgym/SyntheticFacts-v1, protocol: tool_call, reward: lightsearcher, reward_kwargs: {{store: {store}}}}}
openrlhf:
  rollout: {{temperature: {train}}}
  eval: {{dataset: eval.jsonl, temperature: {evals}}}
"""


def run_file(tmp_path: Path, train: float, evals: float) -> Path:
    path = tmp_path / "run.yaml"
    path.write_text(RUN.format(store=tmp_path / "mins.sqlite", train=train, evals=evals))
    return path


def test_the_fake_engine_raises_low_temperatures_as_vllm_does():
    assert SamplingParams(temperature=0.005).temperature == 0.01
    assert SamplingParams(temperature=0.0).temperature == 0.0  # greedy stays greedy
    assert [vllm_temperature(t) for t in (0.0, 1e-6, 0.005, 0.01, 0.6)] == [0.0, 0.01, 0.01, 0.01, 0.6]


def test_the_agent_compares_the_temperature_vllm_samples_at():
    """A sign read before this check (or built by hand) with eval at 0.005 still finds eval episodes."""
    sign = EvalSign(train_temperature=1.0, eval_temperature=0.005)
    assert sign.is_eval(SamplingParams.openrlhf(temperature=0.005))  # reaches the agent as 0.01
    assert not sign.is_eval(SamplingParams.openrlhf(temperature=1.0))
    assert EvalSign(train_temperature=0.01, eval_temperature=0.005).ambiguous  # both sampled at 0.01


@pytest.mark.parametrize(
    "train, evals, match",
    [
        (
            1.0,
            0.005,
            r"eval.temperature is 0.005, which vLLM samples at 0.01.*set eval.temperature to 0 \(greedy\)",
        ),
        (0.005, 0.6, r"rollout.temperature is 0.005, which vLLM samples at 0.01"),
        (
            0.6,
            0.6,
            r"both sampled at 0.6.*minimum tool-call store.*set openrlhf.eval.temperature to another value \(e.g. 0.5\)",
        ),
        (0.01, 0.0100000000001, r"both sampled at 0.01"),
    ],
)
def test_loading_the_run_file_refuses_eval_episodes_that_look_like_training(tmp_path, train, evals, match):
    with pytest.raises(InvalidArgumentError, match=match) as caught:
        load_run_config(run_file(tmp_path, train, evals))
    assert str(run_file(tmp_path, train, evals)) in str(caught.value) and "\n" not in str(caught.value)


def test_the_suggested_fix_loads(tmp_path):
    assert load_run_config(run_file(tmp_path, 0.6, 0.5)).agent.env_id == "searchgym/SyntheticFacts-v1"
    assert load_run_config(run_file(tmp_path, 1.0, 0.0)).openrlhf["eval"]["temperature"] == 0.0


def test_the_dry_run_stops_with_one_line(tmp_path, monkeypatch, capsys):
    from searchgym.cli import main

    monkeypatch.chdir(tmp_path)
    assert (
        main(["train", "--backend", "openrlhf", "--config", str(run_file(tmp_path, 1.0, 0.005)), "--dry-run"])
        == 2
    )
    captured = capsys.readouterr()
    assert captured.out == "" and len(captured.err.strip().splitlines()) == 1
    assert "eval.temperature is 0.005, which vLLM samples at 0.01" in captured.err
