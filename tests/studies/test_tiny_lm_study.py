"""The CPU study's pieces: held-out splits, brief instructions, warm-start data, SFT, evaluation, pipeline."""

from __future__ import annotations

import importlib
import importlib.util
import json
from pathlib import Path

import gymnasium as gym
import pytest
import yaml

import searchgym  # noqa: F401  (registers the envs)
from searchgym.envs.synthetic import RELATIONS, generate_world
from searchgym.envs.synthetic_env import SyntheticFactsEnv, split_questions
from searchgym.error import InvalidArgumentError, SearchGymError

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from searchgym.trainers.config import ConfigError  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
TINY_LM = REPO / "studies" / "frugal" / "tiny_lm"

from studies.frugal.tiny_lm.config import StudyRunConfig, load_run_config  # noqa: E402

SMALL_WORLD = {"num_people": 12, "num_cities": 8, "num_countries": 3, "num_companies": 6}
BRIEF = "Answer the question. Search with <search> query </search>; answer with <answer> answer </answer>."


def trained_text(tokenizer, example):
    """The text of the tokens an SFT example trains on (its loss mask)."""
    return tokenizer.decode([t for t, m in zip(example.token_ids, example.loss_mask, strict=True) if m])


def test_split_questions_partition_the_world_the_same_way_every_time():
    world = generate_world(0)
    train, held_out = split_questions(world, "train"), split_questions(world, "eval", 0.25)
    assert {q.id for q in train}.isdisjoint(q.id for q in held_out)
    assert len(train) + len(held_out) == len(world.questions)
    assert len(held_out) == round(0.25 * len(world.questions))
    assert split_questions(world, "eval") == held_out
    assert split_questions(world, "all") == world.questions


@pytest.mark.parametrize(
    ("split", "fraction"), [("test", 0.25), ("eval", 0.0), ("eval", 1.0), ("eval", "0.2"), ("eval", True)]
)
def test_split_questions_reject_bad_arguments(split, fraction):
    with pytest.raises(InvalidArgumentError):
        split_questions(generate_world(0), split, fraction)


def test_env_split_and_brief_instructions():
    env = gym.make("searchgym/SyntheticFacts-v1", split="eval", instructions=BRIEF)
    obs, _ = env.reset(seed=0)
    assert obs.startswith(BRIEF + "\n\nQuestion: ")
    held_out = {q.id for q in split_questions(env.unwrapped.world, "eval")}
    assert {q.id for q in env.unwrapped.questions} == held_out
    with pytest.raises(InvalidArgumentError, match="instructions"):
        gym.make("searchgym/SyntheticFacts-v1", instructions="  ")


def test_experience_wrapper_keeps_the_envs_own_instructions():
    from searchgym.memory import ExperienceBank, ExperienceWrapper

    class FixedBank:  # a memory whose bank already holds one item
        experience = ExperienceBank(success_strategies=("Search for facts you do not know.",))

    memory = FixedBank()
    env = ExperienceWrapper(
        gym.make("searchgym/SyntheticFacts-v1", instructions=BRIEF), memory, few_shot=False
    )
    obs, info = env.reset(seed=0)
    assert obs.startswith(BRIEF)
    assert "Search for facts you do not know." in obs
    assert info["memory_spans"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from searchgym.policies.tiny import build_tiny_lm, load_tiny_lm

    path = build_tiny_lm(tmp_path_factory.mktemp("tiny"), vocab_size=400, hidden_size=32, num_layers=1)
    return path, load_tiny_lm(path)[1]


@pytest.mark.parametrize("protocol", ["search_r1", "sem"])
@pytest.mark.parametrize("search", [True, False])
def test_demonstrations_are_well_formed_episodes_with_masked_env_text(tiny, protocol, search):
    from studies.frugal.tiny_lm.demos import _episode, write_demo_actions

    env = SyntheticFactsEnv(world_seed=3, world_kwargs=SMALL_WORLD, protocol=protocol, max_turns=3)
    index = next(i for i, q in enumerate(env.questions) if q.hops == 2)
    chain = env.world.chain(env.questions[index].id)
    actions = write_demo_actions(protocol, chain, search)
    tokenizer = tiny[1]
    from searchgym.policies.chat import ChatFormatter

    example = _episode(env, index, actions, tokenizer, ChatFormatter(tokenizer))
    assert example is not None
    assert env.unwrapped.trajectory.em == 1.0  # the demonstration answers right
    assert len(example.token_ids) == len(example.loss_mask)
    trained = trained_text(tokenizer, example)
    assert "<information>" not in trained and "<result>" not in trained and "Question:" not in trained
    assert trained.count("<answer>") == (2 if protocol == "sem" and search else 1)
    assert example.kind == ("search" if search else "direct")


def test_warm_start_data_never_shows_an_unknown_fact_of_the_study_world(tiny):
    import random

    from studies.frugal.tiny_lm.demos import (
        chain_demonstrations,
        demo_env,
        demonstrations,
        recall_lessons,
        statements,
    )
    from studies.frugal.tiny_lm.sft import held_out_chains

    kwargs = {"world_kwargs": SMALL_WORLD, "max_turns": 3, "instructions": BRIEF}
    env = demo_env(5, kwargs, split="train")
    tokenizer = tiny[1]
    examples = statements(env, tokenizer, 1.0, 0.5, random.Random(0))
    examples += recall_lessons(env.world, tokenizer, 2)
    examples += demonstrations(env, tokenizer, search_prob=0.5, rng=random.Random(0), known_only=True)
    chains = chain_demonstrations(env, tokenizer, 1.0, 0.5, random.Random(0), held_out_chains(5, kwargs))
    assert chains
    examples += chains
    text = "\n".join(tokenizer.decode(e.token_ids) for e in examples)
    trained = "\n".join(trained_text(tokenizer, e) for e in examples)
    world = env.world
    assert any(f.known for f in world.facts)
    for fact, doc in zip(world.facts, world.docs, strict=True):
        assert (doc.text in trained) == fact.known  # unknown facts are at most retrieved context
    for question in split_questions(world, "eval"):
        if not question.known or question.hops == 2:  # known one-hop ones are shown by design
            assert question.question not in text


def test_chain_demonstrations_recall_both_hops_of_known_chains_and_skip_held_out_ones(tiny):
    import random

    from searchgym.envs.synthetic import two_hop_chains, two_hop_question
    from studies.frugal.tiny_lm.demos import chain_demonstrations, demo_env
    from studies.frugal.tiny_lm.sft import held_out_chains

    kwargs = {"world_kwargs": {**SMALL_WORLD, "known_fraction": 0.8}, "max_turns": 3, "instructions": BRIEF}
    env, tokenizer = demo_env(5, kwargs, split="train"), tiny[1]
    world = env.world
    for question, chain in zip(world.questions, world.chains, strict=True):
        if len(chain) == 2:  # the world's own two-hop questions are worded by two_hop_question
            assert question.question in {two_hop_question(*chain, v) for v in range(2)}
    held_out = held_out_chains(5, kwargs)
    known = [c for c in two_hop_chains(world.facts) if c[0].known and c[1].known]
    shown = [c for c in known if c not in held_out]
    assert shown and len(shown) < len(known)  # some known chains are held out
    examples = chain_demonstrations(env, tokenizer, 1.0, 0.0, random.Random(0), held_out, recall=True)
    assert len(examples) == sum(len(RELATIONS[second.relation].questions) for _, second in shown)
    texts = [tokenizer.decode(e.token_ids) for e in examples]
    for first, second in shown:
        hops = [(RELATIONS[f.relation].question_text(f.subject), f.object) for f in (first, second)]
        recollection = "<think>" + " ".join(f"Question: {q} Answer: {o}." for q, o in hops) + "</think>"
        assert any(two_hop_question(first, second) in t and recollection in t for t in texts)
    for first, second in set(known) & held_out:
        assert not any(two_hop_question(first, second, v) in t for t in texts for v in range(2))
    assert all(e.kind == "direct" for e in examples)  # search_prob 0
    searched = chain_demonstrations(env, tokenizer, 1.0, 1.0, random.Random(0), held_out, recall=True)
    assert searched and all(e.kind == "search" for e in searched)
    assert all(trained_text(tokenizer, e).count("<search>") == 2 for e in searched)
    assert all(e.hops == 2 for e in examples + searched)


def test_demonstrations_record_their_questions_hops(tiny):
    import random

    from studies.frugal.tiny_lm.demos import demo_env, demonstrations

    env = demo_env(5, {"world_kwargs": SMALL_WORLD, "max_turns": 3, "instructions": BRIEF}, split="all")
    examples = list(demonstrations(env, tiny[1], search_prob=1.0, rng=random.Random(0), known_only=False))
    assert len(examples) == len(env.questions)
    for example, question in zip(examples, env.questions, strict=True):
        assert example.hops == (question.hops or 1)
        assert trained_text(tiny[1], example).count("<search>") == example.hops  # one search per hop
    assert {e.hops for e in examples} == {1, 2}


def test_reading_lessons_train_only_the_copied_part(tiny):
    from studies.frugal.tiny_lm.demos import reading_examples, reading_seeds, shadow_seeds

    assert set(reading_seeds(5)).isdisjoint(shadow_seeds(0, 5) + shadow_seeds(1, 5))
    world = generate_world(9, **SMALL_WORLD)
    tokenizer = tiny[1]
    lessons = reading_examples(world, tokenizer)
    assert len(lessons) == 2 * sum(q.hops == 1 for q in world.questions)
    queries_only = reading_examples(world, tokenizer, passages=False)
    assert queries_only == lessons[0::2]  # the query lesson of each question, without the passage one
    for lesson in lessons[:20]:
        text = tokenizer.decode(lesson.token_ids)
        trained = trained_text(tokenizer, lesson)
        context = text[: len(text) - len(trained)]
        assert context.endswith(("Search:", "Answer:"))
        copied = trained.removesuffix("<|im_end|>").strip()
        name = copied.split(" born")[0].split(" city")[0].split(" capital")[0]
        name = name.split(" founder")[0].split(" founded")[0].split(" headquarters")[0]
        assert name and name in context  # the trained part copies a name that the context holds


def _smoke_config(tmp_path, **changes):
    data = {
        "output_dir": str(tmp_path / "run"),
        "steps": 2,
        "seed": 0,
        "env": {
            "id": "searchgym/SyntheticFacts-v1",
            "kwargs": {
                "world_seed": 7,
                "world_kwargs": SMALL_WORLD,
                "split": "train",
                "instructions": BRIEF,
                "reward": "lightsearcher",
                "retriever": "simulated",
                "retriever_kwargs": {"noise_prob": 0.2},
                "topk": 1,
                "max_turns": 3,
            },
        },
        "model": {
            "tiny": {"dir": str(tmp_path / "tiny"), "vocab_size": 400, "hidden_size": 32, "num_layers": 1}
        },
        "rollout": {
            "group_size": 2,
            "questions_per_step": 2,
            "max_new_tokens": 24,
            "max_context_tokens": 400,
        },
        "algo": {"lr": 1e-3},
        "checkpoint": {"every": 0},
        "sft": {
            "enabled": True,
            "dir": str(tmp_path / "sft"),
            "epochs": 1,
            "shadow_worlds": 1,
            "batch_size": 16,
            "reading_worlds": 1,
            "reading_epochs": 1,
            "replay_worlds": 1,
            "recall_repeats": 2,
        },
        "eval": {"enabled": True, "max_questions": 6},
    }
    data.update(changes)
    return StudyRunConfig.from_dict(data)


def test_sft_trains_and_is_cached(tmp_path):
    from safetensors.torch import load_file

    from searchgym.trainers.grpo.model import model_source
    from studies.frugal.tiny_lm.warm_start import warm_start

    config = _smoke_config(tmp_path)
    path = warm_start(config, progress=False)
    report = json.loads((path / "searchgym_sft.json").read_text())
    assert report["examples"]["recall"] > 0 and report["examples"]["direct"] > 0
    assert report["examples"]["search"] > 0 and report["examples"]["statement"] == 0  # passages off
    assert report["examples"]["reading"] > 0  # rehearsed reading lessons
    assert set(report["skills"]) == {"search_r1"}
    assert set(report["skills"]["search_r1"]) == {"forced_copy", "forced_recall", "forced_chain"}
    assert all(0.0 <= v <= 1.0 for v in report["skills"]["search_r1"].values())
    base = Path(report["base"])
    assert base.name.startswith("read-") and base.parent == path.parent
    base_report = json.loads((base / "searchgym_sft.json").read_text())
    assert len(base_report["epoch_losses"]) == 1
    for built in (report, base_report):  # what the cache key leaves out is recorded
        assert built["build"] == {"torch": torch.__version__, "torch_threads": torch.get_num_threads()}
    start = load_file(model_source(config.model) / "model.safetensors")
    read = load_file(base / "model.safetensors")
    after = load_file(path / "model.safetensors")
    assert any(not torch.equal(start[k], read[k]) for k in start)
    assert any(not torch.equal(read[k], after[k]) for k in start)
    mtime = (path / "searchgym_sft.json").stat().st_mtime
    assert warm_start(config, progress=False) == path
    assert (path / "searchgym_sft.json").stat().st_mtime == mtime
    # another seed: its own protocol stage, on the same reading-stage model
    other = warm_start(_smoke_config(tmp_path, seed=1), progress=False)
    assert other != path
    assert json.loads((other / "searchgym_sft.json").read_text())["base"] == report["base"]
    folders = sorted(p.name.split("-")[0] for p in path.parent.iterdir() if not p.name.startswith("."))
    assert folders == ["read", "sft", "sft"]


@pytest.mark.parametrize("chain_repeats", [0.0, 1.0])
@pytest.mark.parametrize("recall_form", [None, "recall", "question"])
@pytest.mark.parametrize("protocol", ["search_r1", "sem"])
def test_forced_probes_open_like_the_demonstrations_and_score_their_continuation(
    tmp_path, tiny, protocol, recall_form, chain_repeats
):
    from studies.frugal.tiny_lm.demos import write_demo_actions
    from studies.frugal.tiny_lm.evaluation import forced_probes, probe_score

    recall_think = recall_form is not None
    sft = {
        "recall_think": recall_think,
        "chain_repeats": chain_repeats,
        "recall_form": recall_form or "recall",
    }
    config = _smoke_config(tmp_path, sft=sft)

    def asked(question):
        return question.question if recall_form == "question" else None

    config = config.replace(env={"id": config.env.id, "kwargs": {**config.env.kwargs, "protocol": protocol}})
    tokenizer = tiny[1]
    probes = forced_probes(config, tokenizer)
    env = SyntheticFactsEnv(**{**config.env.kwargs, "split": "eval"})
    copy = [p for p in probes if p[1] == "forced_copy"]
    recall = [p for p in probes if p[1] == "forced_recall"]
    assert len(copy) == len(env.questions)
    assert len(recall) == sum(q.known and q.hops == 1 for q in env.questions) > 0
    for (ids, skill, name), question in zip(copy, env.questions, strict=True):
        fact = env.world.chain(question.id)[0]
        demo = write_demo_actions(
            protocol, [fact], search=True, recall=recall_think, question=asked(question)
        )[0]
        text = tokenizer.decode(ids)
        opening = text[text.rindex("<think>") :]
        assert demo.startswith(opening) and question.question in text and name == fact.subject
        assert probe_score(skill, name, demo[len(opening) :]) == 1.0  # the demonstration's own query
        assert probe_score(skill, name, " somebody else </search>") == 0.0
    known = [q for q in env.questions if q.known and q.hops == 1]
    for (ids, skill, name), question in zip(recall, known, strict=True):
        text = tokenizer.decode(ids)
        demo = write_demo_actions(
            protocol,
            env.world.chain(question.id),
            search=False,
            known=True,
            recall=recall_think,
            question=asked(question),
        )[0]
        opening = text[text.rindex("<think>") :]
        assert demo.startswith(opening)
        assert probe_score(skill, name, demo[len(opening) :]) == 1.0
        assert probe_score(skill, name, f" {name} junior </answer>") == 0.0
    chains = [p for p in probes if p[1] == "forced_chain"]
    known = [q for q in env.questions if q.known and q.hops == 2]
    assert len(chains) == len(known) > 0
    for (ids, skill, name), question in zip(chains, known, strict=True):
        chain = env.world.chain(question.id)
        demo = write_demo_actions(
            protocol,
            chain,
            search=False,
            known=True,
            recall=recall_think,
            ask_hops=bool(chain_repeats),
            question=asked(question),
        )[0]
        text = tokenizer.decode(ids)
        opening = text[text.rindex("<think>") :]
        assert demo.startswith(opening) and name == chain[-1].object
        assert probe_score(skill, name, demo[len(opening) :]) == 1.0  # scored on the last hop
        wrong = f" Who? Answer: {name}. Question: Who? Answer: {chain[0].object}.</think>"
        assert probe_score(skill, name, wrong) == 0.0


@pytest.mark.parametrize("ask_hops", [False, True])
@pytest.mark.parametrize("hops", [1, 2])
def test_recall_demonstrations_state_the_recollection_and_never_invent_a_name(tiny, hops, ask_hops):
    from searchgym.policies.chat import ChatFormatter
    from studies.frugal.tiny_lm.demos import _episode, write_demo_actions

    env = SyntheticFactsEnv(world_seed=3, world_kwargs=SMALL_WORLD, max_turns=3, instructions=BRIEF)
    index = next(i for i, q in enumerate(env.questions) if q.hops == hops)
    chain = env.world.chain(env.questions[index].id)
    answer, tokenizer = chain[-1].object, tiny[1]

    def run(search, known):
        actions = write_demo_actions("search_r1", chain, search, known=known, recall=True, ask_hops=ask_hops)
        assert _episode(env, index, actions, tokenizer, ChatFormatter(tokenizer)) is not None
        return actions, env.unwrapped.trajectory

    recollection = f"Recall: {answer}."
    if ask_hops and hops == 2:  # a known chain asks and answers each hop as a recall lesson does
        recollection = " ".join(
            f"Question: {RELATIONS[f.relation].question_text(f.subject)} Answer: {f.object}." for f in chain
        )
    actions, trajectory = run(search=False, known=True)
    assert actions == [f"<think>{recollection}</think>\n<answer> {answer} </answer>"]
    assert trajectory.em == 1.0
    actions, trajectory = run(search=False, known=False)
    assert actions == ["<think>Recall: unknown.</think>\n<answer> unknown </answer>"]
    assert trajectory.em == 0.0 and trajectory.num_searches == 0
    for known in (True, False):
        actions, trajectory = run(search=True, known=known)
        assert actions[0].startswith(
            f"<think>{recollection if known else 'Recall: unknown.'}</think>\n<search>"
        )
        assert trajectory.num_searches == hops and trajectory.em == 1.0


@pytest.mark.parametrize("hops", [1, 2])
def test_question_form_recollections_restate_the_question_in_a_recall_lessons_words(tiny, hops):
    from searchgym.policies.chat import ChatFormatter
    from studies.frugal.tiny_lm.demos import _episode, forced_opening, recall_pairs, write_demo_actions

    env = SyntheticFactsEnv(world_seed=3, world_kwargs=SMALL_WORLD, max_turns=3, instructions=BRIEF)
    index = next(i for i, q in enumerate(env.questions) if q.hops == hops and q.known)
    question, chain, tokenizer = env.questions[index], env.world.chain(env.questions[index].id), tiny[1]
    lessons = dict(recall_pairs(env.world))
    for known in (True, False):
        recalled = chain[-1].object if known else "unknown"
        for search in (True, False):
            actions = write_demo_actions(
                "search_r1", chain, search, known=known, recall=True, question=question.question
            )
            thought = f"<think>Question: {question.question} Answer: {recalled}.</think>\n"
            assert actions[0].startswith(thought)
            assert _episode(env, index, actions, tokenizer, ChatFormatter(tokenizer)) is not None
            assert env.unwrapped.trajectory.num_searches == (hops if search else 0)
            if not (known and search):  # the probes open as the demonstrations do
                opening = forced_opening("search_r1", search, recall=True, question=question.question)
                assert actions[0].startswith(opening)
    if hops == 1:  # a known fact's recollection is the recall lesson of its question, word for word
        context = f"Question: {question.question} Answer:"
        assert lessons[context] == f" {chain[0].object}"


@pytest.mark.parametrize("hops", [1, 2])
def test_sem_recall_demonstrations_choose_to_search_after_the_first_answer(tiny, hops):
    from searchgym.policies.chat import ChatFormatter
    from studies.frugal.tiny_lm.demos import _episode, forced_opening, write_demo_actions

    env = SyntheticFactsEnv(world_seed=3, world_kwargs=SMALL_WORLD, max_turns=3, protocol="sem", reward="sem")
    index = next(i for i, q in enumerate(env.questions) if q.hops == hops)
    chain = env.world.chain(env.questions[index].id)
    answer, tokenizer = chain[-1].object, tiny[1]
    rewards = {}
    for known in (True, False):
        first = (
            f"<think>My first answer.</think>\n<answer>\\boxed{{ {answer if known else 'unknown'} }}</answer>"
        )
        for search in (True, False):
            actions = write_demo_actions("sem", chain, search, known=known, recall=True)
            assert actions[0].startswith(first) and actions[0].startswith(forced_opening("sem", False, True))
            assert (len(actions) == 2) == search and actions[0].endswith(
                "</search>" if search else "</answer>"
            )
            assert _episode(env, index, actions, tokenizer, ChatFormatter(tokenizer)) is not None
            rewards[known, search] = env.unwrapped.trajectory.reward
    # SEM's reward: a needless search scores 0, a search after "unknown" the final answer
    assert rewards == {(True, False): 1.0, (True, True): 0.0, (False, True): 1.0, (False, False): 0.0}


def test_recall_think_writes_every_episode_of_the_protocol_stage_with_a_recollection(tmp_path, tiny):
    from studies.frugal.tiny_lm.sft import sft_examples

    tokenizer = tiny[1]
    sft = {"enabled": True, "shadow_worlds": 2, "recall_think": True, "chain_repeats": 1.0}
    config = _smoke_config(tmp_path, sft=sft)
    first_thoughts = []
    for example in sft_examples(config, tokenizer):
        if example.kind in ("direct", "search"):
            trained = trained_text(tokenizer, example)
            first_thoughts.append(trained.split("</think>")[0])
    assert first_thoughts and all(
        t.startswith(("<think>Recall: ", "<think>Question: ")) for t in first_thoughts
    )
    named = [t for t in first_thoughts if t != "<think>Recall: unknown."]
    assert any(t.count("Answer:") == 2 for t in named)  # two known facts asked and answered in turn
    # known facts (one-hop statements and two-hop demonstrations) name their answer; shadows do not
    assert 0.2 < len(named) / len(first_thoughts) < 0.8


def test_question_form_writes_every_recollection_of_the_protocol_stage_about_its_own_question(tmp_path, tiny):
    import re

    from studies.frugal.tiny_lm.sft import sft_examples

    tokenizer = tiny[1]
    sft = {"enabled": True, "shadow_worlds": 2, "recall_think": True, "recall_form": "question"}
    answers = []
    for example in sft_examples(_smoke_config(tmp_path, sft=sft), tokenizer):
        if example.kind in ("direct", "search"):
            prompt = tokenizer.decode(example.token_ids).split("<think>")[0]
            thought = trained_text(tokenizer, example).split("</think>")[0]
            asked, answer = re.fullmatch(r"<think>Question: (.+) Answer: (.+)", thought).groups()
            assert f"Question: {asked}<|im_end|>" in prompt  # the question of its own prompt
            answers.append(answer)
    assert answers and 0.2 < sum(a != "unknown." for a in answers) / len(answers) < 0.8


def test_recall_lessons_repeat_every_phrasing_of_known_facts_only(tiny):
    from studies.frugal.tiny_lm.demos import recall_lessons

    world, tokenizer = generate_world(9, **SMALL_WORLD), tiny[1]
    lessons = recall_lessons(world, tokenizer, 3)
    known = [f for f in world.facts if f.known]
    assert len(lessons) == 3 * 2 * len(known)  # every relation has two phrasings
    answers = {trained_text(tokenizer, e) for e in lessons}
    assert answers == {f" {f.object}<|im_end|>" for f in known}


def test_recall_topup_trains_missed_facts_until_the_target_and_is_cached(tmp_path):
    from safetensors.torch import load_file

    from studies.frugal.tiny_lm.sft import protocol_model
    from studies.frugal.tiny_lm.warm_start import warm_start

    topup = {
        "recall_target": 1.0,
        "topup_rounds": 1,
        "topup_share": 0.1,
        "topup_samples": 2,
        "recall_think": True,
    }
    config = _smoke_config(tmp_path, sft={**_smoke_config(tmp_path).sft.__dict__, **topup})
    path = warm_start(config, progress=False)
    report = json.loads((path / "searchgym_sft.json").read_text())
    assert path.name.startswith("top-")
    # the protocol stage is the one a run without a target gets, shared and unchanged
    no_target = config.replace(sft={**vars(config.sft), "recall_target": 0.0})
    assert (
        Path(report["base"])
        == protocol_model(config, progress=False)
        == warm_start(no_target, progress=False)
    )
    assert len(report["recall_levels"]) == 2 and all(0.0 <= v < 1.0 for v in report["recall_levels"])
    assert report["examples_per_round"] > 0
    before, after = (
        load_file(Path(report["base"]) / "model.safetensors"),
        load_file(path / "model.safetensors"),
    )
    assert any(not torch.equal(before[k], after[k]) for k in before)
    assert set(report["skills"]["search_r1"]) >= {"forced_copy", "forced_recall", "named_right"}
    mtime = (path / "searchgym_sft.json").stat().st_mtime
    assert warm_start(config, progress=False) == path
    assert (path / "searchgym_sft.json").stat().st_mtime == mtime


def test_memory_arms_warm_start_is_topped_up_behind_the_scripted_memory(tmp_path):
    from safetensors.torch import load_file

    from studies.frugal.tiny_lm.warm_start import warm_start, warm_start_folder

    sft = {
        **_smoke_config(tmp_path).sft.__dict__,
        "recall_think": True,
        "memory_share": 0.5,
        "memory_recall_target": 1.0,
        "topup_rounds": 1,
        "memory_topup_share": 0.2,
        "topup_samples": 2,
    }
    plain = _smoke_config(tmp_path, sft=sft)  # no memory: no top-up behind it
    config = plain.replace(memory={"kind": "lightsearcher"})
    assert warm_start_folder(config).name.startswith("mem-")
    path = warm_start(config, progress=False)
    assert path == warm_start_folder(config)
    report = json.loads((path / "searchgym_sft.json").read_text())
    assert Path(report["base"]) == warm_start(plain, progress=False) == warm_start_folder(plain)
    assert len(report["recall_levels"]) == 2 and report["examples_per_round"] > 0
    before, after = (
        load_file(Path(report["base"]) / "model.safetensors"),
        load_file(path / "model.safetensors"),
    )
    assert any(not torch.equal(before[k], after[k]) for k in before)
    # more copies of the two-hop episodes: a folder of its own, with more of them per round
    more = config.replace(sft={**vars(config.sft), "memory_topup_two_hop": 4})
    assert warm_start_folder(more) != path and warm_start_folder(more).name.startswith("mem-")
    richer = json.loads((warm_start(more, progress=False) / "searchgym_sft.json").read_text())
    assert richer["base"] == report["base"]  # the same protocol stage below it
    assert richer["examples_per_round"] == report["examples_per_round"]
    assert 0 < report["two_hop_share"] < richer["two_hop_share"]


def test_recall_by_fact_scores_every_known_one_hop_fact_of_the_split(tmp_path, tiny):
    from searchgym.policies.tiny import load_tiny_lm
    from studies.frugal.tiny_lm.demos import demo_env
    from studies.frugal.tiny_lm.evaluation import recall_by_fact

    model, tokenizer = load_tiny_lm(tiny[0])
    config = _smoke_config(tmp_path, sft={"recall_think": True})
    env = demo_env(7, config.env.kwargs, "train")
    expected = {env.world.chain(q.id)[0] for q in env.questions if q.known and (q.hops or 1) == 1}
    scores = recall_by_fact(model, tokenizer, config, samples=2, temperature=1.0)
    assert set(scores) == expected and expected
    assert all(v == 0.0 for v in scores.values())  # an untrained model names no fact
    asked = []
    recall_by_fact(model, tokenizer, config, wrap=lambda env: asked.append(env) or env)
    assert len(asked) == sum(1 for q in env.questions if q.known and (q.hops or 1) == 1)


def test_protocol_stage_shares_its_episodes_between_protocols(tmp_path, tiny):
    from studies.frugal.tiny_lm.sft import sft_examples

    def formats(protocols):
        config = _smoke_config(tmp_path, sft={"enabled": True, "shadow_worlds": 2, "protocols": protocols})
        examples = sft_examples(config, tiny[1])
        trained = [trained_text(tiny[1], e) for e in examples]
        return len(examples), sum("boxed" in t for t in trained if "<answer>" in t)

    (one, sem_in_one), (two, sem_in_two) = formats(["search_r1"]), formats(["search_r1", "sem"])
    assert sem_in_one == 0 and sem_in_two > 0
    assert abs(two - one) < 0.25 * one  # a second protocol costs about no more examples


def test_memory_share_writes_episodes_with_the_memory_arms_prompt_layout(tmp_path, tiny):
    from studies.frugal.tiny_lm.sft import sft_examples

    tokenizer = tiny[1]

    def episodes(share):
        config = _smoke_config(tmp_path, sft={"enabled": True, "shadow_worlds": 2, "memory_share": share})
        out = [e for e in sft_examples(config, tokenizer) if e.kind in ("direct", "search")]
        return out, [tokenizer.decode(e.token_ids) for e in out]

    plain, plain_text = episodes(0.0)
    mixed, mixed_text = episodes(0.5)
    assert episodes(0.5)[0] == mixed  # the few-shot examples are drawn the same way on every build
    assert not any("<experience>" in t for t in plain_text)
    wrapped = [(e, t) for e, t in zip(mixed, mixed_text, strict=True) if "<experience>" in t]
    assert 0.3 < len(wrapped) / len(mixed) < 0.7
    assert {e.kind for e, _ in wrapped} == {"direct", "search"}  # the bank never decides the action
    assert all("<example>\nAn earlier episode that scored" in t for _, t in wrapped)
    assert len({t.split("<experience>")[1].split("</experience>")[0] for _, t in wrapped}) > 1  # banks vary
    for example, text in wrapped:  # the memory's text is prompt: never trained
        trained = trained_text(tokenizer, example)
        assert "<experience>" not in trained and "earlier episode" not in trained
        assert text.index("</example>") < text.index("Question:", text.index("</example>"))


def test_warm_start_needs_the_synthetic_world(tmp_path):
    from studies.frugal.tiny_lm.warm_start import warm_start

    config = _smoke_config(tmp_path, env={"id": "searchgym/HotpotQA-v1", "kwargs": {}})
    with pytest.raises(InvalidArgumentError, match="SyntheticFacts"):
        warm_start(config, progress=False)


def test_pipeline_smoke_warm_start_grpo_and_held_out_table(tmp_path, capsys):
    """The CI smoke test of the study pipeline: it runs, parameters change, a table comes out."""
    from searchgym.trainers.config import save_config

    config = _smoke_config(
        tmp_path, memory={"kind": "lightsearcher", "update_every": 1}, algo={"lr": 1e-3, "ptx_coef": 0.1}
    )
    path = tmp_path / "arm.yaml"
    save_config(config, path)
    from studies.frugal.tiny_lm.train import main as train_arm

    assert train_arm(["--config", str(path), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "| Policy | Split |" in out and "known" in out
    result = json.loads((tmp_path / "run" / "eval.json").read_text())
    assert result["episodes"] == 6
    assert set(result["splits"]) <= {"known", "unknown", "1-hop", "2-hop"}
    assert result["settings"]["action_tokens"] > 0
    assert set(result["settings"]["skills"]) == {
        "direct_em_known",
        "query_names_subject",
        "em_after_search",
        "sr_known_recalled",
        "sr_known_unrecalled",
        "sr_known_2hop",
        "forced_copy",
        "forced_recall",
        "forced_chain",
    }
    saved = (tmp_path / "run" / "config.yaml").read_text()
    assert "sft-" in saved  # GRPO started from the warm start
    # ... and the saved config continues from it with no second SFT.
    continued = load_run_config(tmp_path / "run" / "config.yaml")
    assert not continued.sft.enabled and Path(continued.model.path).name.startswith(("sft-", "top-"))
    # ... and replayed the warm start's recall lessons, each known fact's phrasings once.
    assert str(tmp_path / "run" / "ptx_recall.jsonl") in saved
    replayed = (tmp_path / "run" / "ptx_recall.jsonl").read_text().splitlines()
    world = generate_world(7, **SMALL_WORLD)
    assert len(replayed) == 2 * sum(f.known for f in world.facts)
    # tiny_lm/benchmarks/study_reeval.py resumes the finished run (memory included) aside and
    # repeats its evaluation exactly, leaving the run folder as it was.
    spec = importlib.util.spec_from_file_location("study_reeval", TINY_LM / "benchmarks" / "study_reeval.py")
    reeval = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(reeval)
    before = sorted(p.relative_to(tmp_path) for p in (tmp_path / "run").rglob("*"))
    again = reeval.reevaluate(tmp_path / "run")
    assert again["repeats_eval_json"] and again["settings"]["skills"] == result["settings"]["skills"]
    # ... behind a borrowed store (here its own, so the figures repeat), without the memory,
    # and from the warm start.
    borrowed = reeval.reevaluate(tmp_path / "run", prompt=str(tmp_path / "run"))
    assert borrowed["repeats_eval_json"] is None
    assert all(borrowed[k] == result[k] for k in ("em", "st", "sr", "action_chars"))
    plain = reeval.reevaluate(tmp_path / "run", prompt="plain")
    assert plain["step"] == again["step"] == 2 and plain["episodes"] == 6
    assert reeval.reevaluate(tmp_path / "run", warm_start=True)["step"] == 0
    assert sorted(p.relative_to(tmp_path) for p in (tmp_path / "run").rglob("*")) == before
    # tiny_lm/benchmarks/study_searches.py rolls the final policy out on known training questions.
    spec = importlib.util.spec_from_file_location(
        "study_searches", TINY_LM / "benchmarks" / "study_searches.py"
    )
    searches = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(searches)
    counts = searches.count(tmp_path / "run", "train", hops=2, samples=2)
    env = SyntheticFactsEnv(world_seed=7, world_kwargs=SMALL_WORLD, split="train")
    known = sum(q.known and q.hops == 2 for q in env.questions)
    assert known and sum(counts["greedy"].values()) == known and sum(counts["T=1"].values()) == 2 * known
    # tiny_lm/benchmarks/study_recall_spread.py: per-fact recall of the final policy and of its warm start.
    spec = importlib.util.spec_from_file_location("spread", TINY_LM / "benchmarks" / "study_recall_spread.py")
    spread = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(spread)
    env = SyntheticFactsEnv(world_seed=7, world_kwargs=SMALL_WORLD, split="eval")
    known_eval = [q for q in env.questions if q.known]
    one_hop = [q for q in known_eval if q.hops == 1]
    facts = {env.world.chain(q.id)[0] for q in one_hop}
    for warm, plain in ((False, False), (True, False), (True, True)):
        rows = spread.spread(
            tmp_path / "run",
            warm_start=warm,
            split="eval",
            samples=2,
            temperatures=[0.0, 1.0],
            thresholds=[0.5],
            plain=plain,
        )
        assert [(r["T"], r["facts"]) for r in rows] == [(0.0, len(facts)), (1.0, len(facts))]
        for row in rows:
            assert 0.0 <= row["skippable >= 0.5"] <= len(one_hop) / len(known_eval)
            assert (row["facts >= 0.5"] == 0.0) == (row["skippable >= 0.5"] == 0.0)
    assert sorted(p.relative_to(tmp_path) for p in (tmp_path / "run").rglob("*")) == before
    # tiny_lm/benchmarks/study_probe.py --model probes a given folder (here the run's warm start).
    spec = importlib.util.spec_from_file_location("probe", TINY_LM / "benchmarks" / "study_probe.py")
    probe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe)
    study = tmp_path / "study.yaml"
    study.write_text(
        yaml.safe_dump({"output_dir": str(tmp_path / "s"), "base": config.to_dict(), "arms": {"a": {}}})
    )
    capsys.readouterr()
    args = ["--config", str(study), "--arm", "a", "--samples", "1", "--model", continued.model.path]
    assert probe.main(args) == 0
    assert f"model: {continued.model.path}" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        probe.main([*args[:-1], str(tmp_path / "nowhere")])


def test_greedy_sampling_is_deterministic(tiny):
    from searchgym.policies.tiny import load_tiny_lm
    from searchgym.trainers.grpo.generation import SamplingSettings, sample_actions

    model, tokenizer = load_tiny_lm(tiny[0])
    context = tokenizer("Question: where?", add_special_tokens=False)["input_ids"]
    runs = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        runs.append(
            sample_actions(model, tokenizer, [context] * 2, [8, 8], ["</search>"], SamplingSettings(0.0))
        )
    assert runs[0] == runs[1]
    assert runs[0][0] == runs[0][1]


@pytest.mark.parametrize(
    ("section", "value", "field"),
    [
        ("sft", {"fact_repeats": -1}, "fact_repeats"),
        ("sft", {"recall_repeats": -1}, "recall_repeats"),
        ("sft", {"passages": "yes"}, "passages"),
        ("sft", {"search_prob": 1.5}, "search_prob"),
        ("sft", {"shadow_search_prob": -0.1}, "shadow_search_prob"),
        ("sft", {"replay_worlds": -1}, "replay_worlds"),
        ("sft", {"memory_share": 2}, "memory_share"),
        ("sft", {"recall_think": "yes"}, "recall_think"),
        ("sft", {"recall_think": True, "recall_form": "lesson"}, "recall_form"),
        ("sft", {"recall_form": "question"}, "recall_form"),  # needs recall_think
        ("sft", {"protocols": []}, "protocols"),
        ("sft", {"epochs": 0}, "epochs"),
        ("sft", {"recall_target": 1.5}, "recall_target"),
        ("sft", {"topup_rounds": -1}, "topup_rounds"),
        ("sft", {"topup_share": 1.5}, "topup_share"),
        ("sft", {"topup_share": 0}, "topup_share"),
        ("sft", {"topup_samples": 0}, "topup_samples"),
        ("sft", {"memory_recall_target": -0.1}, "memory_recall_target"),
        ("sft", {"memory_topup_share": 0}, "memory_topup_share"),
        ("sft", {"memory_topup_two_hop": 0}, "memory_topup_two_hop"),
        ("sft", {"nope": 1}, "nope"),
        ("eval", {"temperature": -1}, "temperature"),
        ("eval", {"max_questions": -2}, "max_questions"),
    ],
)
def test_sft_and_eval_sections_are_checked(section, value, field):
    with pytest.raises(ConfigError, match=field):
        StudyRunConfig.from_dict({section: value})


def test_study_runs_every_arm_and_writes_table_json_and_plot(tmp_path, capsys):
    from searchgym.cli import main

    base = _smoke_config(tmp_path, steps=1).to_dict()
    base["eval"]["max_questions"] = 4
    study = {
        "runner": str(TINY_LM / "runner.py"),
        "output_dir": str(tmp_path / "study"),
        "seeds": [0],
        "base": base,
        "arms": {"f1": {"env": {"kwargs": {"reward": "f1"}}}, "tsas": {"algo": {"advantage": "tsas"}}},
    }
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(study))
    assert main(["study", "--config", str(path), "--no-progress"]) == 0
    table = capsys.readouterr().out
    assert "| f1 | 1 |" in table and "| tsas | 1 |" in table
    out = tmp_path / "study"
    results = json.loads((out / "results.json").read_text())
    assert {r["arm"] for r in results["runs"]} == {"f1", "tsas"}
    assert results["arms"]["f1"]["EM"]["n"] == 1
    assert (out / "frontier.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (out / "results.md").read_text().startswith("| Arm | Seeds |")
    # a second run picks the finished runs up instead of training again
    mtime = (out / "f1" / "seed0" / "eval.json").stat().st_mtime
    assert main(["study", "--config", str(path), "--no-progress", "--arms", "f1"]) == 0
    assert (out / "f1" / "seed0" / "eval.json").stat().st_mtime == mtime
    # ... and the table of a run of some arms keeps the other arms' finished runs
    assert json.loads((out / "results.json").read_text())["arms"].keys() == {"f1", "tsas"}
    capsys.readouterr()
    assert main(["study", "--config", str(path), "--no-progress", "--arms", "tsa"]) == 2
    assert "tsas" in capsys.readouterr().err  # did you mean
    # ... unless its settings changed since: then --collect leaves it out, and a run runs it again
    study["arms"]["f1"]["algo"] = {"lr": 1e-4}
    path.write_text(yaml.safe_dump(study))
    assert main(["study", "--config", str(path), "--no-progress", "--collect"]) == 0
    assert (out / "f1" / "seed0" / "eval.json").stat().st_mtime == mtime
    collected = json.loads((out / "results.json").read_text())["arms"]
    assert "f1" not in collected and set(collected) == set(results["arms"]) - {"f1"}
    assert main(["study", "--config", str(path), "--no-progress", "--arms", "f1"]) == 0
    assert (out / "f1" / "seed0" / "eval.json").stat().st_mtime > mtime
    # ... from scratch: the earlier run's folder (checkpoints and all) was set aside whole
    assert (out / "f1" / "seed0.old-1" / "eval.json").stat().st_mtime == mtime
    (checkpoint,) = (out / "f1" / "seed0" / "checkpoints").iterdir()
    assert load_run_config(checkpoint / "config.yaml").algo.lr == 1e-4


def test_aggregate_leaves_out_missing_and_nan_figures():
    from studies.frugal.tiny_lm.study import aggregate

    def run(seed, p_search_right):
        skills = {} if p_search_right is None else {"p_search_right": p_search_right}
        return {"arm": "sem", "seed": seed, "result": {"em": 0.5, "settings": {"skills": skills}}}

    summary = aggregate([run(0, 0.2), run(1, float("nan")), run(2, None)])["sem"]
    assert summary["P(search) recalled"] == {"mean": 20.0, "std": 0.0, "n": 1.0}
    assert summary["EM"] == {"mean": 50.0, "std": 0.0, "n": 3.0}


def test_a_runs_key_hashes_only_the_settings_that_differ_from_the_defaults(tmp_path):
    from studies.frugal.tiny_lm.study import config_key

    config = _smoke_config(tmp_path)
    data = config.to_dict()
    for section in ("algo", "rollout"):  # fields not written at all, as in a file older than them
        for name in ("ptx_coef", "ptx_data", "ptx_batch_size", "top_p"):
            data[section].pop(name, None)
    assert config_key(StudyRunConfig.from_dict(data)) == config_key(config)
    assert config_key(config.replace(algo={**vars(config.algo), "ptx_coef": 0.0})) == config_key(config)
    assert config_key(config.replace(algo={**vars(config.algo), "kl_coef": 0.01})) != config_key(config)
    assert config_key(config.replace(seed=1)) != config_key(config)
    assert config_key(config.replace(memory={"kind": "lightsearcher"})) != config_key(config)
    moved = config.replace(output_dir=str(tmp_path / "elsewhere"))
    assert config_key(moved) == config_key(config)  # where a run is, not how it runs
    assert config_key(moved, with_output_dir=True) != config_key(config, with_output_dir=True)


def test_a_study_moved_to_another_folder_keeps_its_finished_runs(tmp_path):
    from searchgym.cli import main
    from studies.frugal.tiny_lm.study import arm_config, load_study, run_key

    base = _smoke_config(tmp_path, steps=1).to_dict()
    base["eval"]["max_questions"] = 2
    study = {
        "runner": str(TINY_LM / "runner.py"),
        "output_dir": str(tmp_path / "a"),
        "seeds": [0],
        "base": base,
        "arms": {"f1": {}},
    }
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(study))
    assert main(["study", "--config", str(path), "--no-progress"]) == 0
    (tmp_path / "a").rename(tmp_path / "b")
    study["output_dir"] = str(tmp_path / "b")
    path.write_text(yaml.safe_dump(study))
    assert main(["study", "--config", str(path), "--no-progress", "--collect"]) == 0
    assert json.loads((tmp_path / "b" / "results.json").read_text())["arms"].keys() == {"f1"}
    # a key written before output_dir was left out of it still counts where the run is
    done = tmp_path / "b" / "f1" / "seed0" / "eval.json"
    result = json.loads(done.read_text())
    result["settings"]["config_key"] = run_key(arm_config(load_study(path), "f1", 0), with_output_dir=True)
    done.write_text(json.dumps(result))
    assert main(["study", "--config", str(path), "--no-progress", "--collect"]) == 0
    assert json.loads((tmp_path / "b" / "results.json").read_text())["arms"].keys() == {"f1"}


def test_a_runs_key_names_its_warm_start(tmp_path):
    """A finished run goes stale when the code would build its seed another warm start."""
    from studies.frugal.tiny_lm.study import config_key, run_key
    from studies.frugal.tiny_lm.warm_start import warm_start_folder

    config = _smoke_config(tmp_path, sft={"enabled": True, "recall_target": 0.5})
    assert run_key(config) == f"{config_key(config)}+{warm_start_folder(config).name}"
    assert warm_start_folder(config).name.startswith("top-")
    other = config.replace(sft={**vars(config.sft), "shadow_worlds": 3})
    assert warm_start_folder(other) != warm_start_folder(config)
    off = config.replace(sft={**vars(config.sft), "enabled": False})
    assert run_key(off) == config_key(off)


def _with_env(config, **kwargs):
    return config.replace(env={"id": config.env.id, "kwargs": {**config.env.kwargs, **kwargs}})


@pytest.mark.parametrize(
    "change",
    [
        lambda c: _with_env(c, split_by="fact"),
        lambda c: _with_env(c, world_kwargs={**SMALL_WORLD, "known_two_hop": False}),
        lambda c: _with_env(c, world_seed=8),
        lambda c: c.replace(seed=1),
        lambda c: c.replace(model={**vars(c.model), "cpu_threads": 2}),
        lambda c: c.replace(model={**vars(c.model), "tiny": {**vars(c.model.tiny), "hidden_size": 64}}),
        lambda c: c.replace(sft={**vars(c.sft), "fact_repeats": 2.0}),
        lambda c: c.replace(sft={**vars(c.sft), "reading_worlds": 3}),
        lambda c: c.replace(sft={**vars(c.sft), "recall_target": 0.6}),
    ],
    ids=[
        "split_by",
        "known_two_hop",
        "world_seed",
        "seed",
        "threads",
        "model_width",
        "fact_repeats",
        "reading_worlds",
        "recall_target",
    ],
)
def test_a_changed_setting_names_another_warm_start(tmp_path, change):
    from studies.frugal.tiny_lm.warm_start import warm_start_folder

    config = _smoke_config(tmp_path, sft={"enabled": True, "reading_worlds": 2, "recall_target": 0.5})
    same = StudyRunConfig.from_dict(json.loads(json.dumps(config.to_dict())))  # rebuilt from its dict
    assert warm_start_folder(same) == warm_start_folder(config)
    assert warm_start_folder(change(config)) != warm_start_folder(config)


def test_the_warm_start_runs_on_the_threads_its_key_holds(tmp_path):
    from studies.frugal.tiny_lm.warm_start import warm_start

    config = _smoke_config(tmp_path)
    config = config.replace(model={**vars(config.model), "cpu_threads": 1})
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        path = warm_start(config, progress=False)
    finally:
        torch.set_num_threads(threads)
    assert json.loads((path / "searchgym_sft.json").read_text())["build"]["torch_threads"] == 1


@pytest.mark.parametrize("library", ["torch", "transformers"])
def test_another_library_version_names_another_warm_start(tmp_path, monkeypatch, library):
    from studies.frugal.tiny_lm.warm_start import warm_start_folder

    config = _smoke_config(tmp_path, sft={"enabled": True})
    before = warm_start_folder(config)
    module = importlib.import_module(library)
    monkeypatch.setattr(module, "__version__", "99.1.0")
    assert warm_start_folder(config) != before


def test_study_file_errors_name_the_arm(tmp_path):
    from studies.frugal.tiny_lm.study import load_study

    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump({"seeds": [0], "arms": {"bad": {"algo": {"advantage": "nope"}}}}))
    with pytest.raises(ConfigError, match=r"arms\.bad"):
        load_study(path)
    path.write_text(yaml.safe_dump({"seeds": [], "arms": {"a": {}}}))
    with pytest.raises(ConfigError, match="seeds"):
        load_study(path)


def test_shipped_study_configs_load():

    from studies.frugal.tiny_lm.study import load_study, merge

    root = TINY_LM
    study = load_study(root / "study.yaml")
    assert len(study["arms"]) == 9 and study["seeds"] == [0, 1, 2]
    arm = load_run_config(root / "lightsearcher.yaml")
    assert arm.sft.enabled and arm.eval.enabled and arm.memory.kind == "lightsearcher"
    # the one-arm config is the study's lightsearcher arm, seed 0
    assert arm == StudyRunConfig.from_dict(
        merge(study["base"], {**study["arms"]["lightsearcher"], "seed": 0})
    )


def test_skills_read_recall_and_copying_from_real_episodes():
    from searchgym.trainers.grpo.rollout import Episode
    from studies.frugal.tiny_lm.demos import write_demo_actions
    from studies.frugal.tiny_lm.evaluation import skills

    env = SyntheticFactsEnv(world_seed=4, world_kwargs=SMALL_WORLD, max_turns=3)
    world = env.world

    def run(index, actions):
        env.reset(options={"index": index})
        for action in actions:
            _, reward, terminated, truncated, info = env.step(action)
            if terminated or truncated:
                return Episode(
                    question_index=index, group=0, reward=reward, info=info, trajectory=env.trajectory
                )
        raise AssertionError("the episode did not end")

    one_hop = [i for i, q in enumerate(env.questions) if q.hops == 1]
    known = next(i for i in one_hop if env.questions[i].known)
    unknown = next(i for i in one_hop if not env.questions[i].known)
    chain = world.chain(env.questions[unknown].id)
    right = run(known, write_demo_actions("search_r1", world.chain(env.questions[known].id), search=False))
    wrong = run(known, ["<answer> nobody </answer>"])
    searched = run(unknown, write_demo_actions("search_r1", chain, search=True))
    off_topic = run(unknown, ["<search> something else </search>", "<answer> x </answer>"])
    figures = skills([right, wrong, searched, off_topic], world)
    assert figures == {"direct_em_known": 0.5, "query_names_subject": 0.5, "em_after_search": 0.5}
    # Known questions searched, split by what the model recalls: here it recalls the
    # known fact, and searches it once out of three episodes.
    searched_known = run(
        known, write_demo_actions("search_r1", world.chain(env.questions[known].id), search=True)
    )
    fact = world.chain(env.questions[known].id)[0]
    figures = skills([right, wrong, searched_known, searched], world, {fact: 1.0})
    assert figures["sr_known_recalled"] == pytest.approx(1 / 3)
    assert figures["sr_known_unrecalled"] is None and figures["sr_known_2hop"] is None
    figures = skills([right, searched_known], world, {fact: 0.0})
    assert figures["sr_known_unrecalled"] == 0.5 and figures["sr_known_recalled"] is None


def test_shadow_demonstrations_search_as_often_as_shadow_search_prob_says(tmp_path, tiny):
    from studies.frugal.tiny_lm.sft import sft_examples

    def kinds(shadow_search_prob):
        sft = {"enabled": True, "shadow_worlds": 2, "search_prob": 0.0, "fact_repeats": 0}
        config = _smoke_config(tmp_path, sft={**sft, "shadow_search_prob": shadow_search_prob})
        examples = sft_examples(config, tiny[1])
        return sum(e.kind == "direct" for e in examples), sum(e.kind == "search" for e in examples)

    (direct_never, search_never), (direct_always, search_always) = kinds(0.0), kinds(1.0)
    assert search_never == 0  # search_prob 0 on the study world, and no shadow searches
    assert search_always > 0 and direct_always + search_always == direct_never
    assert kinds(None) == (direct_never, search_never)  # defaults to search_prob


def test_sem_demonstrations_show_needless_searches_to_the_sem_reward():
    from studies.frugal.tiny_lm.demos import write_demo_actions

    env = SyntheticFactsEnv(world_seed=3, world_kwargs=SMALL_WORLD, protocol="sem", reward="sem", max_turns=3)
    index = next(i for i, q in enumerate(env.questions) if q.hops == 1)
    chain = env.world.chain(env.questions[index].id)

    def reward(actions):
        env.reset(options={"index": index})
        for action in actions:
            _, value, terminated, truncated, info = env.step(action)
            assert info["format_ok"]
            if terminated or truncated:
                return value
        raise AssertionError("the episode did not end")

    known = write_demo_actions("sem", chain, search=True, known=True)
    unknown = write_demo_actions("sem", chain, search=True, known=False)
    assert chain[-1].object in known[0] and "unknown" in unknown[0]
    assert reward(known) == 0.0  # a right first answer, then a search: SEM scores it 0
    assert reward(unknown) == 1.0  # a wrong first answer repaired by the search
    assert reward(write_demo_actions("sem", chain, search=False)) == 1.0


def test_sft_weighs_every_trained_token_alike_across_length_grouped_batches(tiny):
    # Short examples end in " yes", long ones in " no" and a long trained tail, 1 : 3. Batches
    # are grouped by length, so per-batch averaging would give " yes" most of the weight.
    from searchgym.policies.tiny import load_tiny_lm
    from studies.frugal.tiny_lm.config import SFTConfig
    from studies.frugal.tiny_lm.demos import Example
    from studies.frugal.tiny_lm.sft import train_sft

    path, tok = tiny
    model = load_tiny_lm(path)[0]
    torch.manual_seed(0)

    def encode(text):
        return list(tok(text, add_special_tokens=False)["input_ids"])

    context, yes, no = encode("Question: shall we?"), encode(" yes"), encode(" no")
    tail = encode(" because the passage says so and so on" * 3)

    def example(target):
        ids = context + target
        return Example(tuple(ids), (0,) * len(context) + (1,) * len(target), "direct")

    examples = [example(yes)] * 40 + [example(no + tail)] * 120
    train_sft(
        model,
        examples,
        SFTConfig(enabled=True, epochs=6, lr=3e-3, batch_size=8),
        pad_id=tok.pad_token_id,
        seed=0,
        progress=False,
    )
    with torch.no_grad():
        probs = model(torch.tensor([context])).logits[0, -1].softmax(-1)
    share_yes = float(probs[yes[0]] / (probs[yes[0]] + probs[no[0]]))
    assert 0.1 < share_yes < 0.45, share_yes


def test_choice_probability_compares_the_two_whole_continuations(tiny):
    from searchgym.policies.tiny import load_tiny_lm
    from studies.frugal.tiny_lm.evaluation import _first_choice_probability

    model, tokenizer = load_tiny_lm(tiny[0])
    encode = lambda text: list(tokenizer(text, add_special_tokens=False)["input_ids"])  # noqa: E731
    context = encode("Question: who founded Abc?")
    first, second = (
        encode("<think>Recall: Abc.</think>\n<search>"),
        encode("<think>Recall: Abc.</think>\n<answer>"),
    )

    def whole(action):
        ids = torch.tensor([context + action])
        with torch.inference_mode():
            logprobs = torch.log_softmax(model(input_ids=ids).logits[0].float(), dim=-1)
        return sum(float(logprobs[t - 1, ids[0, t]]) for t in range(len(context), ids.shape[1]))

    expected = 1.0 / (1.0 + torch.exp(torch.tensor(whole(second) - whole(first))).item())
    assert _first_choice_probability(model, context, first, second) == pytest.approx(expected, abs=1e-5)
    assert _first_choice_probability(model, context, first, first) == pytest.approx(0.5)


def test_decision_probe_reads_the_recollection_and_the_choice_after_it(tmp_path, tiny):
    from searchgym.policies.tiny import load_tiny_lm
    from studies.frugal.tiny_lm.evaluation import decision_probe

    model, tokenizer = load_tiny_lm(tiny[0])
    config = _smoke_config(tmp_path, sft={"recall_think": True})
    found = decision_probe(model, tokenizer, config)
    assert {"recall_right_known", "says_unknown_unknown", "named_right"} <= set(found)
    assert {"p_search_known", "p_search_unknown", "p_search_right", "p_search_said_unknown"} <= set(found)
    assert found["recall_right_known"] == 0.0  # an untrained model names no fact
    assert 0.0 < found["p_search_known"] < 1.0 and 0.0 < found["p_search_unknown"] < 1.0
    sampled = decision_probe(model, tokenizer, config, temperature=1.0, samples=3)
    assert set(sampled) == set(found) and sampled["recall_right_known"] == 0.0


def test_decision_probe_asks_behind_the_memory_arms_prompt(tmp_path, tiny):
    import random

    from searchgym.policies.tiny import load_tiny_lm
    from studies.frugal.tiny_lm.evaluation import decision_probe
    from studies.frugal.tiny_lm.sft import scripted_memory

    model, tokenizer = load_tiny_lm(tiny[0])
    config = _smoke_config(tmp_path, sft={"recall_think": True, "shadow_worlds": 2, "memory_share": 0.5})
    memory, prompts = scripted_memory(config, "search_r1", random.Random(0)), []

    class Recorder(gym.Wrapper):
        def reset(self, **kwargs):
            obs, info = self.env.reset(**kwargs)
            prompts.append(obs)
            return obs, info

    found = decision_probe(model, tokenizer, config, wrap=lambda env: Recorder(memory.wrapped(env)))
    questions = split_questions(generate_world(7, **SMALL_WORLD), "eval")  # the probe asks held-out ones
    one_hop = [q for q in questions if (q.hops or 1) == 1]
    assert len(prompts) == len(one_hop)
    assert all("<experience>" in p and "<example>" in p for p in prompts)
    assert found["p_search_known"] != decision_probe(model, tokenizer, config)["p_search_known"]


def test_memory_arms_evaluation_probes_behind_their_memory(tmp_path, tiny):
    """A memory arm's eval skills describe the model as the arm meets it: behind its memory."""
    import random

    from searchgym.policies.tiny import load_tiny_lm
    from studies.frugal.tiny_lm.evaluation import evaluate_model
    from studies.frugal.tiny_lm.sft import scripted_memory

    model, tokenizer = load_tiny_lm(tiny[0])
    config = _smoke_config(
        tmp_path, sft={"recall_think": True, "shadow_worlds": 2}, eval={"max_questions": 2}
    )
    memory = scripted_memory(config, "search_r1", random.Random(0)).memory
    before = memory.experience
    behind = evaluate_model(model, tokenizer, config, memory=memory).settings["skills"]
    plain = evaluate_model(model, tokenizer, config).settings["skills"]
    assert memory.experience == before  # evaluation wrote nothing into the store
    assert behind["p_search_known"] != plain["p_search_known"]
    assert behind["forced_recall"] == plain["forced_recall"]  # the other probes stay plain


@pytest.mark.parametrize("protocol", ["search_r1", "sem"])
def test_scripted_memory_shows_right_direct_answers_and_searches(tmp_path, protocol):
    """The warm start's memory prompts must show what RL's will: right direct answers in the
    few-shot pool, and banks that sometimes speak for answering at once."""
    import random

    from studies.frugal.tiny_lm.sft import scripted_memory

    sft = {"recall_think": True, "shadow_worlds": 2, "memory_share": 0.5, "protocols": ["search_r1", "sem"]}
    memory, banks = scripted_memory(_smoke_config(tmp_path, sft=sft), protocol, random.Random(0)), []
    for _ in range(12):
        banks.append(memory.memory.experience.to_text())
        memory._new_bank()
    pool = memory.memory._trajectories.pool
    searched = [any(t.action.kind == "search" for t in trajectory.turns) for trajectory in pool]
    assert 0.2 < sum(searched) / len(pool) < 0.8
    assert all(trajectory.reward == 1.0 for trajectory in pool)
    assert any("without searching" in bank for bank in banks)
    assert any("Search for the facts" in bank for bank in banks)


def test_searchgym_train_refuses_a_study_config_in_one_line(capsys):
    from searchgym.cli import main

    assert main(["train", "--config", str(TINY_LM / "lightsearcher.yaml")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(TINY_LM / "lightsearcher.yaml") in err[0]


def test_the_study_config_holds_eval_and_the_dry_run_builds_the_eval_env(tmp_path):
    from searchgym.trainers.dry_run import check_run

    config = StudyRunConfig.from_dict({"output_dir": str(tmp_path / "run"), "eval": {"enabled": True}})
    assert config.eval.env_kwargs == {"split": "eval"} and config.eval.temperature == 0.0
    assert "the env and the eval env" in "\n".join(check_run(config))
    bad = config.replace(eval={"enabled": True, "env_kwargs": {"split": "evall"}})
    with pytest.raises(SearchGymError, match="eval.env_kwargs"):
        check_run(bad)
    with pytest.raises(ConfigError, match=r"^eval.max_questions: got -1; allowed: an int >= 0"):
        StudyRunConfig.from_dict({"eval": {"max_questions": -1}})


def test_searchgym_study_names_the_missing_runner_key(tmp_path):
    from searchgym.cli import main

    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump({"seeds": [0], "arms": {"a": {}}}))
    with pytest.raises(SystemExit, match="runner"):
        main(["study", "--config", str(path)])


def test_the_integration_checks_docs_table_is_generated_from_its_committed_result():
    """docs/tiny_lm_study.md's integration table is what integration_report.py writes from
    the committed integration.json, and the run's config is the committed one."""
    from studies.frugal.tiny_lm import integration_report
    from studies.frugal.tiny_lm.study import load_study

    result = json.loads(integration_report.RESULT.read_text(encoding="utf-8"))
    page = integration_report.PAGE.read_text(encoding="utf-8")
    assert f"<!-- table:{integration_report.NAME} -->\n{integration_report.render(result)}\n" in page
    study = load_study(TINY_LM / "integration.yaml")
    assert set(result["arms"]) == set(study["arms"]) == {"f1", "lightsearcher_no_memory", "otc"}
    kwargs = study["base"]["env"]["kwargs"]
    assert kwargs["split_by"] == "fact" and kwargs["world_kwargs"]["known_two_hop"] is False
    assert result["timing"]["torch_threads"] == 1


def test_integration_report_writes_only_between_its_markers(tmp_path):
    from studies.frugal.tiny_lm import integration_report

    page = tmp_path / "page.md"
    name = integration_report.NAME
    page.write_text(f"before\n<!-- table:{name} -->\nold\n<!-- end table:{name} -->\nafter\n")
    integration_report.write_page(page, "new table")
    assert page.read_text() == f"before\n<!-- table:{name} -->\nnew table\n<!-- end table:{name} -->\nafter\n"
    page.write_text("no markers\n")
    with pytest.raises(SystemExit, match="markers"):
        integration_report.write_page(page, "new table")


def test_the_runners_progress_lines_reach_stderr_as_it_is_when_each_line_is_written(monkeypatch):
    """A handler bound to the stream of setup time would keep writing to a replaced stream, and
    the CLI, finding a handler there, would add none of its own: its lines would vanish."""
    import io
    import logging
    import sys

    from studies.frugal.tiny_lm.runner import _log_progress

    logger = logging.getLogger("searchgym.trainers")
    monkeypatch.setattr(logger, "handlers", [])
    monkeypatch.setattr(logger, "level", logger.level)
    _log_progress()
    later = io.StringIO()
    monkeypatch.setattr(sys, "stderr", later)
    logger.info("step 1 of 2")
    assert "step 1 of 2" in later.getvalue()
