"""The ReSearch protocol: ``<search>`` → ``<result>``, the answer in ``\\boxed{}``.

ReSearch / ReCall (PAPERS.md §5) search with ``<search>query</search>``, get passages back
inside ``<result>…</result>``, and give the final answer in ``\\boxed{…}``, usually inside
``<answer>…</answer>``. Also home of :func:`read_boxed`, which SEM and the tool-call
protocol use to read a boxed answer.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ..errors import InvalidArgumentError
from ..records import Action, Doc
from .base import Protocol, neutralise_tags
from .search_r1 import Block, check_action_args, check_think, count_blocks, find_block, invalid, not_text

__all__ = ["ReSearchProtocol", "read_boxed", "boxed_or_whole", "box", "drop_unmatched_braces"]

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


class ReSearchProtocol(Protocol):
    """ReSearch's tags: ``<search>`` → ``<result>``, final answer in ``\\boxed{}``.

    The earliest of a complete ``<search>…</search>`` block and a balanced ``\\boxed{…}``
    is the action; the box may sit inside ``<answer>…</answer>`` or stand alone (both are
    well formed). An ``<answer>`` block with no box in it, before any search, is invalid:
    the error asks for ``\\boxed{}``.
    """

    name = "research"
    tags = ("think", "search", "result", "answer")

    def instructions(self) -> str:
        return (
            "Work out the answer to the question at the end of this message.\n"
            "Think things through between <think> and </think>.\n"
            "To look something up, write <search> your query </search> and stop; the passages "
            "found will come back between <result> and </result>. Search again if you need to.\n"
            "When you are done, give the answer between <answer> and </answer>, with the short "
            "answer itself wrapped in \\boxed{}, for example <answer> The capital is "
            "\\boxed{Paris} </answer>.\n"
            "Each turn holds one search or the final answer; anything after it is ignored."
        )

    def parse(self, text: str, turn: int = 0) -> Action:
        bad = not_text(text)
        if bad is not None:
            return bad
        search = find_block(text, "search")
        boxed = read_boxed(text, open_before=search.start if search is not None else None)
        answer = find_block(text, "answer")
        if boxed is not None:
            end = answer.end if answer is not None and answer.start <= boxed.start < answer.end else boxed.end
            thinks, answers = count_blocks(text, "think", end), count_blocks(text, "answer", end)
            content = boxed.content.strip()
            if not content:
                return invalid(
                    "The \\boxed{} is empty: write the answer inside the braces.",
                    think_blocks=thinks,
                    answer_blocks=answers,
                )
            return Action(kind="answer", answer=content, think_blocks=thinks, answer_blocks=answers)
        if answer is not None and (search is None or answer.start < search.start):
            return invalid(
                "The <answer> block has no \\boxed{}: put the final answer in \\boxed{...}, "
                "for example <answer> \\boxed{Paris} </answer>.",
                think_blocks=count_blocks(text, "think", answer.end),
                answer_blocks=1,
            )
        if search is None:
            return invalid(
                "No complete <search>…</search> block and no \\boxed{} answer found. Search with "
                "<search> query </search> or answer with <answer> \\boxed{answer} </answer>.",
                think_blocks=count_blocks(text, "think"),
            )
        thinks = count_blocks(text, "think", search.end)
        query = search.content.strip()
        if not query:
            return invalid(
                "The <search> block is empty: put the query between <search> and </search>.",
                think_blocks=thinks,
            )
        return Action(kind="search", query=query, think_blocks=thinks)

    def render_docs(self, docs: Sequence[Doc]) -> str:
        body = self.format_doc_list(docs) if docs else "No results."
        return f"\n<result>{body}</result>\n"

    def write_action(self, *, query: str | None = None, answer: str | None = None, think: str = "") -> str:
        """``<think>…</think>`` then ``<search>{query}</search>`` or ``<answer>\\boxed{answer}</answer>``.

        Raises:
            InvalidArgumentError: unless exactly one of ``query``/``answer`` is given, or when
                the answer is blank once unmatched braces are dropped (see :func:`box`).
        """
        check_action_args(query, answer)
        think = neutralise_tags(check_think(think), self.tags)
        if query is not None:
            return f"<think>{think}</think>\n<search>{neutralise_tags(query, self.tags)}</search>"
        answer = box(neutralise_tags(str(answer), self.tags))
        if not boxed_or_whole(answer):
            raise InvalidArgumentError(
                f"answer {answer!r} is blank once its unmatched braces are dropped; give some text."
            )
        return f"<think>{think}</think>\n<answer>{answer}</answer>"
