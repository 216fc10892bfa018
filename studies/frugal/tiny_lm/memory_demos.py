"""Experience-memory prompts for the warm start, so the memory arms meet no unseen prompt layout.

LightSearcher's arms put an experience bank and a few-shot example in front of every
question (:class:`~searchgym.memory.ExperienceWrapper`). A tiny model warm-started only on
plain prompts answers those with malformed turns (measured: the memory arms of the CPU
study broke as soon as the first bank was written). :class:`ScriptedMemory` gives the warm
start the same layout: an :class:`~searchgym.memory.ExperienceMemory` with the rule
summariser, fed with scripted episodes of a world (searches and direct answers, right and
wrong, in a new random mix for every bank) so that its banks and few-shot examples vary as
they do during RL. Which actions the demonstrations take is left to their own coin flips:
the bank's text never decides them.
"""

from __future__ import annotations

import logging
import random

from searchgym.envs.synthetic_env import SyntheticFactsEnv
from searchgym.memory import ExperienceMemory, ExperienceWrapper

from .demos import write_demo_actions

__all__ = ["ScriptedMemory"]

_EPISODES_PER_BANK = 16


class ScriptedMemory:
    """An experience memory written by scripted episodes of ``env``, and wrappers that show it.

    Args:
        env: A demonstration env (:func:`~tiny_lm.demos.demo_env`) of a
            world of its own: the banks' figures and few-shot examples come from it.
        rng: The random source of the episode mixes.
        rotate_every: Wrapped episodes between two banks.
        recall: Write the episodes as ``recall`` demonstrations
            (:func:`~tiny_lm.demos.write_demo_actions`).
        ask_question: Their recollections restate the question (``sft.recall_form: question``).
    """

    def __init__(
        self,
        env: SyntheticFactsEnv,
        rng: random.Random,
        rotate_every: int = 50,
        recall: bool = False,
        ask_question: bool = False,
    ):
        self.env, self.rng, self.rotate_every, self.recall = env, rng, rotate_every, recall
        self.ask_question = ask_question
        self.seed = rng.randrange(2**31)
        self.memory = ExperienceMemory(update_every=1, summarizer="rule", seed=self.seed)
        self._recorder = ExperienceWrapper(env, self.memory, use_experience=False, few_shot=False)
        self._wrapper: ExperienceWrapper | None = None
        self._uses = 0
        while not len(self.memory.experience):
            self._new_bank()

    def wrapped(self, env: SyntheticFactsEnv) -> ExperienceWrapper:
        """``env`` behind an :class:`ExperienceWrapper` of this memory (a fresh bank every
        ``rotate_every`` calls); the wrapper shares ``env``, so plain and wrapped episodes
        can alternate."""
        self._uses += 1
        if self._uses % self.rotate_every == 0:
            self._new_bank()
        if self._wrapper is None or self._wrapper.env is not env:
            # seeded: demonstrations reset without a seed, and must draw the same examples in every process
            self._wrapper = ExperienceWrapper(env, self.memory, record=False, seed=self.seed)
        return self._wrapper

    def _new_bank(self) -> None:
        """Record a random mix of scripted episodes, then let the memory write a bank from them."""
        env, shares = self.env, [self.rng.random() for _ in range(4)]
        for _ in range(_EPISODES_PER_BANK):
            index = self.rng.randrange(len(env.questions))
            chain = env.world.chain(env.questions[index].id)
            search, right = self.rng.choices([(1, 1), (1, 0), (0, 1), (0, 0)], weights=shares)[0]
            question = env.questions[index]
            asked = question.question if self.ask_question else None
            # a direct answer names somebody (right, or swapped for a wrong name below); a
            # search recollects what the world's split says the model knows
            known = question.known or not search
            actions = write_demo_actions(
                env.protocol.name, chain, bool(search), known=known, recall=self.recall, question=asked
            )
            if not right:
                last = chain[-1]
                others = [
                    f.object
                    for f in env.world.facts
                    if f.relation == last.relation and f.object != last.object
                ]
                actions[-1] = actions[-1].replace(last.object, self.rng.choice(others or ["nobody"]))
            self._recorder.reset(options={"index": index})
            for action in actions:
                *_, terminated, truncated, _ = self._recorder.step(action)
                if terminated or truncated:
                    break
        quiet = logging.getLogger("searchgym.memory")
        level = quiet.level
        quiet.setLevel(logging.ERROR)  # a mix with no contrast is expected now and then: draw again
        try:
            self.memory.update()
        finally:
            quiet.setLevel(level)
