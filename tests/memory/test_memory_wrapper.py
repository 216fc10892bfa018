"""ExperienceWrapper: prompt layout, switches, marked spans, recording, HiExp hints, conformance."""

from __future__ import annotations

import re

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import searchgym  # noqa: F401  (registers the env ids)
from searchgym.envs.records import Action, Question, Trajectory, Turn
from searchgym.envs.testing import HOSTILE_ACTIONS
from searchgym.error import InvalidArgumentError
from searchgym.memory import ExperienceBank, ExperienceMemory, ExperienceWrapper, MemorySpan
from searchgym.policies import make_policy
from searchgym.policies.base import split_context
from searchgym.retrieval.records import Doc

ENV_ID = "searchgym/SyntheticFacts-v1"

_CALL = '<tool_call>{"name": "search", "arguments": {"query": "capital of Zedland"}}</tool_call>'
EXAMPLE = Trajectory(
    Question("ex-1", "What is the capital of Zedland?", ("Qor",)),
    "tool_call",
    [
        Turn(
            f"<think>I need the capital.</think>\n{_CALL}",
            Action(kind="search", query="capital of Zedland", think_blocks=1),
            [Doc("d1", "Zedland", "The capital of Zedland is Qor.")],
            "\n<tool_response>Doc 1 (Title: Zedland) The capital of Zedland is Qor.</tool_response>\n",
        ),
        Turn(
            "<think>Found it.</think>\n<answer>Qor</answer>",
            Action(kind="answer", answer="Qor", think_blocks=1),
        ),
    ],
    reward=1.0,
)
# The example part as the wrapper must render it (worked out by hand from EXAMPLE).
EXAMPLE_PART = (
    "<example>\n"
    "An earlier episode that scored 1.00:\n"
    "Question: What is the capital of Zedland?\n"
    f"<think>I need the capital.</think>\n{_CALL}\n"
    "<tool_response>Doc 1 (Title: Zedland) The capital of Zedland is Qor.</tool_response>\n"
    "<think>Found it.</think>\n<answer>Qor</answer>\n"
    "</example>"
)
EXPERIENCE_PART = (
    "<experience>\n"
    "Guidance learnt from earlier episodes:\n"
    "Success strategies:\n- Search once for the missing fact.\n"
    "Pitfalls to avoid:\n- Guessing without a search.\n"
    "</experience>"
)


class _FixedSummarizer:
    name = "fixed"

    def summarize(self, good, bad, previous):
        return ExperienceBank(("Search once for the missing fact.",), ("Guessing without a search.",))


def _memory() -> ExperienceMemory:
    memory = ExperienceMemory(update_every=1, summarizer=_FixedSummarizer(), seed=0)
    memory.add(EXAMPLE)
    bad = Trajectory(Question("ex-2", "Who?", ("A",)), "tool_call", [], truncated=True, reward=0.0)
    memory.add(bad)
    assert memory.step().outcome == "written"  # type: ignore[union-attr]
    return memory


def _env(**kwargs) -> gym.Env:
    return gym.make(ENV_ID, protocol="tool_call", reward="lightsearcher", **kwargs)


def test_prompt_layout_is_instructions_experience_example_question() -> None:
    env = ExperienceWrapper(_env(), _memory())
    obs, info = env.reset(seed=0, options={"index": 5})
    base = env.unwrapped
    instructions = base.protocol.instructions()
    question = base.trajectory.question.question
    assert obs == f"{instructions}\n\n{EXPERIENCE_PART}\n\n{EXAMPLE_PART}\n\nQuestion: {question}\n"
    e_start = len(instructions) + 2
    x_start = e_start + len(EXPERIENCE_PART) + 2
    assert info["memory_spans"] == [
        MemorySpan("experience", e_start, e_start + len(EXPERIENCE_PART)),
        MemorySpan("example", x_start, x_start + len(EXAMPLE_PART)),
    ]
    assert split_context(obs)[0] == question  # policies still find the real question


@pytest.mark.parametrize("use_experience", [True, False])
@pytest.mark.parametrize("few_shot", [True, False])
@pytest.mark.parametrize("instructions", [True, False])
def test_switches_and_spans(use_experience: bool, few_shot: bool, instructions: bool) -> None:
    bare = _env()
    bare_obs, _ = bare.reset(seed=3)
    env = ExperienceWrapper(
        _env(), _memory(), use_experience=use_experience, few_shot=few_shot, instructions=instructions
    )
    obs, info = env.reset(seed=3)
    kinds = [s.kind for s in info["memory_spans"]]
    assert kinds == [k for k, on in (("experience", use_experience), ("example", few_shot)) if on]
    assert ("<experience>" in obs) == use_experience and ("<example>" in obs) == few_shot
    for span in info["memory_spans"]:
        assert obs[span.start : span.end].startswith(f"<{span.kind}>\n")
        assert obs[span.start : span.end].endswith(f"\n</{span.kind}>")
    # Cutting the marked spans out leaves the env's own prompt (less the instructions when off).
    cut = obs
    for span in reversed(info["memory_spans"]):
        cut = cut[: span.start] + cut[span.end :]
    instr = env.unwrapped.protocol.instructions()
    expected = bare_obs if instructions else bare_obs[len(instr) :].lstrip("\n")
    assert re.sub(r"\n{3,}", "\n\n", cut).lstrip("\n") == expected
    if not (use_experience or few_shot) and instructions:
        assert obs == bare_obs and info["memory_spans"] == []


def test_no_example_of_the_current_question() -> None:
    memory = _memory()
    env = ExperienceWrapper(_env(), memory)
    obs, info = env.reset(
        options={"question": EXAMPLE.question.question, "golden_answers": ["Qor"], "id": "x"}
    )
    assert "<example>" not in obs and [s.kind for s in info["memory_spans"]] == ["experience"]


def test_seeded_resets_draw_the_same_example() -> None:
    memory = ExperienceMemory(seed=0)
    for i in range(20):
        t = Trajectory(Question(f"p{i}", f"Pool question {i}?", ("x",)), "tool_call", [], reward=1.0)
        memory.add(t)
    env = ExperienceWrapper(_env(), memory)
    first, _ = env.reset(seed=11)
    assert env.reset(seed=11)[0] == first
    draws = {env.reset()[0] for _ in range(10)}
    assert len(draws) > 1  # unseeded resets vary


def test_a_prompt_seed_fixes_the_example_whatever_the_reset_seed() -> None:
    memory = ExperienceMemory(seed=0)
    for i in range(20):
        t = Trajectory(Question(f"p{i}", f"Pool question {i}?", ("x",)), "tool_call", [], reward=1.0)
        memory.add(t)
    env = ExperienceWrapper(_env(), memory, record=False)

    def example(seed, prompt_seed):
        obs, _ = env.reset(seed=seed, options={"index": 3, "prompt_seed": prompt_seed})
        assert env.unwrapped.questions[3].question in obs  # the index still reaches the env
        return obs.split("<example>")[1]

    # A GRPO group: one prompt seed, eight reset seeds, one example.
    assert len({example(seed, [7, 0]) for seed in range(8)}) == 1
    assert len({example(0, [7, g]) for g in range(8)}) > 1  # other groups draw others
    assert example(5, 11) == example(6, 11)
    env.reset(options={"prompt_seed": 2})  # no other option: a random question, no error
    for bad in (-1, "7", 1.5, True, [1, -2], {"a": 1}):
        with pytest.raises(InvalidArgumentError, match="prompt_seed"):
            env.reset(options={"index": 0, "prompt_seed": bad})


def test_episodes_are_recorded_with_their_reward() -> None:
    memory = ExperienceMemory(seed=0)
    env = ExperienceWrapper(_env(), memory)
    agent = make_policy("oracle_synthetic", protocol="tool_call", world=env.unwrapped.world)
    rewards, f1s = [], []
    for ep in range(12):
        context, _ = env.reset(seed=ep)
        done = False
        while not done:
            action = agent.act([context])[0]
            obs, reward, terminated, truncated, info = env.step(action)
            context += action + obs
            done = terminated or truncated
        rewards.append(reward)
        f1s.append(info["f1"])
    assert len(memory) == 12
    # The oracle reads the real question through the augmented prompt: every answer is right.
    assert f1s == [1.0] * 12
    stored = [memory.sample_few_shot(np.random.default_rng(s)) for s in range(50)]
    assert {t.reward for t in stored if t is not None} <= set(rewards)
    assert memory.pool_size == sum(r >= 0.3 for r in rewards)


def test_seeded_wrappers_draw_the_same_examples_without_reset_seeds() -> None:
    memory = ExperienceMemory(update_every=1, summarizer=_FixedSummarizer(), seed=0)
    for n in range(8):
        memory.add(Trajectory(Question(f"ex-{n}", f"Question {n}?", ("A",)), "tool_call", [], reward=1.0))
    memory.add(Trajectory(Question("bad", "Who?", ("A",)), "tool_call", [], truncated=True, reward=0.0))
    memory.step()

    def examples(seed):
        env = ExperienceWrapper(_env(), memory, record=False, seed=seed)
        return [env.reset(options={"index": 0})[0].split("<example>")[1] for _ in range(12)]

    assert examples(3) == examples(3)
    assert len(set(examples(3))) > 1 and examples(3) != examples(4)


def test_record_off_and_memory_without_add() -> None:
    memory = ExperienceMemory()
    env = ExperienceWrapper(_env(), memory, record=False)
    env.reset(seed=0)
    env.step("<think>x</think><answer>y</answer>")
    assert len(memory) == 0


@pytest.mark.filterwarnings("ignore:.*different from the unwrapped version")
def test_check_env_and_hostile_actions_through_the_wrapper() -> None:
    env = ExperienceWrapper(_env(), _memory())
    check_env(env, skip_render_check=True)
    for action in HOSTILE_ACTIONS:
        env.reset(seed=0)
        for _ in range(10):
            obs, reward, terminated, truncated, info = env.step(action)
            assert isinstance(obs, str) and info["memory_spans"] == []
            if terminated or truncated:
                break


class _BrokenMemory:
    def __init__(self) -> None:
        self.added = 0

    @property
    def experience(self) -> ExperienceBank:
        raise OSError("disk gone")

    def sample_few_shot(self, rng):
        return None

    def add(self, trajectory):
        raise OSError("disk full")


def test_memory_failures_do_not_end_the_episode() -> None:
    env = ExperienceWrapper(_env(), _BrokenMemory())
    obs, info = env.reset(seed=0)
    assert "disk gone" in info["memory_error"] and "<experience>" not in obs
    _, _, terminated, _, info = env.step("<think>x</think><answer>y</answer>")
    assert terminated and "disk full" in info["memory_error"]


def test_bad_arguments() -> None:
    with pytest.raises(InvalidArgumentError, match="searchgym env"):
        ExperienceWrapper(gym.make("CartPole-v1"), ExperienceMemory())
    with pytest.raises(InvalidArgumentError, match="memory must be"):
        ExperienceWrapper(_env(), object())
    with pytest.raises(InvalidArgumentError, match="few_shot must be a bool"):
        ExperienceWrapper(_env(), ExperienceMemory(), few_shot="yes")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="seed must be an int >= 0"):
        ExperienceWrapper(_env(), ExperienceMemory(), seed=-1)
    memory = ExperienceMemory()
    wrapped = ExperienceWrapper(_env(), memory, use_experience=False)
    assert wrapped._saved_kwargs["memory"] is memory and wrapped._saved_kwargs["use_experience"] is False


# -- HiExp memories ------------------------------------------------------------------------------


class _StubHiExp:
    """Strategies and hints as plain strings, recording the calls."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def strategies(self, question: str, k: int = 5) -> list[str]:
        self.calls.append(("strategies", question, k))
        return [f"Strategy {i}" for i in range(k)]

    def hints(self, query: str, threshold: float = 0.8) -> list[str]:
        self.calls.append(("hints", query, threshold))
        return [f"Hint for {query}"]


def test_hiexp_strategies_at_reset_and_hints_after_a_search() -> None:
    memory = _StubHiExp()
    env = ExperienceWrapper(_env(), memory)
    obs, info = env.reset(seed=0)
    question = env.unwrapped.trajectory.question.question
    part = "<experience>\nStrategies from earlier episodes:\n" + "\n".join(
        f"- Strategy {i}" for i in range(5)
    )
    assert part + "\n</experience>" in obs and memory.calls == [("strategies", question, 5)]
    assert [s.kind for s in info["memory_spans"]] == ["experience"]  # no sample_few_shot: no example
    search = env.unwrapped.protocol.write_action(query="capital of Peru", think="t")
    obs, _, _, _, info = env.step(search)
    block = "<hint>\nHints from similar cases:\n- Hint for capital of Peru\n</hint>"
    assert obs.endswith(block + "\n") and "</tool_response>\n<hint>" in obs
    (span,) = info["memory_spans"]
    assert span.kind == "hint" and obs[span.start : span.end] == block
    assert memory.calls[-1] == ("hints", "capital of Peru", 0.8)
    # The recorded trajectory keeps the env's own observation, without the hint.
    assert "<hint>" not in env.unwrapped.trajectory.turns[-1].observation
    obs, _, terminated, _, info = env.step(env.unwrapped.protocol.write_action(answer="Lima", think="t"))
    assert terminated and "<hint>" not in obs and info["memory_spans"] == []


def test_hiexp_experience_off_means_no_strategies_and_no_hints() -> None:
    memory = _StubHiExp()
    env = ExperienceWrapper(_env(), memory, use_experience=False)
    obs, _ = env.reset(seed=0)
    obs, _, _, _, info = env.step(env.unwrapped.protocol.write_action(query="capital of Peru", think="t"))
    assert memory.calls == [] and "<hint>" not in obs and info["memory_spans"] == []


def _bag_of_words(texts: list[str]) -> np.ndarray:
    """A deterministic toy encoder: word counts hashed into 64 buckets."""
    out = np.zeros((len(texts), 64), dtype=np.float32)
    for row, text in enumerate(texts):
        for word in re.findall(r"[a-z]+", text.lower()):
            out[row, sum(map(ord, word)) % 64] += 1.0
    return out


def test_with_the_real_hierarchical_experience() -> None:
    from searchgym.memory import ExperienceRecord, HierarchicalExperience

    env = ExperienceWrapper(_env(), HierarchicalExperience([], encoder=_bag_of_words))
    env.reset(seed=0)
    question = env.unwrapped.trajectory.question.question
    records = [
        ExperienceRecord(1, "retrieval", question, ("t",), "Search the question as it is.", "why"),
        ExperienceRecord(1, "retrieval", "unrelated words entirely", ("t",), "Other advice.", "why"),
        ExperienceRecord(
            2, "strategy", "Answer questions like this", ("t",), "Search once, then answer.", "why"
        ),
    ]
    hiexp = HierarchicalExperience(records, encoder=_bag_of_words)
    env = ExperienceWrapper(_env(), hiexp)
    obs, _ = env.reset(seed=0)
    assert "- Answer questions like this — Search once, then answer." in obs
    agent = make_policy("naive_rag", protocol="tool_call")
    obs, _, _, _, info = env.step(agent.act([obs])[0])  # searches with the question text: cosine 1
    assert (
        "<hint>\nHints from similar cases:\n- " + question + " — Search the question as it is.\n</hint>"
        in obs
    )
    assert "Other advice." not in obs
