"""Evaluate a trained transformers policy on held-out questions, with the rollouts' own code.

Episodes run through :class:`~searchgym.trainers.grpo.rollout.RolloutCollector` (the same
prompt, feedback and tokenisation as training; greedy decoding by default), one episode
per question, and are scored with :func:`~searchgym.policies.evaluation.summarise`: EM, F1,
ST, SD, SR overall and per split (known/unknown, 1-hop/2-hop). The result's ``settings``
adds the mean sampled tokens per episode (``action_tokens``) and, on SyntheticFacts, the
two skills a warm start must give the study, as the policy uses them (:func:`skills`) and
with its first action's opening forced (:func:`forced_skills`).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from functools import cache, partial
from typing import Any

import torch

from searchgym.envs.metrics import exact_match
from searchgym.envs.synthetic import Fact
from searchgym.policies.chat import ChatFormatter
from searchgym.policies.evaluation import EpisodeRecord, EvalResult, summarise
from searchgym.trainers.config import EnvConfig
from searchgym.trainers.grpo.envs import build_reward, env_factory, memory_wrapper
from searchgym.trainers.grpo.generation import SamplingSettings, sample_actions
from searchgym.trainers.grpo.rollout import Episode, RolloutCollector

from .config import StudyRunConfig
from .demos import _encode, demo_env, forced_opening

__all__ = [
    "evaluate_model",
    "eval_env_config",
    "skills",
    "forced_skills",
    "forced_probes",
    "probe_score",
    "decision_probe",
    "recall_by_fact",
    "rollout_collector",
]


def eval_env_config(config: StudyRunConfig) -> EnvConfig:
    """The training env with ``eval.env_kwargs`` applied (e.g. the held-out split)."""
    return EnvConfig(id=config.env.id, kwargs={**config.env.kwargs, **config.eval.env_kwargs})


def skills(
    episodes: list[Episode], world: Any, recalled: dict[Fact, float] | None = None
) -> dict[str, float | None]:
    """What a SyntheticFacts policy can do, from finished episodes (None where no episode counts).

    * ``direct_em_known``: EM of known one-hop questions answered without a search
      (recall from the weights);
    * ``query_names_subject``: share of first searches whose query holds the first hop's
      subject (copying from the question);
    * ``em_after_search``: EM of one-hop questions answered after a search (copying from
      the passage; the retriever's noise caps it).

    With ``recalled`` (the model's greedy recall per fact, :func:`recall_by_fact`), the
    searches on known questions are split by what the model could skip:

    * ``sr_known_recalled``: share of known one-hop questions searched whose fact the model
      recalls (a frugal policy skips these);
    * ``sr_known_unrecalled``: the same for the known facts it does not recall;
    * ``sr_known_2hop``: share of known two-hop questions searched (answering them directly
      needs two recollections chained).
    """
    direct, queries, searched = [], [], []
    known_searched: dict[str, list[float]] = {"recalled": [], "unrecalled": [], "2hop": []}
    for episode in episodes:
        info, trajectory = episode.info, episode.trajectory
        if trajectory is None:
            continue
        question = trajectory.question
        chain = world.chain(question.id)
        if info["num_searches"]:
            queries.append(float(chain[0].subject in (info["queries"][0] or "")))
            if question.hops == 1:
                searched.append(float(info["em"]))
        elif question.known and question.hops == 1:
            direct.append(float(info["em"]))
        if recalled is not None and question.known:
            if question.hops != 1:
                group = "2hop"
            else:
                group = "recalled" if recalled.get(chain[0]) == 1.0 else "unrecalled"
            known_searched[group].append(float(info["num_searches"] > 0))

    def mean(values: list[float]) -> float | None:
        return sum(values) / len(values) if values else None

    found = {
        "direct_em_known": mean(direct),
        "query_names_subject": mean(queries),
        "em_after_search": mean(searched),
    }
    if recalled is not None:
        found.update({f"sr_known_{group}": mean(values) for group, values in known_searched.items()})
    return found


def forced_skills(model: Any, tokenizer: Any, config: StudyRunConfig) -> dict[str, float]:
    """Copying and recall with the first action's opening written for the model (greedy).

    On the held-out questions of a noise-free copy of the eval env, each prompt is followed
    by the opening of a search (or of an answer) in the demonstrations' words and the model
    writes the rest, so both skills are measured whatever the policy would choose:

    * ``forced_copy``: share of questions whose query names the first hop's subject;
    * ``forced_recall``: EM of known one-hop questions answered at once;
    * ``forced_chain``: the same on known two-hop questions, scored on the last hop's
      answer (``Question: … Answer: <bridge>. Question: … Answer: <answer>.``); absent
      when there are none.
    """
    probes = forced_probes(config, tokenizer)
    settings = SamplingSettings(0.0, 1.0, config.rollout.generation_batch_size)
    budgets = [config.rollout.max_new_tokens] * len(probes)
    actions = sample_actions(
        model, tokenizer, [p[0] for p in probes], budgets, ["</search>", "</answer>"], settings
    )
    scores: dict[str, list[float]] = {"forced_copy": [], "forced_recall": []}
    for (_, skill, name), action in zip(probes, actions, strict=True):
        scores.setdefault(skill, []).append(probe_score(skill, name, action.text))
    return {skill: sum(values) / max(1, len(values)) for skill, values in scores.items()}


def forced_probes(config: StudyRunConfig, tokenizer: Any) -> list[tuple[list[int], str, str]]:
    """``(context ids, skill, expected name)`` of every probe of :func:`forced_skills`."""
    kwargs = {**config.env.kwargs, **config.eval.env_kwargs}
    env = demo_env(int(kwargs.get("world_seed", 0)), kwargs, str(kwargs.get("split", "eval")))
    formatter, protocol = ChatFormatter(tokenizer), env.protocol.name
    recall, asks_question = config.sft.recall_think, config.sft.asks_question
    asks_hops = config.sft.asks_hops  # a chain's recollection then opens with its first question
    encode = partial(_encode, tokenizer)

    probes = []
    for index, question in enumerate(env.questions):
        obs, _ = env.reset(options={"index": index})
        prompt, chain = encode(formatter.prompt(obs)), env.world.chain(question.id)
        asked = question.question if asks_question else None
        probes.append(
            (
                prompt + encode(forced_opening(protocol, search=True, recall=recall, question=asked)),
                "forced_copy",
                chain[0].subject,
            )
        )
        if question.known:
            hops = (question.hops or 1) if asks_hops else 1
            opening = forced_opening(protocol, search=False, recall=recall, hops=hops, question=asked)
            probes.append(
                (
                    prompt + encode(opening),
                    "forced_recall" if (question.hops or 1) == 1 else "forced_chain",
                    chain[-1].object,
                )
            )
    env.close()
    return probes


def recall_by_fact(
    model: Any,
    tokenizer: Any,
    config: StudyRunConfig,
    *,
    split: str = "train",
    samples: int = 1,
    temperature: float = 0.0,
    wrap: Callable[[Any], Any] | None = None,
) -> dict[Fact, float]:
    """How often the model answers each known fact right at once, in the protocol's format.

    Every known one-hop question of ``split`` in a noise-free copy of ``config``'s env is
    opened as a direct answer (as for ``forced_recall`` in :func:`forced_skills`) and
    answered ``samples`` times at ``temperature`` (greedy at 0; 24 new tokens at most).
    Returns the share of right answers per fact, over all of its questions and samples.
    ``wrap`` puts the env behind a wrapper before each question, as in :func:`decision_probe`.
    """
    env = demo_env(int(config.env.kwargs.get("world_seed", 0)), config.env.kwargs, split)
    formatter, encode = ChatFormatter(tokenizer), partial(_encode, tokenizer)
    recall, asks_question = config.sft.recall_think, config.sft.asks_question
    contexts, facts = [], []
    for index, question in enumerate(env.questions):
        if question.known and (question.hops or 1) == 1:
            obs, _ = (wrap(env) if wrap else env).reset(options={"index": index})
            asked = question.question if asks_question else None
            opening = forced_opening(env.protocol.name, search=False, recall=recall, question=asked)
            contexts += [encode(formatter.prompt(obs)) + encode(opening)] * samples
            facts += [env.world.chain(question.id)[0]] * samples
    env.close()
    settings = SamplingSettings(temperature, 1.0, config.rollout.generation_batch_size)
    actions = sample_actions(
        model, tokenizer, contexts, [24] * len(contexts), ["</think>", "</answer>"], settings
    )
    scores: dict[Fact, list[float]] = {}
    for fact, action in zip(facts, actions, strict=True):
        scores.setdefault(fact, []).append(probe_score("forced_recall", fact.object, action.text))
    return {fact: sum(v) / len(v) for fact, v in scores.items()}


def probe_score(skill: str, name: str, text: str) -> float:
    """1.0 when the model's continuation ``text`` of a probe holds ``name`` as it should
    (a recall: the text up to ``</answer>``, or up to ``.</think>`` after ``Recall:``; a
    chain: its last ``Answer:``)."""
    if skill == "forced_copy":
        return float(name in text.split("</search>")[0])
    recalled = re.split(r"</answer>|\.</think>", text)[0]
    if skill == "forced_chain":
        recalled = recalled.split("Answer:")[-1]
    return exact_match(recalled, [name])


def decision_probe(
    model: Any,
    tokenizer: Any,
    config: StudyRunConfig,
    *,
    temperature: float = 0.0,
    samples: int = 1,
    wrap: Callable[[Any], Any] | None = None,
) -> dict[str, float]:
    """What a ``recall_think`` policy recalls, and how likely it then searches.

    On the one-hop questions of a noise-free copy of the eval env (``eval.env_kwargs``
    choose the split), the model writes its recollection after the demonstrations' opening
    (``<think>Recall:``, or the question form's; for ``sem``, its first answer), greedily
    or ``samples`` times at ``temperature``; the probe then compares the probabilities of
    the two ways on:
    ``\\n<search>`` against ``\\n<answer>`` after the thought (``sem``: against ending the
    episode after the first answer). It reports:

    * ``recall_right_known``: share of known questions recalled right;
    * ``says_unknown_unknown``: share of unknown questions recalled as "unknown";
    * ``named_right``: share of recollections naming somebody (not "unknown") that are
      right, known and unknown questions together. A direct answer after a name pays only
      when this share q is high enough. With searches that find the answer 80% of the time
      (the study's retrieval noise), answering beats searching when q > 0.8 under F1
      (a right direct answer 1, a search 0.8), q > 0.59 under LightSearcher (a needless
      search 0.74 × 0.8) and q > 0.44 under SEM (a needless search 0);
    * ``p_search_known`` / ``p_search_unknown``: mean P(search) after the recollection;
    * ``p_search_right`` / ``p_search_said_unknown``: the same on known questions recalled
      right and on unknown ones recalled as "unknown" (NaN where none).

    The gap between the last two is what a frugal scheme must open: a warm start gives a
    coin flip on both, an outcome-only baseline pushes both to 1.

    ``wrap`` puts the env behind a wrapper before each question (e.g. the ``wrapped``
    method of the warm start's :func:`~tiny_lm.sft.scripted_memory`), so
    the prompts take the memory arms' layout.
    """
    kwargs = {**config.env.kwargs, **config.eval.env_kwargs}
    env = demo_env(int(kwargs.get("world_seed", 0)), kwargs, str(kwargs.get("split", "eval")))
    formatter, sem = ChatFormatter(tokenizer), env.protocol.name == "sem"

    encode = partial(_encode, tokenizer)

    prompts, openings, questions = [], [], []
    for index, question in enumerate(env.questions):
        if (question.hops or 1) == 1:
            obs, _ = (wrap(env) if wrap else env).reset(options={"index": index})
            asked = question.question if config.sft.asks_question else None
            prompts += [encode(formatter.prompt(obs))] * samples
            openings += [
                forced_opening(env.protocol.name, search=False, recall=True, question=asked)
            ] * samples
            questions += [(question.known, env.world.chain(question.id)[0].object)] * samples
    env.close()
    settings = SamplingSettings(temperature, 1.0, config.rollout.generation_batch_size)
    stop = "</answer>" if sem else "</think>"
    contexts = [p + encode(o) for p, o in zip(prompts, openings, strict=True)]
    written = sample_actions(model, tokenizer, contexts, [24] * len(prompts), [stop], settings)
    groups: dict[str, list[float]] = {name: [] for name in _PROBE_FIGURES}
    for prompt, opening, (known, answer), action in zip(prompts, openings, questions, written, strict=True):
        head = opening + action.text.split(stop)[0] + stop
        said = re.split(r"\.</think>|}", action.text)[0].strip()
        search = encode(head + "\n<search>")
        other = encode(head) + [tokenizer.eos_token_id] if sem else encode(head + "\n<answer>")
        p = _first_choice_probability(model, prompt, search, other)
        right, unknown = exact_match(said, [answer]) == 1.0, said.lower() == "unknown"
        groups["p_search_known" if known else "p_search_unknown"].append(p)
        if known:
            groups["recall_right_known"].append(float(right))
        else:
            groups["says_unknown_unknown"].append(float(unknown))
        if not unknown:
            groups["named_right"].append(float(right))
        if known and right:
            groups["p_search_right"].append(p)
        if not known and unknown:
            groups["p_search_said_unknown"].append(p)
    return {name: sum(v) / len(v) if v else float("nan") for name, v in groups.items()}


_PROBE_FIGURES = (
    "recall_right_known",
    "says_unknown_unknown",
    "named_right",
    "p_search_known",
    "p_search_unknown",
    "p_search_right",
    "p_search_said_unknown",
)


def _first_choice_probability(model: Any, context: list[int], first: list[int], second: list[int]) -> float:
    """P(``first``) / (P(``first``) + P(``second``)) as continuations of ``context`` (token ids)."""
    shared = next(
        (k for k, (a, b) in enumerate(zip(first, second, strict=False)) if a != b),
        min(len(first), len(second)),
    )
    rows = [context + first, context + second]
    width = max(len(r) for r in rows)
    # one forward pass for both; right padding leaves a causal model's real positions alone
    batch = torch.tensor([r + [0] * (width - len(r)) for r in rows], device=next(model.parameters()).device)
    with torch.inference_mode():
        logprobs = torch.log_softmax(model(input_ids=batch).logits.float(), dim=-1)
    start = len(context) + shared
    scores = [
        sum(float(logprobs[n, t - 1, ids[t]]) for t in range(start, len(ids))) for n, ids in enumerate(rows)
    ]
    return float(torch.softmax(torch.tensor(scores, dtype=torch.float64), dim=0)[0])


def rollout_collector(
    make_env: Any, model: Any, tokenizer: Any, config: StudyRunConfig, temperature: float
) -> Any:
    """A :class:`RolloutCollector` of ``model`` on ``make_env``'s envs, with ``config``'s
    rollout budgets, sampling at ``temperature`` (greedy at 0)."""
    return RolloutCollector(
        make_env,
        model,
        tokenizer,
        ChatFormatter(tokenizer),
        max_new_tokens=config.rollout.max_new_tokens,
        max_context_tokens=config.rollout.max_context_tokens,
        sampling=SamplingSettings(temperature, 1.0, config.rollout.generation_batch_size),
    )


def evaluate_model(
    model: Any, tokenizer: Any, config: StudyRunConfig, *, name: str = "policy", memory: Any = None
) -> EvalResult:
    """Run one episode per held-out question and summarise them.

    Args:
        model: The policy (a transformers causal LM).
        tokenizer: Its tokenizer.
        config: The run's config: ``env`` and ``eval`` choose the env, ``rollout`` the budgets.
        name: The policy's name in the result.
        memory: The run's experience memory, to give the policy the same prompts as in
            training (nothing is recorded into it).
    """
    env_config = eval_env_config(config)
    make_env = env_factory(env_config, build_reward(env_config), memory, config.memory)
    if memory is not None:
        inner = make_env

        def make_env() -> Any:
            env: Any = inner()
            env.record = False  # evaluation never writes into the store
            return env

    collector = rollout_collector(make_env, model, tokenizer, config, config.eval.temperature)
    try:
        probe: Any = collector.env(0).unwrapped
        total = len(probe.questions)
        count = min(total, config.eval.max_questions) if config.eval.max_questions else total
        start = time.perf_counter()
        episodes = collector.collect(list(range(count)), 1, seed=config.seed)
        result = summarise(
            name, [EpisodeRecord.from_info(e.info, e.reward) for e in episodes], time.perf_counter() - start
        )
    finally:
        collector.close()
    result.settings["action_tokens"] = sum(e.action_tokens for e in episodes) / len(episodes)
    world = getattr(probe, "world", None)
    if world is not None:
        split = str(env_config.kwargs.get("split", "eval"))
        recalled = recall_by_fact(model, tokenizer, config.replace(env=env_config), split=split)
        found = {**skills(episodes, world, recalled), **forced_skills(model, tokenizer, config)}
        if config.sft.recall_think:
            wrap = None
            if memory is not None:  # the probe asks in the arm's own layout, one wrapper for all questions
                wrap = cache(
                    lambda env: memory_wrapper(env, memory, config.memory, record=False, seed=config.seed)
                )
            found.update(decision_probe(model, tokenizer, config, wrap=wrap))
        result.settings["skills"] = found
    return result
