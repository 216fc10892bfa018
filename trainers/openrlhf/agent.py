"""searchgym envs as OpenRLHF multi-turn agents (target: openrlhf 0.11.2).

OpenRLHF's :class:`~openrlhf.utils.agent.MultiTurnAgentExecutor` builds one agent instance
per sample, calls ``reset({"observation", "label"})`` once, then alternates vLLM
generation with ``step({"observation_text", "action_text", "label", "sampling_params"})``
until the step says ``done``. It sums the steps' ``rewards``, keeps the last step's
``scores`` and ``extra_logs``, and trains only on the generated tokens: the prompt and
every ``environment_feedback`` are masked out of the loss.

:class:`SearchGymAgentInstance` maps one searchgym episode onto that loop:

- ``reset``: the row's ``label`` (JSON ``{"id", "question", "golden_answers"}``, as
  ``searchgym prepare`` writes it) becomes ``env.reset(options=...)``; the observation
  (instructions, memory blocks when configured, question) is rendered as the first user
  turn with :class:`~searchgym.policies.chat.ChatFormatter`. The row's ``prompt`` is not
  used: the env renders the prompt, so memory can change it per episode.
- ``step``: ``env.step(action_text)`` runs in a thread (retrieval blocks; the step runs
  on the vLLM actor's event loop). The env's reward becomes ``rewards`` (0 until the last
  step, then the scheme's value, so the sum is the scheme's reward); the observation
  becomes the next user or tool turn with ``ChatFormatter.feedback``, the same text
  ``searchgym eval`` and the built-in trainer produce.
- ``extra_logs``: the same numeric keys (:data:`EXTRA_LOG_KEYS`) on every step of every
  sample, because OpenRLHF stacks them across samples.

:class:`SearchGymAgentExecutor` adds what the base executor lacks: the protocol's stop
strings with ``include_stop_str_in_output`` (the default sampling parameters have none),
OpenRLHF's tokenizer handed to the formatter, and an ending for episodes that run out of
token budget (the base loop then stops without a last step, so the executor ends the
episode as truncated and adds the scheme's reward for it). It also puts right what vLLM
hands back and what the base loop asks of it:

- End of sequence: OpenRLHF keeps special tokens in the text (``skip_special_tokens``
  off), and with ``include_stop_str_in_output`` on vLLM writes the EOS token's text into
  ``output.text`` when a turn ends at EOS (``...</answer><|im_end|>``, the usual ending
  of a SEM answer turn, which stops only at ``</search>``). The instance gives the env the
  action without the trailing special tokens, and when the chat template's next turn
  opens with the same token, the feedback leaves it out, so the tokens are still exactly
  the chat rendering.
- Tokens past a stop string: vLLM cuts the text at the stop string but keeps every token
  of the engine step (several with speculative decoding). :class:`TurnEngine` drops the
  tokens (and their logprobs) after the one that completes the stop string, and cuts that
  one back to the stop string's end when it runs past it (SmolLM2's ``>.``), so the
  sequence trained on matches the action the env parsed.
- The per-turn cap: the base loop sets ``max_tokens`` to the remaining context before
  every turn, which overrides ``--rollout.max_new_tokens``. :class:`TurnEngine` applies
  the ``max_tokens`` OpenRLHF first asked for to every turn (Light-Search: 512).
- Evaluation episodes (``--eval.dataset``, told apart by their sampling temperature, see
  :mod:`.eval_split`) are not written into the experience memory nor into the minimum
  tool-call store.
- A sample whose ``reset`` or ``step`` raises ends as a failed episode (logged, counted in
  ``extra_logs["failed"]``, the reward of a malformed turn), so one sample cannot end the
  run through OpenRLHF's ``asyncio.gather`` (see :mod:`searchgym.trainers.failures`). One that fails at
  ``reset`` generates a single token from the row's prompt, the sequence OpenRLHF trains.
"""

from __future__ import annotations

import asyncio
import contextvars
import copy
import os
import threading
from dataclasses import dataclass, field
from typing import Any

import torch
from openrlhf.utils.agent import AgentInstanceBase, MultiTurnAgentExecutor

from ...envs.records import Question
from ...envs.search_env import question_from_options
from ...error import SearchGymError
from ..agent_config import AGENT_CONFIG_VARIABLE, AgentConfig, agent_config_from_env, load_agent_config
from ..env_pool import env_pool
from ..episodes import EPISODE_METRIC_KEYS, label_to_options, trajectory_metrics
from ..episodes import end_truncated as _end_truncated
from ..eval_stores import keep_out_of_stores, put_back, stores_written
from ..failures import failure_counter, failure_reward
from .eval_split import EvalSign
from .turns import TurnEngine, split_end_of_sequence

__all__ = [
    "EXTRA_LOG_KEYS",
    "SearchGymAgentExecutor",
    "SearchGymAgentInstance",
    "TurnEngine",
    "label_to_options",
    "split_end_of_sequence",
    "with_stop_strings",
]

EXTRA_LOG_KEYS = EPISODE_METRIC_KEYS
"""The ``extra_logs`` keys of every step, all floats. OpenRLHF logs their batch means
(``train/f1``, ``train/num_searches`` ...; ``searched`` is SR, ``num_searches`` ST);
the TSAS hook reads ``num_searches`` and ``reasoning_steps``. ``episode_truncated`` is an
episode that ended without an answer (out of turns or of context); OpenRLHF's own
``truncated`` (the last generation hit ``max_tokens``) keeps its name. ``failed`` is a
sample whose ``reset`` or ``step`` raised (see :mod:`searchgym.trainers.failures`): ``train/failed`` is the
share of failed samples."""

_CONFIG_LOCK = threading.Lock()
_CONFIG_CACHE: dict[str, AgentConfig] = {}


def _config_from_env() -> AgentConfig:
    """The agent config of ``$SEARCHGYM_AGENT_CONFIG``, read once per process and file."""
    path = os.environ.get(AGENT_CONFIG_VARIABLE, "")
    with _CONFIG_LOCK:
        config = _CONFIG_CACHE.get(path)
        if config is None:
            config = _CONFIG_CACHE[path] = agent_config_from_env() if not path else load_agent_config(path)
        return config


def with_stop_strings(sampling_params: Any, stops: list[str]) -> Any:
    """A copy of vLLM ``sampling_params`` that also stops at ``stops`` and keeps the stop string.

    The stop strings already set are kept (first), and ``include_stop_str_in_output`` is
    turned on so that the action text ends with its closing tag, which the protocol
    needs to parse it.
    """
    params = copy.deepcopy(sampling_params)
    current = getattr(params, "stop", None)
    if current is None:
        existing: list[str] = []
    elif isinstance(current, str):
        existing = [current]
    else:
        existing = list(current)
    params.stop = existing + [s for s in stops if s not in existing]
    params.include_stop_str_in_output = True
    return params


def _formatter_for(tokenizer: Any) -> Any:
    from ...policies.chat import ChatFormatter

    return ChatFormatter(tokenizer)


@dataclass
class _Episode:
    """What one ``execute`` call shares with the instance it builds (through a context var)."""

    config: AgentConfig
    formatter: Any
    evaluating: bool = False
    engine: TurnEngine | None = None
    instances: list[SearchGymAgentInstance] = field(default_factory=list)


_EPISODE: contextvars.ContextVar[_Episode | None] = contextvars.ContextVar("searchgym_episode", default=None)


class SearchGymAgentInstance(AgentInstanceBase):
    """One searchgym episode behind OpenRLHF's agent-instance interface (see the module docstring).

    Built with no arguments, as OpenRLHF builds it. Inside :class:`SearchGymAgentExecutor`
    it uses the executor's config and tokenizer; on its own it reads
    ``$SEARCHGYM_AGENT_CONFIG`` and formats with ``agent.tokenizer`` (or plain text).
    """

    def __init__(self, *args: Any, **kwargs: Any):
        episode = _EPISODE.get()
        self._engine: TurnEngine | None = None
        self.evaluating = False
        """An evaluation episode: it writes nothing into the memory or the minimum tool-call store."""
        if episode is not None:
            self.config, self.formatter = episode.config, episode.formatter
            self.evaluating = episode.evaluating
            self._engine = episode.engine
            episode.instances.append(self)
        else:
            self.config = _config_from_env()
            self.formatter = _default_formatter(self.config)
        self._env: Any = None
        self._pool = env_pool(self.config)
        self.done = False
        self.total_reward = 0.0
        self._format_errors = 0
        self._retrieval_errors = 0
        self._memory_chars = 0
        self._final_logs: dict[str, float] | None = None
        self._restore: list[tuple[Any, str, Any]] = []
        self._lock = threading.Lock()
        self.failed = False
        """The sample failed (its reset or step raised) and ended as a failed episode."""
        self._question: Question | None = None
        self._started = False  # env.reset returned: the env's trajectory is this episode's
        self._unpaid = 0.0  # a failed reset's reward, paid by the step after its one token
        self._broken = False  # the env raised: closed, not lent again

    # -- OpenRLHF's interface ----------------------------------------------------------------

    async def reset(self, states: dict, **kwargs: Any) -> dict:
        """Start the episode of ``states["label"]``; returns the rendered first turn.

        When the label cannot be read or the env's ``reset`` raises, the sample ends as a
        failed episode (see :mod:`searchgym.trainers.failures`) and the first turn is the row's prompt, from
        which one token is generated.
        """
        self._env = await asyncio.to_thread(self._pool.acquire)  # a failure here is the run's
        if self.evaluating:
            self._restore = keep_out_of_stores(self._env)
        try:
            options = label_to_options(states.get("label"))
            self._question = question_from_options(options)
            observation, info = await asyncio.to_thread(self._env.reset, options=options)
        except Exception as exc:  # noqa: BLE001 - one sample's failure must not end the run
            self._unpaid = self._fail("reset", exc, states.get("label"))
            if self._engine is not None:
                self._engine.next_cap = 1
            prompt = states.get("observation")
            return {
                "observation": prompt if isinstance(prompt, str) and prompt else self.formatter.prompt("")
            }
        self._started = True
        self._memory_chars = sum(span[2] - span[1] for span in info.get("memory_spans", ()))
        return {"observation": self.formatter.prompt(observation)}

    async def step(self, states: dict, **kwargs: Any) -> dict:
        """Apply one generated action; returns OpenRLHF's step dict."""
        if self.done:  # after a failed reset; else the base executor never gets here
            reward, self._unpaid = self._unpaid, 0.0
            return self._result(reward, "", True)
        if self._env is None:
            raise SearchGymError("step() before reset(): OpenRLHF calls reset first; so must you.")
        text = states.get("action_text", "")
        action, ending = split_end_of_sequence(
            text if isinstance(text, str) else "", self.formatter.tokenizer
        )
        try:
            observation, reward, terminated, truncated, info = await asyncio.to_thread(self._env.step, action)
        except Exception as exc:  # noqa: BLE001 - one sample's failure must not end the run
            before = self.total_reward
            return self._result(self._fail("step", exc, states.get("label")) - before, "", True)
        self._format_errors += "error" in info
        self._retrieval_errors += "retrieval_error" in info
        self.total_reward += float(reward)
        if terminated or truncated:
            self._finish()
            return self._result(float(reward), "", True)
        feedback = self.formatter.feedback(observation)
        # what the model's own tokens already wrote (its EOS closing the turn, or a token past
        # the stop string) is not repeated, so the tokens stay the rendering of the episode
        said = self._engine.said if self._engine is not None else ending
        if said and feedback.startswith(said):
            feedback = feedback[len(said) :]
        return self._result(float(reward), feedback, False)

    # -- ending and logs -----------------------------------------------------------------------

    def _result(self, reward: float, feedback: str, done: bool) -> dict:
        return {
            "rewards": torch.tensor(reward, dtype=torch.float32),
            "scores": torch.tensor(self.total_reward, dtype=torch.float32),
            "environment_feedback": feedback,
            "done": done,
            "extra_logs": self.extra_logs(),
        }

    async def finish_truncated(self) -> float:
        """End a running episode as truncated (the token budget ran out); returns its reward.

        The reward scheme scores the trajectory as it stands, as the env does when
        ``max_turns`` runs out, and the memory wrapper's recording is done here too.
        """
        if self.done or self._env is None:
            return 0.0
        try:
            reward = await asyncio.to_thread(_end_truncated, self._env)
        except Exception as exc:  # noqa: BLE001 - one sample's failure must not end the run
            before = self.total_reward
            return self._fail("the ending of a truncated episode", exc, None) - before
        self.total_reward += reward
        self._finish()
        return reward

    def _finish(self) -> None:
        """Mark the episode done, keep its logs, and give the env back."""
        self.done = True
        self._final_logs = self.extra_logs()
        self.close()
        failure_counter("openrlhf").finished()

    def _fail(self, where: str, exc: Exception, label: object) -> float:
        """End the episode as failed (see :mod:`searchgym.trainers.failures`); returns its reward, now the total.

        Raises:
            SampleFailuresError: too many samples in a row have failed in this process.
        """
        reward = failure_reward(self._env, self._question, f"{type(exc).__name__}: {exc}")
        logs = self.extra_logs() if self._started else dict.fromkeys(EXTRA_LOG_KEYS, 0.0)
        logs.update(failed=1.0, format_ok=0.0, answered=0.0, episode_truncated=1.0)
        self.failed = self.done = self._broken = True
        self.total_reward = reward
        self._final_logs = logs
        self.close()
        failure_counter("openrlhf").failed(where, exc, label if label is not None else "", reward)
        return reward

    def extra_logs(self) -> dict[str, float]:
        """The :data:`EXTRA_LOG_KEYS` of the episode so far (or at its end), as floats."""
        if self._final_logs is not None:
            return dict(self._final_logs)
        base = getattr(self._env, "unwrapped", None)
        trajectory = getattr(base, "trajectory", None)
        if trajectory is None:
            values = dict.fromkeys(EXTRA_LOG_KEYS, 0.0)
            values["memory_chars"] = float(self._memory_chars)
            return values
        return {
            **trajectory_metrics(trajectory, self.done),
            "format_errors": float(self._format_errors),
            "retrieval_errors": float(self._retrieval_errors),
            "memory_chars": float(self._memory_chars),
            "failed": 0.0,
        }

    def close(self) -> None:
        """Give the env back to the pool (at the episode's end, and by the executor in any case)."""
        with self._lock:
            env, self._env = self._env, None
            restore, self._restore = self._restore, []
        if env is None:
            return
        put_back(restore)
        if not self._broken:
            self._pool.release(env)
            return
        try:  # an env that raised is not lent to another episode
            env.close()
        except Exception:  # noqa: BLE001 - closing a broken env must not fail the sample twice
            pass


def _default_formatter(config: AgentConfig) -> Any:
    if config.tokenizer is None:
        return _formatter_for(None)
    from ...policies.tiny import load_tokenizer  # the class the folder was saved with

    return _formatter_for(load_tokenizer(config.tokenizer))


class SearchGymAgentExecutor(MultiTurnAgentExecutor):
    """OpenRLHF's multi-turn executor with searchgym's stop strings, formatter and ending.

    Built with no arguments (OpenRLHF's loader does ``AgentExecutor()``). Each
    :meth:`execute` runs the base class's loop unchanged on a copy of the sampling
    parameters that stops at the protocol's closing tags, with the engine seen through
    a :class:`TurnEngine` (per-turn cap, no tokens past a stop string).

    Args:
        agent_instance_cls: The instance class (default :class:`SearchGymAgentInstance`).
        config: The agent config (default: read from ``$SEARCHGYM_AGENT_CONFIG`` on first use).
        eval_sign: How evaluation episodes are told apart (default: from the ``openrlhf``
            section of the ``$SEARCHGYM_AGENT_CONFIG`` file, OpenRLHF's defaults otherwise).
    """

    def __init__(
        self,
        agent_instance_cls: type[SearchGymAgentInstance] = SearchGymAgentInstance,
        config: AgentConfig | None = None,
        eval_sign: EvalSign | None = None,
    ):
        super().__init__(agent_instance_cls)
        self._config = config
        self._eval_sign = eval_sign
        self._protocol: Any = None

    @property
    def config(self) -> AgentConfig:
        """The agent config in use."""
        if self._config is None:
            self._config = _config_from_env()
        return self._config

    @property
    def eval_sign(self) -> EvalSign:
        """The training and evaluation temperatures of the run, checked against the stores it writes."""
        if self._eval_sign is None:
            path = os.environ.get(AGENT_CONFIG_VARIABLE, "")
            sign = EvalSign.from_run_file(path) if path else EvalSign()
            sign.check(stores_written(self.config))
            self._eval_sign = sign
        return self._eval_sign

    def stop_strings(self, formatter: Any) -> list[str]:
        """The protocol's stop strings, from the formatter (the same ones eval uses)."""
        if self._protocol is None:
            from ...envs.protocols import make_protocol

            self._protocol = make_protocol(self.config.env_kwargs.get("protocol", "search_r1"))
        return list(formatter.stop_strings(self._protocol))

    async def execute(
        self, prompt, label, sampling_params, max_length: int, hf_tokenizer, llm_engine, images=None
    ):
        """Run one episode with ``llm_engine``; returns OpenRLHF's sample dict."""
        config = self.config
        formatter = _formatter_for(hf_tokenizer)
        cap = getattr(sampling_params, "max_tokens", None)  # the base loop overwrites it every turn
        params = with_stop_strings(sampling_params, self.stop_strings(formatter))
        engine = TurnEngine(llm_engine, hf_tokenizer, cap if isinstance(cap, int) and cap > 0 else None)
        episode = _Episode(config, formatter, self.eval_sign.is_eval(sampling_params), engine)
        token = _EPISODE.set(episode)
        try:
            result = await super().execute(prompt, label, params, max_length, hf_tokenizer, engine, images)
            if episode.instances:
                instance = episode.instances[-1]
                if not instance.done:
                    extra = await instance.finish_truncated()
                    result["reward"] = float(result.get("reward") or 0.0) + extra
                    result["scores"] = instance.total_reward
                if instance.failed:  # its reward, whether or not the base loop reached a step
                    result["reward"] = result["scores"] = instance.total_reward
                result["extra_logs"] = instance.extra_logs()
            return result
        finally:
            _EPISODE.reset(token)
            for instance in episode.instances:
                instance.close()
