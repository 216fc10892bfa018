"""The shared turn handling (searchgym.trainers.turns) on SmolLM2's real tokenizer.

Expected values are worked out by hand from the tokenizer's pieces: SmolLM2 writes
``</search>.`` as ``</``, ``search``, ``>.``, so the last token runs past the stop string.
"""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

from searchgym.trainers.turns import first_stop, settle_turn  # noqa: E402


@pytest.fixture(scope="module")
def tok(smollm2_dir):
    from searchgym.policies.tiny import load_tokenizer

    return load_tokenizer(smollm2_dir)


def enc(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"]


def test_a_token_past_the_stop_string_is_cut_back_and_keeps_its_logprob(tok):
    ids = enc(tok, "<search>capital</search>. More <answer>x</answer>")
    pieces = [tok.decode([i]) for i in ids]
    assert pieces[:7] == ["<", "search", ">", "capital", "</", "search", ">."]
    logprobs = [-(i + 1) / 10 for i in range(len(ids))]
    turn = settle_turn(ids, logprobs, ["</search>", "</answer>"], tok)
    assert turn.action == "<search>capital</search>" and turn.said == "" and turn.stop == "</search>"
    assert turn.token_ids == ids[:6] + enc(tok, ">")
    assert turn.logprobs == logprobs[:7]  # ">" takes the logprob of ">.", the rest are dropped


def test_a_turn_that_ends_at_eos_gives_the_env_the_text_without_it(tok):
    ids = enc(tok, "<answer>Paris</answer>") + [tok.eos_token_id]
    turn = settle_turn(ids, None, ["</search>"], tok)
    assert (turn.action, turn.said, turn.stop) == ("<answer>Paris</answer>", "<|im_end|>", None)
    assert turn.token_ids == ids and turn.logprobs is None


def test_a_turn_cut_at_the_length_limit_is_passed_whole(tok):
    ids = enc(tok, "<search>capi")
    turn = settle_turn(ids, [-0.5] * len(ids), ["</search>"], tok)
    assert (turn.action, turn.said, turn.stop, turn.token_ids) == ("<search>capi", "", None, ids)


def test_the_stop_string_that_completes_first_wins_and_a_tie_goes_to_the_first_listed():
    text = "<search>q</search> <answer>a</answer>"
    assert first_stop(text, ["</answer>", "</search>"]) == "</search>"
    assert first_stop(text, ["q</search>", "</search>"]) == "q</search>"
    assert first_stop(text, ["</search>", "q</search>"]) == "</search>"
    assert first_stop("no stop here", ["</search>"]) is None
