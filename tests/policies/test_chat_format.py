"""ChatFormatter, stop strings and ContextTracker, token by token on the tiny Qwen-style tokenizer.

The property that matters: a model reads the same text in training and evaluation. Every
consumer builds its input as ``prompt(p) + a1 + feedback(o1) + a2 + ...``, so that text
(and its token ids, also when each segment is tokenised on its own, as a trainer does)
must equal what the tokenizer's chat template renders for the whole conversation.
"""

from __future__ import annotations

import gymnasium as gym
import pytest

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

import searchgym  # noqa: F401,E402  (registers the ids)
from searchgym.envs.protocols import PROTOCOLS, SearchR1Protocol, make_protocol  # noqa: E402
from searchgym.error import InvalidArgumentError, SearchGymError  # noqa: E402
from searchgym.policies.chat import (  # noqa: E402
    ChatFormatter,
    ContextTracker,
    check_stop_strings,
    resolve_stop_strings,
    stop_strings,
)
from searchgym.policies.hf import cut_at_stop  # noqa: E402
from searchgym.policies.tiny import TINY_CHAT_TEMPLATE, build_tiny_lm, load_tokenizer  # noqa: E402

ENV_ID = "searchgym/SyntheticFacts-v1"
SYSTEM = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    return build_tiny_lm(tmp_path_factory.mktemp("tiny"), hidden_size=64, num_layers=2)


@pytest.fixture()
def tok(tiny_path):
    return load_tokenizer(tiny_path)


def _ids(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"]


def _template(tok, messages, generation_prompt=True) -> str:
    return tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)


def _episode(protocol: str):
    """A real prompt and a real search observation from SyntheticFacts, with the action taken."""
    env = gym.make(ENV_ID, protocol=protocol)
    prompt, _ = env.reset(options={"index": 3})
    question = env.unwrapped.questions[3].question
    action = make_protocol(protocol).write_action(query=question, think="I should look it up.")
    if protocol == "sem":
        action = make_protocol(protocol).write_action(query=question, answer="unknown", think="Not sure.")
    observation, *_ = env.step(action)
    env.close()
    return prompt, action, observation


# -- prompt and feedback against the template -------------------------------------------------


def test_prompt_is_the_template_of_one_user_message_with_the_generation_prompt(tok):
    prompt, _, _ = _episode("search_r1")
    formatter = ChatFormatter(tok)
    # written out by hand from the Qwen2.5 layout: default system turn, user turn, open assistant turn
    expected = f"{SYSTEM}<|im_start|>user\n{prompt.strip()}<|im_end|>\n<|im_start|>assistant\n"
    assert formatter.prompt(prompt) == expected
    assert formatter.prompt(prompt) == _template(tok, [{"role": "user", "content": prompt.strip()}])
    assert _ids(tok, formatter.prompt(prompt)) == _ids(tok, expected)
    # the special tokens are single ids, not spelled out in pieces
    im_start, im_end = tok.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"])
    ids = _ids(tok, formatter.prompt(prompt))
    assert ids[0] == im_start and ids.count(im_start) == 3 and ids.count(im_end) == 2


@pytest.mark.parametrize("protocol", sorted(PROTOCOLS))
def test_prompt_action_feedback_equals_the_template_token_by_token(tok, protocol):
    prompt, action, observation = _episode(protocol)
    formatter = ChatFormatter(tok)
    messages = [
        {"role": "user", "content": prompt.strip()},
        {"role": "assistant", "content": action},
        {"role": "user", "content": observation.strip()},
    ]
    rendered = _template(tok, messages)
    built = formatter.prompt(prompt) + action + formatter.feedback(observation)
    assert built == rendered
    # a trainer tokenises the segments one by one and concatenates the ids
    pieces = (
        _ids(tok, formatter.prompt(prompt)) + _ids(tok, action) + _ids(tok, formatter.feedback(observation))
    )
    assert pieces == _ids(tok, rendered)
    # feedback by hand: close the assistant turn, the observation as a user turn, open the next one
    assert formatter.feedback(observation) == (
        f"<|im_end|>\n<|im_start|>user\n{observation.strip()}<|im_end|>\n<|im_start|>assistant\n"
    )


def test_three_turns_render_as_the_template_does(tok):
    prompt, action, observation = _episode("search_r1")
    answer = "<think>Found it.</think>\n<answer>Lima</answer>"
    error = "\n[format error] Something was off.\n"
    formatter = ChatFormatter(tok)
    segments = [prompt, action, observation, "junk without tags", error, answer]
    messages = [
        {"role": "user", "content": prompt.strip()},
        {"role": "assistant", "content": action},
        {"role": "user", "content": observation.strip()},
        {"role": "assistant", "content": "junk without tags"},
        {"role": "user", "content": error.strip()},
        {"role": "assistant", "content": answer},
    ]
    # an unfinished final assistant turn: the template without the generation prompt, minus its <|im_end|>\n
    full = _template(tok, messages, generation_prompt=False)
    assert full.endswith("<|im_end|>\n")
    assert formatter.render(segments) == full[: -len("<|im_end|>\n")]
    assert formatter.render(segments[:5]) == _template(tok, messages[:5])
    assert formatter.messages(segments) == messages


def test_tool_role_wraps_the_observation_as_qwen_does(tok):
    _, _, observation = _episode("tool_call")
    formatter = ChatFormatter(tok, observation_role="tool")
    assert formatter.feedback(observation) == (
        "<|im_end|>\n<|im_start|>user\n<tool_response>\n"
        f"{observation.strip()}\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )


def test_a_system_message_replaces_the_default_one(tok):
    formatter = ChatFormatter(tok, system="Be brief.")
    assert (
        formatter.prompt("Q?\n")
        == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nQ?<|im_end|>\n<|im_start|>assistant\n"
    )
    assert formatter.messages(["Q?"]) == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Q?"},
    ]


def test_eos_generated_by_the_model_matches_the_start_of_feedback(tok):
    # A model that ends its turn emits <|im_end|>; decoded without special tokens the
    # action loses it and feedback puts it back, so the text is the template's either way.
    formatter = ChatFormatter(tok)
    assert formatter.feedback("obs").startswith(tok.eos_token)


# -- no template: plain text ------------------------------------------------------------------


def test_without_a_template_the_text_passes_unchanged(tiny_path):
    bare = load_tokenizer(tiny_path)
    bare.chat_template = None
    prompt, action, observation = _episode("search_r1")
    for formatter in (ChatFormatter(bare), ChatFormatter(None)):
        assert not formatter.uses_template
        assert formatter.prompt(prompt) == prompt
        assert formatter.feedback(observation) == observation
        assert formatter.render([prompt, action, observation]) == prompt + action + observation


def test_a_tiny_lm_built_without_template_has_none(tmp_path):
    path = build_tiny_lm(tmp_path, vocab_size=300, hidden_size=32, num_layers=1, chat_template=False,
                         texts=["alpha beta gamma", "<search>x</search>"])  # fmt: skip
    assert not ChatFormatter(load_tokenizer(path)).uses_template


def test_a_template_that_rewrites_earlier_turns_is_refused(tok):
    tok.chat_template = "{{ messages | length }}" + TINY_CHAT_TEMPLATE  # the count changes the first line
    with pytest.raises(SearchGymError, match="incrementally"):
        ChatFormatter(tok).feedback("obs")


def test_bad_arguments_are_refused():
    with pytest.raises(InvalidArgumentError, match="observation_role"):
        ChatFormatter(None, observation_role="assistant")
    with pytest.raises(InvalidArgumentError, match="system"):
        ChatFormatter(None, system=3)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="empty"):
        ChatFormatter(None).render([])


# -- stop strings -----------------------------------------------------------------------------


def test_stop_strings_per_protocol():
    # by hand from the protocol table: the closing tags of the actions, never of env text
    assert stop_strings("search_r1") == ["</search>", "</answer>"]
    assert stop_strings("research") == ["</search>", "</answer>"]
    assert stop_strings("tool_call") == ["</answer>", "</tool_call>"]
    assert stop_strings("sem") == ["</search>"]  # its first turn goes on after </answer>
    assert ChatFormatter.stop_strings("tool_call") == stop_strings("tool_call")


def test_a_protocol_may_set_its_own_stop_strings():
    class Custom(SearchR1Protocol):
        stop_strings = ("</search>",)

    assert stop_strings(Custom()) == ["</search>"]
    Custom.stop_strings = "</search>"  # type: ignore[assignment]
    with pytest.raises(InvalidArgumentError, match="list of non-empty strings"):
        stop_strings(Custom())


def test_check_stop_strings_takes_any_iterable_of_non_empty_strings_once():
    given = ["</a>", "</b>"]
    checked = check_stop_strings("stop_strings", given)
    assert checked == ["</a>", "</b>"] and checked is not given  # a copy: the caller's list stays theirs
    assert check_stop_strings("stop_strings", ("</a>",)) == ["</a>"]
    assert check_stop_strings("stop_strings", (s for s in ["</a>", "</b>"])) == ["</a>", "</b>"]  # read once
    assert check_stop_strings("stop_strings", []) == []  # no stop strings at all


@pytest.mark.parametrize("bad", ["</answer>", b"</answer>", ["</a>", ""], ["</a>", None], [3], 3, None])
def test_check_stop_strings_refuses_anything_else_with_one_clear_line(bad):
    with pytest.raises(InvalidArgumentError) as caught:
        check_stop_strings("stop_strings", bad)
    assert str(caught.value).startswith(f"stop_strings must be a list of non-empty strings, got {bad!r}")
    assert "[] for none" in str(caught.value)


def test_resolve_stop_strings_falls_back_to_the_protocol_only_on_none():
    assert resolve_stop_strings(None, "sem") == ["</search>"]
    assert resolve_stop_strings(None, make_protocol("tool_call")) == ["</answer>", "</tool_call>"]
    assert resolve_stop_strings([], "sem") == []
    assert resolve_stop_strings(["</x>"], "sem") == ["</x>"]


@pytest.mark.parametrize("protocol", sorted(PROTOCOLS))
def test_stop_strings_never_cut_a_well_formed_action_short(protocol):
    proto = make_protocol(protocol)
    stops = stop_strings(protocol)
    search = (
        proto.write_action(query="q", answer="a", think="t")
        if protocol == "sem"
        else proto.write_action(query="q", think="t")
    )
    answer = proto.write_action(answer="a", think="t")
    # a search always ends on a stop string, and cutting there changes nothing
    assert cut_at_stop(search, stops) == (search, True)
    assert proto.parse(cut_at_stop(search, stops)[0], turn=0).kind == "search"
    # an answer is kept whole (SEM's ends with the end-of-turn token instead)
    assert cut_at_stop(answer, stops)[0] == answer
    # text after the stop string is cut off
    assert cut_at_stop(search + "<information>made up</information>", stops) == (search, True)


# -- ContextTracker -----------------------------------------------------------------------------


def test_tracker_recovers_turns_from_running_contexts():
    tracker = ContextTracker()
    assert tracker.split("P") == ["P"]
    tracker.record("P", "A1")
    assert tracker.split("PA1O1") == ["P", "A1", "O1"]
    tracker.record("PA1O1", "A2")
    assert tracker.split("PA1O1A2O2") == ["P", "A1", "O1", "A2", "O2"]
    # the longest recorded prefix wins; another episode with the same prompt is unaffected
    tracker.record("P", "B1")
    assert tracker.split("PB1X") == ["P", "B1", "X"]
    assert tracker.split("Q") == ["Q"]
    # after an empty action, the same prompt again is a new episode, not an empty observation
    tracker.record("R", "")
    assert tracker.split("R") == ["R"]
    assert tracker.split("RO") == ["R", "", "O"]


def test_tracker_forgets_the_oldest_records_beyond_capacity():
    tracker = ContextTracker(capacity=2)
    tracker.record("P1", "a")
    tracker.record("P2", "b")
    tracker.record("P3", "c")
    assert len(tracker) == 2
    assert tracker.split("P1ax") == ["P1ax"]  # forgotten: read as a fresh prompt
    assert tracker.split("P3cx") == ["P3", "c", "x"]
    with pytest.raises(InvalidArgumentError, match="capacity"):
        ContextTracker(capacity=0)
