"""Multi-turn episodes keep their key/value cache between turns: the trainer's sampler and the
``hf`` evaluation policy encode only each turn's new tokens, and sample what they sampled
when every turn was encoded whole."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import gymnasium as gym  # noqa: E402

from searchgym.policies import HFPolicy, evaluate  # noqa: E402
from searchgym.policies.chat import ChatFormatter  # noqa: E402
from searchgym.policies.tiny import build_tiny_lm, load_tiny_lm, load_tokenizer  # noqa: E402
from searchgym.policies.turn_cache import TurnCache, common_prefix  # noqa: E402
from searchgym.trainers.grpo.generation import SamplingSettings, generate_batch, sample_actions  # noqa: E402
from searchgym.trainers.grpo.rollout import RolloutCollector  # noqa: E402

ENV_ID = "searchgym/SyntheticFacts-v1"


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return build_tiny_lm(tmp_path_factory.mktemp("tiny"), hidden_size=64, num_layers=2)


@pytest.fixture(scope="module")
def tiny(tiny_dir) -> tuple:
    model, tok = load_tiny_lm(tiny_dir)
    return model.float().eval(), tok


def load(request, name: str) -> tuple:
    if name == "tiny":
        return request.getfixturevalue("tiny")
    from transformers import AutoModelForCausalLM

    folder = request.getfixturevalue("smollm2_dir")
    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval(), load_tokenizer(folder)


class EmbeddingCounter:
    """Records the (batch, length) of every input the model's embedding layer gets."""

    def __init__(self, model):
        self.shapes: list[tuple[int, int]] = []
        self.handle = model.get_input_embeddings().register_forward_hook(self._hook)

    def _hook(self, module, inputs, output):
        self.shapes.append(tuple(inputs[0].shape))

    def close(self):
        self.handle.remove()


def first_prompts(tok, n: int) -> list[list[int]]:
    """Chat-formatted first turns of ``n`` SyntheticFacts questions (different lengths)."""
    env = gym.make(ENV_ID, protocol="search_r1")
    formatter = ChatFormatter(tok)
    rows = []
    for i in range(n):
        obs, _ = env.reset(options={"index": i})
        rows.append(list(tok(formatter.prompt(obs), add_special_tokens=False)["input_ids"]))
    return rows


# -- the sampler: tokens and logits --------------------------------------------------------------


@pytest.mark.parametrize(
    ("model_name", "temperature"),
    [("tiny", 0.0), ("tiny", 1.0), pytest.param("smollm2", 1.0, marks=pytest.mark.slow)],
)
def test_a_second_turn_from_the_cache_gives_the_same_tokens_and_logits(request, model_name, temperature):
    """Turn 2 of four episodes (contexts of different lengths, one whose last sampled token is
    replaced, one whose cache is missing): the same tokens and logits as encoding it whole."""
    model, tok = load(request, model_name)
    rows = first_prompts(tok, 4)
    settings = SamplingSettings(temperature=temperature, share_prefix=False)
    caches = [TurnCache() for _ in rows]
    torch.manual_seed(0)
    first, stop, _ = generate_batch(model, tok, rows, [6, 9, 7, 8], [], settings, turn_caches=caches)
    assert [len(c) for c in caches] == [
        len(r) + min(k, len(f) - 1) for r, k, f in zip(rows, stop.kept, first, strict=True)
    ]
    observation = tok(
        "<|im_end|>\n<|im_start|>user\n<information>Doc 1</information>", add_special_tokens=False
    )
    second = []
    for i, (row, new, kept) in enumerate(zip(rows, first, stop.kept, strict=True)):
        action = new[:kept]
        if i == 1:  # the episode's ids replace the last sampled token (finish_action does so)
            action = action[:-1] + [tok.convert_tokens_to_ids("<|im_start|>")]
        second.append(row + action + observation["input_ids"] * (i + 1))
    caches[3].clear()  # an episode without a cache encodes its context whole, in the same batch
    runs = []
    for reuse in (False, True):
        counter = EmbeddingCounter(model)
        torch.manual_seed(1)
        new, _, output = generate_batch(
            model, tok, second, [8] * 4, [], settings, turn_caches=caches if reuse else None,
            output_logits=True, return_dict_in_generate=True,
        )  # fmt: skip
        counter.close()
        runs.append((new, torch.stack(output.logits, dim=1), counter.shapes[0]))
    (whole, whole_logits, whole_input), (cached, cached_logits, cached_input) = runs
    assert cached == whole
    torch.testing.assert_close(cached_logits, whole_logits, atol=1e-4, rtol=1e-4)
    picked = torch.tensor(whole).unsqueeze(-1)
    torch.testing.assert_close(
        cached_logits.log_softmax(-1).gather(-1, picked),
        whole_logits.log_softmax(-1).gather(-1, picked),
        atol=1e-5,
        rtol=1e-5,
    )
    assert whole_input == (4, max(len(r) for r in second))
    # from its cache, a row encodes what follows the tokens turn 1 fed the model; the row
    # without a cache encodes all of its context
    fed = [
        row + new[: min(kept, len(new) - 1)] for row, new, kept in zip(rows, first, stop.kept, strict=True)
    ]
    encoded = [len(s) - common_prefix(s, f) for s, f in zip(second[:3], fed[:3], strict=True)] + [
        len(second[3])
    ]
    assert cached_input == (4, max(encoded))
    assert encoded[1] > encoded[0] - len(observation["input_ids"])  # the replaced token is encoded again


# -- the rollouts ------------------------------------------------------------------------------------


def collector(model, tok, temperature: float, reuse: bool, max_turns=(2, 3, 4)) -> RolloutCollector:
    """Six episodes that end after 2, 3 or 4 turns, sampled 4 contexts per ``generate`` call."""
    made = []

    def make_env():
        made.append(None)
        return gym.make(ENV_ID, protocol="search_r1", max_turns=max_turns[(len(made) - 1) % len(max_turns)])

    return RolloutCollector(
        make_env,
        model,
        tok,
        ChatFormatter(tok),
        max_new_tokens=10,
        max_context_tokens=2048,
        sampling=SamplingSettings(temperature=temperature, batch_size=4, reuse_cache=reuse),
    )


class Recorder:
    """sample_actions, recording per call the contexts, what their caches held before it,
    the cache objects, the first model input of each ``generate`` call (its inputs longer
    than the one-token decoding steps) and what it sampled."""

    def __init__(self, model):
        self.counter = EmbeddingCounter(model)
        self.calls: list[dict] = []
        self.seen: list[TurnCache] = []

    def __call__(self, model, tok, contexts, budgets, stops, settings, prefix_lengths=None, turn_caches=None):
        start = len(self.counter.shapes)
        caches = list(turn_caches or [])
        others = [c for c in self.seen if all(c is not d for d in caches)]
        self.seen += [c for c in caches if all(c is not d for d in self.seen)]
        held = [list(c.ids) for c in caches]
        extra = {} if turn_caches is None else {"turn_caches": turn_caches}
        out = sample_actions(
            model, tok, contexts, budgets, stops, settings, prefix_lengths=prefix_lengths, **extra
        )
        self.calls.append(
            {
                "contexts": [list(c) for c in contexts],
                "held": held,
                "others_held": [len(c) for c in others],
                "inputs": [s for s in self.counter.shapes[start:] if s[1] > 1],
                "sampled": out,
            }
        )
        return out


def shared_start(a, b) -> int:
    """Leading ids ``a`` and ``b`` share (counted here, independently of the library)."""
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_rollouts_are_the_same_with_and_without_reusing_the_cache(tiny, temperature):
    model, tok = tiny
    collected = []
    for reuse in (False, True):
        c = collector(model, tok, temperature, reuse)
        episodes = c.collect([0, 1, 2], 2, seed=5)
        c.close()
        collected.append([(ep.token_ids, ep.action_mask, ep.reward, len(ep.actions())) for ep in episodes])
    assert collected[0] == collected[1]
    assert sorted({turns for *_, turns in collected[0]}) == [2, 3, 4]  # they end at different turns


def test_a_single_episode_encodes_each_token_once(tiny):
    """One episode, four turns: each turn's first model input is the turn's new tokens only
    (the whole context each turn without the cache)."""
    model, tok = tiny
    c = collector(model, tok, 1.0, True, max_turns=(4,))
    recorder = Recorder(model)
    c.sampler = recorder
    (episode,) = c.collect([3], 1, seed=2)
    recorder.counter.close()
    c.close()
    actions = [s for s in episode.segments if s.kind == "action"]
    assert len(actions) == 4 == len(recorder.calls)
    ids = episode.token_ids
    expected = [actions[0].start]  # the prompt
    for turn, (before, action) in enumerate(zip(actions, actions[1:], strict=False)):
        # the model has seen the previous context and the tokens it sampled but the last one
        # (never fed back); the episode's ids may differ from them at the action's end
        seen = ids[: before.start] + recorder.calls[turn]["sampled"][0].ids[:-1]
        context = ids[: action.start]
        expected.append(len(context) - shared_start(context, seen))
        assert expected[-1] <= action.start - before.start  # at most the previous action and the feedback
    assert [call["inputs"][0] for call in recorder.calls] == [(1, n) for n in expected]


def test_a_batch_encodes_only_its_rows_new_tokens_and_ended_episodes_drop_their_cache(tiny):
    """Six episodes, 4 contexts per ``generate`` call, ending after 2, 3 or 4 turns."""
    model, tok = tiny
    c = collector(model, tok, 1.0, True)
    recorder = Recorder(model)
    c.sampler = recorder
    episodes = c.collect([0, 1, 2], 2, seed=7)
    recorder.counter.close()
    c.close()
    assert sorted(len(ep.actions()) for ep in episodes) == [2, 2, 3, 3, 4, 4]
    assert [len(call["contexts"]) for call in recorder.calls] == [6, 6, 4, 2]
    for call in recorder.calls[1:]:
        expected = []
        for first in range(0, len(call["contexts"]), 4):  # each generate call: its rows' new tokens
            rows = call["contexts"][first : first + 4]
            held = call["held"][first : first + 4]
            new = [len(r) - min(shared_start(r, h), len(r) - 1) for r, h in zip(rows, held, strict=True)]
            expected.append((len(rows), max(new)))
            assert max(new) < min(len(r) for r in rows) // 2
        assert call["inputs"] == expected
        assert call["others_held"] == [0] * (6 - len(call["contexts"]))  # ended episodes hold nothing
    assert all(len(cache) == 0 for cache in recorder.seen)  # nor does any episode once all ended


# -- the hf policy --------------------------------------------------------------------------------


class LogitsRecorder:
    """Wraps ``model.generate`` to read the logits of every step."""

    def __init__(self, model):
        self.model, self.generate = model, model.generate
        self.logits: list = []
        model.generate = self

    def __call__(self, **kwargs):
        output = self.generate(**{**kwargs, "output_logits": True, "return_dict_in_generate": True})
        self.logits.append(torch.stack(output.logits, dim=1))
        return output

    def close(self):
        del self.model.generate


@pytest.mark.parametrize(
    ("model_name", "temperature"),
    [("tiny", 0.0), ("tiny", 0.8), pytest.param("smollm2", 0.0, marks=pytest.mark.slow)],
)
def test_hf_evaluation_gives_the_same_episodes_and_logits_and_encodes_fewer_tokens(
    request, model_name, temperature
):
    model, tok = load(request, model_name)
    runs = []
    for reuse in (False, True):
        policy = HFPolicy(
            model,
            tokenizer=tok,
            max_new_tokens=12,
            temperature=temperature,
            batch_size=2,
            seed=3,
            reuse_cache=reuse,
        )
        counter, logits = EmbeddingCounter(model), LogitsRecorder(model)
        actions: list[list[str]] = []
        act = policy.act
        policy.act = lambda contexts, act=act, seen=actions: seen.append(act(contexts)) or seen[-1]
        result = evaluate(
            lambda: gym.make(ENV_ID, protocol="search_r1", max_turns=3),
            policy,
            4,
            batch_size=4,
            progress=False,
        )
        counter.close()
        logits.close()
        prefill = sum(b * t for b, t in counter.shapes[::1] if t > 1)
        runs.append((actions, result.em, result.format_ok, logits.logits, prefill, len(policy._turn_caches)))
    (actions, em, ok, whole_logits, whole_prefill, _), (c_actions, c_em, c_ok, c_logits, c_prefill, held) = (
        runs
    )
    assert c_actions == actions and (c_em, c_ok) == (em, ok)
    assert len(actions) == 3  # three turns
    assert len(c_logits) == len(whole_logits)
    for a, b in zip(c_logits, whole_logits, strict=True):
        torch.testing.assert_close(a.log_softmax(-1), b.log_softmax(-1), atol=1e-4, rtol=1e-4)
    assert c_prefill < 0.6 * whole_prefill
    assert held == 4  # the last turn's caches, dropped by the next call that does not continue them


def test_the_hf_spec_turns_reuse_off_and_a_non_boolean_is_named(tiny_dir):
    from searchgym.error import InvalidArgumentError
    from searchgym.policies import make_policy

    assert make_policy(f"hf:{tiny_dir}?reuse_cache=false", protocol="search_r1").reuse_cache is False
    assert make_policy(f"hf:{tiny_dir}", protocol="search_r1").reuse_cache is True
    with pytest.raises(InvalidArgumentError, match="reuse_cache must be true or false, got 'no'"):
        make_policy(f"hf:{tiny_dir}?reuse_cache=no", protocol="search_r1")
