"""Every env takes the episode options of SearchQAEnv, with its defaults, from one declaration."""

import inspect

import gymnasium as gym
import pytest

import searchgym  # noqa: F401  (registers the envs)
from searchgym.envs.benchmarks import BenchmarkQAEnv
from searchgym.envs.config import EnvConfig
from searchgym.envs.search_env import EpisodeOptions, SearchQAEnv
from searchgym.envs.synthetic_env import SyntheticFactsEnv
from searchgym.error import UnknownArgumentError

ENV_CLASSES = [BenchmarkQAEnv, SyntheticFactsEnv]


def test_the_episode_options_are_the_base_envs_keyword_arguments():
    base = inspect.signature(SearchQAEnv.__init__).parameters
    keyword_only = [name for name, p in base.items() if p.kind is p.KEYWORD_ONLY]
    assert list(EpisodeOptions.__annotations__) == keyword_only


@pytest.mark.parametrize("env_class", ENV_CLASSES, ids=lambda c: c.__name__)
def test_each_env_shows_every_episode_option_with_the_base_default(env_class):
    base = inspect.signature(SearchQAEnv.__init__).parameters
    own = inspect.signature(env_class).parameters
    assert not any(p.kind is p.VAR_KEYWORD for p in own.values())
    for name in EpisodeOptions.__annotations__:
        assert own[name].default == base[name].default, name
        assert own[name].kind is inspect.Parameter.KEYWORD_ONLY


@pytest.mark.parametrize("env_class", ENV_CLASSES, ids=lambda c: c.__name__)
def test_a_misspelt_episode_option_names_the_right_one(env_class):
    args = ("popqa",) if env_class is BenchmarkQAEnv else ()
    with pytest.raises(UnknownArgumentError, match="Did you mean 'max_turns'"):
        env_class(*args, max_turn=2)


def test_the_episode_options_reach_the_base_env():
    env = gym.make(
        "searchgym/SyntheticFacts-v1",
        instructions="Answer tersely.",
        topk=2,
        max_turns=3,
        max_searches=0,
        reward="em",
    ).unwrapped
    prompt, _ = env.reset(seed=0)
    assert prompt.startswith("Answer tersely.")
    assert (env.topk, env.max_turns, env.max_searches, env.reward_scheme.name) == (2, 3, 0, "em")
    _, _, terminated, truncated, info = env.step("<search> capital </search>")
    assert truncated and not terminated and "error" in info  # the search is refused


def test_the_run_files_env_section_reads_the_defaults_and_refuses_what_an_env_lacks():
    config = EnvConfig(id="searchgym/PopQA-v1")
    assert (config.turns, config.reward_name, config.protocol_name) == (4, "f1", "search_r1")
    with pytest.raises(Exception, match="world_seed"):
        EnvConfig(id="searchgym/PopQA-v1", world_seed=1)
