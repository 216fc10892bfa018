"""The env contract: check_env on every id, step semantics, determinism, bad input."""

from __future__ import annotations

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import searchgym
from searchgym.envs import ENV_IDS
from searchgym.envs.testing import INFO_KEYS, ConformanceError, check_search_env
from searchgym.error import DataFileError, InvalidArgumentError, SearchGymError, UnknownNameError


def make(env_id: str, shared_data=None, **kwargs) -> gym.Env:
    if not env_id.endswith("SyntheticFacts-v1"):
        key = searchgym.envs.BENCHMARKS[env_id.split("/")[1][:-3]]
        kwargs.setdefault("data_path", shared_data / "questions" / f"{key}.jsonl")
        kwargs.setdefault("corpus_path", shared_data / "corpus.jsonl")
    return gym.make(env_id, **kwargs)


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_every_registered_id_passes_the_conformance_checks(env_id, shared_data):
    env = make(env_id, shared_data)
    check_env(env.unwrapped)
    check_search_env(env)
    observation, info = env.reset(seed=3)
    assert isinstance(observation, str) and "Question: " in observation
    assert INFO_KEYS <= set(info)


def test_registration_imports_nothing_heavy_and_uses_string_entry_points():
    for env_id in ENV_IDS:
        assert isinstance(gym.spec(env_id).entry_point, str)


@pytest.fixture
def env():
    return gym.make("searchgym/SyntheticFacts-v1", reward="f1", max_turns=4)


def question_of(env) -> searchgym.Question:
    return env.unwrapped.trajectory.question


def test_search_then_answer(env):
    env.reset(seed=0)
    q = question_of(env)
    obs, reward, terminated, truncated, info = env.step(
        f"<think>look up</think><search>{q.question}</search>"
    )
    assert (reward, terminated, truncated) == (0.0, False, False)
    assert obs.startswith("\n<information>") and "Doc 1 (Title:" in obs
    assert info["num_searches"] == 1 and info["queries"] == [q.question]
    assert len(info["retrieved_ids"]) == 1 and len(info["retrieved_ids"][0]) == 3
    obs, reward, terminated, truncated, info = env.step(f"<answer>{q.golden_answers[0]}</answer>")
    assert terminated and not truncated
    assert reward == 1.0 and info["em"] == 1.0 and info["answer"] == q.golden_answers[0]
    assert info["turn"] == 2 and info["reasoning_steps"] == 1


def test_malformed_action_keeps_episode_and_reports_error(env):
    env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step("I think the answer is Paris.")
    assert not terminated and not truncated and reward == 0.0
    assert "error" in info and info["format_ok"] is False and "format error" in obs


def test_max_turns_truncates_and_still_computes_the_terminal_reward():
    env = gym.make(
        "searchgym/SyntheticFacts-v1", reward="f1", reward_kwargs={"format_penalty": -0.5}, max_turns=2
    )
    env.reset(seed=1)
    env.step("no tags")
    _, reward, terminated, truncated, info = env.step("still no tags")
    assert truncated and not terminated
    assert reward == -0.5  # the scheme's format penalty, applied at truncation


def test_max_searches_refuses_the_extra_search():
    env = gym.make("searchgym/SyntheticFacts-v1", max_searches=1, max_turns=5)
    env.reset(seed=2)
    env.step("<search>anything</search>")
    _, reward, terminated, truncated, info = env.step("<search>again</search>")
    assert truncated and not terminated and info["num_searches"] == 1
    assert "limit" in info["error"] and reward == 0.0


def test_reset_options_run_an_arbitrary_question(env):
    obs, info = env.reset(
        options={"question": "Who wrote <answer>x</answer>?", "golden_answers": ["Tolkien"], "id": "q1"}
    )
    assert info["question_id"] == "q1" and "<answer>x</answer>" not in obs
    _, reward, terminated, _, info = env.step("<answer>J. R. R. Tolkien</answer>")
    assert terminated and info["em"] == 0.0 and 0 < reward < 1  # F1 of 1 token among 4: 2/5
    assert reward == pytest.approx(0.4)


def test_seeded_reset_and_steps_are_reproducible(env):
    def rollout(seed):
        obs, info = env.reset(seed=seed)
        out = [obs, info]
        for action in ["<search>capital</search>", "<answer>x</answer>"]:
            out.append(env.step(action))
        return out

    assert rollout(7) == rollout(7)
    assert rollout(7)[0] != rollout(8)[0] or rollout(7)[1] != rollout(8)[1]


def test_step_before_reset_is_a_clear_error():
    base = gym.make("searchgym/SyntheticFacts-v1").unwrapped
    with pytest.raises(SearchGymError, match="reset"):
        base.step("<answer>x</answer>")


def test_non_string_action_is_a_format_error(env):
    env.reset(seed=0)
    _, _, terminated, _, info = env.unwrapped.step(b"\x00\xff")
    assert not terminated and "str" in info["error"]


@pytest.mark.parametrize("protocol", ["search_r1", "research", "tool_call", "sem"])
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    action=st.one_of(
        st.text(max_size=2000),
        st.binary(max_size=500).map(lambda b: b.decode("latin-1")),
        st.lists(
            st.sampled_from(
                [
                    "<search>",
                    "</search>",
                    "<answer>",
                    "</answer>",
                    "<think>",
                    "</think>",
                    "<tool_call>",
                    "</tool_call>",
                    "{",
                    "}",
                    "\\boxed{",
                    "x",
                    " ",
                ]
            ),
            max_size=60,
        ).map("".join),
    )
)
def test_any_action_never_raises(protocol, action):
    env = gym.make("searchgym/SyntheticFacts-v1", protocol=protocol, reward="lightsearcher", max_turns=2)
    env.reset(seed=0)
    for _ in range(2):
        obs, reward, terminated, truncated, info = env.step(action)
        assert isinstance(obs, str) and isinstance(reward, float)
        if not info["format_ok"]:
            assert terminated or truncated or "error" in info
        if terminated or truncated:
            break


def test_megabyte_action_is_handled():
    env = gym.make("searchgym/SyntheticFacts-v1", reward="lightsearcher", protocol="tool_call")
    env.reset(seed=0)
    _, _, _, _, info = env.step("<think>" + "a" * 2_000_000)
    assert info["format_ok"] is False and info["action_chars"] == 2_000_007


def test_bad_names_and_values_get_clear_errors(shared_data):
    with pytest.raises(UnknownNameError, match="Did you mean 'lightsearcher'"):
        gym.make("searchgym/SyntheticFacts-v1", reward="lightsearch")
    with pytest.raises(UnknownNameError, match="search_r1"):
        gym.make("searchgym/SyntheticFacts-v1", protocol="search-r1")
    with pytest.raises(InvalidArgumentError, match="topk"):
        gym.make("searchgym/SyntheticFacts-v1", topk="3")
    with pytest.raises(InvalidArgumentError, match="max_turns"):
        gym.make("searchgym/SyntheticFacts-v1", max_turns=0)
    with pytest.raises(DataFileError, match="data_path"):
        gym.make("searchgym/HotpotQA-v1", corpus_path=shared_data / "corpus.jsonl")
    with pytest.raises(DataFileError, match="corpus_path"):
        gym.make("searchgym/HotpotQA-v1", data_path=shared_data / "questions" / "hotpotqa.jsonl")
    with pytest.raises(UnknownNameError, match="HotpotQA"):
        searchgym.envs.check_env_id("searchgym/HotPotQA-v1")


def test_retrieval_error_becomes_an_observation(env):
    class Broken(searchgym.Retriever):
        def search(self, queries, k):
            raise searchgym.RetrievalError("index unavailable")

    env.unwrapped.retriever = Broken()
    env.reset(seed=0)
    obs, _, terminated, _, info = env.step("<search>x</search>")
    assert not terminated and info["retrieval_error"] == "index unavailable" and "failed" in obs


def test_synthetic_info_has_known_and_hops(env):
    _, info = env.reset(seed=0)
    assert isinstance(info["known"], bool) and info["hops"] in (1, 2)


def test_conformance_check_catches_an_env_that_raises_on_actions():
    class Fragile(searchgym.SearchQAEnv):
        def step(self, action):
            if not action:
                raise ValueError("empty action")
            return super().step(action)

    good = gym.make("searchgym/SyntheticFacts-v1").unwrapped
    fragile = Fragile(good.questions, good.retriever)
    with pytest.raises(ConformanceError, match="must never raise"):
        check_search_env(fragile)


def _echo_generator(prompts):
    # Stands in for an LLM (the world outside the unit): one passage per prompt.
    return [f"Title: Echo\n{len(p)} characters asked" for p in prompts]


def test_benchmark_env_with_a_generated_corpus_needs_no_corpus_path(shared_data):
    env = gym.make(
        "searchgym/HotpotQA-v1",
        data_path=shared_data / "questions" / "hotpotqa.jsonl",
        retriever="simulated",
        retriever_kwargs={"generator": _echo_generator},
    )
    env.reset(seed=0)
    obs, _, _, _, info = env.step("<search>anything</search>")
    assert info["num_searches"] == 1 and "characters asked" in obs


def test_benchmark_env_takes_its_own_instructions(shared_data):
    # SearchQAEnv and SyntheticFacts take instructions; a benchmark env must too (a study that
    # shortens the prompt needs it), and keep the protocol's own when none are given.
    kwargs = {
        "data_path": shared_data / "questions" / "nq.jsonl",
        "retriever": "simulated",
        "retriever_kwargs": {"generator": _echo_generator},
    }
    short = "Answer with <answer> answer </answer>."
    observation, _ = gym.make("searchgym/NQ-v1", instructions=short, **kwargs).reset(seed=0)
    assert observation.startswith(short) and "Question: " in observation
    default, _ = gym.make("searchgym/NQ-v1", **kwargs).reset(seed=0)
    assert not default.startswith(short) and "<search>" in default


# -- versions -------------------------------------------------------------------------------------


def _older(env_id: str) -> str | None:
    name, version = env_id.rsplit("-v", 1)
    return f"{name}-v{int(version) - 1}" if int(version) > 0 else None


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_each_id_has_a_version_history_line_for_every_version_up_to_its_own(env_id):
    entry = gym.spec(env_id).entry_point
    module, _, name = entry.partition(":")
    import importlib

    doc = getattr(importlib.import_module(module), name).__doc__ or ""
    latest = int(env_id.rsplit("-v", 1)[1])
    history = doc.split("## Version History", 1)[1]
    assert [f"* v{v}:" in history for v in range(latest + 1)] == [True] * (latest + 1), history
    assert f"* v{latest + 1}:" not in history  # no line for a version that is not registered


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_an_older_or_unknown_version_names_the_current_id(env_id):
    older = _older(env_id)
    if older is not None:
        with pytest.warns(DeprecationWarning, match="out of date"):
            with pytest.raises(gym.error.DeprecatedEnv, match=f"Please use `{env_id}`"):
                gym.make(older)
        with pytest.raises(UnknownNameError, match=f"is deprecated: use '{env_id}'"):
            searchgym.envs.check_env_id(older)
        with pytest.raises(UnknownNameError, match=f"is deprecated: use '{env_id}'"):
            searchgym.envs.check_env_id(older.split("/", 1)[1])  # the short form too
    name, version = env_id.rsplit("-v", 1)
    with pytest.raises(
        UnknownNameError, match=f"does not exist \\(the latest is v{version}\\): use '{env_id}'"
    ):
        searchgym.envs.check_env_id(f"{name}-v{int(version) + 5}")


def test_every_id_is_at_v1_after_the_protocol_changes_and_v0_says_so():
    assert [i.rsplit("-v", 1)[1] for i in ENV_IDS] == ["1"] * len(ENV_IDS)
    with pytest.warns(DeprecationWarning, match="out of date"):
        with pytest.raises(gym.error.DeprecatedEnv, match="searchgym/SyntheticFacts-v1"):
            gym.make("searchgym/SyntheticFacts-v0")  # bump_ids: keep
    with pytest.raises(UnknownNameError, match="'SyntheticFacts-v0' is deprecated"):  # bump_ids: keep
        searchgym.envs.check_env_id("SyntheticFacts-v0")  # bump_ids: keep
