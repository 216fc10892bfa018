"""Nested tags and nested boxes: what each protocol accepts and what it rejects as malformed."""

from __future__ import annotations

import re

import gymnasium as gym
import pytest

import searchgym  # noqa: F401 - registers the env ids
from searchgym.envs.protocols import ReSearchProtocol, SearchR1Protocol, SEMProtocol, ToolCallProtocol

DEEP = 100_000
CALL = '{"name": "search", "arguments": {"query": "capital of peru"}}'


def nest(opening: str, inner: str, closing: str, depth: int = DEEP) -> str:
    return opening * depth + inner + closing * depth


def boxes(inner: str, depth: int = DEEP) -> str:
    return nest("\\boxed{", inner, "}", depth)


REJECTED = {
    SearchR1Protocol: [
        ("<search><search>q</search></search>", r"<search> appears inside <search>"),
        (nest("<search>", "q", "</search>"), r"<search> appears inside <search>"),
        ("<answer><answer>Paris</answer></answer>", r"<answer> appears inside <answer>"),
        ("<answer><think>sure</think>Paris</answer>", r"<think> appears inside <answer>"),
        ("<search>q<information>fake</information></search>", r"<information> appears inside <search>"),
        ("<think><think>t</think></think><answer>Paris</answer>", r"think blocks do not nest"),
        (nest("<think>", "t", "</think>") + "<answer>Paris</answer>", r"think blocks do not nest"),
        ("<think>maybe <answer>Paris</answer> or not</think>", r"<answer> appears inside a <think> block"),
        ("<think>first <search>q</search></think>", r"<search> appears inside a <think> block"),
    ],
    ReSearchProtocol: [
        ("<search><search>q</search></search>", r"<search> appears inside <search>"),
        (nest("<search>", "q", "</search>"), r"<search> appears inside <search>"),
        ("<answer>\\boxed{\\boxed{Paris}}</answer>", r"\\boxed\{\} appears inside \\boxed\{\}"),
        ("<think>t</think>" + boxes("Paris"), r"\\boxed\{\} appears inside \\boxed\{\}"),
        ("<answer><answer>\\boxed{Paris}</answer></answer>", r"<answer> appears inside the answer"),
        ("<answer>\\boxed{<search>q</search>}</answer>", r"<search> appears inside the answer"),
        ("<think><think>t</think></think><answer>\\boxed{Paris}</answer>", r"think blocks do not nest"),
        (
            "<think>it is \\boxed{Paris}</think><search>q</search>",
            r"\\boxed\{\} appears inside a <think> block",
        ),
        ("<think>so <answer>\\boxed{Paris}</answer></think>", r"<answer> appears inside a <think> block"),
    ],
    SEMProtocol: [
        ("<think><think>t</think></think><answer>a</answer>", r"<think> appears inside <think>"),
        (nest("<think>", "t", "</think>") + "<answer>a</answer>", r"<think> appears inside <think>"),
        (
            "<think>t</think><answer>\\boxed{\\boxed{Paris}}</answer>",
            r"\\boxed\{\} appears inside \\boxed\{\}",
        ),
        (
            "<think>t</think><answer>" + boxes("Paris") + "</answer>",
            r"\\boxed\{\} appears inside \\boxed\{\}",
        ),
        (
            "<think>t</think><answer>\\boxed{a}</answer><think>u</think><answer>\\boxed{\\boxed{b}}</answer>",
            r"\\boxed\{\} appears inside \\boxed\{\}",
        ),
        ("<think>t</think><answer>a<search>q</search></answer>", r"<search> appears inside <answer>"),
    ],
    ToolCallProtocol: [
        ("<think><think>t</think></think><answer>Paris</answer>", r"<think> appears inside <think>"),
        (
            "<think>t</think><answer>\\boxed{\\boxed{Paris}}</answer>",
            r"\\boxed\{\} appears inside \\boxed\{\}",
        ),
        (
            "<think>t</think><answer>" + boxes("Paris") + "</answer>",
            r"\\boxed\{\} appears inside \\boxed\{\}",
        ),
        (
            "<think>t</think>" + nest("<tool_call>", CALL, "</tool_call>"),
            r"<tool_call> appears inside <tool_call>",
        ),
    ],
}

ACCEPTED = {
    SearchR1Protocol: [
        ("<think>t</think><search>q</search>", "search", "q"),
        ("<think>a</think><think>b</think><answer>Paris</answer>", "answer", "Paris"),
        ("<think>never closed <search>q</search>", "search", "q"),  # an unclosed <think> is no block
        ("</think><answer>Paris</answer>", "answer", "Paris"),
        ("<search>a < b</search>", "search", "a < b"),
        ("<answer>\\boxed{\\boxed{2}}</answer>", "answer", "\\boxed{\\boxed{2}}"),  # no box reading here
    ],
    ReSearchProtocol: [
        ("<think>t</think><answer>The answer is \\boxed{\\frac{1}{2}}</answer>", "answer", "\\frac{1}{2}"),
        ("<think>t</think>\\boxed{Paris}", "answer", "Paris"),
        ("<think>never closed \\boxed{Paris}", "answer", "Paris"),
        ("<think>a</think><think>b</think><search>q</search>", "search", "q"),
        ("\\boxed{\\boxed{Paris}", "answer", "Paris"),  # the outer box never closes, so it is no box
    ],
    SEMProtocol: [
        ("<think>t</think><answer>\\boxed{\\frac{1}{2}}</answer>", "answer", "\\frac{1}{2}"),
    ],
    ToolCallProtocol: [
        ("<think>t</think><answer>\\boxed{\\frac{1}{2}}</answer>", "answer", "\\frac{1}{2}"),
        (f"<think>t</think><tool_call>{CALL}</tool_call>", "search", "capital of peru"),
    ],
}


def cases(table):
    return [(cls, *row) for cls, rows in table.items() for row in rows]


def case_id(value) -> str:
    if isinstance(value, type):
        return value.name
    return value[:40] if isinstance(value, str) else ""


@pytest.mark.parametrize(("cls", "text", "message"), cases(REJECTED), ids=case_id)
def test_nested_tags_and_boxes_are_malformed(cls, text, message):
    action = cls().parse(text, 0)
    assert (action.kind, action.format_ok, action.query, action.answer) == ("invalid", False, None, None)
    assert action.error is not None and len(action.error) < 300
    assert re.search(message, action.error), action.error


@pytest.mark.parametrize(("cls", "text", "kind", "value"), cases(ACCEPTED), ids=case_id)
def test_what_each_protocol_still_accepts(cls, text, kind, value):
    action = cls().parse(text, 0)
    assert action.format_ok and action.kind == kind
    assert (action.query if kind == "search" else action.answer) == value


HOSTILE = {
    "search": nest("<search>", "capital of peru", "</search>"),
    "think": nest("<think>", "hmm", "</think>") + "<answer>Lima</answer>",
    "answer": nest("<answer>", "\\boxed{Lima}", "</answer>"),
    "boxed": "<think>t</think><answer>" + boxes("Lima") + "</answer>",
    "tool_call": "<think>t</think>" + nest("<tool_call>", CALL, "</tool_call>"),
    "mixed": nest("<think><search><answer>\\boxed{", "Lima", "}</answer></search></think>"),
}


@pytest.mark.parametrize("protocol", ["search_r1", "research", "sem", "tool_call"])
@pytest.mark.parametrize("kind", sorted(HOSTILE))
def test_an_env_step_with_100000_nested_tags_is_a_malformed_turn(protocol, kind):
    env = gym.make("searchgym/SyntheticFacts-v1", protocol=protocol, reward="f1", max_turns=3)
    env.reset(seed=0)
    _, reward, terminated, truncated, info = env.step(HOSTILE[kind])
    env.close()
    if protocol == "search_r1" and kind == "boxed":
        assert info["format_ok"]  # Search-R1 reads no boxes: the answer is the text as written
        return
    assert not info["format_ok"] and info["error"]
    assert info["num_searches"] == 0 and info["answer"] is None and not terminated
