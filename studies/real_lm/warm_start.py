"""The shared supervised warm start: taught facts, and episodes that search before answering.

One warm start serves every arm and seed (it is cached under the study's output folder,
keyed by its settings). It trains the actions' tokens only (masked cross-entropy,
:func:`searchgym.trainers.grpo.ptx.ptx_nll`) on three kinds of example:

- **fact lessons** for the taught facts of both sides (training and held-out), in the
  prompts of ``lesson_prompts``: ``chat``, ``question -> answer`` in a plain chat
  (``QA_SYSTEM``); ``agent``, the agent's own prompt with its answer turn opened (the known
  probe's input, :func:`real_lm.evaluation.answer_prompts`), so the fact is recalled where the
  agent answers; ``think``, the agent's prompt with ``<think>`` opened, where a
  ``recall_first`` agent recalls (these lessons end at ``</think>``, and a model taught them
  may end its turn there: ``results/calibration_attempt.json``, ``tenth_attempt``). The decision to answer is not taught there (the opened tag
  is in the prompt).
- **search_r1 episodes** on the RL-training questions, played through the env with BM25:
  ``<search> question </search>`` then ``<answer> gold </answer>``. With ``recall_first``
  the first action opens with the agent's recall, ``<think> gold </think>`` on a taught
  question and ``<think> unknown </think>`` on an untaught one (Search-R1's template reasons
  in ``<think>`` before acting), so the search decision can read what the model recalled;
  untaught questions always search. A share
  ``direct_share`` of the *taught* training questions answer at once instead, so that
  sampling sometimes tries it (RL has something to compare); the rest search, so the model
  starts by over-searching, as the papers' outcome-rewarded agents do.
- **SEM episodes** on the same questions, in SEM's layout: a first answer (the taught
  answer, or ``unknown``), then a search and the final answer; ``direct_share`` of the
  taught ones stop after the first answer. SEM's generation stops only at ``</search>``, so
  its answer turns are trained with the end token, which ends them.

Held-out questions appear only as fact lessons (taught side), never as episodes.

A **decision pass** (``decision_steps`` > 0) follows: AdamW steps at a small constant rate
on the demonstrated first actions alone, every batch holding direct, searching-taught and
searching-untaught first actions in the demonstrated proportions. In the main pass a batch
holds one or two first actions, so the last few batches set the choice to search for every
question alike (``results/calibration_attempt.json``); in the decision pass every batch asks
for the same proportions. Its model is saved under the main pass's folder, keyed apart, so
a change to the pass reuses the main pass.
"""

from __future__ import annotations

import hashlib
import json
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from searchgym.error import InvalidArgumentError

from .data import StudyData

__all__ = [
    "WarmStartSettings",
    "QA_SYSTEM",
    "warm_start",
    "fact_prompt",
    "agent_lessons",
    "episode_pairs",
    "first_actions",
    "split_by_turn_end",
    "lr_factor",
]

QA_SYSTEM = "Answer the question in a few words."
"""The system message of fact lessons and of the no-retrieval baseline."""

SEM_THINK_FIRST = "<think>From memory.</think>"
SEM_THINK_LAST = "<think>From the result.</think>"
UNKNOWN = "unknown"
"""The recall, or SEM's first answer, that a demonstration gives on an untaught question."""
LESSON_PROMPTS = ("chat", "agent", "think")


@dataclass(frozen=True)
class WarmStartSettings:
    """The warm start's data and optimiser.

    Attributes:
        fact_repeats: Times each taught fact is shown as a lesson, in each lesson prompt.
        episode_repeats: Times each demonstrated action is shown.
        lesson_prompts: The prompts of the fact lessons: any of ``chat``, ``agent``, ``think``.
        recall_first: Whether search_r1's demonstrated first action opens with the recalled
            answer (or ``unknown``) in ``<think>``.
        direct_share: Share of taught training questions demonstrated answering at once.
        protocols: Protocols whose episodes are demonstrated (``search_r1``, ``sem``).
        epochs: Passes over the examples.
        batch_size: Examples per AdamW step.
        lr: AdamW learning rate (the peak, under ``lr_schedule``).
        lr_schedule: ``linear``: a warmup over the first 5% of steps, then a linear decay to 0;
            ``constant``: ``lr`` throughout. Under a constant rate the last few batches set the
            first action for every question alike (the search/answer choice ends near 0 or 1);
            under the decay the last batches move it less, though it still depends on the
            batch order (``results/calibration_attempt.json``).
        seed: Seed of the example order, the direct/search coin and torch.
        decision_steps: AdamW steps of the decision pass (0: none).
        decision_lr: Its constant learning rate.
        autocast: ``bfloat16`` trains float32 weights under bfloat16 autocast (fast on a CPU
            with native bfloat16, AMX or AVX512-BF16); ``None`` trains in float32, the fast
            choice on a CPU without it (see ``benchmarks/results/autocast_cpu_avx2.json``).
    """

    fact_repeats: int = 6
    episode_repeats: int = 1
    direct_share: float = 0.15
    protocols: tuple[str, ...] = ("search_r1", "sem")
    epochs: int = 2
    batch_size: int = 16
    lr: float = 1.0e-4
    lr_schedule: str = "linear"
    seed: int = 0
    autocast: str | None = None
    lesson_prompts: tuple[str, ...] = ("chat", "agent")
    recall_first: bool = False
    decision_steps: int = 0
    decision_lr: float = 3.0e-5

    def __post_init__(self) -> None:
        unknown = sorted(set(self.lesson_prompts) - set(LESSON_PROMPTS))
        if unknown or not self.lesson_prompts:
            raise InvalidArgumentError(
                f"warm_start.lesson_prompts: got {list(self.lesson_prompts)}; "
                f"allowed: one or more of {', '.join(LESSON_PROMPTS)}."
            )
        if not isinstance(self.recall_first, bool):
            raise InvalidArgumentError(
                f"warm_start.recall_first: got {self.recall_first!r}; expected true or false."
            )
        for name, least in (("fact_repeats", 1), ("episode_repeats", 1), ("decision_steps", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise InvalidArgumentError(
                    f"warm_start.{name}: got {value!r}; expected an integer >= {least}."
                )
        if self.lr_schedule not in ("linear", "constant"):
            raise InvalidArgumentError(
                f"warm_start.lr_schedule: got {self.lr_schedule!r}; allowed: linear, constant."
            )


def fact_prompt(formatter_tokenizer: Any, question: str) -> str:
    """The model input of a fact lesson (and of the no-retrieval baseline) for ``question``."""
    from searchgym.policies.chat import ChatFormatter

    return ChatFormatter(formatter_tokenizer, system=QA_SYSTEM).prompt(question)


def agent_lessons(
    data: StudyData, env_kwargs: dict[str, Any], tokenizer: Any, tag: str = "answer"
) -> list[tuple[str, str]]:
    """``(agent prompt with <tag> opened, " gold </tag>")`` for every taught fact."""
    from .evaluation import answer_prompts

    lessons = []
    for path, side in ((data.train_path, data.train), (data.heldout_path, data.heldout)):
        prompts = answer_prompts(tokenizer, env_kwargs, str(path), len(side))
        lessons += [
            (prompt.removesuffix("<answer>") + f"<{tag}>", f" {q['golden_answers'][0]} </{tag}>")
            for prompt, q in zip(prompts, side, strict=True)
            if q["id"] in data.taught
        ]
    return lessons


def _direct(qid: str, taught: frozenset[str], share: float, seed: int) -> bool:
    """Whether the demonstration of ``qid`` answers at once: taught, and a seeded coin."""
    return qid in taught and random.Random(f"{seed}:{qid}").random() < share


def episode_pairs(
    data: StudyData, env_kwargs: dict[str, Any], protocol: str, tokenizer: Any, settings: WarmStartSettings
) -> list[tuple[str, str]]:
    """``(model input, action)`` pairs of demonstrated episodes on the training questions.

    ``env_kwargs`` are the PopQA env's arguments for ``protocol`` (corpus, index, its
    instructions, ``topk``, ``max_turns``); ``data_path`` and ``reward`` are set here.
    """
    return [
        (context, action)
        for _, _, context, action in _demonstrations(data, env_kwargs, protocol, tokenizer, settings)
    ]


def first_actions(
    data: StudyData, env_kwargs: dict[str, Any], protocol: str, tokenizer: Any, settings: WarmStartSettings
) -> dict[str, list[tuple[str, str]]]:
    """The demonstrated first actions of ``protocol``, by kind: ``direct`` (a taught question
    answered at once), ``taught`` and ``untaught`` (questions that search)."""
    kinds: dict[str, list[tuple[str, str]]] = {"direct": [], "taught": [], "untaught": []}
    for qid, turn, context, action in _demonstrations(data, env_kwargs, protocol, tokenizer, settings):
        if turn == 0:
            kind = (
                "direct"
                if _direct(qid, data.taught, settings.direct_share, settings.seed)
                else "taught"
                if qid in data.taught
                else "untaught"
            )
            kinds[kind].append((context, action))
    return kinds


def _demonstrations(
    data: StudyData, env_kwargs: dict[str, Any], protocol: str, tokenizer: Any, settings: WarmStartSettings
) -> list[tuple[str, int, str, str]]:
    """``(question id, turn, model input, action)`` of every demonstrated action."""
    import gymnasium as gym

    import searchgym  # noqa: F401  (registers the ids)
    from searchgym.policies.chat import ChatFormatter

    kwargs = {**env_kwargs, "data_path": str(data.train_path), "protocol": protocol, "reward": "f1"}
    kwargs.pop("reward_kwargs", None)
    env = gym.make("searchgym/PopQA-v1", **kwargs)
    popqa: Any = env.unwrapped
    formatter = ChatFormatter(tokenizer)
    pairs: list[tuple[str, int, str, str]] = []
    for index, q in enumerate(popqa.questions):
        gold = q.golden_answers[0]
        direct = _direct(q.id, data.taught, settings.direct_share, settings.seed)
        if protocol == "sem":
            first = gold if q.id in data.taught else UNKNOWN
            opening = f"{SEM_THINK_FIRST}<answer> {first} </answer>"
            actions = [opening] if direct else [f"{opening}<search> {q.question} </search>"]
            actions += [] if direct else [f"{SEM_THINK_LAST}<answer> {gold} </answer>"]
        else:
            recall = (
                f"<think> {gold if q.id in data.taught else UNKNOWN} </think>"
                if settings.recall_first
                else ""
            )
            actions = (
                [f"{recall}<answer> {gold} </answer>"]
                if direct
                else [
                    f"{recall}<search> {q.question} </search>",
                    f"<answer> {gold} </answer>",
                ]
            )
        obs, _ = env.reset(seed=0, options={"index": index})
        context = formatter.prompt(obs)
        for k, action in enumerate(actions):
            pairs.append((q.id, k, context, action))
            obs, _, terminated, truncated, info = env.step(action)
            if not info.get("format_ok", False):
                raise RuntimeError(f"the env refused the demonstration {action!r} ({protocol}): {info}")
            if k < len(actions) - 1:
                context += action + formatter.feedback(obs)
            elif not (terminated or truncated):
                raise RuntimeError(f"the demonstration {actions!r} did not end the episode ({protocol}).")
    env.close()
    return pairs


def split_by_turn_end(
    pairs: list[tuple[str, str]], protocol: str
) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """``pairs`` whose action ends at one of ``protocol``'s stop strings (generation stops
    there), and the others, whose turn ends with the end token (SEM's answer turns)."""
    from searchgym.policies.chat import stop_strings

    stops = tuple(stop_strings(protocol))
    at_stop = [(c, a) for c, a in pairs if a.rstrip().endswith(stops)]
    return at_stop, [(c, a) for c, a in pairs if not a.rstrip().endswith(stops)]


def _batches(lengths: list[int], size: int, rng: Any) -> list[list[int]]:
    """One epoch's batches of example indices: shuffled, then sorted by length within pools
    of 8 batches so a batch pads little (fact lessons are a fifth of an episode's length),
    in shuffled batch order."""
    order = [int(i) for i in rng.permutation(len(lengths))]
    batches: list[list[int]] = []
    pool = 8 * size
    for first in range(0, len(order), pool):
        chunk = sorted(order[first : first + pool], key=lambda i: lengths[i])
        batches += [chunk[k : k + size] for k in range(0, len(chunk), size)]
    return [batches[int(i)] for i in rng.permutation(len(batches))]


def lr_factor(schedule: str, step: int, total: int) -> float:
    """The multiplier of the peak rate at optimiser step ``step`` (0-based) of ``total``."""
    if schedule == "constant":
        return 1.0
    warmup = max(1, round(0.05 * total))
    if step < warmup:
        return (step + 1) / warmup
    return max(0.0, (total - step) / max(1, total - warmup))


def _stratified_batches(groups: list[str], size: int, rng: Any) -> list[list[int]]:
    """One pass's batches of example indices, each group (``groups[i]`` is example ``i``'s)
    keeping its share in every batch: a group's shuffled examples are spread evenly over the
    pass, then the pass is cut into batches."""
    position: dict[int, float] = {}
    for group in sorted(set(groups)):
        members = [i for i, g in enumerate(groups) if g == group]
        offset = float(rng.random())
        for rank, k in enumerate(rng.permutation(len(members))):
            position[members[int(k)]] = (rank + offset) / len(members)
    order = sorted(position, key=lambda i: position[i])
    return [order[k : k + size] for k in range(0, len(order), size)]


_DECISION_FIELDS = ("decision_steps", "decision_lr")


_DATA_PATHS = ("corpus_path", "index_dir", "data_path")


def _key(settings: WarmStartSettings, model: str, env_kwargs: dict[str, Any], data: StudyData) -> str:
    """The main pass's key: its settings, the model, and the data by content, not by path, so a
    moved output folder keeps its warm start and rewritten data files do not."""
    main_pass = {k: v for k, v in asdict(settings).items() if k not in _DECISION_FIELDS}
    env = {p: {k: v for k, v in kw.items() if k not in _DATA_PATHS} for p, kw in env_kwargs.items()}
    files = {
        name: hashlib.sha256(path.read_bytes()).hexdigest()
        for name, path in (
            ("train", data.train_path),
            ("heldout", data.heldout_path),
            ("corpus", data.corpus_path),
        )
    }
    blob = json.dumps(
        {
            "settings": main_pass,
            "model": model,
            "env": env,
            "data": {**data.summary(), "files": files, "taught": sorted(data.taught)},
            "v": 5,
        },
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def warm_start(
    data: StudyData,
    settings: WarmStartSettings,
    *,
    model: str,
    env_kwargs: dict[str, dict[str, Any]],
    folder: str | Path,
    threads: int = 1,
    log: Any = print,
    reuse_only: bool = False,
) -> tuple[Path, dict[str, Any]]:
    """Train (or reuse) the warm start; returns its model folder and its figures.

    With ``reuse_only``, a warm start that is not finished yet is an error, not trained.

    ``env_kwargs`` maps each of ``settings.protocols`` to its env arguments
    (see :func:`episode_pairs`).
    """
    out = Path(folder) / f"warm_{_key(settings, model, env_kwargs, data)}"
    done = out / "warm_start.json"
    if not done.exists():
        if reuse_only:
            found = sorted(p.parent.name for p in Path(folder).glob("warm_*/warm_start.json"))
            raise InvalidArgumentError(
                f"no finished warm start {out.name} in {str(folder)!r} for these settings and this code "
                f"(found: {found or 'none'}); run the study without --collect to train it."
            )
        _main_pass(data, settings, model, env_kwargs, out, threads, log)
    figures = {**json.loads(done.read_text(encoding="utf-8")), "settings": asdict(settings)}
    if settings.decision_steps == 0:
        return out, figures
    decision = {k: getattr(settings, k) for k in _DECISION_FIELDS}
    tag = hashlib.sha256(json.dumps(decision, sort_keys=True).encode()).hexdigest()[:12]
    sub = out / f"decision_{tag}"
    if not (sub / "decision.json").exists():
        if reuse_only:
            raise InvalidArgumentError(
                f"no finished decision pass {sub.name} in {str(out)!r}; run the study without --collect to train it."
            )
        _decision_pass(data, settings, env_kwargs, out, sub, threads, log)
    return sub, {**figures, "decision": json.loads((sub / "decision.json").read_text(encoding="utf-8"))}


def _train(
    policy: Any,
    tokenizer: Any,
    examples: list[Any],
    batches: list[list[int]],
    lrs: list[float],
    autocast: str | None,
    log: Any,
    name: str,
) -> list[float]:
    """AdamW over ``batches`` of ``examples`` at the rates ``lrs``; returns the losses."""
    import torch

    from searchgym.trainers.grpo.ptx import ptx_backward

    optimizer = torch.optim.AdamW(policy.parameters(), lr=lrs[0] if lrs else 0.0)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    precision = (
        torch.autocast("cpu", dtype=getattr(torch, autocast))
        if autocast
        else torch.autocast("cpu", enabled=False)
    )
    losses: list[float] = []
    start = time.perf_counter()
    policy.train()
    for step, (indices, lr) in enumerate(zip(batches, lrs, strict=True), start=1):
        optimizer.zero_grad(set_to_none=True)
        with precision:
            loss = ptx_backward(policy, [examples[i] for i in indices], pad, "cpu")
        torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0)
        for group in optimizer.param_groups:
            group["lr"] = lr
        optimizer.step()
        losses.append(round(loss, 4))
        if step % 5 == 0 or step == len(batches):
            log(
                f"{name} step {step}/{len(batches)}: loss {losses[-1]:.3f}, {time.perf_counter() - start:.0f} s"
            )
    policy.eval()
    return losses


def _main_pass(
    data: StudyData,
    settings: WarmStartSettings,
    model: str,
    env_kwargs: dict[str, dict[str, Any]],
    out: Path,
    threads: int,
    log: Any,
) -> None:
    """Fact lessons and demonstrated episodes; writes the model and ``warm_start.json`` to ``out``."""
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM

    from searchgym.models import resolve_model
    from searchgym.policies.tiny import load_tokenizer
    from searchgym.trainers.grpo.ptx import load_ptx_examples, write_ptx_examples

    torch.set_num_threads(threads)
    torch.manual_seed(settings.seed)
    source = resolve_model(model)
    tokenizer = load_tokenizer(source)
    policy = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    out.mkdir(parents=True, exist_ok=True)
    questions = {q["id"]: q for q in [*data.train, *data.heldout]}
    chat_lessons: list[tuple[str, str]] = []
    if "chat" in settings.lesson_prompts:
        chat_lessons = [
            (fact_prompt(tokenizer, questions[qid]["question"]), questions[qid]["golden_answers"][0])
            for qid in sorted(data.taught)
        ]
    # the agent's answer turn stops at its closing tag, without an end token, as episodes do
    agent = [
        lesson
        for prompt, tag in (("agent", "answer"), ("think", "think"))
        if prompt in settings.lesson_prompts
        for lesson in agent_lessons(data, env_kwargs["search_r1"], tokenizer, tag)
    ]
    lessons = chat_lessons + agent
    write_ptx_examples(out / "lessons.jsonl", chat_lessons * settings.fact_repeats, eos=True)
    write_ptx_examples(out / "agent_lessons.jsonl", agent * settings.fact_repeats, eos=False)
    episodes: list[tuple[str, str]] = []
    turn_ends: list[tuple[str, str]] = []
    for protocol in settings.protocols:
        at_stop, at_eos = split_by_turn_end(
            episode_pairs(data, env_kwargs[protocol], protocol, tokenizer, settings), protocol
        )
        episodes += at_stop
        turn_ends += at_eos
    # generation stops at the protocol's stop strings: an action ending in one is trained
    # without the end token; any other action (SEM's answer turns) ends with it
    write_ptx_examples(out / "episodes.jsonl", episodes * settings.episode_repeats, eos=False)
    write_ptx_examples(out / "episode_turn_ends.jsonl", turn_ends * settings.episode_repeats, eos=True)
    examples = [
        *load_ptx_examples(out / "lessons.jsonl", tokenizer),
        *load_ptx_examples(out / "agent_lessons.jsonl", tokenizer),
        *load_ptx_examples(out / "episodes.jsonl", tokenizer),
        *(load_ptx_examples(out / "episode_turn_ends.jsonl", tokenizer) if turn_ends else []),
    ]
    rng = np.random.default_rng(settings.seed)
    batches = [
        batch
        for _ in range(settings.epochs)
        for batch in _batches([len(e.token_ids) for e in examples], settings.batch_size, rng)
    ]
    total = len(batches)
    log(f"warm start: {len(examples)} examples, {total} steps of {settings.batch_size}")
    lrs = [settings.lr * lr_factor(settings.lr_schedule, step, total) for step in range(total)]
    start = time.perf_counter()
    losses = _train(policy, tokenizer, examples, batches, lrs, settings.autocast, log, "warm start")
    policy.save_pretrained(out)
    tokenizer.save_pretrained(out)
    figures = {
        "settings": asdict(settings),
        "model": model,
        "lessons": len(lessons) * settings.fact_repeats,
        "episode_actions": len(episodes) + len(turn_ends),
        "episode_actions_with_end_token": len(turn_ends),
        "steps": total,
        "loss_first": losses[0] if losses else None,
        "loss_last10": float(np.mean(losses[-10:])) if losses else None,
        "wall_s": round(time.perf_counter() - start, 1),
        "torch_threads": threads,
    }
    (out / "warm_start.json").write_text(json.dumps(figures, indent=2) + "\n", encoding="utf-8")


def _decision_pass(
    data: StudyData,
    settings: WarmStartSettings,
    env_kwargs: dict[str, dict[str, Any]],
    main: Path,
    out: Path,
    threads: int,
    log: Any,
) -> None:
    """The decision pass on top of the main pass's model in ``main``; writes the model and
    ``decision.json`` to ``out``."""
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM

    from searchgym.policies.tiny import load_tokenizer
    from searchgym.trainers.grpo.ptx import load_ptx_examples, write_ptx_examples

    torch.set_num_threads(threads)
    torch.manual_seed(settings.seed)
    tokenizer = load_tokenizer(main)
    policy = AutoModelForCausalLM.from_pretrained(main, dtype=torch.float32)
    out.mkdir(parents=True, exist_ok=True)
    examples: list[Any] = []
    groups: list[str] = []
    counts: dict[str, int] = {}
    for protocol in settings.protocols:
        for kind, pairs in first_actions(data, env_kwargs[protocol], protocol, tokenizer, settings).items():
            for eos, part in zip((False, True), split_by_turn_end(pairs, protocol), strict=True):
                if part:  # SEM's direct first actions end with the end token
                    path = out / f"first_{protocol}_{kind}{'_eos' if eos else ''}.jsonl"
                    write_ptx_examples(path, part, eos=eos)
                    examples += load_ptx_examples(path, tokenizer)
                    groups += [f"{protocol}/{kind}"] * len(part)
            counts[f"{protocol}/{kind}"] = len(pairs)
    rng = np.random.default_rng(settings.seed)
    batches: list[list[int]] = []
    while len(batches) < settings.decision_steps:
        batches += _stratified_batches(groups, settings.batch_size, rng)
    batches = batches[: settings.decision_steps]
    log(
        f"decision pass: {len(examples)} first actions {counts}, {len(batches)} steps of {settings.batch_size}"
    )
    start = time.perf_counter()
    lrs = [settings.decision_lr] * len(batches)
    losses = _train(policy, tokenizer, examples, batches, lrs, settings.autocast, log, "decision pass")
    policy.save_pretrained(out)
    tokenizer.save_pretrained(out)
    figures = {
        "first_actions": counts,
        "steps": len(batches),
        "loss_first": losses[0] if losses else None,
        "loss_last10": float(np.mean(losses[-10:])) if losses else None,
        "wall_s": round(time.perf_counter() - start, 1),
        "torch_threads": threads,
    }
    (out / "decision.json").write_text(json.dumps(figures, indent=2) + "\n", encoding="utf-8")
