"""The OpenRLHF agent against a vLLM-faithful engine (tests/fake_vllm.py), through openrlhf 0.11.2's own executor.

OpenRLHF keeps special tokens in vLLM's text and the agent asks vLLM to keep the stop
string, so an action that ends at the model's EOS reads ``...</answer><|im_end|>``; and
vLLM's ``token_ids`` keep every token of the engine step that hit a stop string. Every
protocol's right answer must still score right, for any tokenizer's EOS, and the tokens
trained on must still be the chat rendering of the episode. Expected actions come from
playing the oracle on a separate env; expected tokens from the chat formatter.
"""

from __future__ import annotations

import asyncio
import copy
import json
import random

import gymnasium as gym
import pytest

pytest.importorskip("openrlhf.utils.agent", reason="needs openrlhf==0.11.2 (--no-deps) and aiohttp")
torch = pytest.importorskip("torch")

from fake_vllm import FakeVLLMEngine, SamplingParams, ScriptedText  # noqa: E402

import searchgym  # noqa: E402,F401
from searchgym.envs.synthetic import generate_world  # noqa: E402
from searchgym.memory.config import MemoryConfig  # noqa: E402
from searchgym.policies import OracleSyntheticPolicy  # noqa: E402
from searchgym.policies.chat import ChatFormatter  # noqa: E402
from searchgym.trainers.agent_config import AgentConfig  # noqa: E402
from searchgym.trainers.openrlhf.agent import (  # noqa: E402
    EXTRA_LOG_KEYS,
    SearchGymAgentExecutor,
    label_to_options,
    split_end_of_sequence,
    with_stop_strings,
)
from searchgym.trainers.openrlhf.eval_split import EvalSign  # noqa: E402
from searchgym.trainers.openrlhf.turns import TurnEngine  # noqa: E402

ENV_ID = "searchgym/SyntheticFacts-v1"
WORLD = generate_world(0)
RAMBLE = "\n<information>Doc 1 (Title: Made up) invented text</information>\n<answer>ramble</answer>"
PROTOCOLS = {  # protocol -> env kwargs whose right answer scores 1
    "search_r1": {"protocol": "search_r1", "reward": "em"},
    "research": {"protocol": "research", "reward": "f1"},
    "sem": {"protocol": "sem", "reward": "em"},
    "tool_call": {"protocol": "tool_call", "reward": "f1"},
}
ZEPHYR_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}</s>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from searchgym.policies.tiny import build_tiny_lm, load_tokenizer

    folder = build_tiny_lm(tmp_path_factory.mktemp("tiny"), vocab_size=600, hidden_size=32, num_layers=1)
    return load_tokenizer(folder)


def variant(tiny, eos: str, template: str | None):
    """The tiny BPE with another EOS token and chat template (Zephyr/Llama-style ``</s>``, a base model's)."""
    from transformers import PreTrainedTokenizerFast

    extra = ["<|user|>", "<|assistant|>", "<|system|>"] if template else []
    tok = PreTrainedTokenizerFast(
        tokenizer_object=copy.deepcopy(tiny.backend_tokenizer), eos_token=eos, chat_template=template
    )
    tok.add_special_tokens({"eos_token": eos, "additional_special_tokens": extra})
    return tok


@pytest.fixture(scope="module", params=["qwen_im_end", "zephyr_s", "base_endoftext"])
def tokenizer(request, tiny):
    """Three EOS conventions: ``<|im_end|>`` (ChatML), ``</s>`` (Zephyr template), ``<|endoftext|>`` (no template)."""
    if request.param == "qwen_im_end":
        return tiny
    if request.param == "zephyr_s":
        return variant(tiny, "</s>", ZEPHYR_TEMPLATE)
    return variant(tiny, "<|endoftext|>", None)


def label_of(question) -> str:
    return json.dumps(
        {"id": question.id, "question": question.question, "golden_answers": list(question.golden_answers)}
    )


def two_hop_unknown():
    return next(q for q in WORLD.questions if q.hops == 2 and all(not f.known for f in WORLD.chain(q.id)))


def one_hop_unknown():
    return next(q for q in WORLD.questions if q.hops == 1 and not q.known)


def known_one_hop():
    return next(q for q in WORLD.questions if q.known and q.hops == 1)


def play(env_kwargs: dict, question, actions=None):
    """Play the oracle (or ``actions``) on a separate env: (prompt, actions, observations, rewards, trajectory)."""
    env = gym.make(ENV_ID, **env_kwargs)
    prompt, _ = env.reset(options=label_to_options(label_of(question)))
    policy = OracleSyntheticPolicy(WORLD, env_kwargs["protocol"])
    context, played, observations, rewards = prompt, [], [], []
    for i in range(8):
        action = actions[i] if actions is not None else policy.act([context])[0]
        obs, reward, terminated, truncated, _ = env.step(action)
        played.append(action)
        observations.append(obs)
        rewards.append(reward)
        context += action + obs
        if terminated or truncated:
            break
    return prompt, played, observations, rewards, env.unwrapped.trajectory


def execute(executor, question, engine, tokenizer, params=None, max_length=4096):
    return asyncio.run(
        executor.execute(
            prompt="unused",
            label=label_of(question),
            sampling_params=params or SamplingParams.openrlhf(),
            max_length=max_length,
            hf_tokenizer=tokenizer,
            llm_engine=engine,
        )
    )


def eos_text(tokenizer) -> str:
    return tokenizer.decode([tokenizer.eos_token_id], skip_special_tokens=False)


# -- the fake engine does what vLLM does ---------------------------------------------------------------


def test_engine_writes_the_eos_text_only_when_asked_to_keep_stop_text_and_special_tokens(tiny):
    ids = tiny("<answer>Paris</answer>", add_special_tokens=False)["input_ids"]
    prompt = tiny("<|im_start|>assistant\n", add_special_tokens=False)["input_ids"]
    outs = {}
    for include, skip in ((True, False), (False, False), (True, True)):
        engine = FakeVLLMEngine(tiny, lambda p, s: ids + [tiny.eos_token_id])
        params = SamplingParams(max_tokens=100, include_stop_str_in_output=include, skip_special_tokens=skip)
        outs[include, skip] = asyncio.run(engine.generate(prompt, params)).outputs[0]
    assert outs[True, False].text == "<answer>Paris</answer><|im_end|>"
    assert outs[False, False].text == "<answer>Paris</answer>"
    assert outs[True, True].text == "<answer>Paris</answer>"
    for out in outs.values():
        assert out.token_ids == ids + [tiny.eos_token_id]
        assert (out.finish_reason, out.stop_reason) == ("stop", None)


def test_engine_cuts_text_at_stop_string_and_keeps_the_steps_tokens(tiny):
    text = "<search>capital</search>" + RAMBLE
    ids = tiny(text, add_special_tokens=False)["input_ids"]
    upto = tiny("<search>capital</search>", add_special_tokens=False)["input_ids"]
    for include, expected in ((True, "<search>capital</search>"), (False, "<search>capital")):
        params = SamplingParams(max_tokens=100, stop=["</search>"], include_stop_str_in_output=include)
        one = asyncio.run(FakeVLLMEngine(tiny, lambda p, s: ids).generate([1, 2], params)).outputs[0]
        assert (one.text, one.token_ids, one.stop_reason) == (expected, upto, "</search>")
        four = asyncio.run(FakeVLLMEngine(tiny, lambda p, s: ids, tokens_per_step=4).generate([1, 2], params))
        out = four.outputs[0]
        assert out.text == expected and out.finish_reason == "stop"
        # the step that completed the stop string is kept whole: up to 3 tokens past it
        assert out.token_ids[: len(upto)] == upto and len(out.token_ids) == -(-len(upto) // 4) * 4
    capped = SamplingParams(max_tokens=3, stop=["</search>"], include_stop_str_in_output=True)
    out = asyncio.run(FakeVLLMEngine(tiny, lambda p, s: ids).generate([1], capped)).outputs[0]
    assert out.token_ids == ids[:3] and out.finish_reason == "length" and out.text == tiny.decode(ids[:3])


def one_token(tiny, *texts):
    """A copy of ``tiny`` in which each of ``texts`` is one (added, not special) token, as Qwen2.5's ``</tool_call>``."""
    tok = copy.deepcopy(tiny)
    tok.add_tokens(list(texts))
    assert all(len(tok(t, add_special_tokens=False)["input_ids"]) == 1 for t in texts)
    return tok


def generate(tok, ids, tokens_per_step=1, **params):
    engine = FakeVLLMEngine(tok, lambda p, s: ids, tokens_per_step=tokens_per_step)
    return asyncio.run(engine.generate([1, 2], SamplingParams(**params))).outputs[0]


def test_engine_applies_vllm_0_29_stop_rules_in_their_order(tiny):
    """The fake engine against vLLM 0.29's rules, as its source has them.

    - ``vllm/v1/core/sched/utils.py``, ``check_stop``: nothing ends a request before
      ``min_tokens`` tokens; then the EOS token, then ``stop_token_ids``, and only then
      ``max_tokens`` / ``max_model_len``. An EOS sampled as the last allowed token is a
      ``"stop"``, not a ``"length"``.
    - ``vllm/v1/engine/detokenizer.py``, ``check_stop_strings``: of the stop strings found
      in the new text, the one that completes earliest wins (a tie goes to the first in
      ``stop``), so a step of several tokens ends where one token at a time would.
    - ``vllm/v1/engine/detokenizer.py``, ``BaseIncrementalDetokenizer.update``: stop strings
      are searched once more than ``min_tokens`` tokens are out, from the end of the first
      ``min_tokens`` tokens' text: a first token that is a whole stop string is not one.

    The expected values are worked out from those rules by hand.
    """
    enc = lambda text: tiny(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    eos = tiny.eos_token_id
    answer = enc("<answer>Paris</answer>")
    # EOS as the last allowed token: "stop", its text kept (special tokens on, stop text kept)
    out = generate(
        tiny,
        answer + [eos],
        max_tokens=len(answer) + 1,
        include_stop_str_in_output=True,
        skip_special_tokens=False,
    )
    assert (out.finish_reason, out.stop_reason) == ("stop", None)
    assert out.text == "<answer>Paris</answer><|im_end|>" and out.token_ids == answer + [eos]
    # a stop token id as the last allowed token: "stop" with the id as the reason
    out = generate(tiny, answer + [7, 8], max_tokens=len(answer) + 1, stop_token_ids=[7])
    assert (out.finish_reason, out.stop_reason, out.token_ids) == ("stop", 7, answer + [7])
    # the same length without EOS: "length"
    out = generate(tiny, answer + [8, 8], max_tokens=len(answer) + 1)
    assert (out.finish_reason, out.stop_reason, out.token_ids) == ("length", None, answer + [8])
    # nothing ends before min_tokens: an EOS in the first two tokens does not
    out = generate(tiny, [eos] + answer + [eos], max_tokens=100, min_tokens=2, skip_special_tokens=False)
    assert out.token_ids == [eos] + answer + [eos] and out.finish_reason == "stop"

    # two stop strings in one step: the one that completes first wins, whatever the list order
    both = enc("<search>q</search> <answer>a</answer> more")
    for stop in (["</answer>", "</search>"], ["</search>", "</answer>"]):
        for include, text in ((True, "<search>q</search>"), (False, "<search>q")):
            for per_step in (1, len(both)):
                out = generate(
                    tiny, both, per_step, max_tokens=100, stop=stop, include_stop_str_in_output=include
                )
                assert (out.text, out.stop_reason, out.finish_reason) == (text, "</search>", "stop")
    # a tie (both end at the same character) goes to the first in the list
    out = generate(tiny, both, len(both), max_tokens=100, stop=["q</search>", "</search>"])
    assert (out.text, out.stop_reason) == ("<search>", "q</search>")
    out = generate(tiny, both, len(both), max_tokens=100, stop=["</search>", "q</search>"])
    assert (out.text, out.stop_reason) == ("<search>q", "</search>")

    # a first token that is a whole stop string: not searched within min_tokens = 1
    tok = one_token(tiny, "</tool_call>")
    ids = tok("</tool_call> x</tool_call> tail", add_special_tokens=False)["input_ids"]
    kw = {"max_tokens": 100, "stop": ["</tool_call>"], "include_stop_str_in_output": True}
    for per_step in (1, 4):
        out = generate(tok, ids, per_step, min_tokens=1, **kw)
        assert (out.text, out.stop_reason) == ("</tool_call> x</tool_call>", "</tool_call>")
    out = generate(tok, ids, min_tokens=0, **kw)
    assert (out.text, out.token_ids) == ("</tool_call>", ids[:1])


# -- every protocol's right answer scores right, with any EOS ---------------------------------------------


@pytest.mark.parametrize("protocol", sorted(PROTOCOLS))
@pytest.mark.parametrize("tokens_per_step", [1, 4])
def test_right_answer_scores_right_and_tokens_are_the_chat_rendering(protocol, tokens_per_step, tokenizer):
    env_kwargs = PROTOCOLS[protocol]
    question = one_hop_unknown()  # one search, then the answer
    prompt, actions, observations, rewards, trajectory = play(env_kwargs, question)
    assert trajectory.em == 1.0 and rewards[-1] == 1.0 and trajectory.num_searches >= 1
    # the model writes each action, then rambles on (a stop string ends it first) or ends
    # with EOS: SEM's answer turn has no stop string of its own
    generator = ScriptedText(tokenizer, [a + RAMBLE if a.endswith("</search>") else a for a in actions])
    engine = FakeVLLMEngine(tokenizer, generator, tokens_per_step=tokens_per_step)
    executor = SearchGymAgentExecutor(config=AgentConfig(ENV_ID, env_kwargs))
    result = execute(executor, question, engine, tokenizer)

    logs = result["extra_logs"]
    assert result["reward"] == sum(rewards) == 1.0
    assert logs["em"] == 1.0 and logs["format_ok"] == 1.0 and logs["format_errors"] == 0.0
    assert logs["num_searches"] == trajectory.num_searches and logs["answered"] == 1.0
    ends_at_eos = [out.stop_reason is None for out in engine.outputs]
    assert ends_at_eos[-1] == (protocol == "sem")  # only SEM's answer turn reaches the EOS
    if protocol == "sem":
        assert engine.outputs[-1].text == actions[-1] + eos_text(tokenizer)

    # the tokens trained on: the chat rendering, the actions' own tokens (with their EOS) masked in
    fmt = ChatFormatter(tokenizer)
    text = tokenizer.decode(result["observation_tokens"], skip_special_tokens=False)
    segments = [prompt]
    for action, obs in zip(actions, observations[:-1], strict=False):
        segments += [action, obs]
    segments.append(actions[-1])
    assert text == fmt.render(segments) + (eos_text(tokenizer) if protocol == "sem" else "")
    enc = [tokenizer(a, add_special_tokens=False)["input_ids"] for a in actions]
    enc[-1] += [tokenizer.eos_token_id] if protocol == "sem" else []
    ranges = result["action_ranges"]
    assert [result["observation_tokens"][a:b] for a, b in ranges] == enc


@pytest.mark.parametrize("protocol", sorted(PROTOCOLS))
def test_a_turn_that_ends_at_eos_closes_the_chat_turn_once(protocol, tokenizer):
    """A malformed turn ends at EOS; the env's error comes back and the next turn answers."""
    env_kwargs = PROTOCOLS[protocol]
    question = known_one_hop()
    _, right, _, _, _ = play(env_kwargs, question)
    actions = ["I am not sure yet", right[-1]]
    prompt, _, observations, rewards, trajectory = play(env_kwargs, question, actions)
    assert len(rewards) == 2 and trajectory.em == 1.0 and not trajectory.format_ok
    engine = FakeVLLMEngine(tokenizer, ScriptedText(tokenizer, actions))
    executor = SearchGymAgentExecutor(config=AgentConfig(ENV_ID, env_kwargs))
    result = execute(executor, question, engine, tokenizer)

    assert engine.outputs[0].text == "I am not sure yet" + eos_text(tokenizer)
    assert result["reward"] == sum(rewards) and result["extra_logs"]["format_errors"] == 1.0
    text = tokenizer.decode(result["observation_tokens"], skip_special_tokens=False)
    rendered = ChatFormatter(tokenizer).render([prompt, actions[0], observations[0], actions[1]])
    if ChatFormatter(tokenizer).uses_template:  # the EOS is the turn's end: the same text, once
        expected = rendered + (eos_text(tokenizer) if protocol == "sem" else "")
    else:  # no template: the EOS stays where the model put it
        expected = prompt + actions[0] + eos_text(tokenizer) + observations[0] + actions[1]
        expected += eos_text(tokenizer) if protocol == "sem" else ""
    assert text == expected


def test_split_end_of_sequence(tiny):
    assert split_end_of_sequence("<answer>x</answer><|im_end|>", tiny) == ("<answer>x</answer>", "<|im_end|>")
    assert split_end_of_sequence("a<|endoftext|><|im_end|>", tiny) == ("a", "<|endoftext|><|im_end|>")
    assert split_end_of_sequence("<answer>x</answer>", tiny) == ("<answer>x</answer>", "")
    assert split_end_of_sequence("<|im_end|> in the middle", tiny) == ("<|im_end|> in the middle", "")
    assert split_end_of_sequence("done</s>") == ("done", "</s>")  # no tokenizer: common EOS texts


# -- Light-Search's per-turn cap -----------------------------------------------------------------------------


def test_the_configured_max_new_tokens_caps_every_turn(tiny):
    question = two_hop_unknown()
    babble = "<think>" + " ".join(["the capital"] * 200)  # never closes a tag
    engine = FakeVLLMEngine(tiny, ScriptedText(tiny, [babble]))
    executor = SearchGymAgentExecutor(config=AgentConfig(ENV_ID, {"protocol": "search_r1", "max_turns": 3}))
    result = execute(executor, question, engine, tiny, params=SamplingParams.openrlhf(max_new_tokens=40))
    assert len(engine.requests) == 3
    assert [params.max_tokens for _, params in engine.requests] == [40, 40, 40]
    assert [b - a for a, b in result["action_ranges"]] == [40, 40, 40]
    assert result["truncated"] is True and result["extra_logs"]["episode_truncated"] == 1.0
    # the context budget still wins when less is left than the cap
    second_start = result["action_ranges"][1][0]
    engine = FakeVLLMEngine(tiny, ScriptedText(tiny, [babble]))
    short = execute(
        executor, question, engine, tiny, params=SamplingParams.openrlhf(40), max_length=second_start + 10
    )
    assert [params.max_tokens for _, params in engine.requests] == [40, 10]
    assert tuple(short["action_ranges"][1]) == (second_start, second_start + 10)


# -- evaluation episodes write nothing -------------------------------------------------------------------------


def test_eval_episodes_stay_out_of_the_memory_and_the_minimum_store(tiny, tmp_path):
    from searchgym.envs.rewards import MinToolCallStore
    from searchgym.memory import ExperienceMemory

    store, mins = tmp_path / "memory", tmp_path / "mins.sqlite"
    env_kwargs = {"protocol": "tool_call", "reward": "lightsearcher", "reward_kwargs": {"store": str(mins)}}
    config = AgentConfig(ENV_ID, env_kwargs, memory=MemoryConfig(kind="lightsearcher", path=str(store)))
    executor = SearchGymAgentExecutor(
        config=config, eval_sign=EvalSign(train_temperature=1.0, eval_temperature=0.6)
    )
    question = two_hop_unknown()
    _, actions, _, _, _ = play({"protocol": "tool_call"}, question)

    def episode(temperature):
        engine = FakeVLLMEngine(tiny, ScriptedText(tiny, actions))
        params = SamplingParams.openrlhf(temperature=temperature)
        return execute(executor, question, engine, tiny, params=params)

    for _ in range(2):  # the same pooled env serves eval, then training
        evaluated = episode(0.6)
        assert evaluated["reward"] > 0.5 and evaluated["extra_logs"]["em"] == 1.0
        assert len(ExperienceMemory(store)) == 0 and MinToolCallStore(mins).minima() == {}
    trained = episode(1.0)
    assert trained["reward"] == evaluated["reward"]
    assert len(ExperienceMemory(store)) == 1
    assert MinToolCallStore(mins).minima() == {question.id: 2}


def test_eval_sign_reads_the_run_file_and_refuses_equal_temperatures(tmp_path):
    run = tmp_path / "run.yaml"
    run.write_text(
        "backend: openrlhf\nenv: {id: SyntheticFacts-v1}\nopenrlhf:\n  eval: {dataset: data/eval.jsonl}\n"
    )
    sign = EvalSign.from_run_file(run)
    assert sign == EvalSign(1.0, 0.6)  # OpenRLHF 0.11.2's defaults
    assert sign.is_eval(SamplingParams(temperature=0.6)) and not sign.is_eval(SamplingParams(temperature=1.0))
    run.write_text(
        "backend: openrlhf\nenv: {id: SyntheticFacts-v1}\nopenrlhf: {rollout: {temperature: 0.7}}\n"
    )
    assert EvalSign.from_run_file(run) == EvalSign(0.7, None)  # no eval set: nothing is eval
    same = EvalSign.from_flags({"rollout": {"temperature": 0.6}, "eval": {"dataset": "x.jsonl"}})
    same.check("")  # writes nothing: fine
    with pytest.raises(searchgym.error.InvalidArgumentError, match="eval.temperature"):
        same.check("the experience memory")


# -- logs ----------------------------------------------------------------------------------------------------


def test_extra_logs_do_not_shadow_openrlhf_experience_fields():
    """OpenRLHF's actor logs an Experience field only when no info key has its name."""
    from dataclasses import fields

    from openrlhf.trainer.ppo_utils.experience import Experience

    episode_fields = {f.name for f in fields(Experience) if Experience.is_episode_tensor_field(f.name)}
    assert "truncated" in episode_fields
    assert not set(EXTRA_LOG_KEYS) & episode_fields
    # nor any info key OpenRLHF writes itself (reward, score, kl, return...)
    import pathlib
    import re

    import openrlhf

    source = "".join(p.read_text() for p in pathlib.Path(openrlhf.__file__).parent.rglob("*.py"))
    info_keys = set(re.findall(r"info\[\"(\w+)\"\]", source))
    assert {"reward", "score", "kl", "return"} <= info_keys
    assert not set(EXTRA_LOG_KEYS) & info_keys


def test_an_ambiguous_eval_set_stops_the_first_rollout_with_a_fix(tiny, tmp_path, monkeypatch):
    run = tmp_path / "run.yaml"
    run.write_text(
        f"backend: openrlhf\nenv: {{id: {ENV_ID}, protocol: tool_call}}\n"
        f"memory: {{kind: lightsearcher, path: {tmp_path / 'memory'}}}\n"
        "openrlhf:\n  rollout: {temperature: 0.6}\n  eval: {dataset: data/eval.jsonl}\n"
    )
    monkeypatch.setenv("SEARCHGYM_AGENT_CONFIG", str(run))
    engine = FakeVLLMEngine(tiny, ScriptedText(tiny, ["<answer>x</answer>"]))
    with pytest.raises(searchgym.error.InvalidArgumentError, match="the experience memory"):
        execute(SearchGymAgentExecutor(), known_one_hop(), engine, tiny)
    assert engine.requests == []  # refused before generating anything


@pytest.mark.parametrize("protocol", ["search_r1", "research"])
def test_a_token_that_straddles_the_stop_string_is_not_written_twice(protocol, tiny):
    """Qwen's pre-tokenizer merges ``>`` with the newlines after it: ``</search>\\n`` ends in one token.

    vLLM's text stops at ``</search>`` but the token carries the ``\\n`` too; the agent cuts
    it back to ``>``, and the feedback then writes the env's ``\\n`` once.
    """
    tok = variant(tiny, "<|endoftext|>", None)
    tok.add_tokens([">\n"])
    straddle = tok.convert_tokens_to_ids(">\n")
    env_kwargs = PROTOCOLS[protocol]
    question = one_hop_unknown()
    prompt, actions, observations, rewards, _ = play(env_kwargs, question)
    assert observations[0].startswith("\n<")
    engine = FakeVLLMEngine(tok, ScriptedText(tok, [actions[0] + observations[0], actions[1]]))
    result = execute(SearchGymAgentExecutor(config=AgentConfig(ENV_ID, env_kwargs)), question, engine, tok)
    first = engine.outputs[0]
    assert first.text == actions[0] and first.token_ids[-1] == straddle  # past the stop: "\n"
    assert result["reward"] == sum(rewards) == 1.0
    text = tok.decode(result["observation_tokens"], skip_special_tokens=False)
    assert text == prompt + actions[0] + observations[0] + actions[1]
    a, b = result["action_ranges"][0]
    assert result["observation_tokens"][a:b] == tok(actions[0], add_special_tokens=False)["input_ids"]


def test_an_eos_left_out_of_the_text_still_closes_the_turn_once(tiny):
    """With ``skip_special_tokens`` on, vLLM's text has no EOS but its token ids do."""
    env_kwargs = PROTOCOLS["tool_call"]
    question = known_one_hop()
    _, right, _, _, _ = play(env_kwargs, question)
    actions = ["I am not sure yet", right[-1]]
    prompt, _, observations, rewards, _ = play(env_kwargs, question, actions)
    engine = FakeVLLMEngine(tiny, ScriptedText(tiny, actions))
    params = SamplingParams.openrlhf()
    params.skip_special_tokens = True
    result = execute(
        SearchGymAgentExecutor(config=AgentConfig(ENV_ID, env_kwargs)), question, engine, tiny, params
    )
    assert (
        engine.outputs[0].text == "I am not sure yet" and engine.outputs[0].token_ids[-1] == tiny.eos_token_id
    )
    assert result["reward"] == sum(rewards)
    text = tiny.decode(result["observation_tokens"], skip_special_tokens=False)
    assert text == ChatFormatter(tiny).render([prompt, actions[0], observations[0], actions[1]])


def test_rollout_logprobs_stay_aligned_with_the_tokens(tiny):
    """OpenRLHF reads ``logprobs[i][token_ids[i]]``; dropped tokens take their logprobs along."""
    env_kwargs = PROTOCOLS["search_r1"]
    question = one_hop_unknown()
    _, actions, _, _, _ = play(env_kwargs, question)
    script = ScriptedText(tiny, [a + RAMBLE for a in actions])

    def generator(prompt_ids, params):  # the script's tokens, with logprobs -(position + 1) / 100
        return [(t, -(i + 1) / 100) for i, t in enumerate(script(prompt_ids, params))]

    engine = FakeVLLMEngine(tiny, generator, tokens_per_step=4)
    executor = SearchGymAgentExecutor(config=AgentConfig(ENV_ID, env_kwargs))
    result = execute(executor, question, engine, tiny, params=SamplingParams.openrlhf(logprobs=True))
    assert result["reward"] == 1.0
    logprobs, tokens = result["rollout_log_probs"], result["observation_tokens"]
    assert len(logprobs) == len(tokens)
    for a, b in result["action_ranges"]:
        assert logprobs[a:b] == [-(i + 1) / 100 for i in range(b - a)]
    in_actions = {i for a, b in result["action_ranges"] for i in range(a, b)}
    assert all(lp == 0.0 for i, lp in enumerate(logprobs) if i not in in_actions)


@pytest.mark.parametrize("tokens_per_step", [1, 4])
def test_a_first_token_that_is_the_whole_stop_string_keeps_the_turn_the_env_parsed(tokens_per_step, tiny):
    """Qwen2.5 writes ``</tool_call>`` as one token, and vLLM searches no stop string in the
    first ``min_tokens=1`` token: a turn that opens with it goes on to the next
    ``</tool_call>``, and the text the env parses holds both. The tokens trained on are
    that whole turn, not the first token alone.
    """
    tok = one_token(tiny, "<tool_call>", "</tool_call>")
    env_kwargs = PROTOCOLS["tool_call"]
    question = one_hop_unknown()
    _, right, _, _, _ = play(env_kwargs, question)
    actions = ["</tool_call>" + right[0], right[-1]]
    prompt, _, observations, rewards, trajectory = play(env_kwargs, question, actions)
    assert not trajectory.format_ok and len(rewards) == 2  # the stray tag is a format error
    engine = FakeVLLMEngine(
        tok, ScriptedText(tok, [a + RAMBLE for a in actions]), tokens_per_step=tokens_per_step
    )
    params = SamplingParams.openrlhf(logprobs=True)
    result = execute(
        SearchGymAgentExecutor(config=AgentConfig(ENV_ID, env_kwargs)), question, engine, tok, params
    )

    first = engine.outputs[0]
    assert first.text == actions[0] and first.token_ids[0] == tok.convert_tokens_to_ids("</tool_call>")
    assert result["reward"] == sum(rewards) and result["extra_logs"]["format_errors"] == 1.0
    tokens = result["observation_tokens"]
    for (a, b), action in zip(result["action_ranges"], actions, strict=True):
        assert tokens[a:b] == tok(action, add_special_tokens=False)["input_ids"]
        assert tok.decode(tokens[a:b], skip_special_tokens=False) == action  # what the env parsed
    text = tok.decode(tokens, skip_special_tokens=False)
    assert text == ChatFormatter(tok).render([prompt, actions[0], observations[0], actions[1]])
    assert len(result["rollout_log_probs"]) == len(tokens)


def test_the_kept_tokens_read_the_text_vllm_returned_in_every_case(tiny):
    """Random turns of pieces that make, break and repeat the stop strings, with EOS anywhere.

    Whatever vLLM's rules (the fake engine) make of a turn, the tokens the agent keeps
    decode to exactly the text vLLM returned: the action the env parses, plus the EOS text
    where the turn ended at EOS. A first token that is a whole stop string included.
    """
    tok = one_token(tiny, "<tool_call>", "</tool_call>")
    texts = ("</tool_call>", "<tool_call>", "</answer>", "</", "answer", "tool_call", ">", ">.", " x", "\n")
    pieces = [tok(t, add_special_tokens=False)["input_ids"] for t in texts] + [[tok.eos_token_id]]
    rng = random.Random(0)
    first_token_stops = 0
    for _ in range(300):
        ids = [t for _ in range(rng.randint(1, 10)) for t in rng.choice(pieces)]
        params = with_stop_strings(SamplingParams.openrlhf(len(ids)), ["</answer>", "</tool_call>"])
        fake = FakeVLLMEngine(tok, lambda p, s, ids=ids: ids, tokens_per_step=rng.choice([1, 2, 4]))
        out = asyncio.run(TurnEngine(fake, tok).generate([1, 2], params)).outputs[0]
        assert tok.decode(out.token_ids, skip_special_tokens=False) == out.text, (ids, out)
        assert (
            out.token_ids == ids[: len(out.token_ids)] or out.token_ids[-1] == pieces[6][0]
        )  # or cut to ">"
        first_token_stops += ids[0] == pieces[0][0] and out.stop_reason == "</tool_call>"
    assert first_token_stops > 5  # the case of the issue came up, several times
