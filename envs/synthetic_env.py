"""SyntheticFacts-v1: the embedded default, a generated world built to study when to search."""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..error import InvalidArgumentError, keyword_checked
from ..retrieval import Retriever, make_retriever
from .records import Question
from .search_env import EpisodeOptions, SearchQAEnv, check_retriever_kwargs, takes_episode_options
from .synthetic import SyntheticWorld, generate_world

if TYPE_CHECKING:
    from typing_extensions import Unpack  # typing.Unpack from Python 3.11

__all__ = ["SyntheticFactsEnv", "split_questions", "SPLITS", "SPLIT_BY"]

SPLITS = ("all", "train", "eval")
SPLIT_BY = ("question", "fact")


def split_questions(
    world: SyntheticWorld, split: str = "all", eval_fraction: float = 0.25, split_by: str = "question"
) -> tuple[Question, ...]:
    """The questions of ``split``: ``"all"``, or a seeded train/eval partition of them.

    ``eval`` takes ``round(eval_fraction * n)`` questions drawn at random (seeded by the
    world's seed) and ``train`` the rest, so the two never share a question and every run
    on the same world draws the same partition.

    With ``split_by="fact"`` the partition is held out by fact: ``eval`` is drawn as above,
    and ``train`` keeps only the other questions none of whose facts is a hop of an eval
    question, so no held-out fact is ever seen in training (a two-hop eval question then
    also removes the one-hop questions about its two facts from ``train``).
    """
    if split not in SPLITS:
        raise InvalidArgumentError(f"split must be one of {', '.join(SPLITS)}; got {split!r}.")
    if split_by not in SPLIT_BY:
        raise InvalidArgumentError(f"split_by must be one of {', '.join(SPLIT_BY)}; got {split_by!r}.")
    if (
        isinstance(eval_fraction, bool)
        or not isinstance(eval_fraction, (int, float))
        or not 0 < eval_fraction < 1
    ):
        raise InvalidArgumentError(f"eval_fraction must be a number in (0, 1); got {eval_fraction!r}.")
    if split == "all":
        return world.questions
    order = list(range(len(world.questions)))
    random.Random(f"synthetic-facts/{world.seed}/split").shuffle(order)
    cut = round(eval_fraction * len(order))
    if not 0 < cut < len(order):
        raise InvalidArgumentError(
            f"eval_fraction={eval_fraction} leaves the train or eval split of {len(order)} questions empty."
        )
    chosen = sorted(order[:cut] if split == "eval" else order[cut:])
    if split == "train" and split_by == "fact":
        held_out = {fact for i in order[:cut] for fact in world.chains[i]}
        chosen = [i for i in chosen if not held_out.intersection(world.chains[i])]
    return tuple(world.questions[i] for i in chosen)


class SyntheticFactsEnv(SearchQAEnv):
    """Questions about a seeded, generated world of people, cities, countries and companies.

    ## Description
    A world generator (:func:`~searchgym.envs.synthetic.generate_world`) writes entities,
    one passage per fact, and one-hop and two-hop questions. Each question carries a
    ``known`` flag: whether all its facts belong to the "parametric" subset a policy could
    have memorised (SEM's known/unknown split). Retrieval is BM25 over the world's
    passages, built in memory and shared by every env of the process with the same world.
    No files, downloads or keys are needed.

    ## Info
    As :class:`SearchQAEnv`, plus ``known`` (bool) and ``hops`` (1 or 2).

    ## Arguments
    world_seed: seed of the world generator (default 0). The episode seed given to
        ``reset`` only picks questions. world_kwargs: passed to ``generate_world`` (sizes,
        ``known_fraction``, ``two_hop_fraction``, ``num_questions``, ``known_by``, and
        ``known_two_hop``: False keeps two-hop questions out of the known split, so a
        known question needs one recalled fact and no chaining; the studies set it).
    retriever: ``"bm25"`` (default), another backend name (``"simulated"``: documents
        written from the world by :class:`~searchgym.envs.synthetic_docs.SyntheticDocGenerator`
        unless ``retriever_kwargs`` names a generator, model or base_url), or a
        :class:`Retriever`. retriever_kwargs: options of the backend (e.g.
        ``{"noise_prob": 0.3}``). split: ``"all"`` (default), ``"train"`` or ``"eval"``, a
    seeded partition of the questions (:func:`split_questions`) so that a policy can be
    trained on one part and evaluated on held-out questions of the same world;
    eval_fraction: the eval part's share (default 0.25). split_by: ``"question"``
    (default: held out by question, so an eval two-hop question may chain facts that
    training questions ask about) or ``"fact"`` (held out by fact: no fact of an eval
    question is a hop of any training question; the studies use it). Other arguments as
    :class:`SearchQAEnv`.

    ## Evaluation
    A policy trained by sampling (GRPO samples rollouts at temperature 1) is a different
    policy when decoded greedily. Report both: greedy (``temperature=0``) and at the
    training temperature, e.g. ``searchgym eval --policy "hf:DIR?temperature=1.0"``
    with several episode seeds. The incentive study (``studies/frugal``) reports both.

    ## Version History
    * v1: an action with nested tags or nested boxes (a protocol tag inside a search or
          answer block, an action inside ``<think>``, ``\\boxed{}`` in ``\\boxed{}``) and a
          search query without a letter or digit are malformed (``info["error"]``), never
          searched for; under ``sem`` the model may search again after its first answer.
    * v0: initial version.
    """

    @keyword_checked
    @takes_episode_options
    def __init__(
        self,
        *,
        world_seed: int = 0,
        world_kwargs: Mapping[str, Any] | None = None,
        retriever: str | Retriever = "bm25",
        retriever_kwargs: Mapping[str, Any] | None = None,
        split: str = "all",
        eval_fraction: float = 0.25,
        split_by: str = "question",
        **episode: Unpack[EpisodeOptions],
    ):
        self.world: SyntheticWorld = generate_world(world_seed, **dict(world_kwargs or {}))
        self.split = split
        questions = split_questions(self.world, split, eval_fraction, split_by)
        options = check_retriever_kwargs(retriever, retriever_kwargs)
        if retriever == "simulated" and not {"generator", "model", "base_url"} & options.keys():
            from .synthetic_docs import SyntheticDocGenerator

            options["generator"] = SyntheticDocGenerator(self.world)
        if not isinstance(retriever, Retriever):
            retriever = make_retriever(retriever, docs=self.world.docs, **options)
        super().__init__(questions, retriever, **episode)
