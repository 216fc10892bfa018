"""A language model's skills as explicit knobs, and the decision policy trained on top of them.

The incentive study replaces only the language model. What a model *can* do is fixed by
:class:`Skills` (how often it recalls a known fact, says "unknown" on an unknown one,
names a wrong entity, chains two facts, and how noisy retrieval is); what it *chooses* to
do is a small stochastic policy, :class:`DecisionPolicy`, over the choice the papers are
about: answer from memory, or search, and how many times. The policy sees only what a
model can observe of itself: the question's form (one hop or two) and its own
recollection of the first fact (a name, or "unknown").

:class:`SkillAgent` plays one episode of a real searchgym env: it writes each action with
the env's protocol (``write_action``), reads the retrieved passages back from the
observation text, and the env's reward scheme scores the trajectory.
"""

from __future__ import annotations

import math
import random
from dataclasses import asdict, dataclass, fields
from typing import Any

from searchgym.envs.synthetic import RELATIONS, Fact, SyntheticWorld

__all__ = ["Skills", "Recollector", "DecisionPolicy", "SkillAgent", "STATES", "ACTIONS", "UNKNOWN"]

UNKNOWN = "unknown"
ACTIONS = (0, 1, 2)
"""The decision: how many searches to make (0 = answer from memory)."""
STATES = ("1-hop, unknown", "1-hop, name", "2-hop, unknown", "2-hop, name")
"""What the policy observes: the question's form and whether it recalls a name for the first fact."""


@dataclass(frozen=True)
class Skills:
    """A language model's skills, as probabilities.

    Defaults are calibrated from the tiny model's decision probe (``tiny_lm/benchmarks/study_probe.py``,
    search_r1 format, held-out one-hop questions):

    Attributes:
        recall: P(the right name | a known fact) when sampled at T = 1 (probe: 0.85).
        recall_greedy: The same under greedy decoding (probe: 0.96).
        says_unknown: P("unknown" | an unknown fact) at T = 1 (probe: 0.76); otherwise
            the model names a wrong entity.
        says_unknown_greedy: The same under greedy decoding (probe: 0.85).
        hallucination: P(a wrong name | a known fact not recalled right); otherwise it says
            "unknown". 0.34 solves the probe's ``named_right`` = 0.77 (share of named
            recollections that are right) given the three rates above.
        chain: P(composing two hops right | both values in hand); otherwise the model
            answers the intermediate value. 0.8: f1's two-hop EM (52%) over the share of
            two-search chains whose both reads are right (0.8² = 0.64) in the CPU study.
        retrieval_noise: P(a search returns a wrong passage of the same form) (0.2, the
            CPU study's simulated retriever).
    """

    recall: float = 0.85
    recall_greedy: float = 0.96
    says_unknown: float = 0.76
    says_unknown_greedy: float = 0.85
    hallucination: float = 0.34
    chain: float = 0.8
    retrieval_noise: float = 0.2

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
                raise ValueError(f"skills.{f.name} must be a probability in [0, 1], got {value!r}.")

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


class Recollector:
    """What the model recalls of a fact: its object, a wrong name, or None ("unknown").

    Sampled (``greedy=False``): every call draws afresh from ``rng``, as a model sampling at
    T = 1. Greedy: a fixed answer per fact (drawn once from a hash of the seed and the
    fact), as a model decoding greedily always gives the same output for the same input.
    """

    def __init__(self, world: SyntheticWorld, skills: Skills, rng: random.Random, greedy: bool, seed: int):
        self.world, self.skills, self.rng, self.greedy, self.seed = world, skills, rng, greedy, seed
        self._objects: dict[str, list[str]] = {}
        for fact in world.facts:
            self._objects.setdefault(fact.relation, []).append(fact.object)

    def _draw(self, fact: Fact, salt: str) -> random.Random:
        return (
            random.Random(f"{self.seed}/{salt}/{fact.subject}/{fact.relation}") if self.greedy else self.rng
        )

    def recall(self, fact: Fact | None) -> str | None:
        """The model's recollection of ``fact`` (None when it says "unknown" or there is no such fact)."""
        if fact is None:
            return None
        s = self.skills
        rng = self._draw(fact, "recall")
        u = rng.random()
        if fact.known:
            right = s.recall_greedy if self.greedy else s.recall
            if u < right:
                return fact.object
            named = (u - right) / (1.0 - right) < s.hallucination if right < 1.0 else False
        else:
            named = u >= (s.says_unknown_greedy if self.greedy else s.says_unknown)
        return self._wrong(fact, rng) if named else None

    def _wrong(self, fact: Fact, rng: random.Random) -> str:
        choices = [o for o in self._objects[fact.relation] if o != fact.object]
        return choices[rng.randrange(len(choices))] if choices else UNKNOWN


class DecisionPolicy:
    """A softmax policy over :data:`ACTIONS` for each of :data:`STATES`: a 4 x 3 table of logits.

    ``update`` is the policy-gradient step of GRPO with one update per batch (the PPO
    ratio is 1, so clipping never binds): ``θ[s] += lr · mean_i A_i · (onehot(a_i) − π(·|s))``.
    """

    def __init__(self, logits: list[list[float]] | None = None):
        self.logits = [list(row) for row in logits] if logits else [[0.0] * len(ACTIONS) for _ in STATES]

    def probs(self, state: int) -> list[float]:
        row = self.logits[state]
        top = max(row)
        exps = [math.exp(x - top) for x in row]
        total = sum(exps)
        return [e / total for e in exps]

    def sample(self, state: int, rng: random.Random) -> int:
        u, acc = rng.random(), 0.0
        probs = self.probs(state)
        for action, p in enumerate(probs):
            acc += p
            if u < acc:
                return action
        return len(probs) - 1

    def greedy(self, state: int) -> int:
        probs = self.probs(state)
        return max(range(len(probs)), key=lambda a: (probs[a], -a))  # ties: fewer searches

    def update(self, samples: list[tuple[int, int, float]], lr: float) -> None:
        """One step on ``(state, action, advantage)`` samples, averaged over the batch."""
        if not samples:
            return
        grads = [[0.0] * len(ACTIONS) for _ in STATES]
        probs = [self.probs(s) for s in range(len(STATES))]
        for state, action, advantage in samples:
            for a in range(len(ACTIONS)):
                grads[state][a] += advantage * ((a == action) - probs[state][a])
        scale = lr / len(samples)
        for s in range(len(STATES)):
            for a in range(len(ACTIONS)):
                self.logits[s][a] += scale * grads[s][a]

    def table(self) -> dict[str, list[float]]:
        """P(searches = 0, 1, 2) per state, rounded for reports."""
        return {name: [round(p, 4) for p in self.probs(i)] for i, name in enumerate(STATES)}


class SkillAgent:
    """Plays episodes of a SyntheticFacts env for a given decision, with the model's skills.

    For a one-hop question, ``k`` searches: 0 answers from memory; 1 searches the fact's
    query; 2 also searches the question's own text and, when the two passages disagree,
    keeps the one that matches its recollection (else the first). For a two-hop question:
    0 chains two recollections; 1 searches the hop it cannot recall (the first when it
    says "unknown" to it, else the second) and recalls the other; 2 searches both. A hop
    whose search read nothing falls back to memory; two values in hand compose right with
    probability ``skills.chain``. Under SEM the first turn carries the answer from memory
    (a1) before the first search.
    """

    def __init__(self, env: Any, recollector: Recollector, rng: random.Random):
        self.env, self.memory, self.rng = env, recollector, rng
        self.world: SyntheticWorld = env.unwrapped.world
        self.protocol = env.unwrapped.protocol
        self.sem = self.protocol.name == "sem"

    def observe(self, index: int) -> tuple[int, str | None, list[Fact]]:
        """The state, the first-hop recollection and the chain of question ``index``."""
        question = self.env.unwrapped.questions[index]
        chain = self.world.chain(question.id)
        recalled = self.memory.recall(chain[0])
        return 2 * (len(chain) - 1) + (recalled is not None), recalled, chain

    def play(
        self, index: int, k: int, recalled: str | None, chain: list[Fact]
    ) -> tuple[float, dict[str, Any]]:
        """Run question ``index`` with ``k`` searches; return the env's reward and last info."""
        env = self.env
        env.reset(options={"index": index})
        self._searches = 0
        from_memory = self._answer_from_memory(recalled, chain)
        self._first_answer = from_memory
        if k == 0:
            answer = from_memory
        elif len(chain) == 1:
            answer = self._one_hop(chain[0], k, recalled)
        else:
            answer = self._two_hop(chain, k, recalled)
        _, reward, terminated, truncated, info = env.step(
            self.protocol.write_action(answer=answer or UNKNOWN, think="final")
        )
        if not (terminated or truncated):
            raise RuntimeError(f"the episode did not end after the answer: {info.get('error')}")
        return float(reward), info

    # -- the plans ---------------------------------------------------------------------

    def _search(self, fact_subject: str, relation: str, query: str) -> str | None:
        if self.sem:
            first = self._searches == 0
            text = self.protocol.write_action(
                query=query,
                answer=(self._first_answer or UNKNOWN) if first else None,
                think="search",
                first=first,
            )
        else:
            text = self.protocol.write_action(query=query, think="search")
        self._searches += 1
        observation, *_ = self.env.step(text)
        return RELATIONS[relation].read(observation, fact_subject)

    def _compose(self, first: str | None, second: str | None) -> str | None:
        if second is None:
            return None
        if self.rng.random() < self.memory.skills.chain:
            return second
        return first  # the chaining slip: the intermediate value

    def _answer_from_memory(self, recalled: str | None, chain: list[Fact]) -> str | None:
        if len(chain) == 1:
            return recalled
        if recalled is None:
            return None
        return self._compose(recalled, self.memory.recall(self.world.lookup(recalled, chain[1].relation)))

    def _one_hop(self, fact: Fact, k: int, recalled: str | None) -> str | None:
        relation = RELATIONS[fact.relation]
        first = self._search(fact.subject, fact.relation, relation.query(fact.subject))
        if k == 1:
            return first or recalled
        text = self.env.unwrapped.trajectory.question.question  # its own words as a second query
        second = self._search(fact.subject, fact.relation, text)
        if first and second and first != second:
            return second if second == recalled else first
        return first or second or recalled

    def _two_hop(self, chain: list[Fact], k: int, recalled: str | None) -> str | None:
        f, g = chain
        if k == 1 and recalled is not None:
            value = recalled  # search the second hop only
        else:
            value = self._search(f.subject, f.relation, RELATIONS[f.relation].query(f.subject)) or recalled
        if value is None:
            return None
        if k == 2 or (k == 1 and recalled is not None):
            second = self._search(value, g.relation, RELATIONS[g.relation].query(value))
            if second is None:
                second = self.memory.recall(self.world.lookup(value, g.relation))
        else:
            second = self.memory.recall(self.world.lookup(value, g.relation))
        return self._compose(value, second)
