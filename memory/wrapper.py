"""``ExperienceWrapper``: puts experience memory in front of the policy, and records episodes.

At ``reset`` the wrapper rebuilds the prompt as LightSearcher's Eq. 20 orders it:
instructions, experience, one few-shot example, question. Each added part is wrapped in a
marker so a trainer can mask it out of the loss (HiExp masks experience text;
docs/methods.md#hiexp), and ``info["memory_spans"]`` gives the character offsets of every marked block::

    {instructions}

    <experience>
    Guidance learnt from earlier episodes:
    Success strategies:
    - ...
    </experience>

    <example>
    An earlier episode that scored 1.00:
    Question: ...
    <think>...</think> ...
    </example>

    Question: ...

With a HiExp memory (one with ``strategies`` and ``hints``) the experience part holds the
top-k strategy records for the question, and an observation that follows a search gets a
``<hint>…</hint>`` block of the level-1 records whose title matches the query.
"""

from __future__ import annotations

import inspect
import logging
import re
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np

from ..checks import check_int, check_number
from ..envs.protocols import Protocol
from ..envs.protocols.base import neutralise_tags
from ..envs.records import Trajectory
from ..error import InvalidArgumentError, SearchGymError

__all__ = ["ExperienceWrapper", "MemorySpan", "MARKER_TAGS", "render_example"]

logger = logging.getLogger("searchgym.memory")

MARKER_TAGS = ("experience", "example", "hint")
"""The tags that mark text the wrapper added."""

_BLANK_LINES = re.compile(r"\n\s*\n")
_FEW_SHOT_DRAWS = 8


class MemorySpan(NamedTuple):
    """One marked block of an observation: ``observation[start:end]``, markers included."""

    kind: str
    """``"experience"``, ``"example"`` or ``"hint"``."""
    start: int
    end: int


def _clean(body: str) -> str:
    """A part's body: no marker tags inside, no blank lines (so ``\\n\\nQuestion:`` stays unique)."""
    return _BLANK_LINES.sub("\n", neutralise_tags(body, MARKER_TAGS)).strip("\n")


def _marked(kind: str, body: str) -> str:
    return f"<{kind}>\n{_clean(body)}\n</{kind}>"


def _item_text(item: object) -> str:
    """A memory item as one line: a string as it is, a HiExp record as ``title — description``."""
    if isinstance(item, str):
        return " ".join(item.split())
    title, description = getattr(item, "title", None), getattr(item, "description", None)
    if isinstance(title, str) and isinstance(description, str):
        return " ".join(f"{title} — {description}".split())
    render = getattr(item, "render", None)
    return " ".join(str(render() if callable(render) else item).split())


def _bullets(items: Sequence[object]) -> str:
    return "\n".join(f"- {_item_text(i)}" for i in items)


def render_example(trajectory: Trajectory, protocol: Protocol) -> str:
    """A finished trajectory as a few-shot example in ``protocol``'s own text.

    The policy's actions and the env's observations are shown as they were when the
    trajectory was written under the same protocol; under another protocol each search
    and answer is rewritten with ``protocol.write_action`` and each result list with
    ``protocol.render_docs``, and malformed turns are left out.
    """
    reward = trajectory.reward if trajectory.reward is not None else 0.0
    lines = [
        f"An earlier episode that scored {reward:.2f}:",
        f"Question: {neutralise_tags(trajectory.question.question, protocol.tags)}",
    ]
    same = trajectory.protocol == protocol.name
    for turn in trajectory.turns:
        action, observation = turn.action_text, turn.observation
        if not same:
            kind = turn.action.kind
            try:
                if kind == "search" and turn.action.query:
                    action, observation = (
                        protocol.write_action(query=turn.action.query),
                        protocol.render_docs(turn.docs),
                    )
                elif kind == "answer" and turn.action.answer:
                    action, observation = protocol.write_action(answer=turn.action.answer), ""
                else:
                    continue
            except SearchGymError:
                continue
        lines.append(action.strip())
        if observation.strip():
            lines.append(observation.strip())
    return "\n".join(lines)


class ExperienceWrapper(gym.ObservationWrapper, gym.utils.RecordConstructorArgs):
    """Adds experience memory to a searchgym env's observations (see the module docstring).

    ## Observations
    ``reset`` returns instructions + experience + one few-shot example + question, each
    added part in ``<experience>``/``<example>`` markers. After a search, a HiExp memory's
    hints follow the documents in ``<hint>`` markers. Other observations pass through
    unchanged. When nothing is added (switches off, empty memory) the observation is
    exactly the env's.

    ## Reset options
    ``prompt_seed`` (an int >= 0 or a list of them) seeds this reset's few-shot draw: envs
    reset with the same ``prompt_seed`` show the same example (GRPO's group of rollouts of
    one question, when ``memory.example_per`` is ``group``). The other options go to the env.

    ## Info
    ``memory_spans``: a list of :class:`MemorySpan` (kind, start, end), character offsets
    of each marked block in this observation, for masking. ``memory_error``: set when the
    memory failed (the part is then left out; the episode goes on).

    ## Recording
    With ``record``, the trajectory of every finished episode (``env.unwrapped.trajectory``,
    reward set) goes to ``memory.add``, so an unmodified rollout loop fills the memory. The
    wrapper never calls ``memory.step``: training steps are the trainer's to count.

    ## Arguments
    env: A searchgym env (``env.unwrapped`` has ``protocol`` and ``trajectory``).
    memory: An :class:`~searchgym.memory.ExperienceMemory`, or a HiExp memory with
        ``strategies(question, k)`` and ``hints(query, threshold)``.
    use_experience: Add the experience part and hints (turn off for inference, as
        LightSearcher does after training).
    few_shot: Add one example drawn with ``memory.sample_few_shot``; examples of the
        current question are never shown (they would give the answer away).
    record: Add finished episodes to the memory (when it has ``add``).
    instructions: Keep the protocol's instructions at the top.
    top_k: Strategy records for a HiExp memory (HiExp: 5).
    hint_threshold: Cosine threshold of HiExp hints (HiExp: 0.8).
    seed: Seed of the few-shot draws until ``reset(seed=...)`` reseeds them (None: fresh
        entropy, as Gymnasium does): episodes reset without a seed draw the same examples
        in every process only when it is set.
    """

    def __init__(
        self,
        env: gym.Env,
        memory: Any,
        *,
        use_experience: bool = True,
        few_shot: bool = True,
        record: bool = True,
        instructions: bool = True,
        top_k: int = 5,
        hint_threshold: float = 0.8,
        seed: int | None = None,
    ):
        gym.utils.RecordConstructorArgs.__init__(
            self,
            _disable_deepcopy=True,
            memory=memory,
            use_experience=use_experience,
            few_shot=few_shot,
            record=record,
            instructions=instructions,
            top_k=top_k,
            hint_threshold=hint_threshold,
            seed=seed,
        )
        gym.ObservationWrapper.__init__(self, env)
        for name, value in (
            ("use_experience", use_experience),
            ("few_shot", few_shot),
            ("record", record),
            ("instructions", instructions),
        ):
            if not isinstance(value, bool):
                raise InvalidArgumentError(f"{name} must be a bool, got {value!r}.")
        check_int("top_k", top_k, 1)
        check_int("seed", seed, 0, optional=True)
        check_number("hint_threshold", hint_threshold)
        base: Any = env.unwrapped
        if not isinstance(getattr(base, "protocol", None), Protocol) or not hasattr(base, "trajectory"):
            raise InvalidArgumentError(
                f"ExperienceWrapper needs a searchgym env (with .protocol and .trajectory), got {base!r}."
            )
        self.hierarchical = callable(getattr(memory, "strategies", None)) and callable(
            getattr(memory, "hints", None)
        )
        if not self.hierarchical and inspect.getattr_static(memory, "experience", None) is None:
            raise InvalidArgumentError(
                "memory must be an ExperienceMemory (with .experience and .sample_few_shot) or a HiExp memory "
                f"(with .strategies and .hints), got {type(memory).__name__}."
            )
        self.memory = memory
        self.use_experience = use_experience
        self.few_shot = few_shot
        self.record = record
        self.instructions = instructions
        self.top_k = top_k
        self.hint_threshold = float(hint_threshold)
        self._rng = np.random.default_rng(seed)

    @property
    def _base(self) -> Any:
        """The searchgym env under every wrapper (typed loosely: any SearchQAEnv subclass)."""
        return self.env.unwrapped

    # -- the parts ----------------------------------------------------------------------------

    def experience_text(self, question: str) -> str:
        """The body of the experience part for ``question`` ("" when there is nothing)."""
        if self.hierarchical:
            items = self.memory.strategies(question, k=self.top_k)
            return f"Strategies from earlier episodes:\n{_bullets(items)}" if items else ""
        bank = self.memory.experience
        return f"Guidance learnt from earlier episodes:\n{bank.to_text()}" if len(bank) else ""

    def example_text(self, question_id: str, question: str, rng: np.random.Generator | None = None) -> str:
        """The body of the few-shot part: an example of another question ("" when none),
        drawn with ``rng`` (default: the wrapper's own generator)."""
        sample = getattr(self.memory, "sample_few_shot", None)
        if not callable(sample):
            return ""
        for _ in range(_FEW_SHOT_DRAWS):
            example = sample(self._rng if rng is None else rng)
            if example is None:
                return ""
            if example.question.id != question_id and example.question.question != question:
                return render_example(example, self._base.protocol)
        return ""

    def step_hints(self, query: str) -> str:
        """The body of the hint block after a search for ``query`` ("" for no hints).

        Uses ``memory.step_hints(query)`` when the memory has it (ExperienceMemory's returns
        ""), else a HiExp memory's ``hints(query, threshold)`` as bullet points.
        """
        hook = getattr(self.memory, "step_hints", None)
        if callable(hook):
            return str(hook(query) or "")
        if self.hierarchical:
            items = self.memory.hints(query, threshold=self.hint_threshold)
            return f"Hints from similar cases:\n{_bullets(items)}" if items else ""
        return ""

    def _safely(self, what: str, info: dict[str, Any], fn: Any, *args: Any) -> str:
        try:
            return fn(*args)
        except Exception as exc:  # noqa: BLE001 - a memory failure must not end the episode
            logger.warning("ExperienceWrapper: %s failed and was left out: %r", what, exc)
            info["memory_error"] = f"{what} failed: {exc}"
            return ""

    # -- Gymnasium API --------------------------------------------------------------------------

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        example_rng = None
        if isinstance(options, Mapping) and "prompt_seed" in options:
            options = dict(options)
            example_rng = _prompt_rng(options.pop("prompt_seed"))
            options = options or None
        obs, info = self.env.reset(seed=seed, options=options)
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        info = dict(info)
        base = self._base
        question = base.trajectory.question
        instructions = getattr(base, "instructions", None) or base.protocol.instructions()
        if obs.startswith(instructions):
            head, question_part = instructions, obs[len(instructions) :].lstrip("\n")
        else:  # a protocol with its own prompt layout: add the parts in front of it
            head, question_part = "", obs
        added: list[tuple[str, str]] = []
        if self.use_experience:
            body = self._safely("the experience part", info, self.experience_text, question.question)
            if body:
                added.append(("experience", _marked("experience", body)))
        if self.few_shot:
            body = self._safely(
                "the few-shot example", info, self.example_text, question.id, question.question, example_rng
            )
            if body:
                added.append(("example", _marked("example", body)))
        if not added and (self.instructions or not head):
            info["memory_spans"] = []
            return obs, info
        pieces: list[tuple[str | None, str]] = []
        if self.instructions and head:
            pieces.append((None, head))
        pieces += added
        pieces.append((None, question_part))
        text, spans = "", []
        for kind, piece in pieces:
            if text:
                text += "\n\n"
            if kind is not None:
                spans.append(MemorySpan(kind, len(text), len(text) + len(piece)))
            text += piece
        info["memory_spans"] = spans
        return text, info

    def step(self, action: str):
        obs, reward, terminated, truncated, info = self.env.step(action)
        info = dict(info)
        spans: list[MemorySpan] = []
        trajectory = self._base.trajectory
        last = trajectory.turns[-1].action if trajectory is not None and trajectory.turns else None
        if self.use_experience and last is not None and last.kind == "search" and last.query:
            body = self._safely("the hints", info, self.step_hints, last.query)
            if body:
                block = _marked("hint", body)
                start = len(obs) + (0 if obs.endswith("\n") else 1)
                obs = obs + ("" if obs.endswith("\n") else "\n") + block + "\n"
                spans.append(MemorySpan("hint", start, start + len(block)))
        info["memory_spans"] = spans
        if (terminated or truncated) and self.record and trajectory is not None:
            add = getattr(self.memory, "add", None)
            if callable(add):
                self._safely("recording the episode", info, add, trajectory)
        return obs, reward, terminated, truncated, info

    def observation(self, observation: str) -> str:
        """Unused: :meth:`reset` and :meth:`step` build the observations themselves."""
        return observation


def _prompt_rng(prompt_seed: Any) -> np.random.Generator:
    """The generator of ``reset(options={"prompt_seed": ...})``: an int or a list of ints >= 0."""
    try:
        if isinstance(prompt_seed, (bool, float, str, bytes)):
            raise TypeError
        return np.random.default_rng(prompt_seed)
    except (TypeError, ValueError):
        raise InvalidArgumentError(
            f"options['prompt_seed'] must be an int >= 0 or a list of them, got {prompt_seed!r}."
        ) from None
