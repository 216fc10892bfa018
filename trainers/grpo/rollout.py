"""Multi-turn rollouts through searchgym envs, as token sequences with action masks.

An episode becomes one token sequence::

    prompt | action 1 | feedback 1 | action 2 | feedback 2 | … | action n
      0        1          0            1          0                1        ← action mask

* ``prompt`` is the env's first observation rendered by
  :class:`~searchgym.policies.chat.ChatFormatter` (the chat template's first user turn and
  generation prompt). With experience memory it holds the wrapper's experience and
  few-shot blocks (``info["memory_spans"]``).
* ``action`` tokens are the ones the policy sampled, kept as sampled (never re-tokenised):
  the only tokens the loss trains on.
* ``feedback`` is ``ChatFormatter.feedback(observation)``: the end of the assistant turn,
  the retrieved documents (or an error, or HiExp's hints) as a user turn, and the opening
  of the next assistant turn. It is environment text, masked out of the loss.

All episodes of a step run side by side: at each turn the contexts of the running
episodes are sampled from in batches, each action goes to its env, and the episodes that
go on get their feedback appended. An episode whose context reaches ``max_context_tokens``
(or whose next feedback would leave no room for an action) has its remaining turns taken as
empty actions (format errors), so that the env ends and scores it as usual; its tokens never
exceed the budget.

A sampler that takes ``turn_caches`` (as :func:`~.generation.sample_actions` does) gets one
:class:`~searchgym.policies.turn_cache.TurnCache` per episode, so each turn encodes only the
tokens its episode has not encoded yet; an episode's cache is dropped when it ends.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import gymnasium as gym
import torch

from ...envs.records import Trajectory
from ...policies.chat import ChatFormatter
from ...policies.turn_cache import TurnCache
from .generation import Sampled, SamplingSettings, sample_actions

__all__ = ["Segment", "Episode", "RolloutCollector", "group_prefix_lengths", "locate_spans"]


@dataclass(frozen=True)
class Segment:
    """A stretch of an episode's tokens: ``token_ids[start:end]``.

    Attributes:
        kind: ``"prompt"``, ``"action"`` or ``"feedback"``.
        start: First token.
        end: One past the last token.
        text: The text of the segment (for an action: as the env received it).
        memory_spans: Character spans, within ``text``, of blocks the memory wrapper added
            (experience, example, hint).
    """

    kind: Literal["prompt", "action", "feedback"]
    start: int
    end: int
    text: str
    memory_spans: tuple[tuple[int, int], ...] = ()


@dataclass
class Episode:
    """One finished rollout.

    Attributes:
        question_index: Index of the question in the env's ``questions``.
        group: The group (question of the step) this rollout belongs to.
        token_ids: Prompt, actions and feedback, in order.
        action_mask: 1 on the tokens the policy sampled, 0 on prompt and feedback tokens.
        segments: The stretches of ``token_ids``, in order.
        reward: The env's terminal reward.
        info: The env's ``info`` after the last step.
        trajectory: The env's trajectory record (``env.unwrapped.trajectory``).
        context_exhausted: The context budget ran out before the episode ended.
        retrieval_errors: Steps whose search failed (``info["retrieval_error"]``).
    """

    question_index: int
    group: int
    token_ids: list[int] = field(default_factory=list)
    action_mask: list[int] = field(default_factory=list)
    segments: list[Segment] = field(default_factory=list)
    reward: float = 0.0
    info: dict[str, Any] = field(default_factory=dict)
    trajectory: Trajectory | None = None
    context_exhausted: bool = False
    retrieval_errors: int = 0

    @property
    def prompt_tokens(self) -> int:
        """Tokens of the prompt."""
        return self.segments[0].end if self.segments else 0

    @property
    def action_tokens(self) -> int:
        """Tokens the policy sampled (the trained tokens)."""
        return sum(self.action_mask)

    def actions(self) -> list[str]:
        """The action texts, in order."""
        return [s.text for s in self.segments if s.kind == "action"]

    def _append(
        self, kind: Literal["prompt", "action", "feedback"], ids: Sequence[int], text: str, spans: tuple
    ) -> None:
        start = len(self.token_ids)
        self.token_ids.extend(int(i) for i in ids)
        self.action_mask.extend([1 if kind == "action" else 0] * len(ids))
        self.segments.append(Segment(kind, start, len(self.token_ids), text, spans))


def locate_spans(rendered: str, observation: str, spans: Sequence[Any]) -> tuple[tuple[int, int], ...]:
    """Move character spans of ``observation`` into ``rendered``, the chat text that contains it.

    The chat formatter strips the observation inside its turn; spans are shifted to where
    the stripped observation sits in ``rendered``. Returns ``()`` when it is not there.
    """
    if not spans:
        return ()
    stripped = observation.strip()
    lead = len(observation) - len(observation.lstrip())
    at = rendered.find(stripped)
    if at < 0:
        return ()
    out = []
    for span in spans:
        start, end = int(span[-2]), int(span[-1])  # a MemorySpan (kind, start, end) or a pair
        out.append((at + start - lead, at + end - lead))
    return tuple(out)


def group_prefix_lengths(episodes: Sequence[Episode]) -> list[int]:
    """Per episode, how many leading prompt tokens every episode of its group shares: the
    whole prompt when the group's prompts are equal (one question; with memory and
    ``example_per: group``, one experience block and example), else their common start
    (with ``example_per: rollout``, the instructions and experience before each rollout's
    own example)."""
    prompts: dict[int, list[list[int]]] = {}
    for ep in episodes:
        prompts.setdefault(ep.group, []).append(ep.token_ids[: ep.prompt_tokens])
    common = {}
    for group, rows in prompts.items():
        length = min(len(r) for r in rows)
        for row in rows[1:]:
            length = next((k for k in range(length) if row[k] != rows[0][k]), length)
        common[group] = length
    return [common[ep.group] for ep in episodes]


class RolloutCollector:
    """Runs groups of episodes of one env with a transformers policy (see the module docstring).

    Args:
        make_env: Builds one env (with its wrappers); called as more envs are needed.
        model: The policy, a transformers causal LM.
        tokenizer: Its tokenizer.
        formatter: The chat formatter (prompt, feedback, stop strings).
        max_new_tokens: Tokens per action at most.
        max_context_tokens: Tokens per episode at most.
        sampling: Temperature, top-p and generation batch size.
        sampler: The sampling function (default :func:`~.generation.sample_actions`); any
            function with its signature can stand in, e.g. to script actions in a test. A
            sampler that takes ``prefix_lengths`` gets :func:`group_prefix_lengths`, so the
            rollouts of a group encode the prompt they share once; one that takes
            ``turn_caches`` gets each episode's key/value cache (see the module docstring).
        group_prompt_seeds: Reset every env of a group with the same ``prompt_seed``
            option, so a memory wrapper draws one few-shot example for the whole group.
    """

    def __init__(
        self,
        make_env: Callable[[], gym.Env],
        model: Any,
        tokenizer: Any,
        formatter: ChatFormatter,
        *,
        max_new_tokens: int,
        max_context_tokens: int,
        sampling: SamplingSettings,
        sampler: Callable[..., list[Sampled]] = sample_actions,
        group_prompt_seeds: bool = False,
    ):
        self.make_env = make_env
        self.model = model
        self.tokenizer = tokenizer
        self.formatter = formatter
        self.max_new_tokens = max_new_tokens
        self.max_context_tokens = max_context_tokens
        self.sampling = sampling
        self.sampler = sampler
        self.group_prompt_seeds = group_prompt_seeds
        self.envs: list[gym.Env] = []
        self._stops: list[str] | None = None

    def env(self, i: int) -> gym.Env:
        """Env number ``i`` (built on first use)."""
        while len(self.envs) <= i:
            self.envs.append(self.make_env())
        return self.envs[i]

    @property
    def stop_strings(self) -> list[str]:
        """The stop strings of the env's protocol."""
        if self._stops is None:
            base: Any = self.env(0).unwrapped
            protocol = base.protocol
            self._stops = list(self.formatter.stop_strings(protocol))
        return self._stops

    def _encode(self, text: str, prompt: bool) -> list[int]:
        special = prompt and not self.formatter.uses_template
        return list(self.tokenizer(text, add_special_tokens=special)["input_ids"])

    def collect(self, question_indices: Sequence[int], group_size: int, seed: int) -> list[Episode]:
        """``group_size`` episodes of each question, group after group.

        Env ``i`` (episode ``i`` of the step) is reset with seed ``seed + i`` (and, with
        ``group_prompt_seeds``, ``prompt_seed = [seed, group]``); sampling is seeded with
        ``seed`` in a forked RNG, so a call's result depends on its arguments and the model
        only.
        """
        episodes: list[Episode] = []
        envs: list[gym.Env] = []
        for g, q in enumerate(question_indices):
            for _ in range(group_size):
                i = len(episodes)
                env = self.env(i)
                options: dict[str, Any] = {"index": int(q)}
                if self.group_prompt_seeds:
                    options["prompt_seed"] = [seed, g]
                obs, info = env.reset(seed=seed + i, options=options)
                ep = Episode(question_index=int(q), group=g)
                prompt = self.formatter.prompt(obs)
                spans = locate_spans(prompt, obs, info.get("memory_spans", ()))
                ep._append("prompt", self._encode(prompt, prompt=True), prompt, spans)
                episodes.append(ep)
                envs.append(env)
        devices = (
            [self.model.device.index or 0]
            if getattr(self.model, "device", None) is not None and self.model.device.type == "cuda"
            else []
        )
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(seed)
            self._run(episodes, envs)
        return episodes

    def _run(self, episodes: list[Episode], envs: list[gym.Env]) -> None:
        shared = group_prefix_lengths(episodes)
        takes = inspect.signature(self.sampler).parameters
        caches = [TurnCache() for _ in episodes] if "turn_caches" in takes else None
        active = list(range(len(episodes)))
        stops = self.stop_strings
        while active:
            room = {i: self.max_context_tokens - len(episodes[i].token_ids) for i in active}
            full = [i for i in active if room[i] < 1]
            for i in full:
                self._exhaust(episodes[i], envs[i])
                if caches is not None:
                    caches[i].clear()
            todo = [i for i in active if room[i] >= 1]
            sampled: list[Sampled] = []
            if todo:
                extra: dict[str, Any] = {}
                if "prefix_lengths" in takes:
                    extra["prefix_lengths"] = [shared[i] for i in todo]
                if caches is not None:
                    extra["turn_caches"] = [caches[i] for i in todo]
                sampled = self.sampler(
                    self.model,
                    self.tokenizer,
                    [episodes[i].token_ids for i in todo],
                    [min(self.max_new_tokens, room[i]) for i in todo],
                    stops,
                    self.sampling,
                    **extra,
                )
            still = []
            for i, action in zip(todo, sampled, strict=True):
                if self._step(episodes[i], envs[i], action):
                    still.append(i)
                elif caches is not None:
                    caches[i].clear()  # the episode ended: free its keys and values
            active = still

    def _step(self, ep: Episode, env: gym.Env, action: Sampled) -> bool:
        """Send one action; append it (and the feedback). True while the episode goes on."""
        ep._append("action", action.ids, action.text, ())
        obs, reward, terminated, truncated, info = env.step(action.text)
        ep.retrieval_errors += int("retrieval_error" in info)
        if terminated or truncated:
            self._finish(ep, env, reward, info)
            return False
        feedback = self.formatter.feedback(obs)
        if action.finish == "eos" and action.ids:
            # The sampled end-of-turn token already closed the assistant turn.
            eos_text = self.tokenizer.convert_ids_to_tokens(action.ids[-1])
            if isinstance(eos_text, str) and feedback.startswith(eos_text):
                feedback = feedback[len(eos_text) :]
        ids = self._encode(feedback, prompt=False)
        if len(ep.token_ids) + len(ids) >= self.max_context_tokens:
            # no room for the feedback and a next action: the budget ends the episode here
            self._exhaust(ep, env)
            return False
        spans = locate_spans(feedback, obs, info.get("memory_spans", ()))
        ep._append("feedback", ids, feedback, spans)
        return True

    def _exhaust(self, ep: Episode, env: gym.Env) -> None:
        """The context is full: end the episode with empty (malformed) actions."""
        ep.context_exhausted = True
        while True:
            obs, reward, terminated, truncated, info = env.step("")
            if terminated or truncated:
                self._finish(ep, env, reward, info)
                return

    @staticmethod
    def _finish(ep: Episode, env: gym.Env, reward: Any, info: dict[str, Any]) -> None:
        base: Any = env.unwrapped
        ep.reward = float(reward)
        ep.info = dict(info)
        ep.trajectory = base.trajectory

    def close(self) -> None:
        """Close every env."""
        for env in self.envs:
            env.close()
        self.envs.clear()
