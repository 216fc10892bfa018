"""The ReSearch protocol: ``<search>`` → ``<result>``, the answer in ``\\boxed{}``.

ReSearch / ReCall (docs/methods.md#research-and-recall) search with ``<search>query</search>``, get passages back
inside ``<result>…</result>``, and give the final answer in ``\\boxed{…}``, usually inside
``<answer>…</answer>``. Also home of :func:`read_boxed`, which SEM and the tool-call
protocol use to read a boxed answer.
"""

from __future__ import annotations

from collections.abc import Sequence

from ...error import InvalidArgumentError
from ...retrieval.records import Doc
from ..records import Action
from ._text import (
    box,
    boxed_or_whole,
    check_action_args,
    check_think,
    count_blocks,
    find_block,
    has_words,
    invalid,
    nested_box,
    not_text,
    read_boxed,
    tag_inside,
    tag_pattern,
    think_nesting,
)
from .base import Protocol, neutralise_tags

__all__ = ["ReSearchProtocol"]

_PATTERN = tag_pattern(("think", "search", "result", "answer"))


class ReSearchProtocol(Protocol):
    """ReSearch's tags: ``<search>`` → ``<result>``, final answer in ``\\boxed{}``.

    The earliest of a complete ``<search>…</search>`` block and a balanced ``\\boxed{…}``
    is the action; the box may sit inside ``<answer>…</answer>`` or stand alone (both are
    well formed). An ``<answer>`` block with no box in it, before any search, is invalid:
    the error asks for ``\\boxed{}``.

    Blocks do not nest, and neither do boxes. The action is invalid when the search query,
    the ``<answer>`` block around the box, or the box holds a tag of this format; when the
    box holds another ``\\boxed``; when the search or answer sits inside a ``<think>`` block
    that closes after it (a box in the reasoning is thinking, not the answer); or when
    ``<think>`` blocks before it nest. A ``<think>`` that is never closed is not a block.
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
            around = answer if answer is not None and answer.start <= boxed.start < answer.end else None
            end = around.end if around is not None else boxed.end
            thinks, answers = count_blocks(text, "think", end), count_blocks(text, "answer", end)
            content = boxed.content.strip()
            nesting = (
                nested_box(boxed)
                or tag_inside(around.content if around else content, _PATTERN, "the answer")
                or think_nesting(text, around or boxed)
            )
            if nesting is not None:
                return invalid(nesting, think_blocks=thinks, answer_blocks=answers)
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
        nesting = tag_inside(query, _PATTERN, "<search>…</search>") or think_nesting(text, search)
        if nesting is not None:
            return invalid(nesting, think_blocks=thinks)
        if not has_words(query):
            return invalid(
                "The <search> block is empty (no letter or digit): put the query between <search> and </search>.",
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
