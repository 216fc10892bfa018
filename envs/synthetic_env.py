"""SyntheticFacts-v0: the embedded default, a generated world built to study when to search."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .protocols import Protocol
from .retrieval import Retriever, make_retriever
from .rewards import RewardScheme
from .search_env import SearchQAEnv, check_retriever_kwargs
from .synthetic import SyntheticWorld, generate_world

__all__ = ["SyntheticFactsEnv"]


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
        ``known_fraction``, ``two_hop_fraction``, ``num_questions``).
    retriever: ``"bm25"`` (default), another backend name (``"simulated"``: documents
        written from the world by :class:`~searchgym.envs.retrieval.simulated.SyntheticDocGenerator`
        unless ``retriever_kwargs`` names a generator, model or base_url), or a
        :class:`Retriever`. retriever_kwargs: options of the backend (e.g.
        ``{"noise_prob": 0.3}``). Other arguments as :class:`SearchQAEnv`.

    ## Version History
    * v0: initial version.
    """

    def __init__(
        self,
        *,
        world_seed: int = 0,
        world_kwargs: Mapping[str, Any] | None = None,
        retriever: str | Retriever = "bm25",
        retriever_kwargs: Mapping[str, Any] | None = None,
        protocol: str | Protocol = "search_r1",
        reward: str | RewardScheme = "f1",
        reward_kwargs: Mapping[str, Any] | None = None,
        topk: int = 3,
        max_turns: int = 4,
        max_searches: int | None = None,
        render_mode: str | None = None,
    ):
        self.world: SyntheticWorld = generate_world(world_seed, **dict(world_kwargs or {}))
        options = check_retriever_kwargs(retriever, retriever_kwargs)
        if retriever == "simulated" and not {"generator", "model", "base_url"} & options.keys():
            from .retrieval.simulated import SyntheticDocGenerator

            options["generator"] = SyntheticDocGenerator(self.world)
        if not isinstance(retriever, Retriever):
            retriever = make_retriever(retriever, docs=self.world.docs, **options)
        super().__init__(
            self.world.questions,
            retriever,
            protocol=protocol,
            reward=reward,
            reward_kwargs=reward_kwargs,
            topk=topk,
            max_turns=max_turns,
            max_searches=max_searches,
            render_mode=render_mode,
        )
