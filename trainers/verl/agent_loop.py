"""searchgym envs as a verl agent loop (target: verl 0.9.1).

verl's ``AgentLoopWorker`` builds one agent loop per row (``hydra.utils.instantiate`` of the
row's ``agent_name`` entry, with the keys of its agent-loop config file as keyword
arguments), awaits ``run(sampling_params, **row)`` and pads what it returns. Generation goes
through ``server_manager.generate(request_id, prompt_ids=..., sampling_params=...)``, which
answers with token ids, their log-probabilities and a stop reason (``completed`` for both a
stop and the length limit): tokens, not text.

:class:`SearchGymAgentLoop` (registered as ``searchgym``) runs one searchgym episode:

- The row's ``extra_info["label"]`` (or a ``label`` column: the JSON
  ``{"id", "question", "golden_answers"}`` that ``searchgym prepare`` writes) becomes
  ``env.reset(options=...)``; the observation is rendered as the first user turn with
  :class:`~searchgym.policies.chat.ChatFormatter` (the row's ``raw_prompt`` is not used:
  the env renders the prompt, so memory can change it per episode).
- Each turn asks for the protocol's stop strings; the tokens that come back are settled
  with :func:`searchgym.trainers.turns.settle_turn`, shared with the OpenRLHF backend:
  tokens past the stop string are dropped (a token that straddles it is cut back), and the
  action the env steps on is their text without the EOS. The feedback is
  ``ChatFormatter.feedback`` of the observation, without what the turn's own tokens
  already wrote (its EOS), so the tokens are exactly the chat rendering of the episode.
- Generated tokens get ``response_mask`` 1, feedback tokens 0 (out of the loss).
- ``reward_score`` is the sum of the env's rewards (the reward scheme's value at the end),
  which makes verl skip its reward loop; the episode's numbers (:data:`METRIC_KEYS`) are
  in ``extra_fields``, which verl puts in the batch's ``non_tensor_batch``.
- Evaluation rows, marked by ``extra_info["searchgym_eval"]`` (verl does not tell the loop
  it runs validation), write nothing into the experience memory or the minimum tool-call
  store.
- An episode that runs out of ``rollout.response_length`` (or of ``rollout.max_model_len``)
  ends as truncated (the scheme scores the trajectory as it stands). One that ends before
  its first token (no room, or the server aborted) gets the EOS token with mask 0, on which
  verl puts the score (``AgentLoopOutput.as_dict`` indexes the last response token).
- A row whose ``reset`` or ``step`` raises, or whose prompt is longer than
  ``rollout.prompt_length`` (:class:`PromptTooLongError`: verl would cut off its start), ends
  as a failed episode (one log line on ``searchgym.trainers.verl``, ``failed`` 1, the reward
  of a malformed turn), so one row cannot end the run.

Envs are built once per process and reused (:mod:`searchgym.trainers.env_pool`,
shared with the OpenRLHF backend); the memory is one object per store folder.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
import time
from collections.abc import Mapping
from typing import Any
from uuid import uuid4

from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopMetrics, AgentLoopOutput, register

from ...envs.search_env import question_from_options
from ...error import InvalidArgumentError
from ..agent_config import AGENT_CONFIG_VARIABLE, AgentConfig, load_agent_config
from ..env_pool import env_pool
from ..episodes import EPISODE_METRIC_KEYS, end_truncated, label_to_options, trajectory_metrics
from ..eval_stores import keep_out_of_stores, put_back
from ..failures import failure_counter, failure_reward
from ..turns import settle_turn

__all__ = [
    "EVAL_MARKER",
    "METRIC_KEYS",
    "PromptTooLongError",
    "SearchGymAgentLoop",
    "is_eval_row",
    "row_label",
]

logger = logging.getLogger(__name__)

EVAL_MARKER = "searchgym_eval"
"""The ``extra_info`` key that marks an evaluation row (true): its episode writes nothing
into the experience memory or the minimum tool-call store."""

METRIC_KEYS = EPISODE_METRIC_KEYS
"""The ``extra_fields`` numbers of every episode (floats), the same keys as the OpenRLHF
agent's ``extra_logs``; the TSAS estimator reads ``num_searches`` and ``reasoning_steps``."""

_CONFIGS: dict[str, AgentConfig] = {}
_CONFIG_LOCK = threading.Lock()


def _plain(value: Any) -> Any:
    """A numpy scalar or 0-d object array (how verl hands row fields over) as a plain value."""
    item = getattr(value, "item", None)
    if callable(item) and getattr(value, "shape", None) == ():
        return item()
    return value


def row_label(row: Mapping[str, Any]) -> Any:
    """The searchgym label of a verl row: its ``extra_info["label"]``, else its ``label`` column.

    Raises:
        InvalidArgumentError: the row has neither (the message says how to write the file).
    """
    extra = _plain(row.get("extra_info"))
    if isinstance(extra, Mapping) and extra.get("label") is not None:
        return extra["label"]
    if row.get("label") is not None:
        return _plain(row["label"])
    raise InvalidArgumentError(
        "A searchgym row needs its question: extra_info.label (or a label column) holding "
        '{"id", "question", "golden_answers"}. Write the parquet files with '
        "`python -m searchgym.trainers.verl.data`."
    )


def is_eval_row(row: Mapping[str, Any]) -> bool:
    """Whether a verl row is an evaluation row (``extra_info["searchgym_eval"]`` true)."""
    extra = _plain(row.get("extra_info"))
    return isinstance(extra, Mapping) and bool(_plain(extra.get(EVAL_MARKER, False)))


def _agent_config(run_file: str | None) -> AgentConfig:
    path = run_file or os.environ.get(AGENT_CONFIG_VARIABLE)
    if not path:
        raise InvalidArgumentError(
            "The searchgym agent loop needs its run file: give run_file in the agent-loop config "
            f"(searchgym train --backend verl writes it) or set ${AGENT_CONFIG_VARIABLE}."
        )
    with _CONFIG_LOCK:
        config = _CONFIGS.get(path)
        if config is None:
            config = _CONFIGS[path] = load_agent_config(path)
        return config


@register("searchgym")
class SearchGymAgentLoop(AgentLoopBase):
    """One searchgym episode as a verl agent loop (see the module docstring).

    Args:
        *args: verl's (``trainer_config``, ``server_manager``, ``tokenizer``, ...).
        run_file: The run file whose ``env``, ``memory`` and ``advantage`` sections the loop
            builds (default: ``$SEARCHGYM_AGENT_CONFIG``).
        agent_config: The agent config itself (instead of ``run_file``).
        max_turn_tokens: The most tokens one turn may generate (default: no cap below the
            rest of ``rollout.response_length``).
        **kwargs: verl's keyword arguments (``tools`` is ignored: the env is the tool).
    """

    def __init__(
        self,
        *args: Any,
        run_file: str | None = None,
        agent_config: AgentConfig | None = None,
        max_turn_tokens: int | None = None,
        **kwargs: Any,
    ):
        kwargs.pop("tools", None)
        super().__init__(*args, **kwargs)
        self.agent_config = agent_config if agent_config is not None else _agent_config(run_file)
        self.response_length = int(self.rollout_config.response_length)
        self.prompt_length = int(self.rollout_config.prompt_length)
        context = getattr(self.rollout_config, "max_model_len", None)
        self.max_model_len = None if context is None else int(context)
        self.max_turn_tokens = max_turn_tokens
        from ...envs.protocols import make_protocol
        from ...policies.chat import ChatFormatter

        self.formatter = ChatFormatter(self.tokenizer)
        self.stops = list(self.formatter.stop_strings(make_protocol(self.agent_config.protocol)))

    def _encode(self, text: str) -> list[int]:
        tokenizer: Any = self.tokenizer
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        """Run one episode of the row ``kwargs``; returns verl's :class:`AgentLoopOutput`."""
        episode = _Episode(self, sampling_params, kwargs)
        try:
            return await episode.play()
        finally:
            episode.close()


class PromptTooLongError(InvalidArgumentError):
    """The env's first prompt does not fit in ``rollout.prompt_length``.

    verl would keep only its last tokens (the instructions lost), so the tokens trained on
    would not be the prompt the env wrote; the row ends as a failed episode instead.
    """

    def __init__(self, tokens: int, loop: SearchGymAgentLoop, memory_chars: int):
        memory = f" ({memory_chars} characters of it are memory blocks)" if memory_chars else ""
        super().__init__(
            f"the env's prompt is {tokens} tokens{memory}, over rollout.prompt_length="
            f"{loop.prompt_length}; raise data.max_prompt_length (rollout.prompt_length follows it)"
            + (" or give the memory fewer characters" if memory_chars else "")
            + ". The row is a failed episode."
        )


class _Episode:
    """The state of one :meth:`SearchGymAgentLoop.run`."""

    def __init__(self, loop: SearchGymAgentLoop, sampling_params: dict[str, Any], row: dict[str, Any]):
        self.loop, self.row = loop, row
        self.params = {
            **sampling_params,
            "stop": list(dict.fromkeys([*(sampling_params.get("stop") or []), *loop.stops])),
            "include_stop_str_in_output": True,
        }
        self.evaluating = is_eval_row(row)
        self.pool = env_pool(loop.agent_config)
        self.env: Any = None
        self.restore: list[tuple[Any, str, Any]] = []
        self.broken = False
        self.prompt_ids: list[int] = []
        self.response_ids: list[int] = []
        self.mask: list[int] = []
        self.logprobs: list[float] | None = [] if sampling_params.get("logprobs") else None
        self.total_reward = 0.0
        self.done = False
        self.format_errors = self.retrieval_errors = self.memory_chars = 0
        self.failed = False
        self.question: Any = None
        self.timing = {"generate_sequences": 0.0, "tool_calls": 0.0}
        self.request_id = uuid4().hex
        self.global_steps: Any = None  # the rollout server's training step (verl's extra_fields)

    async def play(self) -> AgentLoopOutput:
        loop = self.loop
        self.env = await asyncio.to_thread(self.pool.acquire)
        if self.evaluating:
            self.restore = keep_out_of_stores(self.env)
        try:
            options = label_to_options(row_label(self.row))
            self.question = question_from_options(options)
            observation, info = await asyncio.to_thread(self.env.reset, options=options)
        except Exception as exc:  # noqa: BLE001 - one row's failure must not end the run
            self.broken = True
            return await self._failed_row("reset", exc)
        self.memory_chars = sum(span[2] - span[1] for span in info.get("memory_spans", ()))
        prompt_ids = loop._encode(loop.formatter.prompt(observation))
        if len(prompt_ids) > loop.prompt_length:  # verl would cut its left end: not the env's prompt
            return await self._failed_row(
                "the prompt", PromptTooLongError(len(prompt_ids), loop, self.memory_chars)
            )
        self.prompt_ids = prompt_ids
        while not self.done:
            room = self._room()
            if room < 1:
                await self._truncate()
                break
            turn = await self._generate(room)
            if turn is None:  # aborted by the server: the episode ends as it stands
                await self._truncate()
                break
            try:
                started = time.perf_counter()
                observation, reward, terminated, truncated, info = await asyncio.to_thread(
                    self.env.step, turn.action
                )
                self.timing["tool_calls"] += time.perf_counter() - started
            except Exception as exc:  # noqa: BLE001 - one row's failure must not end the run
                self._fail("step", exc)
                break
            self.format_errors += "error" in info
            self.retrieval_errors += "retrieval_error" in info
            self.total_reward += float(reward)
            if terminated or truncated:
                self.done = True
                break
            feedback = loop.formatter.feedback(observation)
            if turn.said and feedback.startswith(turn.said):
                feedback = feedback[len(turn.said) :]
            feedback_ids = loop._encode(feedback)
            if self._room(len(feedback_ids)) < 1:
                await self._truncate()  # no room left to answer the feedback
                break
            self._append(feedback_ids, None, generated=False)
        return self._output()

    def _room(self, more: int = 0) -> int:
        """Tokens the next turn may generate after ``more`` tokens of feedback: what is left of
        ``rollout.response_length`` and, when ``rollout.max_model_len`` is set, of the context
        (verl's server refuses a request with no room left in it)."""
        loop, used = self.loop, len(self.response_ids) + more
        room = loop.response_length - used
        if loop.max_model_len is not None:
            room = min(room, loop.max_model_len - len(self.prompt_ids) - used)
        return room

    async def _generate(self, room: int) -> Any:
        loop = self.loop
        cap = room if loop.max_turn_tokens is None else min(room, loop.max_turn_tokens)
        started = time.perf_counter()
        output = await loop.server_manager.generate(
            request_id=self.request_id,
            prompt_ids=self.prompt_ids + self.response_ids,
            sampling_params={**self.params, "max_tokens": cap},
        )
        self.timing["generate_sequences"] += time.perf_counter() - started
        self.global_steps = output.extra_fields.get("global_steps", self.global_steps)
        if output.stop_reason == "aborted" and not output.token_ids:
            return None
        logprobs = output.log_probs if self.logprobs is not None else None
        turn = settle_turn(output.token_ids, logprobs, self.params["stop"], loop.tokenizer)
        self._append(turn.token_ids, turn.logprobs, generated=True)
        return turn

    def _append(self, ids: list[int], logprobs: list[float] | None, generated: bool) -> None:
        self.response_ids += ids
        self.mask += [1 if generated else 0] * len(ids)
        if self.logprobs is not None:
            self.logprobs += list(logprobs) if logprobs is not None else [0.0] * len(ids)

    async def _truncate(self) -> None:
        if self.done:
            return
        try:
            reward = await asyncio.to_thread(end_truncated, self.env)
        except Exception as exc:  # noqa: BLE001 - one row's failure must not end the run
            self._fail("the ending of a truncated episode", exc)
            return
        self.total_reward += reward
        self.done = True

    async def _failed_row(self, where: str, exc: Exception) -> AgentLoopOutput:
        """A row that cannot play (its reset raised, its prompt is too long): one token from its
        raw prompt, and the failure's reward."""
        loop = self.loop
        self._fail(where, exc, broken=self.broken)
        messages = list(_plain(self.row.get("raw_prompt")) or [{"role": "user", "content": ""}])
        tokenizer: Any = loop.tokenizer
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        self.prompt_ids = loop._cap_text_prompt_length(
            loop._encode(text if isinstance(text, str) else text[0])
        )
        output = await loop.server_manager.generate(
            request_id=self.request_id,
            prompt_ids=self.prompt_ids,
            sampling_params={**self.params, "max_tokens": 1},
        )
        self._append(list(output.token_ids)[:1], (output.log_probs or [0.0])[:1], generated=True)
        return self._output()

    def _fail(self, where: str, exc: Exception, broken: bool = True) -> None:
        """End the episode as failed; ``broken``: the env raised and is not lent again."""
        reward = failure_reward(self.env, self.question, f"{type(exc).__name__}: {exc}")
        self.failed = self.done = True
        self.broken = self.broken or broken
        self.total_reward = reward
        label = self.row.get("extra_info")
        failure_counter("verl").failed(where, exc, json.dumps(_plain(label), default=str)[:200], reward)

    def metrics(self) -> dict[str, float]:
        """The :data:`METRIC_KEYS` of the episode."""
        trajectory = getattr(getattr(self.env, "unwrapped", None), "trajectory", None)
        values = dict.fromkeys(METRIC_KEYS, 0.0)
        if trajectory is not None and not self.failed:
            values.update(trajectory_metrics(trajectory, self.done))
        values.update(
            format_errors=float(self.format_errors),
            retrieval_errors=float(self.retrieval_errors),
            memory_chars=float(self.memory_chars),
            failed=float(self.failed),
        )
        if self.failed:
            values.update(format_ok=0.0, answered=0.0, episode_truncated=1.0)
        return values

    def _output(self) -> AgentLoopOutput:
        limit = self.loop.response_length
        metrics = self.metrics()
        if not self.response_ids:  # verl puts the score on the last response token: give it one
            tokenizer: Any = self.loop.tokenizer
            self._append([int(tokenizer.eos_token_id)], None, generated=False)
        if not self.failed:
            failure_counter("verl").finished()
        return AgentLoopOutput(
            prompt_ids=self.prompt_ids,
            response_ids=self.response_ids[:limit],
            response_mask=self.mask[:limit],
            response_logprobs=None if self.logprobs is None else self.logprobs[:limit],
            reward_score=self.total_reward,
            num_turns=1 + 2 * int(metrics["turns"]),
            metrics=AgentLoopMetrics(**self.timing, num_preempted=-1),
            extra_fields={
                **metrics,
                EVAL_MARKER: self.evaluating,
                "global_steps": self.global_steps,
                "turn_scores": [],
                "tool_rewards": [],
            },
        )

    def close(self) -> None:
        env, self.env = self.env, None
        restore, self.restore = self.restore, []
        if env is None:
            return
        put_back(restore)
        if not self.broken:
            self.pool.release(env)
            return
        try:  # an env that raised is not lent to another episode
            env.close()
        except Exception:  # noqa: BLE001 - closing a broken env must not fail the row twice
            pass
