"""Every path a model takes, with a real instruct model: SmolLM2-135M-Instruct on the CPU.

Its tokenizer splits tags into several tokens (``</search>`` is ``</``, ``search``, ``>``
and merges ``>`` with what follows: ``>.``), its ChatML template adds a default system turn,
and it ends turns with ``<|im_end|>`` (id 2), the same token the template closes turns
with. The built-in trainer's rollouts must turn that into token sequences whose text is the
chat text evaluation renders, whose loss mask covers exactly the sampled tokens, and whose
episodes end with the env's reward also when the context budget runs out.
"""

from __future__ import annotations

import gymnasium as gym
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import searchgym  # noqa: F401,E402  (registers the ids)
from searchgym.envs.protocols import PROTOCOLS, make_protocol  # noqa: E402
from searchgym.policies import HFPolicy  # noqa: E402
from searchgym.policies.chat import ChatFormatter, ContextTracker  # noqa: E402
from searchgym.policies.tiny import load_tokenizer  # noqa: E402
from searchgym.trainers.grpo.generation import (  # noqa: E402
    ActionStop,
    SamplingSettings,
    finish_action,
)
from searchgym.trainers.grpo.rollout import RolloutCollector  # noqa: E402

ENV_ID = "searchgym/SyntheticFacts-v1"
ENV_KWARGS = {
    "protocol": "search_r1",
    "reward": "f1",
    "reward_kwargs": {"format_penalty": -1.0},
    "max_turns": 3,
}
SYSTEM = (
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
)
IM_END = 2  # <|im_end|>: SmolLM2's end of turn and EOS


@pytest.fixture(scope="module")
def tok(smollm2_dir):
    return load_tokenizer(smollm2_dir)


@pytest.fixture(scope="module")
def model(smollm2_dir):
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(min(2, torch.get_num_threads()))
    return AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).eval()


def _ids(tok, text: str) -> list[int]:
    return list(tok(text, add_special_tokens=False)["input_ids"])


def _episode(protocol: str) -> tuple[str, str, str]:
    env = gym.make(ENV_ID, protocol=protocol)
    prompt, _ = env.reset(options={"index": 3})
    question = env.unwrapped.questions[3].question
    kwargs = {"answer": "unknown"} if protocol == "sem" else {}
    action = make_protocol(protocol).write_action(query=question, think="I should look it up.", **kwargs)
    observation, *_ = env.step(action)
    env.close()
    return prompt, action, observation


# -- the chat text ------------------------------------------------------------------------------


def test_prompt_and_feedback_are_smollm2s_chatml_written_out_by_hand(tok):
    prompt, _, observation = _episode("search_r1")
    formatter = ChatFormatter(tok)
    assert (
        formatter.prompt(prompt)
        == f"{SYSTEM}<|im_start|>user\n{prompt.strip()}<|im_end|>\n<|im_start|>assistant\n"
    )
    assert formatter.feedback(observation) == (
        f"<|im_end|>\n<|im_start|>user\n{observation.strip()}<|im_end|>\n<|im_start|>assistant\n"
    )
    assert tok.eos_token_id == IM_END and tok.convert_ids_to_tokens(IM_END) == "<|im_end|>"
    assert _ids(tok, "</search>") == _ids(tok, "</") + _ids(tok, "search") + _ids(tok, ">")


@pytest.mark.parametrize("protocol", sorted(PROTOCOLS))
def test_segments_tokenised_one_by_one_equal_the_template_token_by_token(tok, protocol):
    prompt, action, observation = _episode(protocol)
    formatter = ChatFormatter(tok)
    rendered = tok.apply_chat_template(
        [
            {"role": "user", "content": prompt.strip()},
            {"role": "assistant", "content": action},
            {"role": "user", "content": observation.strip()},
        ],
        tokenize=False,
        add_generation_prompt=True,
    )
    pieces = [formatter.prompt(prompt), action, formatter.feedback(observation)]
    assert "".join(pieces) == rendered
    assert sum((_ids(tok, p) for p in pieces), []) == _ids(tok, rendered)


# -- stop strings that span several tokens -------------------------------------------------------


def _first_stop(tok, text: str, stops: list[str]) -> tuple[list[int], int, str]:
    """Feed ``text``'s tokens one by one to ActionStop; the tokens kept and why it stopped."""
    ids = [IM_END] + _ids(tok, text)  # one token of context, then the "generated" ones
    for end in range(2, len(ids) + 1):
        stop = ActionStop(tok, stops, [IM_END], prompt_width=1, budgets=[len(ids)])
        if bool(stop(torch.tensor([ids[:end]]), None)[0]):
            return ids[1:end], stop.kept[0], stop.finish[0]
    return ids[1:], len(ids) - 1, "none"


@pytest.mark.parametrize(
    ("protocol", "action", "after"),
    [
        ("search_r1", "<think>Not sure.</think>\n<search>capital of France</search>", ". More text"),
        ("search_r1", "<think>Found it.</think>\n<answer>Paris</answer>", "\n<search>x</search>"),
        ("tool_call", '<tool_call>{"name": "search", "arguments": {"query": "Paris"}}</tool_call>', ">>"),
        ("sem", "<think>a</think><answer>Paris</answer><search>capital</search>", ", then"),
    ],
)
def test_generation_stops_at_the_token_that_completes_a_multi_token_stop_string(tok, protocol, action, after):
    stops = ChatFormatter.stop_strings(protocol)
    ids, kept, finish = _first_stop(tok, action + after, stops)
    assert finish == "stop"
    assert kept == len(ids)
    # the kept tokens are the shortest prefix that holds the stop string
    assert action in tok.decode(ids) and action not in tok.decode(ids[:-1])
    sampled = finish_action(tok, ids, stops, finish)
    assert sampled.text == action
    # the tokens read exactly the text the env gets, also when the last token ran past the stop string
    assert tok.decode(sampled.ids) == action


def test_a_token_running_past_the_stop_string_is_trimmed_to_it(tok):
    text = "<search>capital of France</search>."
    ids = _ids(tok, text)
    assert tok.convert_ids_to_tokens(ids[-1]) == ">."  # SmolLM2 merges the tag's end with the period
    sampled = finish_action(tok, ids, ["</search>"], "stop")
    assert sampled.text == "<search>capital of France</search>"
    assert sampled.ids == ids[:-1] + _ids(tok, ">")


# -- rollouts of the built-in trainer with the real model ----------------------------------------


def _collector(model, tok, *, max_new_tokens=16, max_context_tokens=2048, temperature=0.0):
    return RolloutCollector(
        lambda: gym.make(ENV_ID, **ENV_KWARGS),
        model,
        tok,
        ChatFormatter(tok),
        max_new_tokens=max_new_tokens,
        max_context_tokens=max_context_tokens,
        sampling=SamplingSettings(temperature=temperature, batch_size=8),
    )


@pytest.fixture(scope="module")
def episodes(model, tok):
    collector = _collector(model, tok)
    try:
        return collector.collect([0, 5], group_size=2, seed=0)
    finally:
        collector.close()


@pytest.mark.slow
def test_rollout_segments_are_the_chat_text_and_the_mask_covers_exactly_the_sampled_tokens(episodes, tok):
    for ep in episodes:
        kinds = [s.kind for s in ep.segments]
        assert kinds[0] == "prompt" and kinds[1::2] == ["action"] * len(kinds[1::2])
        assert kinds[2::2] == ["feedback"] * len(kinds[2::2])
        assert [s.start for s in ep.segments[1:]] == [s.end for s in ep.segments[:-1]]
        assert ep.segments[-1].end == len(ep.token_ids) == len(ep.action_mask)
        in_action = [0] * len(ep.token_ids)
        for s in ep.segments:
            in_action[s.start : s.end] = [int(s.kind == "action")] * (s.end - s.start)
        assert ep.action_mask == in_action
        prompt = ep.segments[0]
        assert ep.token_ids[: prompt.end] == _ids(tok, prompt.text)
        assert prompt.text.startswith(SYSTEM) and prompt.text.endswith("<|im_start|>assistant\n")
        for s in ep.segments[1:]:
            ids = ep.token_ids[s.start : s.end]
            if s.kind == "action":
                assert tok.decode(ids, skip_special_tokens=True) == s.text
                assert IM_END not in ids[:-1]  # generation ends at the end of turn
            else:
                assert ids == _ids(tok, s.text)
        assert ep.info["turn"] == len(ep.actions()) and ep.reward == (
            -1.0 if not ep.info["format_ok"] else ep.info["f1"]
        )


@pytest.mark.slow
def test_an_action_that_ends_with_the_end_of_turn_token_closes_its_turn_once(episodes, tok):
    ended = 0
    for ep in episodes:
        for i, s in enumerate(ep.segments):
            if s.kind != "action" or ep.token_ids[s.end - 1] != IM_END:
                continue
            ended += 1
            assert "<|im_end|>" not in s.text
            if i + 1 < len(ep.segments):  # the feedback goes on from the sampled <|im_end|>
                feedback = ep.segments[i + 1]
                assert feedback.text.startswith("\n<|im_start|>user\n")
                assert ep.token_ids[feedback.start] != IM_END
    assert ended, "greedy SmolLM2 ends its turns with <|im_end|>"
    for ep in episodes:  # every turn is closed once: system, user, then each action and observation
        closed_actions = sum(1 for s in ep.segments if s.kind == "feedback")
        last_closed = int(ep.token_ids[-1] == IM_END)
        assert ep.token_ids.count(IM_END) == 2 + 2 * closed_actions + last_closed


@pytest.mark.slow
def test_evaluation_reads_the_tokens_training_reads(episodes, tok):
    """HFPolicy's input for each turn (the env's running context, split and rendered) is, token
    for token, the training sequence before that turn's action."""
    for ep in episodes:
        tracker, formatter = ContextTracker(), ChatFormatter(tok)
        env = gym.make(ENV_ID, **ENV_KWARGS)
        obs, _ = env.reset(seed=0, options={"index": ep.question_index})
        context = obs
        for s in ep.segments[1:]:
            if s.kind != "action":
                continue
            segments = tracker.split(context)
            rendered = formatter.render(segments)
            assert _ids(tok, rendered) == ep.token_ids[: s.start]
            tracker.record(context, s.text, segments)
            obs, *_ = env.step(s.text)
            context += s.text + obs
        env.close()


@pytest.mark.slow
def test_a_context_budget_that_runs_out_ends_the_episode_with_its_reward(model, tok):
    probe = gym.make(ENV_ID, **ENV_KWARGS)
    prompt, _ = probe.reset(seed=0, options={"index": 0})
    probe.close()
    prompt_tokens = len(_ids(tok, ChatFormatter(tok).prompt(prompt)))
    collector = _collector(model, tok, max_context_tokens=prompt_tokens + 6)
    try:
        (ep,) = collector.collect([0], group_size=1, seed=0)
    finally:
        collector.close()
    assert len(ep.token_ids) <= prompt_tokens + 6
    assert ep.action_tokens <= 6
    assert ep.context_exhausted
    # the env took the rest as empty (malformed) actions up to max_turns and scored the episode
    assert ep.info["turn"] == ENV_KWARGS["max_turns"] and ep.info["format_ok"] is False
    assert ep.reward == -1.0 and ep.trajectory is not None


# -- evaluation with HFPolicy ---------------------------------------------------------------------


@pytest.mark.slow
def test_hf_policy_answers_and_leaves_the_end_of_turn_out_of_the_action(model, tok):
    policy = HFPolicy(model, tokenizer=tok, protocol="search_r1", max_new_tokens=24, stop_strings=[])
    formatter = policy.formatter
    (completion,) = policy.complete([formatter.prompt("What is the capital of France?")])
    assert completion.finish == "eos" and completion.completion_ids[-1] == IM_END
    assert "Paris" in completion.text and "<|im_end|>" not in completion.text
    assert tok.decode(completion.completion_ids) == completion.text + "<|im_end|>"
