"""The Search-R1 protocol.

Search-R1 (docs/methods.md#search-r1): the policy searches with ``<search>query</search>``, reads the
passages inside ``<information>…</information>``, and ends with ``<answer>…</answer>``.
Reasoning in ``<think>…</think>`` is optional.

Parsing is linear in the length of the text (see ``_text.py``); tags are matched exactly.
"""

from __future__ import annotations

from collections.abc import Sequence

from ...retrieval.records import Doc
from ..records import Action
from ._text import (
    Block,
    check_action_args,
    check_think,
    count_blocks,
    find_block,
    has_words,
    invalid,
    not_text,
    tag_inside,
    tag_pattern,
    think_nesting,
)
from .base import Protocol, neutralise_tags

__all__ = ["SearchR1Protocol"]

_PATTERN = tag_pattern(("think", "search", "information", "answer"))

_TAGS = {name: (f"<{name}>", f"</{name}>") for name in ("search", "answer")}


class SearchR1Protocol(Protocol):
    """Search-R1's tags: ``<search>`` → ``<information>``, final ``<answer>``.

    The earliest complete ``<search>…</search>`` or ``<answer>…</answer>`` block is the
    action; whatever follows it (a made-up ``<information>`` block, say) is ignored. The
    answer is the block's text as written, stripped (no ``\\boxed{}`` reading).
    ``format_ok`` is True whenever such a block was found and is non-blank.

    Blocks do not nest. The action is invalid when its text holds a tag of this format
    (``<search><search>q</search></search>``, ``<answer><think>…``), when it sits inside a
    ``<think>`` block that closes after it, or when ``<think>`` blocks before it nest. A
    ``<think>`` that is never closed is not a block, so an action after it still counts.
    """

    name = "search_r1"
    tags = ("think", "search", "information", "answer")

    def instructions(self) -> str:
        return (
            "Answer the question at the end of this message.\n"
            "You may reason step by step between <think> and </think> at any point.\n"
            "When you lack a fact, look it up: write a query as <search> your query </search> "
            "and stop. Matching passages will be returned between <information> and "
            "</information>. You can search as many times as you need.\n"
            "Once you know the answer, write it as <answer> short answer </answer>, a few words "
            "and no explanation, for example <answer> Paris </answer>.\n"
            "Write one search or one answer per turn; anything after the first one is ignored."
        )

    def parse(self, text: str, turn: int = 0) -> Action:
        if not isinstance(text, str):
            return self._parse_general(text)
        # Fast path (runs on every step, so it makes few calls): the tag that opens first is
        # a complete, non-blank block, so it is the earliest complete block, as below.
        search_at, answer_at = text.find("<search>"), text.find("<answer>")
        name = "search" if search_at >= 0 and (answer_at < 0 or search_at < answer_at) else "answer"
        start = search_at if name == "search" else answer_at
        if start >= 0:
            opening, closing = _TAGS[name]
            close = text.find(closing, start + len(opening))
            if close >= 0:
                content = text[start + len(opening) : close].strip()
                if content:
                    end = close + len(closing)
                    if "<" in content or "<think>" in text:
                        return self._read(text, Block(name, start, end, content))
                    if name == "search":
                        if not has_words(content):
                            return self._read(text, Block(name, start, end, content))
                        return Action(kind="search", query=content)
                    return Action(kind="answer", answer=content, answer_blocks=1)
        return self._parse_general(text)

    def _parse_general(self, text: str) -> Action:
        """Any action: not a str, no block, an unclosed first block, or a blank one."""
        bad = not_text(text)
        if bad is not None:
            return bad
        search = find_block(text, "search")
        answer = find_block(text, "answer")
        if search is None and answer is None:
            return invalid(
                "No complete <search>…</search> or <answer>…</answer> block found. "
                "Search with <search> query </search> or finish with <answer> answer </answer>.",
                think_blocks=count_blocks(text, "think"),
            )
        block = min((b for b in (search, answer) if b is not None), key=lambda b: b.start)
        return self._read(text, block)

    def _read(self, text: str, block: Block) -> Action:
        """The action of the earliest complete block, or why it is invalid."""
        thinks = count_blocks(text, "think", end=block.end) if "<think>" in text else 0
        answers = int(block.name == "answer")
        content = block.content.strip()
        nesting = tag_inside(content, _PATTERN, f"<{block.name}>…</{block.name}>") or think_nesting(
            text, block
        )
        if nesting is not None:
            return invalid(nesting, think_blocks=thinks, answer_blocks=answers)
        if not content or (block.name == "search" and not has_words(content)):
            what = "query" if block.name == "search" else "answer"
            return invalid(
                f"The <{block.name}> block is empty (no letter or digit): put the {what} between <{block.name}> and "
                f"</{block.name}>.",
                think_blocks=thinks,
                answer_blocks=answers,
            )
        if block.name == "search":
            return Action(kind="search", query=content, think_blocks=thinks)
        return Action(kind="answer", answer=content, think_blocks=thinks, answer_blocks=1)

    def render_docs(self, docs: Sequence[Doc]) -> str:
        body = self.format_doc_list(docs) if docs else "No results."
        return f"\n<information>{body}</information>\n"

    def write_action(self, *, query: str | None = None, answer: str | None = None, think: str = "") -> str:
        """``<think>{think}</think>`` then ``<search>{query}</search>`` or ``<answer>{answer}</answer>``.

        Tags inside the arguments are neutralised so that the text always parses back.
        """
        check_action_args(query, answer)
        think = neutralise_tags(check_think(think), self.tags)
        if query is not None:
            return f"<think>{think}</think>\n<search>{neutralise_tags(query, self.tags)}</search>"
        return f"<think>{think}</think>\n<answer>{neutralise_tags(str(answer), self.tags)}</answer>"
