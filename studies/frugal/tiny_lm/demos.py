"""Warm-start data for the CPU study: fact statements and protocol demonstrations.

Two kinds of example, both as token ids with a loss mask:

* **recall lessons** (:func:`recall_lessons`): every *known* fact as short question-answer
  pairs, many times over. This is the knob that sets how well the warm-started model has
  memorised the known facts.
* **statements**: every *known* fact as one episode per phrasing of its one-hop question
  (each relation has two), shown ``fact_repeats`` times (a float: ``2.5`` shows each 2 or
  3 times, at random), searching or answering at once by a coin flip with
  ``search_prob``; optionally with the fact's passage as plain text. Passages alone are
  not enough: a tiny model learns to complete them (99% after 8 epochs) yet answers none
  of the questions about them (0% direct accuracy, measured), the knowledge-extraction
  failure of small LMs; questions carry the knowledge to where the policy needs it.
* **demonstrations**: whole episodes of other questions (two-hop ones, and every question
  of a shadow world), searching every hop or answering at once by a coin flip, so the
  warm-started policy searches known facts as often as not. The caller sets the coin per
  world: the study searches every shadow question, since a direct answer there is a name
  the model cannot know, and such answers teach it to make names up (measured: recall in
  the protocol's format fell from 69% to 36% when a fifth of them answered directly).
* **reading lessons** (:func:`reading_examples`): short copying lessons on worlds of
  their own, the first stage of the warm start.

Statements and demonstrations are episodes run through a real env, so observations are
what the env returns; the lessons are short plain texts.

Following the pitfalls of the feasibility trial:

* on the study world only *known* facts are shown; search demonstrations for facts the
  model does not know come from "shadow" worlds of the same generator with other seeds,
  so no unknown fact of the study world is ever trained on (it may appear in a masked
  search result);
* the study's held-out questions are held out from RL, not from the warm start: a known
  one-hop question is, by design, one whose answer the model was shown;
* answers and queries are written with spaces inside the tags (``<answer> Dreresh
  </answer>``), so their names split into the same tokens as in the passages.

The episode layout (prompt | action | feedback | …) and its tokenisation are the ones the
GRPO rollouts use, so the model meets at RL time exactly the token sequences it was
warm-started on. Only action tokens (and statements) are trained; prompts and feedback are
masked out.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from searchgym.envs.synthetic import RELATIONS, Fact, SyntheticWorld, two_hop_chains, two_hop_question
from searchgym.envs.synthetic_env import SyntheticFactsEnv
from searchgym.policies.chat import ChatFormatter

__all__ = [
    "Example",
    "statements",
    "demonstrations",
    "chain_demonstrations",
    "reading_examples",
    "recall_lessons",
    "lesson_context",
    "write_demo_actions",
    "shadow_seeds",
    "reading_seeds",
    "forced_opening",
]

_THINK_SEARCH = "I should look this up."
_THINK_READ = "The passage gives it."
_THINK_KNOW = "I know this."
_THINK_FIRST = "My first answer."
UNKNOWN = "unknown"
"""What a ``recall`` demonstration recalls, and answers, for a fact the model was not shown."""


@dataclass(frozen=True)
class Example:
    """One training sequence: token ids and a 0/1 loss mask of the same length."""

    token_ids: tuple[int, ...]
    loss_mask: tuple[int, ...]
    kind: str  # "statement", "direct" or "search"
    hops: int = 1  # the question's hops (an episode of a two-hop question: 2)


def shadow_seeds(seed: int, count: int) -> list[int]:
    """World seeds of the shadow worlds of study seed ``seed`` (never a study world's seed)."""
    return [100_000 + 1000 * seed + k for k in range(count)]


def reading_seeds(count: int) -> list[int]:
    """World seeds of the reading stage, shared by every study seed (apart from the shadow worlds)."""
    return [500_000 + k for k in range(count)]


def reading_examples(world: SyntheticWorld, tokenizer: Any, passages: bool = True) -> list[Example]:
    """Short plain-text copying lessons from ``world``, one or two per one-hop question.

    ``Question: <q> Search: <query>`` (copy the subject into a query) and, when
    ``passages``, ``Passage: <p> Question: <q> Answer: <object>`` (copy the answer out of a
    passage); only the part after ``Search:``/``Answer:`` is trained. A tiny model learns
    to copy from the number of distinct names it sees, and far faster on such short texts
    than inside whole episodes; the protocol stage then carries the skill over. Measured on
    the 128x4 tiny model with query lessons only, copying names of a held-out world: 0%
    after 10 worlds, 6% after 30, 91% after 100 (one pass, 64 s on one thread).
    """
    out = []
    for question, chain in zip(world.questions, world.chains, strict=True):
        if len(chain) != 1:
            continue
        fact = chain[0]
        query = RELATIONS[fact.relation].query(fact.subject)
        lessons = [(f"Question: {question.question} Search:", f" {query}")]
        if passages:
            passage = RELATIONS[fact.relation].passage_text(fact.subject, fact.object)
            lessons.append((f"Passage: {passage} Question: {question.question} Answer:", f" {fact.object}"))
        out += [_lesson(tokenizer, context, target, "reading") for context, target in lessons]
    return out


def recall_lessons(world: SyntheticWorld, tokenizer: Any, repeats: int) -> list[Example]:
    """Short ``Question: <q> Answer: <object>`` lessons, ``repeats`` per phrasing of every
    *known* fact of ``world``; only the answer is trained.

    The memorisation knob of the study: a tiny model stores a fact far faster from these
    than from episodes (measured on world 0, 128x4 model: direct answers to held-out known
    questions 21% after 20 episodes per phrasing, 71% with 40 of these lessons added),
    and the episodes carry the stored facts over into the protocol's format.
    """
    out = []
    for context, target in recall_pairs(world):
        out += [_lesson(tokenizer, context, target, "recall")] * repeats
    return out


def lesson_context(question: str) -> str:
    """The words a recall lesson asks ``question`` in, up to its answer: ``Question: <question> Answer:``."""
    return f"Question: {question} Answer:"


def recall_pairs(world: SyntheticWorld) -> list[tuple[str, str]]:
    """The text of :func:`recall_lessons`: one ``(context, target)`` per phrasing of every known fact."""
    out = []
    for fact in world.facts:
        if not fact.known:
            continue
        relation = RELATIONS[fact.relation]
        for variant in range(len(relation.questions)):
            out.append((lesson_context(relation.question_text(fact.subject, variant)), f" {fact.object}"))
    return out


def _lesson(tokenizer: Any, context: str, target: str, kind: str) -> Example:
    """A short plain-text lesson: ``context`` masked, ``target`` and an end token trained."""
    head = _encode(tokenizer, context)
    tail = _encode(tokenizer, target) + [tokenizer.eos_token_id]
    return Example(tuple(head + tail), (0,) * len(head) + (1,) * len(tail), kind)


def _repeats(rng: random.Random, fact_repeats: float) -> int:
    whole = int(fact_repeats)
    return whole + int(rng.random() < fact_repeats - whole)


def statements(
    env: SyntheticFactsEnv,
    tokenizer: Any,
    fact_repeats: float,
    search_prob: float,
    rng: random.Random,
    passages: bool = True,
    memory: Any = None,
    memory_share: float = 0.0,
    recall: bool = False,
    ask_question: bool = False,
) -> list[Example]:
    """Each known fact as a passage (unless ``passages`` is off) and as one episode per
    phrasing of its question, ``fact_repeats`` times on average; a ``memory_share`` of the
    episodes behind ``memory``'s wrapper (a :class:`~.memory_demos.ScriptedMemory`).
    ``recall`` and ``ask_question`` as in :func:`write_demo_actions`."""
    world, formatter = env.world, ChatFormatter(tokenizer)
    protocol = env.protocol.name
    out = []
    for fact, doc in zip(world.facts, world.docs, strict=True):
        if not fact.known:
            continue
        ids = _encode(tokenizer, doc.text) + [tokenizer.eos_token_id]
        relation = RELATIONS[fact.relation]
        for _ in range(_repeats(rng, fact_repeats)):
            if passages:
                out.append(Example(tuple(ids), (1,) * len(ids), "statement"))
            for variant in range(len(relation.questions)):
                text = relation.question_text(fact.subject, variant)
                question = {"question": text, "golden_answers": [fact.object], "id": doc.id}
                search = rng.random() < search_prob
                asked = text if ask_question else None
                actions = write_demo_actions(
                    protocol, (fact,), search, known=True, recall=recall, question=asked
                )
                run_env = _episode_env(env, memory, memory_share, rng)
                example = _episode(run_env, question, actions, tokenizer, formatter)
                if example is not None:
                    out.append(example)
    return out


def chain_demonstrations(
    env: SyntheticFactsEnv,
    tokenizer: Any,
    repeats: float,
    search_prob: float,
    rng: random.Random,
    held_out: set[tuple[Fact, ...]],
    memory: Any = None,
    memory_share: float = 0.0,
    recall: bool = False,
) -> list[Example]:
    """Episodes of every two-hop chain of two *known* facts of ``env``'s world, one per
    phrasing of the second relation, ``repeats`` times on average (as ``fact_repeats`` in
    :func:`statements`), searching by a coin flip; chains in ``held_out`` (the held-out
    questions') are left out, so a held-out two-hop question is answered by chaining two
    facts or not at all. With ``recall`` the recollection asks and answers each hop
    (:func:`write_demo_actions`).

    A world's own two-hop questions cover only some of its chains (world 0: 23 of the 49
    known ones are training questions, 6 held out), and each is shown once; these teach
    the chaining itself.
    """
    protocol, formatter = env.protocol.name, ChatFormatter(tokenizer)
    out = []
    for first, second in two_hop_chains(env.world.facts):
        if not (first.known and second.known) or (first, second) in held_out:
            continue
        for _ in range(_repeats(rng, repeats)):
            for variant in range(len(RELATIONS[second.relation].questions)):
                question = {
                    "question": two_hop_question(first, second, variant),
                    "golden_answers": [second.object],
                    "id": f"chain-{first.subject}-{second.relation}",
                }
                search = rng.random() < search_prob
                actions = write_demo_actions(
                    protocol, (first, second), search, known=True, recall=recall, ask_hops=True
                )
                run_env = _episode_env(env, memory, memory_share, rng)
                example = _episode(run_env, question, actions, tokenizer, formatter, hops=2)
                if example is not None:
                    out.append(example)
    return out


def _episode_env(env: SyntheticFactsEnv, memory: Any, share: float, rng: random.Random) -> Any:
    """``memory``'s wrapper of ``env`` for a ``share`` of the episodes (by a coin flip), else ``env``."""
    return memory.wrapped(env) if memory is not None and rng.random() < share else env


def _answer(protocol: str, answer: str, think: str) -> str:
    inner = f"\\boxed{{ {answer} }}" if protocol == "sem" else f" {answer} "
    return f"<think>{think}</think>\n<answer>{inner}</answer>"


def forced_opening(
    protocol: str, search: bool, recall: bool = False, hops: int = 1, question: str | None = None
) -> str:
    """The start of a demonstration's first action, up to the query or the answer.

    A probe appends it to a prompt and lets the model finish the query (``search``) or the
    answer, to measure copying and recall whatever the policy would choose to do. With
    ``recall`` (the ``recall_think`` demonstrations), the answer's opening is
    ``<think>Recall:`` (``<think>Question:`` for a chain of ``hops`` facts; with ``question``,
    the recall-lesson form ``<think>Question: <question> Answer:``; for ``sem``, the
    shared first thought and ``\\boxed{``) and the model writes its recollection first.
    """
    if recall and protocol == "sem":
        if search:
            return f"{_answer(protocol, UNKNOWN, _THINK_FIRST)}\n<search>"
        return f"<think>{_THINK_FIRST}</think>\n<answer>\\boxed{{"
    if recall:
        if search:
            return f"<think>{_recall(UNKNOWN, question)}</think>\n<search>"
        if hops > 1:
            return "<think>Question:"
        return "<think>Recall:" if question is None else f"<think>{lesson_context(question)}"
    if not search:
        return f"<think>{_THINK_KNOW}</think>\n<answer>" + ("\\boxed{" if protocol == "sem" else "")
    if protocol == "sem":
        return f"{_answer(protocol, 'unknown', _THINK_SEARCH)}\n<search>"
    return f"<think>{_THINK_SEARCH}</think>\n<search>"


def _recall(answer: str, question: str | None = None) -> str:
    """A recollection of one fact: ``Recall: <answer>.``, or with ``question`` in the words
    of a recall lesson, ``Question: <question> Answer: <answer>.``"""
    return f"Recall: {answer}." if question is None else f"{lesson_context(question)} {answer}."


def _recollection(chain: Sequence[Fact]) -> str:
    """What the model recalls of a known chain: ``Recall: <answer>.`` for one fact; for more,
    each hop asked and answered as a recall lesson is written (``Question: Who founded X?
    Answer: Y. Question: Where was Y born? Answer: Z.``)."""
    if len(chain) == 1:
        return _recall(chain[0].object)
    return " ".join(
        f"{lesson_context(RELATIONS[f.relation].question_text(f.subject))} {f.object}." for f in chain
    )


def write_demo_actions(
    protocol: str,
    chain: Sequence[Fact],
    search: bool,
    known: bool = False,
    recall: bool = False,
    ask_hops: bool = False,
    question: str | None = None,
) -> list[str]:
    """The scripted actions of one demonstration (the answer is the chain's last object).

    With ``recall`` (``search_r1`` and other one-answer protocols) the first thought states
    what the model recalls before it acts: ``Recall: <answer>.`` when it was shown the fact
    (``known``), and with ``ask_hops`` for a known chain each hop as the one-hop question
    and answer of a recall lesson (``Question: Who founded X? Answer: Y. Question: Where
    was Y born? Answer: Z.``), so a two-hop question is answered by asking itself two
    questions it knows; ``Recall: unknown.`` otherwise; a direct answer to a fact it was not shown
    is ``unknown`` (never a made-up name, which teaches the model to invent names). With
    ``question`` (the question as asked; ``sft.recall_form: question``) every recollection
    but a known chain's restates it as a recall lesson does: ``Question: <question> Answer:
    <answer or unknown>.`` For
    ``sem`` the first answer is the recollection (the answer, or ``unknown``) and both
    branches open with the same thought, so the choice to search comes after the first
    answer and can read it (without ``recall`` the thought chooses the branch before the
    answer is written). Searching or not stays the caller's coin flip, so the warm start
    searches as often on known facts as on unknown ones, and RL can learn to act on the
    recollection.

    ``search_r1`` searches every hop, one query per turn. ``sem`` allows one search: its
    first turn gives a first answer, then searches the first unknown hop of the chain (the
    first hop if all are known); the second turn answers. The first answer is the right
    one when the model was shown the fact (``known``: a needless search, which SEM's
    reward scores 0), else "unknown" (a wrong first answer, which SEM lets a search
    repair). Writing "unknown" for known facts too would hide every needless search from
    SEM's reward.
    """
    answer = chain[-1].object
    if protocol == "sem":
        return _sem_actions(chain, search, known, recall)
    if recall:
        recalled = answer if known else UNKNOWN
        recollection = _recollection(chain) if known and ask_hops else _recall(recalled, question)
        if not search:
            return [_answer(protocol, recalled, recollection)]
        thoughts = [recollection] + [_THINK_SEARCH] * (len(chain) - 1)
    elif not search:
        return [_answer(protocol, answer, _THINK_KNOW)]
    else:
        thoughts = [_THINK_SEARCH] * len(chain)
    actions = [
        f"<think>{thought}</think>\n<search> {RELATIONS[f.relation].query(f.subject)} </search>"
        for thought, f in zip(thoughts, chain, strict=True)
    ]
    return actions + [_answer(protocol, answer, _THINK_READ)]


def _sem_actions(chain: Sequence[Fact], search: bool, known: bool, recall: bool) -> list[str]:
    """``sem``'s demonstration (see :func:`write_demo_actions`)."""
    answer = chain[-1].object
    if recall or search:
        first = _answer("sem", answer if known else UNKNOWN, _THINK_FIRST if recall else _THINK_SEARCH)
    else:
        first = _answer("sem", answer, _THINK_KNOW)
    if not search:
        return [first]
    hop = next((f for f in chain if not f.known), chain[0])
    query = RELATIONS[hop.relation].query(hop.subject)
    return [f"{first}\n<search> {query} </search>", _answer("sem", answer, _THINK_READ)]


def _encode(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def _episode(
    env: SyntheticFactsEnv,
    question: int | dict[str, Any],
    actions: list[str],
    tokenizer: Any,
    formatter: ChatFormatter,
    hops: int = 1,
) -> Example | None:
    """Run ``actions`` through ``env`` on ``question`` (an index, or reset options), a
    question of ``hops`` hops; None when the env does not accept them as written."""
    options = {"index": question} if isinstance(question, int) else question
    obs, _ = env.reset(options=options)
    ids = _encode(tokenizer, formatter.prompt(obs))
    mask = [0] * len(ids)
    for n, action in enumerate(actions):
        obs, _, terminated, truncated, info = env.step(action)
        if not info["format_ok"]:
            return None
        last = n == len(actions) - 1
        action_ids = _encode(tokenizer, action) + ([tokenizer.eos_token_id] if last else [])
        ids += action_ids
        mask += [1] * len(action_ids)
        if terminated or truncated:
            if not last:
                return None
            break
        feedback = formatter.feedback(obs)
        feedback_ids = _encode(tokenizer, feedback)
        ids += feedback_ids
        mask += [0] * len(feedback_ids)
    return Example(tuple(ids), tuple(mask), "search" if len(actions) > 1 else "direct", hops)


def demonstrations(
    env: SyntheticFactsEnv,
    tokenizer: Any,
    *,
    search_prob: float,
    rng: random.Random,
    known_only: bool,
    min_hops: int = 1,
    memory: Any = None,
    memory_share: float = 0.0,
    recall: bool = False,
    ask_hops: bool = False,
    ask_question: bool = False,
) -> Iterator[Example]:
    """One demonstration per question of ``env`` with at least ``min_hops`` hops (only its
    known ones when ``known_only``); a ``memory_share`` of them behind ``memory``'s wrapper.
    ``recall``, ``ask_hops`` and ``ask_question`` as in :func:`write_demo_actions`.

    The env sets the protocol, instructions, retriever and top-k; its world must be the
    one the questions come from.
    """
    protocol = env.protocol.name
    formatter = ChatFormatter(tokenizer)
    for index, question in enumerate(env.questions):
        if (known_only and not question.known) or (question.hops or 1) < min_hops:
            continue
        chain = env.world.chain(question.id)
        # only the study world's known facts are ever shown to the model
        search = rng.random() < search_prob
        actions = write_demo_actions(
            protocol,
            chain,
            search,
            known=known_only,
            recall=recall,
            ask_hops=ask_hops,
            question=question.question if ask_question else None,
        )
        run_env = _episode_env(env, memory, memory_share, rng)
        example = _episode(run_env, index, actions, tokenizer, formatter, hops=len(chain))
        if example is not None:
            yield example


def demo_env(world_seed: int, env_kwargs: Mapping[str, Any], split: str) -> SyntheticFactsEnv:
    """A noise-free env for writing demonstrations: the study env's settings on another world."""
    kwargs = {k: v for k, v in env_kwargs.items() if k not in ("reward", "reward_kwargs", "retriever_kwargs")}
    options = dict(env_kwargs.get("retriever_kwargs") or {})
    options["noise_prob"] = 0.0
    if kwargs.get("retriever", "bm25") == "simulated":
        kwargs["retriever_kwargs"] = options
    kwargs.update(world_seed=world_seed, split=split)
    return SyntheticFactsEnv(**kwargs)
