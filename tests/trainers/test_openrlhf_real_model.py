"""The OpenRLHF agent with a real model: SmolLM2-135M-Instruct generating on the CPU.

OpenRLHF 0.11.2's own ``MultiTurnAgentExecutor`` loop drives a :class:`FakeVLLMEngine`
(vLLM's output conventions, see tests/fake_vllm.py) whose tokens come from SmolLM2 run
with transformers, over real BM25 retrieval on a few passages, for every protocol.

SmolLM2 splits the stop strings into several tokens (``</search>`` is ``</``, ``search``,
``>``), merges ``>`` with what follows (``</search>.`` ends in the one token ``>.``), ends
its turns with ``<|im_end|>``, the token its ChatML template closes turns with, and its
template adds a default system turn. Whatever the weak model writes, the episode must end
without an exception, the tokens trained on must be the chat rendering of the episode, the
loss must cover exactly the model's tokens, no EOS text may reach the env, and the reward
must be the env's. Forced to write the right answer, it must score right.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import math

import gymnasium as gym
import pytest

pytest.importorskip("openrlhf.utils.agent", reason="needs openrlhf==0.11.2 (--no-deps) and aiohttp")
torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from fake_vllm import FakeVLLMEngine, SamplingParams  # noqa: E402

import searchgym  # noqa: E402,F401  (registers the ids)
from searchgym.envs.protocols import make_protocol  # noqa: E402
from searchgym.envs.rewards import make_reward  # noqa: E402
from searchgym.policies.chat import ChatFormatter  # noqa: E402
from searchgym.policies.tiny import load_tokenizer  # noqa: E402
from searchgym.trainers.agent_config import AgentConfig  # noqa: E402
from searchgym.trainers.env_pool import env_pool  # noqa: E402
from searchgym.trainers.openrlhf.agent import SearchGymAgentExecutor, label_to_options  # noqa: E402

ENV_ID = "searchgym/NQ-v1"
IM_END, ENDOFTEXT = 2, 0  # <|im_end|> (EOS, end of turn) and <|endoftext|>
EOS_TEXTS = ("<|im_end|>", "<|endoftext|>", "<|im_start|>")
PASSAGES = [
    ("Ottawa", "Ottawa is the capital city of Canada, on the south bank of the Ottawa River."),
    ("Canberra", "Canberra is the capital city of Australia, founded in 1913."),
    ("Toronto", "Toronto is the most populous city in Canada and the capital of Ontario."),
    ("Maple syrup", "Canada produces most of the world's maple syrup, mainly in Quebec."),
    ("Bern", "Bern is the de facto capital of Switzerland."),
]
QUESTION = {"id": "q0", "question": "What is the capital of Canada?", "golden_answers": ["Ottawa"]}
QUERY = "capital of Canada"
PROTOCOL_REWARDS = {"search_r1": "em", "research": "f1", "sem": "em", "tool_call": "f1"}
MAX_NEW_TOKENS = 16  # per turn: the weak model rambles, a few tokens show all that matters


@pytest.fixture(scope="module")
def tok(smollm2_dir):
    return load_tokenizer(smollm2_dir)


@pytest.fixture(scope="module")
def model(smollm2_dir):
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)
    return AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    folder = tmp_path_factory.mktemp("nq")
    corpus = folder / "corpus.jsonl"
    corpus.write_text(
        "".join(json.dumps({"id": str(i), "title": t, "text": x}) + "\n" for i, (t, x) in enumerate(PASSAGES))
    )
    questions = folder / "nq.jsonl"
    questions.write_text(json.dumps(QUESTION) + "\n")
    return folder


def env_kwargs(data, protocol: str, **extra) -> dict:
    return {
        "data_path": str(data / "nq.jsonl"),
        "corpus_path": str(data / "corpus.jsonl"),
        "index_dir": str(data / "index"),
        "retriever": "bm25",
        "protocol": protocol,
        "reward": PROTOCOL_REWARDS[protocol],
        "max_turns": 3,
        "topk": 2,
        **extra,
    }


class SmolLM2Tokens:
    """A :data:`fake_vllm.TokenGenerator`: SmolLM2's tokens, with their log-probabilities.

    Sampled at the request's temperature from a generator seeded with ``seed`` (greedy at
    temperature 0), from the full softmax (OpenRLHF asks for ``top_p=1``, ``top_k=-1``).

    Decodes one token at a time with the KV cache, lazily, so the engine reads only as far as
    vLLM would; a request reuses the cache of the context it shares with the last one (as
    vLLM's prefix cache does). As vLLM's ``MinTokensLogitsProcessor`` does, no EOS or stop token is chosen
    within ``min_tokens``. ``forced`` (one token list per request) is a prefix the model is
    made to write first (read in one forward pass with the prompt); past it the model writes
    freely. Every log-probability is the model's own.
    """

    def __init__(self, model, tok, forced: list[list[int]] | None = None, seed: int = 0):
        self.model, self.tok, self.forced = model, tok, forced
        self.calls = 0
        self.rng = torch.Generator().manual_seed(seed)
        # transformers renamed the KV cache argument (5.24 warns about the old name)
        self.cache_arg = (
            "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        )
        self.cache, self.cached = None, []  # the KV cache and the ids it holds

    def __call__(self, prompt_ids, params):
        forced = self.forced[self.calls] if self.forced and self.calls < len(self.forced) else []
        self.calls += 1
        banned = [self.tok.eos_token_id, *(params.stop_token_ids or ())]
        return self._decode(list(prompt_ids), forced, params.min_tokens or 0, banned, params.temperature)

    @torch.no_grad()
    def _decode(self, prompt_ids, forced, min_tokens, banned, temperature):
        # the prompt and the forced tokens in one forward pass (reusing the cache of the
        # context they share with the last request); their logprobs are the model's
        reuse = 0
        limit = min(len(self.cached), len(prompt_ids) - 1)
        while reuse < limit and self.cached[reuse] == prompt_ids[reuse]:
            reuse += 1
        if not reuse:
            self.cache = None
        elif reuse < len(self.cached):
            self.cache.crop(reuse - len(self.cached))  # a negative count: that many tokens go
        self.cached = self.cached[:reuse]
        logits = self._forward((prompt_ids + forced)[reuse:], keep=len(forced) + 1)
        logprobs = torch.log_softmax(logits[0].float(), dim=-1)
        for i, token in enumerate(forced):
            yield token, float(logprobs[i, token])
        logprobs, n = logprobs[-1], len(forced)
        while True:
            allowed = logprobs.clone()
            if n < min_tokens:
                allowed[banned] = -math.inf
            if temperature > 0:
                probs = torch.softmax(allowed / temperature, -1)
                token = int(torch.multinomial(probs, 1, generator=self.rng))
            else:
                token = int(allowed.argmax())
            yield token, float(logprobs[token])
            logprobs = torch.log_softmax(self._forward([token])[0, -1].float(), dim=-1)
            n += 1

    def _forward(self, ids, keep=1):
        """The logits of the last ``keep`` of ``ids`` read after the cached ones; the cache then holds them too."""
        cache = {self.cache_arg: self.cache}
        out = self.model(input_ids=torch.tensor([ids]), use_cache=True, logits_to_keep=keep, **cache)
        self.cache = getattr(out, self.cache_arg)  # the output field is named like the argument
        self.cached += list(ids)
        return out.logits


def run_episode(config: AgentConfig, tok, generator, max_new_tokens=MAX_NEW_TOKENS, tokens_per_step=1):
    engine = FakeVLLMEngine(tok, generator, stop_token_ids=[ENDOFTEXT], tokens_per_step=tokens_per_step)
    result = asyncio.run(
        SearchGymAgentExecutor(config=config).execute(
            prompt="unused",
            label=json.dumps(QUESTION),
            sampling_params=SamplingParams.openrlhf(max_new_tokens=max_new_tokens, logprobs=True),
            max_length=2048,
            hf_tokenizer=tok,
            llm_engine=engine,
        )
    )
    env = env_pool(config).acquire()  # the env that played the episode, its trajectory intact
    try:
        trajectory = env.unwrapped.trajectory
    finally:
        env_pool(config).release(env)
    return result, engine, trajectory


def replay(kwargs: dict, actions: list[str]):
    """The actions on a fresh env: (prompt, observations, rewards, trajectory)."""
    env = gym.make(ENV_ID, **kwargs)
    prompt, _ = env.reset(options=label_to_options(json.dumps(QUESTION)))
    observations, rewards = [], []
    for action in actions:
        observation, reward, terminated, truncated, _ = env.step(action)
        observations.append(observation)
        rewards.append(reward)
        if terminated or truncated:
            break
    trajectory = env.unwrapped.trajectory
    env.close()
    return prompt, observations, rewards, trajectory


def check_episode(result, engine, trajectory, kwargs, tok):
    """What must hold whatever the model wrote; returns the replayed rewards."""
    actions = [turn.action_text for turn in trajectory.turns]
    assert len(actions) == len(engine.outputs) == len(result["action_ranges"])
    # the env read each turn's text without the EOS text vLLM wrote into it (SmolLM2 ends
    # its turns with <|im_end|>; with these seeds it never samples <|endoftext|>)
    for action, out in zip(actions, engine.outputs, strict=True):
        assert not any(eos in action for eos in EOS_TEXTS), action
        assert out.text in (action, action + "<|im_end|>")
        assert out.text.endswith("<|im_end|>") == (out.finish_reason == "stop" and out.stop_reason is None)
        if isinstance(out.stop_reason, str):  # stopped at a stop string: it ends the action
            assert action.endswith(out.stop_reason)
    # the reward is the scheme's on the parsed actions, played again on a fresh env
    prompt, observations, rewards, replayed = replay(kwargs, actions)
    assert len(rewards) == len(actions) or trajectory.truncated
    assert result["reward"] == pytest.approx(sum(rewards)) == pytest.approx(trajectory.reward)
    assert [t.action.kind for t in replayed.turns] == [t.action.kind for t in trajectory.turns]
    logs = result["extra_logs"]
    assert (logs["em"], logs["f1"], logs["format_ok"]) == (
        replayed.em,
        replayed.f1,
        float(replayed.format_ok),
    )

    # the tokens trained on: the chat rendering of the episode, token for token
    tokens, ranges = result["observation_tokens"], result["action_ranges"]
    segments = [prompt]
    for action, observation in zip(actions, observations[:-1], strict=False):
        segments += [action, observation]
    segments.append(actions[-1])
    ended_at_eos = engine.outputs[-1].text.endswith("<|im_end|>")
    text = tok.decode(tokens, skip_special_tokens=False)
    assert text == ChatFormatter(tok).render(segments) + ("<|im_end|>" if ended_at_eos else "")
    # the prompt is tokenised as SmolLM2's template renders it (the feedback as the chat
    # formatter renders it: tests/policies/test_real_model.py checks that against the template)
    first = tok.apply_chat_template(
        [{"role": "user", "content": prompt.strip()}], tokenize=False, add_generation_prompt=True
    )
    assert tokens[: ranges[0][0]] == tok(first, add_special_tokens=False)["input_ids"]
    # the loss covers exactly the model's tokens: each turn's sampled ids, up to its stop
    # string's end (the token that completes it cut there), with their logprobs
    logprobs = result["rollout_log_probs"]
    for (a, b), out in zip(ranges, engine.outputs, strict=True):
        kept = tokens[a:b]
        assert kept and tok.decode(kept, skip_special_tokens=False) == out.text
        sampled = [out.logprobs[i][t].logprob for i, t in enumerate(out.token_ids)]
        if isinstance(out.stop_reason, str):
            k = next(
                k for k in range(len(out.token_ids)) if out.stop_reason in tok.decode(out.token_ids[: k + 1])
            )
            assert kept[:k] == out.token_ids[:k] and logprobs[a : a + k] == sampled[:k]
            assert sum(logprobs[a:b]) == pytest.approx(sum(sampled[: k + 1]))
        else:
            assert kept == out.token_ids and logprobs[a:b] == sampled
    in_actions = {i for a, b in ranges for i in range(a, b)}
    assert all(lp == 0.0 for i, lp in enumerate(logprobs) if i not in in_actions)
    return rewards


# -- SmolLM2's tokenizer --------------------------------------------------------------------------


@pytest.mark.parametrize("protocol", sorted(PROTOCOL_REWARDS))
def test_every_stop_string_spans_several_smollm2_tokens(tok, protocol):
    stops = ChatFormatter(tok).stop_strings(protocol)
    assert stops
    for stop in stops:
        assert len(tok(stop, add_special_tokens=False)["input_ids"]) >= 3, stop
    assert tok.eos_token_id == IM_END and tok.convert_ids_to_tokens([IM_END, ENDOFTEXT]) == [
        "<|im_end|>",
        "<|endoftext|>",
    ]
    # and the token that ends it may carry text past it
    assert tok.convert_ids_to_tokens(tok("</search>.", add_special_tokens=False)["input_ids"])[-1] == ">."


# -- whatever the model writes ------------------------------------------------------------------------


@pytest.mark.parametrize("protocol", sorted(PROTOCOL_REWARDS))
def test_a_free_episode_is_the_chat_rendering_with_the_envs_reward(protocol, tok, model, data):
    kwargs = env_kwargs(data, protocol)
    config = AgentConfig(ENV_ID, kwargs)
    result, engine, trajectory = run_episode(config, tok, SmolLM2Tokens(model, tok))
    check_episode(result, engine, trajectory, kwargs, tok)
    assert all(len(out.token_ids) <= MAX_NEW_TOKENS for out in engine.outputs)


# -- forced to write the right answer -------------------------------------------------------------------


def right_turns(protocol: str) -> list[str]:
    proto = make_protocol(protocol)
    think = "I should look it up."
    first = proto.write_action(query=QUERY, think=think)
    return [first, proto.write_action(answer="Ottawa", think="Ottawa is the capital.")]


@pytest.mark.parametrize("protocol", sorted(PROTOCOL_REWARDS))
def test_a_forced_right_answer_scores_right(protocol, tok, model, data):
    kwargs = env_kwargs(data, protocol, index_dir=str(data / "index-forced"))  # its own env pool
    turns = right_turns(protocol)
    stops = ChatFormatter(tok).stop_strings(protocol)
    # each turn's text, then the EOS where no stop string ends it (SEM's answer)
    forced = [
        tok(t, add_special_tokens=False)["input_ids"]
        + ([] if any(t.endswith(s) for s in stops) else [IM_END])
        for t in turns
    ]
    config = AgentConfig(ENV_ID, kwargs)
    result, engine, trajectory = run_episode(
        config, tok, SmolLM2Tokens(model, tok, forced), max_new_tokens=64
    )
    rewards = check_episode(result, engine, trajectory, kwargs, tok)
    # generation stopped right where each multi-token stop string (or the EOS) completed,
    # though the model would have written on
    assert [out.token_ids for out in engine.outputs] == forced
    assert [out.stop_reason for out in engine.outputs] == [
        next((s for s in stops if t.endswith(s)), None) for t in turns
    ]
    assert [t.action_text for t in trajectory.turns] == turns
    assert trajectory.num_searches == 1 and "Ottawa" in [doc.title for doc in trajectory.turns[0].docs]
    assert result["reward"] == sum(rewards) == 1.0
    assert result["extra_logs"]["em"] == 1.0 and result["extra_logs"]["format_errors"] == 0.0
    assert (engine.outputs[-1].stop_reason is None) == (protocol == "sem")  # SEM's answer ends at EOS


@pytest.mark.parametrize("tokens_per_step", [1, 4])
def test_a_stop_token_that_runs_past_the_stop_string_is_trained_as_the_env_read_it(
    tokens_per_step, tok, model, data
):
    """SmolLM2 writes ``</search>.`` as ``</``, ``search``, ``>.``: vLLM cuts the text at the stop
    string but the token carries the ``.``; the trained text must still be the rendering."""
    kwargs = env_kwargs(data, "search_r1", index_dir=str(data / "index-straddle"))
    turns = right_turns("search_r1")
    forced = [tok(text, add_special_tokens=False)["input_ids"] for text in (turns[0] + ".", turns[1])]
    assert tok.convert_ids_to_tokens(forced[0][-1]) == ">."
    config = AgentConfig(ENV_ID, kwargs)
    generator = SmolLM2Tokens(model, tok, forced)
    result, engine, trajectory = run_episode(config, tok, generator, 64, tokens_per_step)
    first = engine.outputs[0]
    assert first.text == turns[0] and first.token_ids[: len(forced[0])] == forced[0]
    check_episode(result, engine, trajectory, kwargs, tok)
    assert result["reward"] == 1.0
    # trained: the model's tokens with ">." cut back to ">", which takes its logprob
    a, b = result["action_ranges"][0]
    assert result["observation_tokens"][a:b] == tok(turns[0], add_special_tokens=False)["input_ids"]
    assert result["rollout_log_probs"][b - 1] == first.logprobs[len(forced[0]) - 1][forced[0][-1]].logprob


def test_a_context_that_runs_out_ends_the_episode_with_the_schemes_reward(tok, model, data):
    """The base loop stops without a last step when the context is full; the episode still
    ends, truncated, with what the scheme gives its parsed actions (here a format penalty)."""
    kwargs = env_kwargs(data, "search_r1", reward="f1", reward_kwargs={"format_penalty": -1.0})
    env = gym.make(ENV_ID, **kwargs)
    prompt, _ = env.reset(options=label_to_options(json.dumps(QUESTION)))
    env.close()
    prompt_tokens = len(tok(ChatFormatter(tok).prompt(prompt), add_special_tokens=False)["input_ids"])
    config = AgentConfig(ENV_ID, kwargs)
    engine = FakeVLLMEngine(tok, SmolLM2Tokens(model, tok), stop_token_ids=[ENDOFTEXT])
    result = asyncio.run(
        SearchGymAgentExecutor(config=config).execute(
            prompt="unused",
            label=json.dumps(QUESTION),
            sampling_params=SamplingParams.openrlhf(max_new_tokens=MAX_NEW_TOKENS),
            max_length=prompt_tokens + MAX_NEW_TOKENS + 4,  # one turn, then its feedback fills it
            hf_tokenizer=tok,
            llm_engine=engine,
        )
    )
    assert len(engine.outputs) == 1 and len(result["action_ranges"]) == 1
    action = engine.outputs[0].text.removesuffix("<|im_end|>")
    *_, replayed = replay(kwargs, [action])
    replayed.truncated = True
    expected = make_reward("f1", format_penalty=-1.0)(replayed)
    assert result["reward"] == pytest.approx(expected) and result["scores"] == pytest.approx(expected)
    assert result["extra_logs"]["episode_truncated"] == 1.0 and result["extra_logs"]["answered"] == 0.0
    assert (expected == -1.0) == (not replayed.format_ok)
