"""The Search-R1 protocol, and the tag-scanning helpers the protocols of this package share.

Search-R1 (PAPERS.md §5): the policy searches with ``<search>query</search>``, reads the
passages inside ``<information>…</information>``, and ends with ``<answer>…</answer>``.
Reasoning in ``<think>…</think>`` is optional.

Every helper here runs in time linear in the length of the text: blocks are found with
``str.find`` or with regexes that have no nested quantifiers, so a policy that writes
megabytes of tag soup costs a single pass, never a backtracking blow-up. Tags are matched
case-sensitively and exactly (``<search>``, not ``<Search>`` or ``<search >``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import InvalidArgumentError
from ..records import Action, Doc
from .base import Protocol, neutralise_tags

__all__ = ["SearchR1Protocol"]


# -- Shared helpers (used by every protocol module of this package) ---------------------


@dataclass(frozen=True)
class Block:
    """One complete ``<name>content</name>`` block: ``text[start:end]`` is the whole block."""

    name: str
    start: int
    end: int
    content: str


def invalid(error: str, *, think_blocks: int = 0, answer_blocks: int = 0) -> Action:
    """A malformed action: kind ``invalid``, ``format_ok`` False, with a plain message."""
    return Action(
        kind="invalid",
        error=error,
        format_ok=False,
        think_blocks=think_blocks,
        answer_blocks=answer_blocks,
    )


def not_text(text: object) -> Action | None:
    """An invalid action when ``text`` is not a ``str``, else None."""
    if isinstance(text, str):
        return None
    return invalid(f"An action must be a str, got {type(text).__name__}.")


def excerpt(text: str, limit: int = 40) -> str:
    """A short quoted piece of ``text`` for error messages."""
    text = text.strip()
    return repr(text[:limit] + "…") if len(text) > limit else repr(text)


def tag_pattern(tags: Sequence[str]) -> re.Pattern[str]:
    """A regex matching ``<tag>`` and ``</tag>`` for each tag; group 1 is ``/`` or empty."""
    names = "|".join(re.escape(t) for t in tags)
    return re.compile(rf"<(/?)({names})>")


def find_block(text: str, tag: str, start: int = 0, end: int | None = None) -> Block | None:
    """The first complete ``<tag>…</tag>`` block of ``text[start:end]``, or None.

    The block opens at the first ``<tag>`` and closes at the first ``</tag>`` after it; if
    that ``<tag>`` is never closed, no later one can be either.
    """
    end = len(text) if end is None else end
    opening, closing = f"<{tag}>", f"</{tag}>"
    i = text.find(opening, start, end)
    if i < 0:
        return None
    j = text.find(closing, i + len(opening), end)
    if j < 0:
        return None
    return Block(tag, i, j + len(closing), text[i + len(opening) : j])


def count_blocks(text: str, tag: str, end: int | None = None) -> int:
    """How many complete, non-overlapping ``<tag>…</tag>`` blocks ``text[:end]`` holds."""
    end = len(text) if end is None else end
    opening, closing = f"<{tag}>", f"</{tag}>"
    count, i = 0, 0
    while True:
        i = text.find(opening, i, end)
        if i < 0:
            return count
        j = text.find(closing, i + len(opening), end)
        if j < 0:
            return count
        count += 1
        i = j + len(closing)


def split_blocks(
    text: str, pattern: re.Pattern[str], stop_after: str | None = None
) -> tuple[list[Block], str | None]:
    """Split ``text`` into consecutive blocks with nothing but white space between them.

    Args:
        text: the action text.
        pattern: a :func:`tag_pattern` of the tags the format knows.
        stop_after: a tag name; reading stops right after the first such block closes,
            and the rest of the text is ignored.

    Returns:
        The blocks read, in order, and an error message when the text broke the rule (a
        tag inside another block, a closing tag with no opening, an unclosed block, or
        text outside the blocks); None when it did not.
    """
    blocks: list[Block] = []
    pos = 0
    open_name: str | None = None
    open_start = content_start = 0
    for m in pattern.finditer(text):
        closing, name = m.group(1) == "/", m.group(2)
        if open_name is None:
            gap = text[pos : m.start()]
            if gap.strip():
                return blocks, f"Found text outside the tags: {excerpt(gap)}."
            if closing:
                return blocks, f"</{name}> appears without a matching <{name}> before it."
            open_name, open_start, content_start = name, m.start(), m.end()
        elif closing and name == open_name:
            blocks.append(Block(name, open_start, m.end(), text[content_start : m.start()]))
            pos, open_name = m.end(), None
            if name == stop_after:
                return blocks, None
        else:
            return blocks, f"{m.group(0)} appears inside <{open_name}> before </{open_name}>."
    if open_name is not None:
        return blocks, f"<{open_name}> is never closed."
    if text[pos:].strip():
        return blocks, f"Found text outside the tags: {excerpt(text[pos:])}."
    return blocks, None


def check_action_args(query: str | None, answer: str | None) -> None:
    """Raise unless exactly one of ``query`` and ``answer`` is a non-blank string."""
    given = [(k, v) for k, v in (("query", query), ("answer", answer)) if v is not None]
    if len(given) != 1:
        raise InvalidArgumentError(
            f"Give exactly one of query= or answer=, got query={query!r}, answer={answer!r}."
        )
    key, value = given[0]
    if not isinstance(value, str) or not value.strip():
        raise InvalidArgumentError(f"{key} must be a non-blank str, got {value!r}.")


def check_think(think: object) -> str:
    """Validate the ``think`` argument of ``write_action``."""
    if not isinstance(think, str):
        raise InvalidArgumentError(f"think must be a str, got {type(think).__name__}.")
    return think


# -- The protocol -------------------------------------------------------------------------


class SearchR1Protocol(Protocol):
    """Search-R1's tags: ``<search>`` → ``<information>``, final ``<answer>``.

    The earliest complete ``<search>…</search>`` or ``<answer>…</answer>`` block is the
    action; whatever follows it (a made-up ``<information>`` block, say) is ignored. The
    answer is the block's text as written, stripped (no ``\\boxed{}`` reading).
    ``format_ok`` is True whenever such a block was found and is non-blank.
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
        thinks = count_blocks(text, "think", end=block.end)
        answers = int(block.name == "answer")
        content = block.content.strip()
        if not content:
            what = "query" if block.name == "search" else "answer"
            return invalid(
                f"The <{block.name}> block is empty: put the {what} between <{block.name}> and "
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
