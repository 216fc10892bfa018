"""The OpenRLHF agent, driven through openrlhf 0.11.2's own ``MultiTurnAgentExecutor.execute``.

The world outside the unit is a vLLM-faithful engine (tests/fake_vllm.py): it decodes the
token ids it is given, asks a scripted searchgym policy for the next action, "generates" that
action followed by text a language model would ramble on with and its EOS, and applies
vLLM's rules for stop strings, EOS text and ``max_tokens``. Tokens
come from the tiny BPE tokenizer with a Qwen2.5-style chat template
(``searchgym.policies.tiny``). Expected texts, tokens and rewards are rebuilt independently
by running a second env with the same actions.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import logging
import re
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import gymnasium as gym
import pytest

pytest.importorskip("openrlhf.utils.agent", reason="needs openrlhf==0.11.2 (--no-deps) and aiohttp")
torch = pytest.importorskip("torch")

from fake_vllm import FakeVLLMEngine, SamplingParams, vllm_modules  # noqa: E402

import searchgym  # noqa: E402,F401
from searchgym.envs.synthetic import generate_world  # noqa: E402
from searchgym.memory.config import MemoryConfig  # noqa: E402
from searchgym.policies import OracleSyntheticPolicy  # noqa: E402
from searchgym.policies.chat import ChatFormatter  # noqa: E402
from searchgym.retrieval import make_retriever  # noqa: E402
from searchgym.retrieval.base import Retriever  # noqa: E402
from searchgym.trainers.agent_config import AgentConfig  # noqa: E402
from searchgym.trainers.openrlhf.agent import (  # noqa: E402
    EXTRA_LOG_KEYS,
    SearchGymAgentExecutor,
    label_to_options,
)

ENV_ID = "searchgym/SyntheticFacts-v1"
WORLD = generate_world(0)
RAMBLE = "\n<tool_response>Doc 1 (Title: Made up) invented text</tool_response>\n<answer>ramble</answer>"


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from searchgym.policies.tiny import build_tiny_lm, load_tokenizer

    folder = build_tiny_lm(tmp_path_factory.mktemp("tiny"), vocab_size=600, hidden_size=32, num_layers=1)
    return load_tokenizer(folder)


class ScriptedLLM(FakeVLLMEngine):
    """A vLLM-faithful engine (tests/fake_vllm.py) whose "model" writes what a policy decides.

    ``act(context) -> action`` decides the action from the decoded context; the model
    then writes the action followed by :data:`RAMBLE` and its EOS token, and vLLM's rules
    (stop strings, EOS text, ``max_tokens``) decide what comes back.
    """

    def __init__(self, tokenizer, act, ramble: str = RAMBLE):
        def generator(prompt_token_ids, sampling_params):
            context = tokenizer.decode(prompt_token_ids, skip_special_tokens=False)
            return self.encode(act(context) + ramble) + [tokenizer.eos_token_id]

        super().__init__(tokenizer, generator)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    @property
    def actions(self) -> list[str]:
        """The text of every answer, in order."""
        return [output.text for output in self.outputs]

    @property
    def params(self) -> list[SamplingParams]:
        """The sampling parameters of every request, in order."""
        return [params for _, params in self.requests]


def plain_context(chat_text: str) -> str:
    """The env-text context a scripted policy reads, recovered from the chat-rendered tokens."""
    head, marker, history = chat_text.partition("<|im_start|>assistant\n")
    if not marker:  # no chat template: the text is the env text already
        return chat_text
    question = head[head.rfind("\n\nQuestion: ") + len("\n\nQuestion: ") :].split("<|im_end|>")[0].strip()
    return f"Instructions\n\nQuestion: {question}\n{history}"


def oracle(protocol: str = "tool_call"):
    policy = OracleSyntheticPolicy(WORLD, protocol)
    return lambda context: policy.act([plain_context(context)])[0]


def scripted(actions: list[str]):
    queue = list(actions)
    return lambda context: queue.pop(0) if queue else actions[-1]


def label_of(question) -> str:
    return json.dumps(
        {"id": question.id, "question": question.question, "golden_answers": list(question.golden_answers)}
    )


def two_hop_unknown():
    """A two-hop question whose facts are both unknown: the oracle searches twice."""
    for q in WORLD.questions:
        if q.hops == 2 and all(not f.known for f in WORLD.chain(q.id)):
            return q
    raise AssertionError("the default world has no such question")


def run(executor, label, engine, tokenizer, max_length=4096, params=None):
    params = params or SamplingParams.openrlhf()
    return asyncio.run(
        executor.execute(
            prompt="ignored: the agent renders the prompt from the label",
            label=label,
            sampling_params=params,
            max_length=max_length,
            hf_tokenizer=tokenizer,
            llm_engine=engine,
        )
    )


def replay(env_kwargs: dict, label: str, actions: list[str]):
    """Run the same actions through a separate env: (prompt, observations, rewards)."""
    env = gym.make(ENV_ID, **env_kwargs)
    prompt, _ = env.reset(options=label_to_options(label))
    observations, rewards = [], []
    for action in actions:
        obs, reward, terminated, truncated, _ = env.step(action)
        observations.append(obs)
        rewards.append(reward)
        if terminated or truncated:
            break
    return prompt, observations, rewards, env.unwrapped.trajectory


# -- the agent file ---------------------------------------------------------------------------


def load_agent_file():
    """The agent file, loaded the way openrlhf/trainer/ray/vllm_engine.py loads it (that module needs vLLM)."""
    out = subprocess.run(
        [sys.executable, "-m", "searchgym.trainers.openrlhf", "--print-agent-path"],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout.strip()
    path = Path(out)
    assert path.is_file() and path.suffix == ".py", out
    spec = importlib.util.spec_from_file_location("agent_module", str(path))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_agent_file_runs_an_episode_configured_by_the_env_variable(tmp_path, monkeypatch, tokenizer):
    from openrlhf.utils.agent import AgentExecutorBase, AgentInstanceBase

    module = load_agent_file()
    assert issubclass(module.AgentExecutor, AgentExecutorBase)
    assert issubclass(module.AgentInstance, AgentInstanceBase)
    config = tmp_path / "agent.yaml"
    config.write_text(f"env: {{id: {ENV_ID}, protocol: tool_call, reward: f1}}\n")
    monkeypatch.setenv("SEARCHGYM_AGENT_CONFIG", str(config))
    question = next(q for q in WORLD.questions if q.known and q.hops == 1)
    engine = ScriptedLLM(tokenizer, oracle())
    result = run(module.AgentExecutor(), label_of(question), engine, tokenizer)  # built with no arguments
    # a known one-hop fact: the oracle answers at once and right, so F1 = 1 with no search
    assert result["reward"] == 1.0
    assert result["extra_logs"]["num_searches"] == 0.0
    assert len(result["action_ranges"]) == 1


# -- a multi-turn episode, token by token ---------------------------------------------------------


def test_two_search_episode_matches_the_chat_rendering_token_by_token(tokenizer):
    question = two_hop_unknown()
    env_kwargs = {"protocol": "tool_call", "reward": "f1"}
    executor = SearchGymAgentExecutor(config=AgentConfig(ENV_ID, env_kwargs))
    engine = ScriptedLLM(tokenizer, oracle())
    params = SamplingParams.openrlhf(max_new_tokens=256)
    result = run(executor, label_of(question), engine, tokenizer, params=params)

    actions = engine.actions
    assert len(actions) == 3 and all(a.endswith("</tool_call>") for a in actions[:2])
    assert actions[2].endswith("</answer>") and "ramble" not in "".join(actions)
    prompt, observations, rewards, trajectory = replay(env_kwargs, label_of(question), actions)
    assert rewards == [0.0, 0.0, 1.0] and trajectory.num_searches == 2

    # the tokens are the chat rendering of [prompt, a1, o1, a2, o2, a3], piece by piece
    fmt = ChatFormatter(tokenizer)
    enc = engine.encode
    pieces = [
        enc(fmt.prompt(prompt)),
        enc(actions[0]),
        enc(fmt.feedback(observations[0])),
        enc(actions[1]),
        enc(fmt.feedback(observations[1])),
        enc(actions[2]),
    ]
    assert result["observation_tokens"] == [t for piece in pieces for t in piece]
    text = tokenizer.decode(result["observation_tokens"], skip_special_tokens=False)
    assert text == fmt.render([prompt, actions[0], observations[0], actions[1], observations[1], actions[2]])
    assert text.count("<|im_start|>user") == 3 and text.endswith("</answer>")
    # the documents came back inside user turns, each closing the assistant turn before it
    assert observations[2] == ""
    for obs in observations[:2]:
        assert f"<|im_end|>\n<|im_start|>user\n{obs.strip()}<|im_end|>\n<|im_start|>assistant\n" in text

    # action ranges: exactly the generated tokens; everything else (env text) is masked
    starts = [sum(len(p) for p in pieces[:i]) for i in range(len(pieces))]
    expected_ranges = [(starts[i], starts[i] + len(pieces[i])) for i in (1, 3, 5)]
    assert [tuple(r) for r in result["action_ranges"]] == expected_ranges
    mask = [0] * len(result["observation_tokens"])
    for a, b in result["action_ranges"]:
        mask[a:b] = [1] * (b - a)
    special = {tokenizer.convert_tokens_to_ids(t) for t in ("<|im_start|>", "<|im_end|>")}
    assert all(m == 0 for t, m in zip(result["observation_tokens"], mask, strict=True) if t in special)
    doc_ids = enc(observations[0].strip())
    assert sum(mask[starts[2] : starts[3]]) == 0 and len(doc_ids) > 10
    assert sum(mask) == sum(len(pieces[i]) for i in (1, 3, 5))

    # rewards: the steps' sum is the env's terminal reward (F1 of the right answer: 1)
    assert result["reward"] == sum(rewards) == 1.0
    logs = result["extra_logs"]
    assert logs["num_searches"] == 2.0 and logs["searched"] == 1.0 and logs["turns"] == 3.0
    assert (
        logs["f1"] == 1.0
        and logs["em"] == 1.0
        and logs["answered"] == 1.0
        and logs["episode_truncated"] == 0.0
    )
    assert logs["reasoning_steps"] == 3.0  # one <think> block per action
    assert logs["action_chars"] == float(sum(len(a) for a in actions))


def test_stop_strings_are_set_on_a_copy_with_the_stop_string_kept(tokenizer):
    executor = SearchGymAgentExecutor(config=AgentConfig(ENV_ID, {"protocol": "tool_call"}))
    engine = ScriptedLLM(tokenizer, oracle())
    params = SamplingParams.openrlhf()
    params.stop = ["<|endoftext|>"]
    run(executor, label_of(two_hop_unknown()), engine, tokenizer, params=params)
    for request in engine.params:
        assert request.stop == ["<|endoftext|>", "</answer>", "</tool_call>"]
        assert request.include_stop_str_in_output is True
    assert params.stop == ["<|endoftext|>"] and params.include_stop_str_in_output is False

    sem = SearchGymAgentExecutor(config=AgentConfig(ENV_ID, {"protocol": "sem", "reward": "sem"}))
    engine = ScriptedLLM(tokenizer, oracle("sem"))
    run(sem, label_of(two_hop_unknown()), engine, tokenizer)
    assert engine.params[0].stop == ["</search>"]  # SEM's first turn goes on after </answer>


def test_without_stop_strings_the_rambling_model_breaks_the_format(tokenizer):
    """The control for the test above: what the executor's stop strings prevent."""
    env = gym.make(ENV_ID, protocol="tool_call")
    prompt, _ = env.reset(options=label_to_options(label_of(two_hop_unknown())))
    action = OracleSyntheticPolicy(WORLD, "tool_call").act([prompt])[0]
    assert action.endswith("</tool_call>")
    _, _, _, _, info = env.step(action + RAMBLE)
    assert "error" in info and info["num_searches"] == 0


def test_plain_tokenizer_gets_the_bare_env_text():
    """A tokenizer without a chat template: prompt and feedback are the env's own text."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    from tokenizers import decoders

    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(
        [d.text for d in WORLD.docs[:50]],
        trainers.BpeTrainer(
            vocab_size=400, special_tokens=["<eos>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
        ),
    )
    plain = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<eos>")
    question = two_hop_unknown()
    env_kwargs = {"protocol": "search_r1", "reward": "em"}
    engine = ScriptedLLM(plain, oracle("search_r1"))
    result = run(
        SearchGymAgentExecutor(config=AgentConfig(ENV_ID, env_kwargs)), label_of(question), engine, plain
    )
    prompt, observations, rewards, _ = replay(env_kwargs, label_of(question), engine.actions)
    text = plain.decode(result["observation_tokens"])
    assert (
        text
        == prompt
        + engine.actions[0]
        + observations[0]
        + engine.actions[1]
        + observations[1]
        + engine.actions[2]
    )
    assert result["reward"] == sum(rewards) == 1.0


# -- rewards and logs across a batch -----------------------------------------------------------------


def test_format_penalty_reaches_the_summed_reward(tokenizer, tmp_path):
    question = next(q for q in WORLD.questions if q.known and q.hops == 1)
    answer = question.golden_answers[0]
    actions = [
        "I will just answer.",  # malformed under tool_call: no <think>, no tags
        f"<think>I know it.</think>\n<answer>{answer}</answer>",
    ]
    env_kwargs = {
        "protocol": "tool_call",
        "reward": "lightsearcher",
        "reward_kwargs": {"store": str(tmp_path / "n.sqlite")},
    }
    engine = ScriptedLLM(tokenizer, scripted(actions), ramble="")
    result = run(
        SearchGymAgentExecutor(config=AgentConfig(ENV_ID, env_kwargs)), label_of(question), engine, tokenizer
    )
    # LightSearcher: any malformed turn makes R = -1 (docs/methods.md#lightsearcher-reward), given at the last step
    assert result["reward"] == -1.0
    assert result["extra_logs"]["format_errors"] == 1.0 and result["extra_logs"]["format_ok"] == 0.0
    assert len(result["action_ranges"]) == 2


def test_episode_out_of_token_budget_ends_truncated_with_the_scheme_reward(tokenizer, tmp_path):
    question = two_hop_unknown()
    env_kwargs = {
        "protocol": "tool_call",
        "reward": "lightsearcher",
        "reward_kwargs": {"store": str(tmp_path / "n.sqlite")},
    }
    executor = SearchGymAgentExecutor(config=AgentConfig(ENV_ID, env_kwargs))
    # room for the prompt, the first search and its documents, then a few tokens only
    probe = ScriptedLLM(tokenizer, oracle())
    full = run(
        SearchGymAgentExecutor(config=AgentConfig(ENV_ID, {"protocol": "tool_call"})),
        label_of(question),
        probe,
        tokenizer,
    )
    second_start = full["action_ranges"][1][0]
    engine = ScriptedLLM(tokenizer, oracle())
    result = run(executor, label_of(question), engine, tokenizer, max_length=second_start + 5)
    assert len(result["action_ranges"]) == 2 and result["truncated"] is True
    assert result["action_ranges"][1][1] - result["action_ranges"][1][0] == 5  # cut at max_tokens
    # the cut action is malformed, the base loop stops without a last step, and the executor
    # scores the truncated trajectory: LightSearcher's -1 for a malformed turn
    assert result["reward"] == -1.0 and result["scores"] == -1.0
    logs = result["extra_logs"]
    assert logs["episode_truncated"] == 1.0 and logs["answered"] == 0.0 and logs["num_searches"] == 1.0


def test_extra_logs_have_the_same_keys_on_every_sample_and_batch_in_openrlhf(tokenizer):
    from openrlhf.trainer.ppo_utils.experience import Experience, split_experience_batch

    questions = [two_hop_unknown(), next(q for q in WORLD.questions if q.known), WORLD.questions[5]]
    executor = SearchGymAgentExecutor(config=AgentConfig(ENV_ID, {"protocol": "tool_call"}))
    engines = [
        ScriptedLLM(tokenizer, oracle()),  # searches twice
        ScriptedLLM(tokenizer, oracle()),  # answers at once
        ScriptedLLM(tokenizer, scripted(["no tags at all"])),  # malformed until max_turns
        ScriptedLLM(tokenizer, oracle()),  # runs out of budget
    ]
    labels = [label_of(q) for q in questions] + [label_of(questions[0])]
    lengths = [4096, 4096, 4096, 300]

    async def rollouts():  # concurrently, as OpenRLHF's generate_responses gathers them
        return await asyncio.gather(
            *(
                executor.execute("p", label, SamplingParams.openrlhf(), n, tokenizer, engine)
                for label, engine, n in zip(labels, engines, lengths, strict=True)
            )
        )

    results = asyncio.run(rollouts())
    for result in results:
        assert list(result["extra_logs"]) == list(EXTRA_LOG_KEYS)
        assert all(isinstance(v, float) for v in result["extra_logs"].values())
    assert [r["extra_logs"]["num_searches"] for r in results[:3]] == [2.0, 0.0, 0.0]
    assert results[2]["extra_logs"]["format_errors"] == 4.0  # max_turns = 4, all malformed
    # OpenRLHF turns extra_logs into info tensors and batches them; mismatched keys fail here
    experiences = []
    for i, r in enumerate(results):
        info = {k: torch.tensor([v]) for k, v in r["extra_logs"].items()}
        info["reward"] = torch.tensor([r["reward"]])
        experiences.append(
            Experience(sequences=torch.tensor([r["observation_tokens"]]), index=[i], info=info)
        )
    batch = Experience.concat_experiences(experiences, tokenizer.pad_token_id)
    assert batch.info["num_searches"].tolist() == [r["extra_logs"]["num_searches"] for r in results]
    assert len(split_experience_batch(batch)) == 4


def test_a_bad_label_is_a_failed_episode_whose_log_line_says_how_to_fix_it(tokenizer, caplog):
    executor = SearchGymAgentExecutor(config=AgentConfig(ENV_ID, {"protocol": "tool_call"}))
    for label in ("not json", json.dumps({"question": "q"}), json.dumps(["a"])):
        caplog.clear()
        engine = ScriptedLLM(tokenizer, oracle())
        with caplog.at_level(logging.WARNING, logger="searchgym.trainers.openrlhf"):
            result = run(executor, label, engine, tokenizer)
        assert result["extra_logs"]["failed"] == 1.0 and result["reward"] == 0.0  # F1's malformed turn
        [record] = caplog.records
        assert "InvalidArgumentError" in record.getMessage() and "searchgym prepare" in record.getMessage()
        # one token generated from the row's prompt: the sequence OpenRLHF trains has an action
        assert [params.max_tokens for params in engine.params] == [1]
        assert [b - a for a, b in result["action_ranges"]] == [1]


# -- retrieval off the event loop, envs reused --------------------------------------------------------


class ThreadRecordingRetriever(Retriever):
    """BM25 over the world's passages, noting which thread each search runs on."""

    name = "thread_recording"

    def __init__(self):
        self.inner = make_retriever("bm25", docs=WORLD.docs)
        self.threads: list[int] = []

    def search(self, queries, k):
        self.threads.append(threading.get_ident())
        return self.inner.search(queries, k)

    def __len__(self):
        return len(self.inner)


def test_retrieval_runs_in_a_worker_thread_and_envs_are_reused(tokenizer):
    retriever = ThreadRecordingRetriever()
    config = AgentConfig(ENV_ID, {"protocol": "tool_call", "retriever": retriever})
    executor = SearchGymAgentExecutor(config=config)
    from searchgym.trainers.env_pool import env_pool

    pool = env_pool(config)

    async def episodes():
        loop_thread = threading.get_ident()
        for _ in range(3):
            await executor.execute(
                "p",
                label_of(two_hop_unknown()),
                SamplingParams.openrlhf(),
                4096,
                tokenizer,
                ScriptedLLM(tokenizer, oracle()),
            )
        return loop_thread

    loop_thread = asyncio.run(episodes())
    assert len(retriever.threads) == 6 and loop_thread not in retriever.threads
    assert pool.built == 1 and len(pool) == 1  # one env served the three episodes in turn


# -- experience memory ---------------------------------------------------------------------------------


def test_memory_example_enters_the_prompt_masked_and_episodes_are_recorded(tokenizer, tmp_path):
    from searchgym.memory import ExperienceMemory

    store = tmp_path / "memory"
    other = next(q for q in WORLD.questions if q.known and q.hops == 1)
    env = gym.make(ENV_ID, protocol="tool_call")
    prompt, _ = env.reset(options=label_to_options(label_of(other)))
    env.step(OracleSyntheticPolicy(WORLD, "tool_call").act([prompt])[0])
    assert env.unwrapped.trajectory.reward == 1.0
    with ExperienceMemory(store) as memory:
        memory.add(env.unwrapped.trajectory)  # R = 1 >= 0.3: the few-shot pool has one example
    config = AgentConfig(
        ENV_ID, {"protocol": "tool_call"}, memory=MemoryConfig(kind="lightsearcher", path=str(store))
    )
    engine = ScriptedLLM(tokenizer, oracle())
    result = run(SearchGymAgentExecutor(config=config), label_of(two_hop_unknown()), engine, tokenizer)
    first_action = result["action_ranges"][0][0]
    prompt_text = tokenizer.decode(result["observation_tokens"][:first_action], skip_special_tokens=False)
    assert "<example>" in prompt_text and other.question in prompt_text  # in the prompt, before any action
    assert re.search(r"Question: " + re.escape(two_hop_unknown().question), prompt_text)
    assert result["extra_logs"]["memory_chars"] > 0
    assert len(ExperienceMemory(store)) == 2  # the finished episode was recorded in the store


# -- a failing sample: a failed episode, not a dead rollout ------------------------------------------


class Flaky(gym.Wrapper):
    """An env whose ``reset`` or ``step`` raises on chosen calls, as a store call that times out does."""

    calls = {"reset": 0, "step": 0}
    fail: dict[str, set[int]] = {"reset": set(), "step": set()}
    lock = threading.Lock()

    def _count(self, where: str) -> None:
        with self.lock:
            n = self.calls[where]
            self.calls[where] += 1
        if n in self.fail[where]:
            raise TimeoutError(f"the store call timed out ({where} call {n})")

    def reset(self, **kwargs):
        self._count("reset")
        return self.env.reset(**kwargs)

    def step(self, action):
        self._count("step")
        return self.env.step(action)


@pytest.fixture
def openrlhf_rollout(monkeypatch):
    """OpenRLHF 0.11.2's rollout modules, imported on a CPU with a stand-in ``vllm`` (tests/fake_vllm.py).

    Returns ``(RolloutRayActor's class, SamplesGenerator, _load_agent_executor)``: the
    real code that loads the agent file, gathers a prompt's samples with
    ``asyncio.gather``, and turns each response into an Experience.
    """
    pytest.importorskip("ray")
    before = set(sys.modules)
    for name, module in vllm_modules().items():
        monkeypatch.setitem(sys.modules, name, module)
    from openrlhf.trainer.ppo_utils.samples_generator import SamplesGenerator
    from openrlhf.trainer.ray.vllm_engine import RolloutRayActor, _load_agent_executor

    yield RolloutRayActor.__ray_metadata__.modified_class, SamplesGenerator, _load_agent_executor
    for name in set(sys.modules) - before:  # nothing imported against the stand-in outlives the test
        if name.startswith("openrlhf."):
            del sys.modules[name]


@pytest.mark.parametrize("where", ["reset", "step"])
def test_one_failing_sample_is_a_failed_episode_in_openrlhf_s_own_rollout(
    where, openrlhf_rollout, tokenizer, tmp_path, monkeypatch, caplog
):
    """One sample's ``reset`` (or ``step``) raises; OpenRLHF's ``generate_responses`` gathers all four.

    The failing sample comes back as a failed episode: ``extra_logs["failed"]`` 1, the
    reward of a malformed turn (F1 with ``format_penalty`` -1: -1), one log line; the
    others are the oracle's right answers (F1 1). Every response becomes an Experience
    through OpenRLHF's own ``_process_response_into_experience``, and they batch.
    """
    from openrlhf.trainer.ppo_utils.experience import Experience

    from searchgym.trainers.failures import failure_counter

    actor_cls, samples_generator, load_agent_executor = openrlhf_rollout
    from searchgym.trainers import env_pool

    config = tmp_path / "agent.yaml"
    config.write_text(
        f"env: {{id: {ENV_ID}, protocol: tool_call, reward: f1, reward_kwargs: {{format_penalty: -1.0}}}}\n"
    )
    monkeypatch.setenv("SEARCHGYM_AGENT_CONFIG", str(config))
    import searchgym.trainers.openrlhf.agent_file as agent_file

    executor = load_agent_executor(agent_file.__file__)  # as the vLLM actor loads --agent_func_path
    build = env_pool.build_env
    monkeypatch.setattr(env_pool, "build_env", lambda config: Flaky(build(config)))
    monkeypatch.setattr(Flaky, "calls", {"reset": 0, "step": 0})
    # the second sample's reset, or the fifth step of the twelve (three per sample)
    fail = {"reset": {1} if where == "reset" else set(), "step": {4} if where == "step" else set()}
    monkeypatch.setattr(Flaky, "fail", fail)
    engine = ScriptedLLM(tokenizer, oracle())
    actor = SimpleNamespace(executor=executor, generate=engine.generate)
    failed_before = failure_counter("openrlhf").total
    with caplog.at_level(logging.WARNING, logger="searchgym.trainers.openrlhf"):
        results = asyncio.run(
            actor_cls.generate_responses(
                actor,
                "p",
                label_of(two_hop_unknown()),
                SamplingParams.openrlhf(),
                4096,
                tokenizer,
                num_samples=4,
            )
        )

    assert len(results) == 4
    failed = [r for r in results if r["extra_logs"]["failed"] == 1.0]
    assert len(failed) == 1 and failure_counter("openrlhf").total == failed_before + 1
    assert failed[0]["reward"] == failed[0]["scores"] == -1.0
    assert failed[0]["extra_logs"]["format_ok"] == 0.0 and failed[0]["extra_logs"]["answered"] == 0.0
    for r in results:
        assert list(r["extra_logs"]) == list(EXTRA_LOG_KEYS)
        if r is not failed[0]:
            assert r["reward"] == 1.0 and r["extra_logs"]["num_searches"] == 2.0
    [record] = [r for r in caplog.records if "a sample failed" in r.getMessage()]
    assert f"failed in {where}" in record.getMessage() and "TimeoutError" in record.getMessage()
    if where == "reset":  # one token from the row's prompt
        prompt_ids = tokenizer("p", add_special_tokens=False)["input_ids"]
        assert failed[0]["observation_tokens"][: len(prompt_ids)] == prompt_ids
        assert failed[0]["action_ranges"] == [(len(prompt_ids), len(prompt_ids) + 1)]
        assert sorted(params.max_tokens for params in engine.params)[0] == 1
    # OpenRLHF turns each response into an Experience; the failed one trains like any other
    experiences = [
        samples_generator._process_response_into_experience(None, r, max_len=4096) for r in results
    ]
    assert all(e.action_mask.sum() > 0 for e in experiences)
    batch = Experience.concat_experiences(experiences, tokenizer.pad_token_id)
    assert sorted(batch.info["failed"].tolist()) == [0.0, 0.0, 0.0, 1.0]
    assert sorted(batch.info["reward"].tolist()) == [-1.0, 1.0, 1.0, 1.0]


def test_a_run_whose_samples_all_fail_stops_with_the_cause(openrlhf_rollout, tokenizer, monkeypatch):
    """Failures are one sample's until they come in a row: then the rollout stops and says why."""
    from searchgym.trainers import failures

    actor_cls, _, _ = openrlhf_rollout
    monkeypatch.setitem(
        failures._COUNTERS,
        "openrlhf",
        failures.FailureCounter(limit=3, logger_name="searchgym.trainers.openrlhf"),
    )
    executor = SearchGymAgentExecutor(config=AgentConfig(ENV_ID, {"protocol": "tool_call"}))
    actor = SimpleNamespace(executor=executor, generate=ScriptedLLM(tokenizer, oracle()).generate)

    def rollout(label, n):
        return asyncio.run(
            actor_cls.generate_responses(
                actor, "p", label, SamplingParams.openrlhf(), 4096, tokenizer, num_samples=n
            )
        )

    assert [r["extra_logs"]["failed"] for r in rollout("not json", 2)] == [1.0, 1.0]
    assert rollout(label_of(two_hop_unknown()), 1)[0]["reward"] == 1.0  # a finished episode: 0 in a row
    assert [r["extra_logs"]["failed"] for r in rollout("not json", 2)] == [1.0, 1.0]
    with pytest.raises(failures.SampleFailuresError, match="3 samples in a row failed.*searchgym prepare"):
        rollout("not json", 1)
