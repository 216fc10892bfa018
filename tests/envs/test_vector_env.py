"""The batched vector env: same results as single envs, one retriever call per step."""

from __future__ import annotations

import random
from collections.abc import Sequence

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.spaces import Tuple
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

import searchgym
from searchgym.envs.spaces import AnyText
from searchgym.envs.vector_env import SearchQAVectorEnv, stack_infos
from searchgym.error import InvalidArgumentError, RetrievalError, SearchGymError
from searchgym.retrieval import Retriever
from searchgym.retrieval.records import Doc

SYNTHETIC = "searchgym/SyntheticFacts-v1"


# -- helpers ------------------------------------------------------------------------------


def unstack(infos: dict, i: int) -> dict:
    """Sub-env ``i``'s info dict, read back from Gymnasium's dict-of-arrays form."""
    out = {}
    for key, value in infos.items():
        if key.startswith("_") or not infos.get(f"_{key}", np.zeros(i + 1, bool))[i]:
            continue
        item = unstack(value, i) if isinstance(value, dict) else value[i]
        out[key] = item.item() if isinstance(item, np.generic) else item  # numpy scalar -> Python
    return out


def same(a: object, b: object) -> bool:
    """Deep equality for info values (numpy arrays compared by dtype, shape and elements)."""
    if isinstance(a, dict) or isinstance(b, dict):
        return (
            isinstance(a, dict)
            and isinstance(b, dict)
            and a.keys() == b.keys()
            and all(same(a[k], b[k]) for k in a)
        )
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (
            isinstance(a, np.ndarray)
            and isinstance(b, np.ndarray)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and all(same(x, y) for x, y in zip(a.tolist(), b.tolist(), strict=True))
        )
    return type(a) is type(b) and a == b


def action_script(
    questions: Sequence[str], golds: Sequence[str], seed: int, steps: int, n: int
) -> list[tuple]:
    """Mixed actions: real searches, junk searches, right and wrong answers, malformed ones."""
    rng = random.Random(seed)
    script = []
    for _ in range(steps):
        row = []
        for _ in range(n):
            kind = rng.choice(["search", "search", "search", "junk", "right", "wrong", "bad", "empty", "int"])
            q = rng.randrange(len(questions))
            row.append(
                {
                    "search": f"<think>look</think><search>{questions[q]}</search>",
                    "junk": "<search>zzqx qqzz</search>",
                    "right": f"<answer>{golds[q]}</answer>",
                    "wrong": "<answer>nobody</answer>",
                    "bad": "I think the answer is blue",
                    "empty": "<search>   </search>",
                    "int": 17,
                }[kind]
            )
        script.append(tuple(row))
    return script


def run_singles(make_env, n: int, seed: int, script, mode: AutoresetMode):
    """Step ``n`` single envs one by one with Gymnasium's autoreset rules, per sub-env."""
    envs = [make_env() for _ in range(n)]
    first = [env.reset(seed=seed + i) for i, env in enumerate(envs)]
    steps = []
    done = [False] * n
    for actions in script:
        row = []
        for i, (env, action) in enumerate(zip(envs, actions, strict=True)):
            if mode is AutoresetMode.NEXT_STEP and done[i]:
                obs, info = env.reset()
                row.append((obs, 0.0, False, False, info))
                done[i] = False
                continue
            obs, reward, terminated, truncated, info = env.step(action)
            done[i] = terminated or truncated
            if mode is AutoresetMode.SAME_STEP and done[i]:
                final = {"final_obs": obs, "final_info": info}
                obs, info = env.reset()
                info = {**final, **info}
            row.append((obs, reward, terminated, truncated, info))
        steps.append(row)
    return first, steps, [env.unwrapped.trajectory for env in envs]


def assert_equivalent(vector: SearchQAVectorEnv, make_env, seed: int, script, mode: AutoresetMode) -> int:
    """Compare the vector env with single envs step by step; return the number of episode ends."""
    n = vector.num_envs
    first, steps, trajectories = run_singles(make_env, n, seed, script, mode)
    obs, infos = vector.reset(seed=seed)
    assert obs == tuple(o for o, _ in first)
    for i in range(n):
        assert same(unstack(infos, i), first[i][1])
    for t, (actions, row) in enumerate(zip(script, steps, strict=True)):
        obs, rewards, terminated, truncated, infos = vector.step(actions)
        assert isinstance(obs, tuple) and vector.observation_space.contains(obs)
        assert rewards.dtype == np.float64 and rewards.shape == (n,)
        assert terminated.dtype == np.bool_ and truncated.dtype == np.bool_ and terminated.shape == (n,)
        for i, (o, r, te, tr, info) in enumerate(row):
            assert obs[i] == o, (t, i)
            assert rewards[i] == r and terminated[i] == te and truncated[i] == tr, (t, i)
            assert same(unstack(infos, i), info), (t, i, unstack(infos, i), info)
    assert list(vector.get_attr("trajectory")) == trajectories
    return sum(te or tr for row in steps for _, _, te, tr, _ in row)


class CountingRetriever(Retriever):
    """Delegates to a real retriever and records the size of every batch."""

    def __init__(self, inner: Retriever):
        self.inner, self.batches = inner, []

    def search(self, queries, k):
        self.batches.append(list(queries))
        return self.inner.search(queries, k)


class BrokenRetriever(Retriever):
    """A retriever whose backend is down (or answers the wrong number of results)."""

    def __init__(self, short: bool = False):
        self.short, self.calls = short, 0

    def search(self, queries, k):
        self.calls += 1
        if self.short:
            return [[Doc(id="x", title="x", text="x")]]
        raise RetrievalError("backend down (connection refused)")


@pytest.fixture(scope="module")
def world():
    return gym.make(SYNTHETIC).unwrapped.world


@pytest.fixture(scope="module")
def script(world):
    return action_script(
        [q.question for q in world.questions], [q.golden_answers[0] for q in world.questions], 7, 24, 5
    )


# -- registration, spaces, API --------------------------------------------------------------


def test_every_id_has_a_string_vector_entry_point():
    for env_id in searchgym.ENV_IDS:
        entry = gym.spec(env_id).vector_entry_point
        assert isinstance(entry, str) and entry.startswith("searchgym.envs.vector_env:")


def test_spaces_metadata_and_types():
    vector = gym.make_vec(SYNTHETIC, num_envs=3, vectorization_mode="vector_entry_point", max_turns=2)
    assert isinstance(vector, SearchQAVectorEnv) and isinstance(vector, VectorEnv)
    assert vector.num_envs == 3 and vector.spec.id == SYNTHETIC
    assert vector.metadata["autoreset_mode"] is AutoresetMode.NEXT_STEP
    assert isinstance(vector.single_observation_space, AnyText)
    assert isinstance(vector.single_action_space, AnyText)
    # batch_space of a Text space is a Tuple of copies; we keep Gymnasium's choice.
    assert isinstance(vector.observation_space, Tuple) and len(vector.observation_space.spaces) == 3
    assert vector.observation_space == batch_space(AnyText(), 3)
    assert vector.action_space == batch_space(AnyText(), 3)
    obs, infos = vector.reset(seed=0)
    assert isinstance(obs, tuple) and all(isinstance(o, str) for o in obs)
    assert vector.observation_space.contains(obs)
    assert infos["_question_id"].tolist() == [True] * 3
    actions = vector.action_space.sample()  # random text: malformed, never raises
    assert vector.action_space.contains(actions)
    obs, rewards, terminated, truncated, infos = vector.step(actions)
    assert vector.observation_space.contains(obs) and infos["_error"].all()
    assert len(vector.render()) == 3 and vector.np_random_seed == (0, 1, 2)
    vector.set_attr("topk", 2)
    assert vector.get_attr("topk") == (2, 2, 2)
    vector.close()
    assert vector.closed


def test_autoreset_mode_by_value_and_bad_arguments():
    vector = gym.make_vec(
        SYNTHETIC, num_envs=2, vectorization_mode="vector_entry_point", autoreset_mode="SameStep"
    )
    assert vector.metadata["autoreset_mode"] is AutoresetMode.SAME_STEP
    with pytest.raises(InvalidArgumentError, match="autoreset_mode"):
        gym.make_vec(SYNTHETIC, num_envs=2, vectorization_mode="vector_entry_point", autoreset_mode="later")
    with pytest.raises(InvalidArgumentError, match="num_envs"):
        gym.make_vec(SYNTHETIC, num_envs=0, vectorization_mode="vector_entry_point")
    with pytest.raises(InvalidArgumentError, match="max_turns"):
        gym.make_vec(SYNTHETIC, num_envs=2, vectorization_mode="vector_entry_point", max_episode_steps=3)
    with pytest.raises(InvalidArgumentError, match="unwrapped"):
        SearchQAVectorEnv([gym.make(SYNTHETIC)])


# -- equivalence with single envs -----------------------------------------------------------


@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP])
def test_synthetic_matches_single_envs(mode, script):
    kwargs = {"max_turns": 3, "topk": 2}
    vector = gym.make_vec(
        SYNTHETIC, num_envs=5, vectorization_mode="vector_entry_point", autoreset_mode=mode, **kwargs
    )
    ends = assert_equivalent(vector, lambda: gym.make(SYNTHETIC, **kwargs), 11, script, mode)
    # Several episodes per sub-env: one lasts at most 3 turns (+1 reset step in NEXT_STEP), so
    # each of the 5 sub-envs ends at least 24 // 4 = 6 times in 24 steps.
    assert ends >= 30


@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP])
def test_matches_gymnasium_sync_vector_env(mode, script):
    """Infos included, array for array, against SyncVectorEnv over gym.make envs."""
    kwargs = {"max_turns": 3, "reward": "lightsearcher"}
    ours = gym.make_vec(
        SYNTHETIC, num_envs=5, vectorization_mode="vector_entry_point", autoreset_mode=mode, **kwargs
    )
    sync = gym.make_vec(
        SYNTHETIC, num_envs=5, vectorization_mode="sync", vector_kwargs={"autoreset_mode": mode}, **kwargs
    )
    for a, b in zip(ours.reset(seed=3), sync.reset(seed=3), strict=True):
        assert same(a, b) if isinstance(a, dict) else a == b
    for actions in script:
        for a, b in zip(ours.step(actions), sync.step(actions), strict=True):
            assert same(a, b) if not isinstance(a, tuple) else a == b


def test_hotpotqa_bm25_matches_single_envs(shared_data):
    data = shared_data / "questions" / "hotpotqa.jsonl"
    kwargs = {"data_path": data, "corpus_path": shared_data / "corpus.jsonl", "max_turns": 3}
    vector = gym.make_vec(
        "searchgym/HotpotQA-v1", num_envs=4, vectorization_mode="vector_entry_point", **kwargs
    )
    questions = vector.unwrapped.envs[0].questions
    script = action_script(
        [q.question for q in questions[:60]], [q.golden_answers[0] for q in questions[:60]], 5, 12, 4
    )
    assert_equivalent(
        vector, lambda: gym.make("searchgym/HotpotQA-v1", **kwargs), 21, script, AutoresetMode.NEXT_STEP
    )
    retrievers = {id(env.retriever) for env in vector.unwrapped.envs}
    assert len(retrievers) == 1  # one shared BM25 index


# -- batching and retrieval errors --------------------------------------------------------


def test_one_batched_call_per_step(world):
    counting = CountingRetriever(searchgym.make_retriever("bm25", docs=world.docs))
    vector = gym.make_vec(SYNTHETIC, num_envs=4, vectorization_mode="vector_entry_point", retriever=counting)
    vector.reset(seed=0)
    vector.step(("<search>alpha</search>", "<answer>x</answer>", "<search>beta</search>", "junk"))
    assert counting.batches == [["alpha", "beta"]]
    vector.step(("<search>gamma</search>",) * 4)  # sub-env 1 is reset by this step (next-step autoreset)
    assert counting.batches[1] == ["gamma"] * 3
    vector.step(("<answer>a</answer>",) * 4)
    assert len(counting.batches) == 2  # no search, no call


@pytest.mark.parametrize("short", [False, True])
def test_retrieval_error_becomes_an_observation(short):
    broken = BrokenRetriever(short=short)
    vector = gym.make_vec(SYNTHETIC, num_envs=3, vectorization_mode="vector_entry_point", retriever=broken)
    vector.reset(seed=0)
    obs, rewards, terminated, truncated, infos = vector.step(
        ("<search>a</search>", "<search>b</search>", "<answer>c</answer>")
    )
    assert broken.calls == 1
    assert infos["_retrieval_error"].tolist() == [True, True, False]
    expected = "answered 1 results for a batch of 2 queries" if short else "backend down"
    assert all(expected in infos["retrieval_error"][i] for i in (0, 1))
    assert all("The search failed" in obs[i] for i in (0, 1)) and terminated.tolist() == [False, False, True]
    if not short:  # the single env says the same
        single = gym.make(SYNTHETIC, retriever=broken)
        single.reset(seed=0)
        _, _, _, _, info = single.step("<search>a</search>")
        assert info["retrieval_error"] == infos["retrieval_error"][0]
    # The episodes go on after the failure.
    vector.step(("<answer>x</answer>",) * 3)


# -- reset options, seeds, disabled autoreset ------------------------------------------------


def test_reset_options_per_env_common_and_masked(world):
    vector = gym.make_vec(SYNTHETIC, num_envs=3, vectorization_mode="vector_entry_point", max_turns=1)
    qs = world.questions
    _, infos = vector.reset(
        options=[{"index": 4}, None, {"question": "Q?", "golden_answers": ["a"], "id": "mine"}]
    )
    assert infos["question_id"][0] == qs[4].id and infos["question_id"][2] == "mine"
    _, infos = vector.reset(options={"index": 9})
    assert infos["question_id"].tolist() == [qs[9].id] * 3
    options = {"reset_mask": np.array([False, True, False]), "env_options": [None, {"index": 1}, None]}
    vector.step(("<answer>x</answer>",) * 3)
    obs_before = vector.unwrapped._observations.copy()
    obs, infos = vector.reset(options=options)
    assert "reset_mask" in options  # the caller's dict is left alone
    assert infos["_question_id"].tolist() == [False, True, False] and infos["question_id"][1] == qs[1].id
    assert obs[0] == obs_before[0] and obs[2] == obs_before[2]


@pytest.mark.parametrize(
    "options, match",
    [
        ([{"index": 1}], "list of 3"),
        ({"reset_mask": [True, False, True]}, "reset_mask"),
        ({"reset_mask": np.zeros(3, dtype=bool)}, "at least one"),
        ("index", "options must be"),
        ([1, 2, 3], r"options\[0\]"),
    ],
)
def test_bad_reset_options(options, match):
    vector = gym.make_vec(SYNTHETIC, num_envs=3, vectorization_mode="vector_entry_point")
    with pytest.raises(InvalidArgumentError, match=match):
        vector.reset(options=options)


def test_seeds_int_list_and_bad():
    vector = gym.make_vec(SYNTHETIC, num_envs=3, vectorization_mode="vector_entry_point")
    a, _ = vector.reset(seed=5)
    b, _ = vector.reset(seed=[5, 6, 7])
    assert a == b
    with pytest.raises(InvalidArgumentError, match="list of 3"):
        vector.reset(seed=[1, 2])


def test_bad_action_batches_raise_and_bad_actions_do_not():
    vector = gym.make_vec(SYNTHETIC, num_envs=2, vectorization_mode="vector_entry_point")
    with pytest.raises(SearchGymError, match="reset"):
        vector.step(("a", "b"))
    vector.reset(seed=0)
    with pytest.raises(InvalidArgumentError, match="one action per sub-env"):
        vector.step(("a",))
    with pytest.raises(InvalidArgumentError, match="tuple or list"):
        vector.step("<search>x</search>")
    _, _, _, _, infos = vector.step(np.array([None, b"\xff" * 3], dtype=object))
    assert infos["_error"].all()


def test_disabled_autoreset_needs_a_masked_reset():
    vector = gym.make_vec(
        SYNTHETIC, num_envs=2, vectorization_mode="vector_entry_point", autoreset_mode="Disabled"
    )
    vector.reset(seed=0)
    _, _, terminated, _, _ = vector.step(("<answer>x</answer>", "<search>y</search>"))
    assert terminated.tolist() == [True, False]
    turns = [len(t.turns) for t in vector.get_attr("trajectory")]
    with pytest.raises(SearchGymError, match=r"Sub-envs \[0\]"):
        vector.step(("<answer>x</answer>",) * 2)
    assert [len(t.turns) for t in vector.get_attr("trajectory")] == turns  # nothing was stepped
    vector.reset(options={"reset_mask": np.array([True, False])})
    _, _, terminated, _, _ = vector.step(("<answer>x</answer>",) * 2)
    assert terminated.tolist() == [True, True]


# -- stack_infos is Gymnasium's _add_info, built column-wise ------------------------------------


class _Probe(VectorEnv):
    def __init__(self, n):
        self.num_envs = n


def test_stack_infos_equals_add_info():
    entries = [
        (0, {"a": 1, "b": None, "c": [1, 2], "d": {"x": 1.5}, "e": np.arange(2)}),
        (1, {"a": 2.7, "b": "s", "c": [], "d": {"x": 2.0, "y": "z"}, "f": np.float32(3)}),
        (2, {"final_obs": "end", "final_info": {"a": True}}),
        (2, {"a": 3, "c": [[1]], "e": np.ones(2, dtype=np.int64)}),
        (3, {"a": 4, "b": "t", "c": [3], "d": {"x": 0.5}, "e": np.arange(2), "f": np.float32(1)}),
        (3, {"a": 5, "b": "u", "c": [4]}),  # sub-env 3 again: the later values win
    ]
    probe = _Probe(5)
    expected: dict = {}
    for i, info in entries:
        expected = probe._add_info(expected, info, i)
    assert same(stack_infos(entries, 5), expected)
    same_keys = [(i, {"q": f"id{i}", "n": i, "ok": i % 2 == 0, "l": [i] * i}) for i in range(4)]
    expected = {}
    for i, info in same_keys:
        expected = probe._add_info(expected, info, i)
    assert same(stack_infos(same_keys, 5), expected)
