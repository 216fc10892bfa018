"""The search-QA environment: retrieval in ``step``, a reward scheme at the end."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from numbers import Integral
from typing import Any, TypedDict

import gymnasium as gym

from ..checks import check_int, check_string
from ..error import InvalidArgumentError, SearchGymError, keyword_checked
from ..retrieval import Retriever, search_with_cache
from ..retrieval.records import Doc
from .protocols import Protocol, make_protocol
from .records import Action, Question, Trajectory, Turn
from .rewards import RewardScheme, make_reward
from .spaces import AnyText

__all__ = [
    "EpisodeOptions",
    "SearchQAEnv",
    "check_retriever_kwargs",
    "question_from_options",
    "takes_episode_options",
]


def question_from_options(options: Mapping[str, Any]) -> Question:
    """Build a :class:`Question` from ``reset(options={"question", "golden_answers", "id"})``."""
    text, golds = options.get("question"), options.get("golden_answers")
    text = check_string("options['question']", text)
    if isinstance(golds, str):
        golds = [golds]
    if not isinstance(golds, (list, tuple)) or not golds or not all(isinstance(g, str) for g in golds):
        raise InvalidArgumentError(
            f"options['golden_answers'] must be a non-empty list of str, got {golds!r}."
        )
    qid = options.get("id", "custom")
    return Question(id=str(qid), question=text, golden_answers=tuple(golds))


def check_retriever_kwargs(retriever: object, retriever_kwargs: object) -> dict[str, Any]:
    """A copy of an env's ``retriever_kwargs``, checked: a dict, and only for a backend name."""
    if retriever_kwargs is None:
        return {}
    if not isinstance(retriever_kwargs, Mapping):
        raise InvalidArgumentError(f"retriever_kwargs must be a dict, got {retriever_kwargs!r:.80}.")
    if isinstance(retriever, Retriever) and retriever_kwargs:
        raise InvalidArgumentError(
            f"retriever_kwargs={dict(retriever_kwargs)!r:.80} only applies to a backend name; the retriever "
            f"given is already built ({type(retriever).__name__}). Configure it before passing it."
        )
    return dict(retriever_kwargs)


class _RunningTotals:
    """The figures ``info`` reports, kept up to date one finished turn at a time."""

    __slots__ = ("queries", "retrieved_ids", "format_ok", "reasoning_steps", "action_chars")

    def __init__(self) -> None:
        self.queries: list[str | None] = []
        self.retrieved_ids: list[list[str]] = []
        self.format_ok = True
        self.reasoning_steps = 0
        self.action_chars = 0

    def add(self, turn: Turn) -> None:
        action = turn.action
        if action.kind == "search":
            self.queries.append(action.query)
            self.retrieved_ids.append([d.id for d in turn.docs])
        self.format_ok = self.format_ok and action.format_ok
        self.reasoning_steps += action.think_blocks
        self.action_chars += len(turn.action_text)


class SearchQAEnv(gym.Env[str, str]):
    """A question-answering episode in which the policy may call a search tool.

    ## Description
    At ``reset`` the env picks a question and returns the protocol's instructions followed
    by the question. Each ``step`` reads one action string under the protocol: a search
    runs the retriever and returns the top-``topk`` documents; an answer ends the episode
    and the reward scheme scores the whole trajectory.

    ## Action Space
    ``AnyText``: any string. Only the policy's own action text is parsed; tags inside
    retrieved documents or the question are neutralised and never count as actions.

    ## Observation Space
    ``AnyText``: the *new* text of this step: the prompt at ``reset``, then the formatted
    documents after a search, or a format-error message after a malformed action. A policy
    keeps the running context itself (``context += action + observation``).

    ## Rewards
    0 on every non-final step. On the final step (answered, or truncated) the reward of
    the chosen scheme (``reward=``), a pure function of the trajectory record. Format
    penalties for malformed turns are part of that final reward, so a trainer summing the
    step rewards gets exactly the scheme's value.

    ## Episode End
    Terminated when the policy answers. Truncated after ``max_turns`` actions without an
    answer, or when the policy asks for a search after ``max_searches`` searches (that
    search is refused, not run). A malformed action does not end the episode; it uses up
    a turn and sets ``info["error"]``.

    ## Info
    After ``reset`` and every step: ``question_id``, ``num_searches``, ``queries``,
    ``retrieved_ids`` (one list per search), ``answer`` (None until answered), ``em``,
    ``f1``, ``cover_em`` (of the answer so far), ``format_ok`` (all turns well formed),
    ``turn`` (actions taken), ``reasoning_steps`` (``<think>`` blocks so far),
    ``action_chars``; ``known`` and ``hops`` where the dataset has them; ``error`` after a
    malformed or refused action; ``retrieval_error`` when the retriever failed (the
    observation then says so and the episode goes on). The env keeps these figures as
    running totals, so a step costs the same at turn 300 as at turn 4 (bar copying the two
    lists, which each step's ``info`` gets as its own snapshot).

    ## Arguments
    questions: the questions to draw from (subclasses load them from files).
    protocol: a protocol name (``search_r1``, ``research``, ``tool_call``, ``sem``) or object.
    reward: a reward-scheme name (``em``, ``f1``, ``otc``, ``lightsearcher``, ``sem``,
        ``cost``) or a :class:`RewardScheme`; ``reward_kwargs`` go to its constructor.
    retriever: a :class:`Retriever` object (subclasses also accept a backend name).
    topk: documents per search (default 3). max_turns: actions per episode (default 4).
    max_searches: searches per episode (default None: bounded by ``max_turns``).
    instructions: text that replaces the protocol's instructions in the prompt (default
        None: the protocol's own), e.g. a brief one for a tiny model.

    ## Version History
    * v1: an action with nested tags or nested boxes (a protocol tag inside a search or
          answer block, an action inside ``<think>``, ``\\boxed{}`` in ``\\boxed{}``) and a
          search query without a letter or digit are malformed (``info["error"]``), never
          searched for; under ``sem`` the model may search again after its first answer.
    * v0: initial version.
    """

    metadata = {"render_modes": ["ansi"], "render_fps": 1}

    @keyword_checked
    def __init__(
        self,
        questions: Sequence[Question],
        retriever: Retriever,
        *,
        protocol: str | Protocol = "search_r1",
        reward: str | RewardScheme = "f1",
        reward_kwargs: Mapping[str, Any] | None = None,
        topk: int = 3,
        max_turns: int = 4,
        max_searches: int | None = None,
        render_mode: str | None = None,
        instructions: str | None = None,
    ):
        if not questions:
            raise InvalidArgumentError("questions is empty: give at least one question.")
        if not isinstance(retriever, Retriever):
            raise InvalidArgumentError(f"retriever must be a Retriever, got {type(retriever).__name__}.")
        if reward_kwargs is not None and not isinstance(reward_kwargs, Mapping):
            raise InvalidArgumentError(f"reward_kwargs must be a dict, got {reward_kwargs!r}.")
        if render_mode not in (None, "ansi"):
            raise InvalidArgumentError(f"render_mode must be None or 'ansi', got {render_mode!r}.")
        self.questions = list(questions)
        self.retriever = retriever
        self.protocol = make_protocol(protocol)
        self.reward_scheme = make_reward(reward, **dict(reward_kwargs or {}))
        self.topk = check_int("topk", topk, 1)
        self.max_turns = check_int("max_turns", max_turns, 1)
        self.max_searches = check_int("max_searches", max_searches, 0, optional=True)
        self.render_mode = render_mode
        self.instructions = check_string("instructions", instructions, optional=True)
        self.observation_space = AnyText()
        self.action_space = AnyText()
        self.trajectory: Trajectory | None = None
        self._done = True
        self._transcript: list[str] = []
        self._totals = _RunningTotals()

    # -- Gymnasium API -------------------------------------------------------------------

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        question = self._choose_question(options)
        self.trajectory = Trajectory(question=question, protocol=self.protocol.name)
        self._done = False
        self._totals = _RunningTotals()
        prompt = self.protocol.render_prompt(question.question, self.instructions)
        self._transcript = [prompt]
        return prompt, self._info()

    def step(self, action: str):
        query = self.begin_step(action)
        docs: Sequence[Doc] = ()
        retrieval_error = None
        if query is not None:
            try:
                docs = search_with_cache(self.retriever, [query], self.topk)[0]
            except SearchGymError as exc:
                retrieval_error = str(exc)
        return self.end_step(docs, retrieval_error)

    def render(self) -> str | None:
        if self.render_mode == "ansi":
            return "".join(self._transcript)
        return None

    # -- The two halves of a step (a vector env batches the search between them) ---------

    def begin_step(self, action: object) -> str | None:
        """Parse ``action`` and record the turn; return the query to run, if any."""
        if self._done or self.trajectory is None:
            raise SearchGymError("The episode is over or has not started: call reset() before step().")
        if isinstance(action, str):
            text, parsed = action, self.protocol.parse(action, turn=len(self.trajectory.turns))
        else:
            text = ""
            parsed = Action(
                kind="invalid",
                format_ok=False,
                error=f"An action must be a str, got {type(action).__name__}.",
            )
        if parsed.kind == "search" and self.max_searches is not None and self._search_limit_reached():
            parsed = Action(
                kind="invalid",
                query=parsed.query,
                answer=parsed.answer,
                format_ok=parsed.format_ok,
                think_blocks=parsed.think_blocks,
                answer_blocks=parsed.answer_blocks,
                error=f"Search refused: the limit of {self.max_searches} searches per episode is reached.",
            )
        self.trajectory.turns.append(Turn(action_text=text, action=parsed))
        self._transcript.append(text)
        return parsed.query if parsed.kind == "search" else None

    def end_step(self, docs: Sequence[Doc], retrieval_error: str | None = None):
        """Finish the step begun by :meth:`begin_step`, given the retrieved documents."""
        traj = self.trajectory
        assert traj is not None  # begin_step guarantees it
        turn = traj.turns[-1]
        action = turn.action
        kind = action.kind
        terminated = kind == "answer"
        refused = kind == "invalid" and action.format_ok
        truncated = not terminated and (refused or len(traj.turns) >= self.max_turns)
        if kind == "search":
            turn.docs = list(docs)
            if retrieval_error is None:
                observation = self.protocol.render_docs(turn.docs)
            else:
                observation = self.protocol.render_error(f"The search failed: {retrieval_error}")
        elif kind == "invalid":
            observation = self.protocol.render_error(action.error or "Malformed action.")
        else:
            observation = ""
        turn.observation = observation
        self._transcript.append(observation)
        self._totals.add(turn)
        traj.truncated = truncated
        reward = 0.0
        if terminated or truncated:
            self._done = True
            reward = float(self.reward_scheme(traj))
            traj.reward = reward
        info = self._info()
        if kind == "invalid":
            info["error"] = action.error or "Malformed action."
        if retrieval_error is not None:
            info["retrieval_error"] = retrieval_error
        return observation, reward, terminated, truncated, info

    # -- Helpers ---------------------------------------------------------------------------

    def _search_limit_reached(self) -> bool:
        assert self.trajectory is not None
        return self.max_searches is not None and len(self._totals.queries) >= self.max_searches

    def _choose_question(self, options: dict[str, Any] | None) -> Question:
        if options is not None and not isinstance(options, Mapping):
            raise InvalidArgumentError(f"options must be a dict, got {type(options).__name__}.")
        if not options:
            return self.questions[int(self.np_random.integers(len(self.questions)))]
        if "question" in options:
            return question_from_options(options)
        if "index" in options:
            index = options["index"]
            if (
                isinstance(index, bool)
                or not isinstance(index, Integral)
                or not 0 <= int(index) < len(self.questions)
            ):
                raise InvalidArgumentError(
                    f"options['index'] must be an int in [0, {len(self.questions)}), got {index!r}."
                )
            return self.questions[int(index)]
        raise InvalidArgumentError(
            f"options must hold 'question' and 'golden_answers' (and optionally 'id'), or 'index'; "
            f"got keys {sorted(options)}."
        )

    def _info(self) -> dict[str, Any]:
        # Running totals, never a pass over the turns: this runs on every step, next to retrieval.
        traj = self.trajectory
        assert traj is not None
        totals = self._totals
        answer = traj.answer
        scored = answer is not None
        question = traj.question
        info: dict[str, Any] = {
            "question_id": question.id,
            "num_searches": len(totals.queries),
            "queries": totals.queries.copy(),
            "retrieved_ids": totals.retrieved_ids.copy(),
            "answer": answer,
            "em": traj.em if scored else 0.0,
            "f1": traj.f1 if scored else 0.0,
            "cover_em": traj.cover_em if scored else 0.0,
            "format_ok": totals.format_ok,
            "turn": len(traj.turns),
            "reasoning_steps": totals.reasoning_steps,
            "action_chars": totals.action_chars,
        }
        if question.known is not None:
            info["known"] = question.known
        if question.hops is not None:
            info["hops"] = question.hops
        return info


class EpisodeOptions(TypedDict, total=False):
    """The episode options every env takes and passes on to :class:`SearchQAEnv`.

    Their defaults and meaning are :class:`SearchQAEnv`'s (its Arguments).
    """

    protocol: str | Protocol
    reward: str | RewardScheme
    reward_kwargs: Mapping[str, Any] | None
    topk: int
    max_turns: int
    max_searches: int | None
    render_mode: str | None
    instructions: str | None


def takes_episode_options(init: Callable[..., None]) -> Callable[..., None]:
    """Give an env's ``__init__(..., **episode: Unpack[EpisodeOptions])`` the full signature.

    ``inspect.signature`` (and so ``help``, :func:`~searchgym.error.keyword_checked` and the
    run file's env section) then lists each episode option with :class:`SearchQAEnv`'s
    default in place of ``**episode``.
    """
    own = [p for p in inspect.signature(init).parameters.values() if p.kind is not p.VAR_KEYWORD]
    base = inspect.signature(SearchQAEnv.__init__).parameters
    episode = [base[name] for name in EpisodeOptions.__annotations__]
    init.__signature__ = inspect.Signature(own + episode)  # type: ignore[attr-defined]
    return init
