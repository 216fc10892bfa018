"""The tool-call protocol of LightSearcher and HiExp: ``<think>`` then one answer or tool call.

A well-formed action (docs/methods.md#lightsearcher) is ``<think>…</think>`` followed by exactly one of
``<answer>…</answer>`` or ``<tool_call>{"name": "search", "arguments": {"query": …}}</tool_call>``,
with nothing but white space around and between them. Search results come back inside
``<tool_response>…</tool_response>``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from ...retrieval.records import Doc
from ..records import Action
from ._text import (
    boxed_or_whole,
    check_action_args,
    check_think,
    count_blocks,
    has_words,
    invalid,
    nested_box,
    not_text,
    read_boxed,
    split_blocks,
    tag_pattern,
)
from .base import Protocol, neutralise_tags

__all__ = ["ToolCallProtocol"]

_EXAMPLE_CALL = '<tool_call>{"name": "search", "arguments": {"query": "your query"}}</tool_call>'


def _read_call(payload: str) -> tuple[str | None, str | None]:
    """The query of a tool-call payload, or an error message: returns ``(query, error)``."""
    try:
        call = json.loads(payload)
    except (ValueError, RecursionError) as exc:
        return None, f"The tool call is not valid JSON ({exc}). Write {_EXAMPLE_CALL}."
    if not isinstance(call, dict):
        return None, f"The tool call must be a JSON object, got {type(call).__name__}. Write {_EXAMPLE_CALL}."
    name = call.get("name")
    if name != "search":
        return None, f"Unknown tool {name!r}: the only tool is 'search'. Write {_EXAMPLE_CALL}."
    arguments = call.get("arguments")
    if not isinstance(arguments, dict):
        return None, (
            f"The tool call's 'arguments' must be a JSON object, got {type(arguments).__name__}. "
            f"Write {_EXAMPLE_CALL}."
        )
    query = arguments.get("query")
    if not isinstance(query, str):
        return None, f"arguments.query must be a string, got {type(query).__name__}. Write {_EXAMPLE_CALL}."
    if not has_words(query):
        return None, "arguments.query is empty (no letter or digit): give the text to search for."
    return query.strip(), None


class ToolCallProtocol(Protocol):
    """LightSearcher / HiExp's strict format: ``<think>`` then one ``<answer>`` or ``<tool_call>``.

    Every deviation (a missing think block, two actions, text outside the blocks, invalid
    JSON, a tool other than ``search``, a missing or non-string query) makes the action
    invalid with ``format_ok`` False. Keys of ``arguments`` other than ``query`` are
    ignored. The answer is the content of the first ``\\boxed{}`` in the ``<answer>`` block
    when there is one (LightSearcher's learnt guidance asks for a boxed answer), else the
    whole block text, stripped; docs/methods.md#sem-protocol settles this reading for SEM and it is used here
    too.

    Blocks do not nest: a tag inside another block (``<think><think>…``, ``<answer><tool_call>…``)
    is invalid, and so is a ``\\boxed{}`` inside the box of the answer. The JSON of a tool call
    is read by ``json``, which refuses nesting deeper than Python's recursion limit.
    """

    name = "tool_call"
    tags = ("think", "answer", "tool_call", "tool_response")

    def __init__(self) -> None:
        self._pattern = tag_pattern(self.tags)

    def instructions(self) -> str:
        return (
            "Answer the question at the end of this message. You have one tool, search, which "
            "takes a text query and returns matching passages.\n"
            "Every reply must start with your reasoning between <think> and </think>, followed "
            "by exactly one of these two, and nothing else:\n"
            f"- a call of the search tool written as JSON: {_EXAMPLE_CALL}. The passages will "
            "come back between <tool_response> and </tool_response>;\n"
            "- the final answer, a few words, as <answer> short answer </answer>.\n"
            "Call the tool only when you need a fact you do not have."
        )

    def parse(self, text: str, turn: int = 0) -> Action:
        bad = not_text(text)
        if bad is not None:
            return bad
        blocks, error = split_blocks(text, self._pattern)
        if error is None:
            error = self._shape_error([b.name for b in blocks])
        if error is not None:
            return invalid(
                error,
                think_blocks=count_blocks(text, "think"),
                answer_blocks=count_blocks(text, "answer"),
            )
        action = blocks[1]
        if action.name == "answer":
            nesting = nested_box(read_boxed(action.content)) if "\\boxed" in action.content else None
            if nesting is not None:
                return invalid(nesting, think_blocks=1, answer_blocks=1)
            answer = boxed_or_whole(action.content)
            if not answer:
                return invalid("The <answer> block is empty: write the answer in it.", think_blocks=1)
            return Action(kind="answer", answer=answer, think_blocks=1, answer_blocks=1)
        query, error = _read_call(action.content)
        if error is not None:
            return invalid(error, think_blocks=1)
        return Action(kind="search", query=query, think_blocks=1)

    @staticmethod
    def _shape_error(names: list[str]) -> str | None:
        """Why a sequence of block names is not ``think`` then ``answer``/``tool_call``, or None."""
        how = "Write <think>…</think> followed by one <answer>…</answer> or one <tool_call>…</tool_call>."
        if not names or names[0] != "think":
            found = f"<{names[0]}>" if names else "no block"
            return f"The action must start with a <think>…</think> block, found {found}. {how}"
        if len(names) == 1:
            return f"Nothing follows </think>. {how}"
        if len(names) > 2:
            listed = ", ".join(f"<{n}>" for n in names[1:4]) + (", …" if len(names) > 4 else "")
            return f"Found {len(names) - 1} blocks after </think> ({listed}); only one is allowed. {how}"
        if names[1] not in ("answer", "tool_call"):
            return f"<{names[1]}> cannot follow </think>. {how}"
        return None

    def render_docs(self, docs: Sequence[Doc]) -> str:
        body = self.format_doc_list(docs) if docs else "No results."
        return f"\n<tool_response>{body}</tool_response>\n"

    def write_action(self, *, query: str | None = None, answer: str | None = None, think: str = "") -> str:
        """``<think>…</think>`` then a JSON search call (``json.dumps``) or ``<answer>…</answer>``."""
        check_action_args(query, answer)
        think = neutralise_tags(check_think(think), self.tags)
        if query is not None:
            call = json.dumps({"name": "search", "arguments": {"query": neutralise_tags(query, self.tags)}})
            return f"<think>{think}</think>\n<tool_call>{call}</tool_call>"
        return f"<think>{think}</think>\n<answer>{neutralise_tags(str(answer), self.tags)}</answer>"
