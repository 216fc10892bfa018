"""The SEM protocol: answer first, then search as often as needed (docs/methods.md#sem-protocol).

Turn 0 is ``<think>…</think><answer>a1</answer>``, optionally followed by
``<search>query</search>``. After a search the env returns ``<result>…</result>`` and each
later turn is either one more search, ``[<think>…</think>]<search>query</search>``, or the
final ``<think>…</think><answer>a2</answer>``. Tags must come in this order with only white
space between them; the env's ``max_searches`` bounds the number of searches.
"""

from __future__ import annotations

from collections.abc import Sequence

from ...error import InvalidArgumentError
from ...retrieval.records import Doc
from ..records import Action
from ._text import (
    Block,
    box,
    boxed_or_whole,
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

__all__ = ["SEMProtocol"]

_TEMPLATE = (
    "Turn 0 is <think>…</think><answer>…</answer>, optionally followed by one <search>…</search>; "
    "after each <result> comes either another search, [<think>…</think>]<search>…</search>, or the "
    "final <think>…</think><answer>…</answer>."
)


def _first_turn_error(blocks: list[Block]) -> str | None:
    """Why turn-0 blocks are not ``(think answer)+ search?``, or None when they are."""
    if not blocks:
        return f"No blocks found. {_TEMPLATE}"
    for i, block in enumerate(blocks):
        expected = "think" if i % 2 == 0 else "answer"
        if block.name == "search" and i % 2 == 0 and i > 0:
            continue  # split_blocks stops right after the search, so it is the last block
        if block.name != expected:
            return f"Tags out of order: block {i + 1} is <{block.name}>, expected <{expected}>. {_TEMPLATE}"
    if blocks[-1].name == "think":
        return f"The last <think> block has no <answer> after it. {_TEMPLATE}"
    return None


def _later_turn_error(blocks: list[Block]) -> str | None:
    """Why a turn after a search is neither ``think? search`` nor ``think answer``, or None."""
    names = [b.name for b in blocks]
    if names in (["search"], ["think", "search"], ["think", "answer"]):
        return None
    shown = " ".join(f"<{n}>" for n in names[:4]) + (" …" if len(names) > 4 else "")
    if "search" in names:
        return (
            "After a <result>, a further search is [<think>…</think>]<search>…</search> alone, "
            f"with no <answer> before it; found {shown}."
        )
    return (
        "After a <result>, write either another [<think>…</think>]<search>…</search> or exactly one "
        f"<think>…</think><answer>…</answer> with your final answer; found {shown or 'no blocks'}."
    )


class SEMProtocol(Protocol):
    """SEM's template: a first answer, then optionally searches and a final answer.

    Readings:

    * Turn 0 with a search: kind ``search`` with ``query`` and ``answer`` = a1. Here a1
      may be empty (SEM's own examples answer ``\\boxed{ }`` before searching); reading
      stops at ``</search>``, so a made-up ``<result>`` after it is ignored.
    * Turn 0 without a search: kind ``answer`` with ``answer`` = a1. Several think/answer
      pairs are well formed (``format_ok`` True); ``answer`` is the first one and
      ``think_blocks``/``answer_blocks`` count all of them, for SEM's ``t`` indicator.
    * Turn 1 and later (after a search): ``[think] search``, kind ``search`` with no
      ``answer``; or exactly one think/answer pair, kind ``answer``. docs/methods.md#sem-protocol
      allows several searches before the final answer, as in SEM's own multi-hop example.

    An answer is the content of the first ``\\boxed{}`` inside ``<answer>`` when present,
    else the whole ``<answer>`` text (as docs/methods.md#sem-protocol settles), stripped.

    Blocks do not nest: a tag inside another block (``<think><think>…``, ``<answer><search>…``)
    is invalid, and so is a ``\\boxed{}`` inside the box of an answer.
    """

    name = "sem"
    tags = ("think", "answer", "search", "result")

    def __init__(self) -> None:
        self._pattern = tag_pattern(self.tags)

    def instructions(self) -> str:
        return (
            "Answer the question at the end of this message, searching only when you need to.\n"
            "Start by reasoning between <think> and </think>, then give your best answer right "
            "away between <answer> and </answer>, with the short answer wrapped in \\boxed{}, for "
            "example <answer> \\boxed{Paris} </answer>.\n"
            "If you are confident in that answer, stop there. If you are not, add a search "
            "after it: <search> your query </search>. The passages found will come back between "
            "<result> and </result>; then either search again, optionally reasoning first "
            "(<think> … </think> <search> … </search>), or reason once more between <think> and "
            "</think> and give your final answer between <answer> and </answer>, boxed the same "
            "way.\nKeep the tags in exactly this order, with nothing outside them."
        )

    def parse(self, text: str, turn: int = 0) -> Action:
        bad = not_text(text)
        if bad is not None:
            return bad
        if isinstance(turn, bool) or not isinstance(turn, int) or turn < 0:
            return invalid(f"turn must be an int >= 0, got {turn!r}.")
        first = turn == 0
        blocks, error = split_blocks(text, self._pattern, stop_after="search")
        if error is None:
            error = _first_turn_error(blocks) if first else _later_turn_error(blocks)
        if error is not None:
            return invalid(
                error,
                think_blocks=count_blocks(text, "think"),
                answer_blocks=count_blocks(text, "answer"),
            )
        thinks = sum(b.name == "think" for b in blocks)
        answers = [b for b in blocks if b.name == "answer"]
        for block in answers:
            nesting = nested_box(read_boxed(block.content)) if "\\boxed" in block.content else None
            if nesting is not None:
                return invalid(nesting, think_blocks=thinks, answer_blocks=len(answers))
        answer = boxed_or_whole(answers[0].content) if answers else None
        if blocks[-1].name == "search":
            query = blocks[-1].content.strip()
            if not has_words(query):
                return invalid(
                    "The <search> block is empty (no letter or digit): put the query between <search> and </search>.",
                    think_blocks=thinks,
                    answer_blocks=len(answers),
                )
            return Action(
                kind="search", query=query, answer=answer, think_blocks=thinks, answer_blocks=len(answers)
            )
        if answer is None or not answer:
            return invalid(
                "The answer is empty: write it inside <answer>…</answer>, boxed as \\boxed{...}.",
                think_blocks=thinks,
                answer_blocks=len(answers),
            )
        return Action(kind="answer", answer=answer, think_blocks=thinks, answer_blocks=len(answers))

    def render_docs(self, docs: Sequence[Doc]) -> str:
        body = self.format_doc_list(docs) if docs else "No results."
        return f"\n<result>{body}</result>\n"

    def write_action(
        self, *, query: str | None = None, answer: str | None = None, think: str = "", first: bool = True
    ) -> str:
        """``<think>{think}</think>\n<answer>\boxed{answer}</answer>``, then ``\n<search>{query}</search>``.

        With a query and ``first`` (the default) this is the turn-0 form (first answer, then
        the search); the first answer may then be left out, which writes an empty
        ``<answer></answer>``, so that ``write_action(query=q)`` works as it does for the
        other protocols. With a query and ``first=False`` it is a later search,
        ``<think>{think}</think>\n<search>{query}</search>``, which takes no answer. Without
        a query it is a final answer, valid on any turn.
        """
        think = neutralise_tags(check_think(think), self.tags)
        if query is not None and (not isinstance(query, str) or not query.strip()):
            raise InvalidArgumentError(f"query must be a non-blank str or None, got {query!r}.")
        if query is not None and not first:
            if answer is not None:
                raise InvalidArgumentError(
                    f"A later search (first=False) carries no answer, got answer={answer!r}; "
                    "give the answer in the final turn instead."
                )
            return f"<think>{think}</think>\n<search>{neutralise_tags(query, self.tags)}</search>"
        if answer is None and query is not None:
            answer = ""
        if not isinstance(answer, str) or (query is None and not answer.strip()):
            raise InvalidArgumentError(
                f"Give a non-blank answer= (and optionally query= to search after it), got answer={answer!r}."
            )
        answer = neutralise_tags(answer, self.tags)
        if answer.strip():
            answer = box(answer)
            if query is None and not boxed_or_whole(answer):
                raise InvalidArgumentError(
                    f"answer {answer!r} is blank once its unmatched braces are dropped; give some text."
                )
        text = f"<think>{think}</think>\n<answer>{answer}</answer>"
        if query is not None:
            text += f"\n<search>{neutralise_tags(query, self.tags)}</search>"
        return text
