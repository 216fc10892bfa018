"""Tag-scanning and ``\\boxed{}`` helpers shared by the protocol modules of this package.

Every helper runs in time linear in the length of the text: blocks are found with
``str.find`` or with regexes that have no nested quantifiers, so a policy that writes
megabytes of tag soup costs a single pass, never a backtracking blow-up. Tags are matched
case-sensitively and exactly (``<search>``, not ``<Search>`` or ``<search >``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from ...error import InvalidArgumentError
from ..records import Action


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


def tag_inside(content: str, pattern: re.Pattern[str], where: str) -> str | None:
    """An error when ``content`` (the inside of the block ``where``) holds a tag of ``pattern``."""
    if "<" not in content:
        return None
    m = pattern.search(content)
    if m is None:
        return None
    return (
        f"{m.group(0)} appears inside {where}: blocks do not nest, and a query or an answer is "
        "plain text. Write one block at a time."
    )


def think_nesting(text: str, action: Block) -> str | None:
    """An error when ``<think>`` blocks before ``action`` nest, or ``action`` sits inside one.

    Read up to the action: a ``<think>`` that opens while another is open is nested; an
    action after an open ``<think>`` whose ``</think>`` comes later is inside that block. A
    ``<think>`` that is never closed is not a block, so an action after it counts; a stray
    ``</think>`` is ignored.
    """
    open_at = -1
    i = text.find("<think>", 0, action.start)
    while i >= 0:
        close = text.find("</think>", i + 7, action.start)
        nested = text.find("<think>", i + 7, action.start if close < 0 else close)
        if nested >= 0:
            return "<think> appears inside another <think> block: think blocks do not nest."
        if close < 0:
            open_at = i
            break
        i = text.find("<think>", close + 8, action.start)
    if open_at >= 0 and text.find("</think>", action.end) >= 0:
        what = "\\boxed{}" if action.name == "boxed" else f"<{action.name}>"
        return f"{what} appears inside a <think> block: close it with </think> before you act."
    return None


def nested_box(answer: Block | None) -> str | None:
    """An error when the ``\\boxed{}`` read as the answer holds another ``\\boxed``."""
    if answer is None or "\\boxed" not in answer.content:
        return None
    return "\\boxed{} appears inside \\boxed{}: box the answer once, as \\boxed{Paris}."


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


# One token per brace or per ``\boxed{`` opening; ``\s*`` follows a literal, so the regex
# cannot backtrack more than the white space it just read.
_BOX_TOKENS = re.compile(r"\\boxed\s*\{|[{}]")


def read_boxed(
    text: str, start: int = 0, end: int | None = None, open_before: int | None = None
) -> Block | None:
    """The earliest-starting ``\\boxed{…}`` of ``text[start:end]`` whose braces balance.

    One pass with a stack of open braces: ``\\boxed{\\frac{1}{2}}`` reads ``\\frac{1}{2}``;
    an unclosed ``\\boxed{`` never counts, but a complete one after it still does.
    White space between ``\\boxed`` and ``{`` is allowed (``\\boxed {2}``).

    Args:
        text: the text to read.
        start, end: the slice to look in.
        open_before: when given, only a box that opens before this index counts.

    Returns:
        A :class:`Block` named ``boxed`` (``content`` is the text between the braces, not
        stripped), or None.
    """
    end = len(text) if end is None else end
    stack: list[int] = []  # for each open brace: the index of its ``{`` when it opens a box, else -1
    open_boxes = 0
    best: tuple[int, int] | None = None  # (index of the box's ``{``, index of its ``}``)
    for m in _BOX_TOKENS.finditer(text, start, end):
        token = m.group(0)
        if open_before is not None and open_boxes == 0 and m.start() >= open_before:
            break  # no box may open from here on, and none is open
        if token == "}":
            if not stack:
                continue
            brace = stack.pop()
            if brace < 0:
                continue
            open_boxes -= 1
            if best is None or brace < best[0]:
                best = (brace, m.start())
            if open_boxes == 0:
                break  # no box that started earlier can still close
        elif token == "{" or (open_before is not None and m.start() >= open_before):
            stack.append(-1)
        else:
            stack.append(m.end() - 1)
            open_boxes += 1
    if best is None:
        return None
    brace, close = best
    box_start = text.rindex("\\boxed", start, brace)
    return Block("boxed", box_start, close + 1, text[brace + 1 : close])


def boxed_or_whole(content: str) -> str:
    """The content of the first balanced ``\\boxed{}`` in ``content``, else all of it; stripped."""
    found = read_boxed(content)
    return (found.content if found is not None else content).strip()


def drop_unmatched_braces(text: str) -> str:
    """``text`` without the braces that have no partner, so that it can go inside ``\\boxed{}``."""
    unmatched: list[int] = []
    opened: list[int] = []
    for i, ch in enumerate(text):
        if ch == "{":
            opened.append(i)
        elif ch == "}":
            if opened:
                opened.pop()
            else:
                unmatched.append(i)
    drop = set(unmatched + opened)
    return "".join(ch for i, ch in enumerate(text) if i not in drop) if drop else text


def box(answer: str) -> str:
    """``\\boxed{answer}``, unless ``answer`` already holds a complete box (then as is).

    Unmatched braces are dropped first, so the box always reads back.
    """
    if read_boxed(answer) is not None:
        return answer
    return f"\\boxed{{{drop_unmatched_braces(answer)}}}"


def has_words(query: str) -> bool:
    """Whether a query holds a letter or digit; one made of punctuation alone ("…", "?!")
    searches for nothing, so the protocols treat it as an empty query."""
    return any(ch.isalnum() for ch in query)
