"""The PettingZoo group env: API conformance, group rewards, shared questions, bad input."""

from __future__ import annotations

import pickle
import random
import subprocess
import sys
import warnings

import gymnasium as gym
import pytest

pytest.importorskip("pettingzoo")

from pettingzoo import ParallelEnv  # noqa: E402
from pettingzoo.test import parallel_api_test  # noqa: E402

from searchgym.envs.group_env import group_parallel_env  # noqa: E402
from searchgym.envs.rewards import otc_grpo_tool_rewards, tsas_advantages  # noqa: E402
from searchgym.error import InvalidArgumentError, SearchGymError, UnknownNameError  # noqa: E402
from searchgym.policies import make_policy  # noqa: E402
from searchgym.retrieval import Retriever  # noqa: E402

ENV_ID = "searchgym/SyntheticFacts-v1"
SCHEMES = ["tsas", "otc", "mean_baseline", None]
POLICY_NAMES = ["oracle_synthetic", "naive_rag", "direct"]
UNKNOWN_OPTION = "The group env ignores reset options"


def make(group_size=3, group_scheme=None, scheme_kwargs=None, **env_kwargs):
    env_kwargs.setdefault("reward", "f1")
    return group_parallel_env(
        ENV_ID, group_size=group_size, group_scheme=group_scheme, scheme_kwargs=scheme_kwargs, **env_kwargs
    )


def run_group(env, policies, seed=None, options=None):
    """Play one group; each agent is driven by its own policy on its own running context.

    Returns the per-step trace, the final infos, and each agent's summed reward.
    """
    observations, infos = env.reset(seed=seed, options=options)
    contexts = dict(observations)
    totals = dict.fromkeys(env.possible_agents, 0.0)
    trace = [("reset", observations, infos)]
    while env.agents:
        actions = {
            agent: policies[i].act([contexts[agent]])[0]
            for i, agent in enumerate(env.possible_agents)
            if agent in env.agents and not infos[agent]["finished"]
        }
        observations, rewards, terminations, truncations, infos = env.step(actions)
        for agent, action in actions.items():
            contexts[agent] += action + observations[agent]
        for agent, reward in rewards.items():
            totals[agent] += reward
        trace.append((actions, observations, rewards, terminations, truncations, infos))
    return trace, infos, totals


def expected_group_rewards(scheme, infos, agents, stage=None):
    """The group values recomputed from each agent's final info alone (the sub-env reward is F1)."""
    f1 = [infos[a]["f1"] for a in agents]
    searches = [infos[a]["num_searches"] for a in agents]
    if scheme == "tsas":
        return tsas_advantages(f1, searches, [infos[a]["reasoning_steps"] for a in agents], stage, 0.01)
    if scheme == "otc":
        em = [infos[a]["em"] for a in agents]
        tool = otc_grpo_tool_rewards(searches, [e == 1.0 for e in em])
        return [e * t for e, t in zip(em, tool, strict=True)]
    if scheme == "mean_baseline":
        return [r - sum(f1) / len(f1) for r in f1]
    return f1


# -- PettingZoo conformance ------------------------------------------------------------------


@pytest.mark.parametrize("group_size", [1, 4])
@pytest.mark.parametrize("scheme", SCHEMES)
def test_parallel_api_test_passes_without_warnings(scheme, group_size, capsys):
    env = make(group_size, scheme)
    assert isinstance(env, ParallelEnv)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        parallel_api_test(env, num_cycles=10)
    assert "Passed Parallel API test" in capsys.readouterr().out
    # The only warning: the test's own reset(options={"options": 1}) has a key the env ignores.
    messages = [str(w.message) for w in caught]
    assert messages and all(m.startswith(UNKNOWN_OPTION) for m in messages), messages


@pytest.mark.parametrize("scheme", SCHEMES)
def test_parallel_api_test_with_staggered_finishes(scheme, monkeypatch, capsys):
    # Random text never answers, so every rollout truncates at max_turns in the same step.
    # Here the sampler answers or searches now and then, so rollouts finish at different
    # steps and wait for the group: the same checks must still hold.
    import pettingzoo.test.parallel_test as parallel_test

    rng = random.Random(scheme)
    choices = ["<answer>Paris</answer>", "<search>capital</search>", "junk"]
    monkeypatch.setattr(parallel_test, "sample_action", lambda env, obs, agent: rng.choice(choices))
    env = make(4, scheme, max_turns=6)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        parallel_test.parallel_api_test(env, num_cycles=10)
    assert "Passed Parallel API test" in capsys.readouterr().out
    assert all(str(w.message).startswith(UNKNOWN_OPTION) for w in caught), [str(w.message) for w in caught]


def test_spaces_are_the_sub_envs_and_stable():
    env = make(2)
    for agent, sub in zip(env.possible_agents, env.envs, strict=True):
        assert env.observation_space(agent) is env.observation_space(agent) is sub.observation_space
        assert env.action_space(agent) is sub.action_space
    with pytest.raises(UnknownNameError, match="rollout_1"):
        env.observation_space("rollout_7")


# -- Group rewards ---------------------------------------------------------------------------


def test_hand_worked_group_and_waiting_agents():
    """Three scripted rollouts of one question; values worked out by hand.

    rollout_0: search, answer gold        -> m=1, T=2 think blocks, EM=F1=1, ends at step 2
    rollout_1: search, search, answer gold -> m=2, T=3, EM=F1=1, ends at step 3
    rollout_2: answer "zzz"               -> m=0, T=1, EM=F1=0, ends at step 1
    r = F1 = [1, 1, 0], mean 2/3, centred [1/3, 1/3, -2/3].
    mean_baseline: [1/3, 1/3, -2/3].
    otc: n = fewest searches among correct = 1; f(m,1) = 2m/(m+1): f(1)=1 -> sin(pi/2) = 1;
         f(2)=4/3 -> sin(2pi/3) = 0.866025; rollout_2 is wrong -> 0.  => [1, 0.866025, 0]
    tsas stage 1: A = c + ln(S+1) + 0.01 ln(T+1):
         1/3 + ln2 + .01 ln3 = 1.037467; 1/3 + ln3 + .01 ln4 = 1.445809; -2/3 + 0 + .01 ln2 = -0.659735
    tsas stage 2: std(S) over [1, 2, 0] = sqrt(2/3) = 0.816497; sigma(1/3) - .5 = 0.082570,
         sigma(-2/3) - .5 = -0.160756;
         A0 = 1/3 + 0.082570 (ln2 - 0.816497 + ln3) = 0.413861
         A1 = 1/3 + 0.082570 (ln3 - 0.816497 + ln4) = 0.471094
         A2 = -2/3 - 0.160756 (-0.816497 + ln2)      = -0.646837
    """
    expected = {
        None: [1.0, 1.0, 0.0],
        "mean_baseline": [1 / 3, 1 / 3, -2 / 3],
        "otc": [1.0, 0.866025, 0.0],
        ("tsas", 1): [1.037467, 1.445809, -0.659735],
        ("tsas", 2): [0.413861, 0.471094, -0.646837],
    }
    for key, values in expected.items():
        scheme, kwargs = (key[0], {"stage": key[1]}) if isinstance(key, tuple) else (key, None)
        env = make(3, scheme, kwargs, max_turns=3)
        env.reset(seed=11)
        gold = env.question.golden_answers[0]
        search, answer = (
            "<think>t</think><search>capital</search>",
            f"<think>t</think><answer>{gold}</answer>",
        )
        scripts = {
            "rollout_0": [search, answer],
            "rollout_1": [search, search, answer],
            "rollout_2": ["<think>t</think><answer>zzz</answer>"],
        }
        for step in range(3):
            actions = {a: s[step] for a, s in scripts.items() if step < len(s)}
            if step > 0:
                actions["rollout_2"] = "ignored: this rollout is waiting"
            obs, rewards, terms, truncs, infos = env.step(actions)
            if step < 2:
                assert env.agents == env.possible_agents  # nobody leaves before the group ends
                assert rewards == dict.fromkeys(env.possible_agents, 0.0)
                assert not any(terms.values()) and not any(truncs.values())
                assert obs["rollout_2"] == ""  # a waiting rollout gets no new text
                assert infos["rollout_2"]["finished"] and infos["rollout_2"]["group_reward_raw"] == 0.0
                assert infos["rollout_2"]["turn"] == 1  # its ignored action was not taken
                assert (
                    infos["rollout_1"]["finished"] is False and "group_reward_raw" not in infos["rollout_1"]
                )
        assert env.agents == []
        assert terms == dict.fromkeys(env.possible_agents, True) and not any(truncs.values())
        got = [rewards[a] for a in env.possible_agents]
        assert got == pytest.approx(values, abs=1e-5), key
        assert [infos[a]["group_reward"] for a in env.possible_agents] == got
        assert [infos[a]["group_reward_raw"] for a in env.possible_agents] == [1.0, 1.0, 0.0]
        assert [infos[a]["num_searches"] for a in env.possible_agents] == [1, 2, 0]
        if scheme == "tsas":
            assert infos["rollout_0"]["tsas_stage"] == key[1]


def test_truncated_rollout_keeps_its_own_flags():
    # rollout_0 answers right at once (r = 1), rollout_1 writes junk until max_turns = 2 (r = 0):
    # mean_baseline gives [1 - 0.5, 0 - 0.5] = [0.5, -0.5].
    env = make(2, "mean_baseline", max_turns=2)
    env.reset(seed=4)
    gold = env.question.golden_answers[0]
    env.step({"rollout_0": f"<answer>{gold}</answer>", "rollout_1": "junk"})
    _, rewards, terms, truncs, infos = env.step({"rollout_1": "more junk"})
    assert rewards == {"rollout_0": 0.5, "rollout_1": -0.5}
    assert terms == {"rollout_0": True, "rollout_1": False}
    assert truncs == {"rollout_0": False, "rollout_1": True}
    assert infos["rollout_1"]["format_ok"] is False


@pytest.mark.parametrize("scheme", SCHEMES)
def test_policy_mixes_match_the_group_functions(scheme):
    rng = random.Random(f"mix-{scheme}")
    env = make(5, scheme, {"stage": 2} if scheme == "tsas" else None, protocol="search_r1")
    world = env.envs[0].unwrapped.world
    single = gym.make(ENV_ID)
    searches_seen = set()
    for seed in range(8):
        names = [rng.choice(POLICY_NAMES) for _ in range(5)]
        names[:2] = ["oracle_synthetic", "naive_rag"]  # every group mixes frugal and naive searchers
        policies = [make_policy(name, world=world) for name in names]
        trace, infos, totals = run_group(env, policies, seed=seed)
        agents = env.possible_agents
        question_id = single.reset(seed=seed)[1]["question_id"]  # the draw a single env makes
        assert {trace[0][2][a]["question_id"] for a in agents} == {question_id}
        assert {infos[a]["question_id"] for a in agents} == {question_id}
        expected = expected_group_rewards(scheme, infos, agents, stage=2)
        assert [totals[a] for a in agents] == pytest.approx(expected, abs=1e-12)
        assert [trace[-1][2][a] for a in agents] == [totals[a] for a in agents]  # all in the last step
        assert all(r == 0.0 for step in trace[1:-1] for r in step[2].values())
        searches_seen.update(infos[a]["num_searches"] for a in agents)
    assert searches_seen >= {0, 1, 2}  # the mixes really differ in how much they search


def test_tsas_stage_switches_after_warmup_resets():
    env = make(2, "tsas", {"warmup_steps": 2})
    world = env.envs[0].unwrapped.world
    policies = [make_policy("oracle_synthetic", world=world), make_policy("naive_rag")]
    stages = []
    for seed in range(4):
        _, infos, totals = run_group(env, policies, seed=seed)
        stage = infos["rollout_0"]["tsas_stage"]
        stages.append(stage)
        expected = expected_group_rewards("tsas", infos, env.possible_agents, stage=stage)
        assert [totals[a] for a in env.possible_agents] == pytest.approx(expected, abs=1e-12)
    assert stages == [1, 1, 2, 2]
    env.group_step = 0  # a trainer may set the counter to its own step: back to stage 1
    _, infos, _ = run_group(env, policies, seed=0)
    assert infos["rollout_0"]["tsas_stage"] == 1


def test_tsas_eq2_variant_charges_searches_to_rollouts_above_the_mean():
    env = make(2, "tsas", {"stage": 2, "variant": "eq2"})
    world = env.envs[0].unwrapped.world
    policies = [make_policy("oracle_synthetic", world=world), make_policy("naive_rag")]
    differs = 0
    for seed in range(6):
        _, infos, totals = run_group(env, policies, seed=seed)
        agents = env.possible_agents
        f1 = [infos[a]["f1"] for a in agents]
        searches = [infos[a]["num_searches"] for a in agents]
        reasoning = [infos[a]["reasoning_steps"] for a in agents]
        expected = tsas_advantages(f1, searches, reasoning, 2, 0.01, "eq2")
        assert [totals[a] for a in agents] == pytest.approx(expected, abs=1e-12)
        differs += expected != pytest.approx(tsas_advantages(f1, searches, reasoning, 2, 0.01, "eq4"))
    assert differs  # some group tells the two readings apart, so the variant really reached the env
    with pytest.raises(InvalidArgumentError, match="variant"):
        make(2, "tsas", {"variant": "eq5"})


def test_otc_with_f1_outcome_and_threshold():
    # One rollout answers right with no search, one answers "zzz": scores s = [1, 0]; with
    # threshold 0.5 rollout_0 is correct, n = 0, r_tool(0) = 1 -> rewards [1 * 1, 0 * 1] = [1, 0].
    env = make(2, "otc", {"outcome": "f1", "threshold": 0.5, "c": 2.0})
    env.reset(seed=2)
    gold = env.question.golden_answers[0]
    _, rewards, *_ = env.step({"rollout_0": f"<answer>{gold}</answer>", "rollout_1": "<answer>zzz</answer>"})
    assert rewards == {"rollout_0": 1.0, "rollout_1": 0.0}


# -- Same question, determinism, shared retriever --------------------------------------------


def test_reset_options_pick_the_question_for_every_agent():
    env = make(3)
    world = env.envs[0].unwrapped.world
    _, infos = env.reset(options={"index": 7})
    assert {info["question_id"] for info in infos.values()} == {world.questions[7].id}
    observations, infos = env.reset(
        options={"question": "What is the capital of Zed?", "golden_answers": ["Zedville"], "id": "z1"}
    )
    assert {info["question_id"] for info in infos.values()} == {"z1"}
    assert len(set(observations.values())) == 1 and "capital of Zed" in observations["rollout_0"]
    with pytest.warns(UserWarning, match=r"ignores reset options \['colour'\]"):
        _, infos = env.reset(options={"index": 3, "colour": "red"})
    assert infos["rollout_2"]["question_id"] == world.questions[3].id


def test_bad_reset_options_lose_nothing():
    env = make(2)
    env.reset(seed=1)
    env.step({"rollout_0": "<search>x</search>", "rollout_1": "<search>y</search>"})
    question = env.question
    with pytest.raises(InvalidArgumentError, match="index"):
        env.reset(options={"index": 10**6})
    with pytest.raises(InvalidArgumentError, match="golden_answers"):
        env.reset(options={"question": "Q?"})
    assert env.question is question and env.agents == env.possible_agents
    _, _, _, _, infos = env.step({"rollout_0": "<answer>a</answer>", "rollout_1": "<answer>b</answer>"})
    assert infos["rollout_0"]["turn"] == 2 and env.agents == []


def test_same_seeds_same_groups():
    def play():
        env = make(4, "tsas", {"warmup_steps": 1})
        world = env.envs[0].unwrapped.world
        policies = [
            make_policy(n, world=world) for n in ("oracle_synthetic", "naive_rag", "direct", "naive_rag")
        ]
        first = run_group(env, policies, seed=123)
        return [first] + [run_group(env, policies) for _ in range(3)]  # unseeded resets continue the stream

    one, two = play(), play()
    assert repr(one) == repr(two)
    assert len({run[1]["rollout_0"]["question_id"] for run in one}) > 1  # the stream moves on


class CountingRetriever(Retriever):
    """Wraps a real retriever and records the size of every batched call."""

    def __init__(self, inner: Retriever):
        self.inner, self.calls = inner, []

    def search(self, queries, k):
        self.calls.append(len(queries))
        return self.inner.search(queries, k)


def test_searches_of_a_step_share_one_batched_call():
    plain = make(2)
    assert plain.envs[0].unwrapped.retriever is plain.envs[1].unwrapped.retriever  # one shared retriever
    counting = CountingRetriever(plain.envs[0].unwrapped.retriever)
    env = make(4, retriever=counting)
    env.reset(seed=0)
    actions = {a: f"<search>{q}</search>" for a, q in zip(env.possible_agents, "abcd", strict=True)}
    actions["rollout_3"] = "<answer>x</answer>"
    _, _, _, _, infos = env.step(actions)
    assert counting.calls == [3]  # three searches, one call
    assert [infos[a]["num_searches"] for a in env.possible_agents] == [1, 1, 1, 0]
    env.step({"rollout_0": "<search>e</search>", "rollout_1": "<answer>y</answer>", "rollout_2": "junk"})
    assert counting.calls == [3, 1]


def test_a_pickled_group_goes_on_like_the_original():
    # Rollout workers (Ray, subprocesses) receive envs by pickle; the class is built lazily.
    env = make(2, "otc")
    env.reset(seed=5)
    env.step({"rollout_0": "<search>capital</search>", "rollout_1": "<answer>x</answer>"})
    copy = pickle.loads(pickle.dumps(env))
    assert type(copy) is type(env)
    actions = {"rollout_0": "<answer>y</answer>"}
    assert repr(copy.step(actions)) == repr(env.step(actions))


def test_hotpotqa_group_over_real_bm25(shared_data):
    paths = {
        "data_path": shared_data / "questions" / "hotpotqa.jsonl",
        "corpus_path": shared_data / "corpus.jsonl",
    }
    env = group_parallel_env(
        "searchgym/HotpotQA-v1", group_size=3, group_scheme="mean_baseline", max_turns=3, **paths
    )
    units = [sub.unwrapped for sub in env.envs]
    assert units[0].retriever is units[1].retriever is units[2].retriever
    single = gym.make("searchgym/HotpotQA-v1", **paths)
    policies = [make_policy("naive_rag"), make_policy("direct"), make_policy("naive_rag")]
    _, infos, totals = run_group(env, policies, seed=9)
    assert {info["question_id"] for info in infos.values()} == {single.reset(seed=9)[1]["question_id"]}
    # naive_rag is deterministic: its two copies search the same query and score the same.
    assert (
        infos["rollout_0"]["queries"] == infos["rollout_2"]["queries"]
        and infos["rollout_0"]["num_searches"] == 1
    )
    assert totals["rollout_0"] == totals["rollout_2"]
    assert sum(totals.values()) == pytest.approx(0.0, abs=1e-12)  # centred on the group mean
    assert [totals[a] for a in env.possible_agents] == pytest.approx(
        expected_group_rewards("mean_baseline", infos, env.possible_agents)
    )


def test_render_and_close():
    env = make(2, render_mode="ansi")
    env.reset(seed=0)
    text = env.render()
    assert "=== rollout_0 ===" in text and "=== rollout_1 ===" in text
    assert make(2).render() is None
    env.close()


# -- Bad arguments ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (
            {"group_size": 0},
            InvalidArgumentError,
            "group_size must be an int >= 1 \\(the number of rollouts per question",
        ),
        ({"group_size": True}, InvalidArgumentError, "group_size"),
        ({"group_size": "5"}, InvalidArgumentError, "got '5'"),
        ({"group_scheme": "tsa"}, UnknownNameError, "Did you mean 'tsas'"),
        ({"group_scheme": 3}, InvalidArgumentError, "group_scheme must be None or one of"),
        ({"group_scheme": "tsas", "scheme_kwargs": {"stag": 1}}, InvalidArgumentError, "accepts: stage"),
        ({"group_scheme": "tsas", "scheme_kwargs": {"stage": 3}}, InvalidArgumentError, "1, 2 or None"),
        (
            {"group_scheme": "tsas", "scheme_kwargs": {"stage": 1, "warmup_steps": 5}},
            InvalidArgumentError,
            "not both",
        ),
        (
            {"group_scheme": "tsas", "scheme_kwargs": {"warmup_steps": -1}},
            InvalidArgumentError,
            "warmup_steps",
        ),
        ({"group_scheme": "tsas", "scheme_kwargs": {"alpha": float("nan")}}, InvalidArgumentError, "alpha"),
        ({"group_scheme": "otc", "scheme_kwargs": {"c": 0}}, InvalidArgumentError, "must be > 0"),
        ({"group_scheme": "otc", "scheme_kwargs": {"outcome": "acc"}}, InvalidArgumentError, "outcome"),
        ({"group_scheme": "otc", "scheme_kwargs": {"threshold": 2}}, InvalidArgumentError, "threshold"),
        ({"group_scheme": None, "scheme_kwargs": {"alpha": 1}}, InvalidArgumentError, "no scheme_kwargs"),
        ({"scheme_kwargs": [1]}, InvalidArgumentError, "scheme_kwargs must be a dict"),
        ({"max_episode_steps": 3}, InvalidArgumentError, "max_turns"),
        ({"topk": 0}, InvalidArgumentError, "topk"),
    ],
)
def test_bad_arguments_get_clear_errors(kwargs, error, match):
    args = {"group_size": 2, **kwargs}
    with pytest.raises(error, match=match):
        group_parallel_env(ENV_ID, **args)


def test_unknown_env_id_lists_close_matches_and_short_ids_work():
    with pytest.raises(UnknownNameError, match="SyntheticFacts-v1"):
        group_parallel_env("searchgym/SyntheticFact-v1", group_size=2)
    assert group_parallel_env("SyntheticFacts-v1", group_size=2).possible_agents == ["rollout_0", "rollout_1"]
    with pytest.raises(InvalidArgumentError, match="SearchQAEnv"):
        group_parallel_env("CartPole-v1", group_size=2)


def test_bad_steps_change_nothing():
    env = make(2)
    with pytest.raises(SearchGymError, match="call reset"):
        env.step({"rollout_0": "<answer>a</answer>", "rollout_1": "<answer>a</answer>"})
    env.reset(seed=0)
    with pytest.raises(InvalidArgumentError, match="dict of agent name"):
        env.step(["<answer>a</answer>", "<answer>a</answer>"])
    with pytest.raises(UnknownNameError, match="rollout_1"):
        env.step({"rollout_0": "<answer>a</answer>", "rollout_9": "x"})
    with pytest.raises(InvalidArgumentError, match=r"running agents \['rollout_1'\]"):
        env.step({"rollout_0": "<answer>a</answer>"})
    assert env.envs[0].unwrapped.trajectory.turns == []  # none of the bad calls took a turn
    _, _, _, _, infos = env.step({"rollout_0": 42, "rollout_1": "<answer>a</answer>"})  # 42: a bad action
    assert "must be a str" in infos["rollout_0"]["error"] and not infos["rollout_0"]["finished"]
    _, rewards, *_ = env.step({"rollout_0": "<answer>a</answer>"})  # rollout_1 waits and may stay silent
    assert set(rewards) == {"rollout_0", "rollout_1"} and env.agents == []
    with pytest.raises(SearchGymError, match="group is over"):
        env.step({"rollout_0": "<answer>a</answer>", "rollout_1": "<answer>a</answer>"})


def test_importing_the_module_does_not_import_pettingzoo():
    code = (
        "import sys, searchgym, searchgym.envs.group_env as g; "
        "print('pettingzoo' in sys.modules); g.GroupParallelEnv; print('pettingzoo' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "True"]
