"""The verl agent loop through verl 0.9.1's own ``AgentLoopWorker``, over a vLLM-faithful server.

The worker is verl's real one, built from verl's own ``ppo_trainer.yaml`` (composed with
Hydra) with SmolLM2's real tokenizer; it picks the loop by each row's ``agent_name`` from an
agent-loop config file, as a verl run does, runs it, pads its output and builds the batch.
Only the server behind ``server_manager.generate`` is a stand-in (tests/fake_verl.py: verl's
vLLM server over tests/fake_vllm.py's engine, which applies vLLM's stop rules).

Expected actions, observations and rewards come from playing the oracle on a separate env;
expected tokens from the chat formatter's rendering of that episode.
"""

from __future__ import annotations

import asyncio
import json
import os

import gymnasium as gym
import pytest

pytest.importorskip(
    "verl.experimental.agent_loop.agent_loop", reason="needs verl==0.9.1 (--no-deps), see .ci/run"
)
np = pytest.importorskip("numpy")
torch = pytest.importorskip("torch")

from fake_verl import VerlServerManager  # noqa: E402
from fake_vllm import FakeVLLMEngine, ScriptedText  # noqa: E402

import searchgym  # noqa: E402,F401  (registers the ids)
from searchgym.envs.synthetic import generate_world  # noqa: E402
from searchgym.policies import OracleSyntheticPolicy  # noqa: E402
from searchgym.policies.chat import ChatFormatter  # noqa: E402
from searchgym.trainers.episodes import label_to_options  # noqa: E402

ENV_ID = "searchgym/SyntheticFacts-v1"
WORLD = generate_world(0)
# SmolLM2 writes "</search>." as "</", "search", ">.": the last token runs past the stop string
RAMBLE = ". More text\n<information>Doc 1 (Title: Made up) invented</information>\n<answer>ramble</answer>"
PROTOCOLS = {  # protocol -> env kwargs whose right answer scores 1
    "search_r1": {"protocol": "search_r1", "reward": "em"},
    "research": {"protocol": "research", "reward": "f1"},
    "sem": {"protocol": "sem", "reward": "em"},
    "tool_call": {"protocol": "tool_call", "reward": "f1"},
}
PROMPT_LENGTH, RESPONSE_LENGTH = 1024, 768


def run_file(folder, name: str, env: dict, **sections) -> str:
    import yaml

    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"backend": "verl", "env": {"id": ENV_ID, **env}, **sections}))
    return str(path)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """Run files and the agent-loop config that names one loop per run file."""
    folder = tmp_path_factory.mktemp("verl")
    loops = []
    for protocol, env in PROTOCOLS.items():
        loops.append({"name": f"sg_{protocol}", "run_file": run_file(folder, protocol, env)})
    loops.append(
        {
            "name": "sg_capped",
            "run_file": run_file(folder, "capped", PROTOCOLS["search_r1"]),
            "max_turn_tokens": 5,
        }
    )
    stores = {
        "protocol": "tool_call",
        "reward": "lightsearcher",
        "reward_kwargs": {"store": str(folder / "minimum.sqlite")},
    }
    memory = {"kind": "lightsearcher", "path": str(folder / "memory")}
    loops.append({"name": "sg_stores", "run_file": run_file(folder, "stores", stores, memory=memory)})
    for loop in loops:
        loop["_target_"] = "searchgym.trainers.verl.agent_loop.SearchGymAgentLoop"
    import yaml

    from searchgym.trainers.verl.launch import AGENT_LOOP_FILE

    loops += yaml.safe_load(open(AGENT_LOOP_FILE))  # the packaged loop, as a run's config names it

    config = folder / "agent_loops.yaml"
    config.write_text(yaml.safe_dump(loops))
    return {
        "folder": folder,
        "agent_loops": str(config),
        "memory": folder / "memory",
        "store": folder / "minimum.sqlite",
    }


def make_worker(files, smollm2_dir, prompt_length: int = PROMPT_LENGTH, *more: str):
    """verl's AgentLoopWorker, from verl's own config (``more``: further overrides), with SmolLM2's tokenizer."""
    import verl.trainer.config as verl_config
    from hydra import compose, initialize_config_dir
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker

    with initialize_config_dir(config_dir=os.path.dirname(verl_config.__file__), version_base=None):
        config = compose(
            config_name="ppo_trainer",
            overrides=[
                f"actor_rollout_ref.model.path={smollm2_dir}",
                "actor_rollout_ref.rollout.name=vllm",
                f"actor_rollout_ref.rollout.prompt_length={prompt_length}",
                f"actor_rollout_ref.rollout.response_length={RESPONSE_LENGTH}",
                "actor_rollout_ref.rollout.calculate_log_probs=true",
                f"actor_rollout_ref.rollout.agent.agent_loop_config_path={files['agent_loops']}",
                "actor_rollout_ref.rollout.agent.default_agent_loop=sg_search_r1",
                *more,
            ],
        )
    return AgentLoopWorker(config, llm_client=None)


@pytest.fixture(scope="module")
def worker(files, smollm2_dir):
    """verl's AgentLoopWorker, from verl's own config, with SmolLM2's tokenizer."""
    return make_worker(files, smollm2_dir)


def label_of(question) -> str:
    return json.dumps(
        {"id": question.id, "question": question.question, "golden_answers": list(question.golden_answers)}
    )


def one_hop_unknown():
    return next(q for q in WORLD.questions if q.hops == 1 and not q.known)


def known_one_hop():
    return next(q for q in WORLD.questions if q.known and q.hops == 1)


def play(env_kwargs: dict, question, actions=None):
    """Play the oracle (or ``actions``) on a separate env: (prompt, actions, observations, rewards, trajectory)."""
    env = gym.make(ENV_ID, **env_kwargs)
    prompt, _ = env.reset(options=label_to_options(label_of(question)))
    policy = OracleSyntheticPolicy(WORLD, env_kwargs["protocol"])
    context, played, observations, rewards = prompt, [], [], []
    for i in range(8):
        action = actions[i] if actions is not None else policy.act([context])[0]
        obs, reward, terminated, truncated, _ = env.step(action)
        played.append(action)
        observations.append(obs)
        rewards.append(reward)
        context += action + obs
        if terminated or truncated:
            break
    return prompt, played, observations, rewards, env.unwrapped.trajectory


def rows(agent_name: str, questions, evaluate: bool = False):
    """verl rows as ``RLHFDataset`` hands them to the worker (object arrays of the parquet columns)."""
    from verl.protocol import DataProto

    n = len(questions)
    extra = [
        {"label": label_of(q), "index": i, **({"searchgym_eval": True} if evaluate else {})}
        for i, q in enumerate(questions)
    ]
    raw = [[{"role": "user", "content": q.question}] for q in questions]
    return DataProto(
        non_tensor_batch={
            "raw_prompt": np.array(raw + [None], dtype=object)[:n],
            "agent_name": np.array([agent_name] * n, dtype=object),
            "extra_info": np.array(extra, dtype=object),
            "index": np.arange(n),
        },
        meta_info={"validate": evaluate},
    )


def generate(worker, server, batch):
    worker.llm_client = server
    return asyncio.run(worker.generate_sequences(batch))


def server_for(worker, generator, tokens_per_step: int = 1) -> VerlServerManager:
    engine = FakeVLLMEngine(worker.tokenizer, generator, tokens_per_step=tokens_per_step)
    return VerlServerManager(engine, PROMPT_LENGTH, RESPONSE_LENGTH)


def sequence(out, i: int, tokenizer) -> tuple[str, list[int], list[int]]:
    """Row ``i``'s whole text (prompt and response, no padding), its response ids and their mask."""
    attention = out.batch["attention_mask"][i].bool()
    text = tokenizer.decode(out.batch["input_ids"][i][attention].tolist(), skip_special_tokens=False)
    n = int(out.batch["attention_mask"][i, PROMPT_LENGTH:].sum())
    return text, out.batch["responses"][i, :n].tolist(), out.batch["response_mask"][i, :n].tolist()


def masked_runs(ids: list[int], mask: list[int]) -> list[list[int]]:
    runs, current = [], []
    for token, m in zip(ids, mask, strict=True):
        if m:
            current.append(token)
        elif current:
            runs.append(current)
            current = []
    return runs + ([current] if current else [])


# -- every protocol's right answer scores right; tokens and text agree ------------------------------------


@pytest.mark.parametrize("protocol", sorted(PROTOCOLS))
@pytest.mark.parametrize("tokens_per_step", [1, 4])
def test_right_answer_scores_right_and_tokens_are_the_chat_rendering(worker, protocol, tokens_per_step):
    tok = worker.tokenizer
    env_kwargs = PROTOCOLS[protocol]
    question = one_hop_unknown()  # one search, then the answer
    prompt, actions, observations, rewards, trajectory = play(env_kwargs, question)
    assert trajectory.em == 1.0 and rewards[-1] == 1.0 and trajectory.num_searches >= 1
    # the model writes each action and rambles on past a stop string (the engine step keeps the
    # tokens past it, and SmolLM2's ">." straddles it), or ends with EOS (SEM's answer turn)
    script = ScriptedText(
        tok, [a + RAMBLE if a.endswith(("</search>", "</tool_call>")) else a for a in actions]
    )
    server = server_for(worker, script, tokens_per_step)
    out = generate(worker, server, rows(f"sg_{protocol}", [question]))

    assert out.batch["rm_scores"][0].sum().item() == sum(rewards) == 1.0
    fields = out.non_tensor_batch
    assert fields["em"][0] == 1.0 and fields["format_ok"][0] == 1.0 and fields["format_errors"][0] == 0.0
    assert fields["num_searches"][0] == trajectory.num_searches and fields["answered"][0] == 1.0
    assert fields["failed"][0] == 0.0 and fields["searchgym_eval"][0] is False
    eos = tok.decode([tok.eos_token_id], skip_special_tokens=False)
    ends_at_eos = protocol == "sem"  # only SEM's answer turn has no stop string of its own
    assert (
        server.engine.outputs[-1].stop_reason is None
        if ends_at_eos
        else isinstance(server.engine.outputs[-1].stop_reason, str)
    )
    # the sequence trained on is the chat rendering of the episode, with the model's EOS on SEM's answer
    fmt = ChatFormatter(tok)
    segments = [prompt]
    for action, obs in zip(actions, observations[:-1], strict=False):
        segments += [action, obs]
    segments.append(actions[-1])
    text, ids, mask = sequence(out, 0, tok)
    assert text == fmt.render(segments) + (eos if ends_at_eos else "")
    # the loss sees exactly each action's tokens (the turn's EOS with it); the feedback is masked out
    expected = [tok(a, add_special_tokens=False)["input_ids"] for a in actions]
    expected[-1] += [tok.eos_token_id] if ends_at_eos else []
    assert masked_runs(ids, mask) == expected
    # the engine's tokens ran past the stop string (SmolLM2's ">." straddles it; a step of 4
    # tokens keeps more): cut back to the action, each generated token keeps the engine's
    # logprob (the scripted engine gives -1 to every token), the feedback gets 0
    first = server.engine.outputs[0]
    assert tok.decode(first.token_ids, skip_special_tokens=False).startswith(actions[0] + ".")
    logprobs = out.batch["rollout_log_probs"][0, : len(ids)].tolist()
    assert [lp for lp, m in zip(logprobs, mask, strict=True) if m] == [-1.0] * sum(mask)
    assert all(lp == 0.0 for lp, m in zip(logprobs, mask, strict=True) if not m)


@pytest.mark.parametrize("protocol", sorted(PROTOCOLS))
def test_a_turn_that_ends_at_eos_closes_the_chat_turn_once(worker, protocol):
    """A malformed turn ends at EOS; the env's error comes back and the next turn answers."""
    tok = worker.tokenizer
    env_kwargs = PROTOCOLS[protocol]
    question = known_one_hop()
    _, right, _, _, _ = play(env_kwargs, question)
    actions = ["I am not sure yet", right[-1]]
    prompt, _, observations, rewards, trajectory = play(env_kwargs, question, actions)
    assert len(rewards) == 2 and trajectory.em == 1.0 and not trajectory.format_ok
    server = server_for(worker, ScriptedText(tok, actions))
    out = generate(worker, server, rows(f"sg_{protocol}", [question]))

    assert out.batch["rm_scores"][0].sum().item() == sum(rewards)
    assert out.non_tensor_batch["format_errors"][0] == 1.0
    eos = tok.decode([tok.eos_token_id], skip_special_tokens=False)
    text, ids, mask = sequence(out, 0, tok)
    rendered = ChatFormatter(tok).render([prompt, actions[0], observations[0], actions[1]])
    # SmolLM2's template closes a turn with its EOS: the model's EOS is that text, written once
    assert text == rendered + (eos if protocol == "sem" else "")
    assert masked_runs(ids, mask)[0] == tok(actions[0], add_special_tokens=False)["input_ids"] + [
        tok.eos_token_id
    ]


def test_a_turn_cut_at_the_length_limit_is_the_action_the_env_sees(worker):
    """``max_turn_tokens: 5``: every turn stops at 5 tokens; the env steps on their text."""
    tok = worker.tokenizer
    env_kwargs = PROTOCOLS["search_r1"]
    question = one_hop_unknown()
    _, actions, _, _, _ = play(env_kwargs, question)
    cut = [tok.decode(tok(a, add_special_tokens=False)["input_ids"][:5]) for a in actions]
    server = server_for(worker, ScriptedText(tok, actions))
    out = generate(worker, server, rows("sg_capped", [question]))

    assert all(o.finish_reason == "length" for o in server.engine.outputs)
    turns = len(server.engine.outputs)
    prompt, played, observations, rewards, trajectory = play(
        env_kwargs, question, [cut[min(i, len(cut) - 1)] for i in range(turns)]
    )
    assert out.batch["rm_scores"][0].sum().item() == sum(rewards)
    assert out.non_tensor_batch["format_errors"][0] == float(turns) == len(trajectory.turns)
    segments = [prompt]
    for action, obs in zip(played, observations[:-1], strict=False):
        segments += [action, obs]
    segments.append(played[-1])
    text, ids, mask = sequence(out, 0, tok)
    assert text == ChatFormatter(tok).render(segments)
    assert all(len(run) == 5 for run in masked_runs(ids, mask))


def test_an_episode_out_of_response_length_ends_truncated_with_the_scheme_reward(worker):
    """A model that never stops writing fills ``rollout.response_length`` in one turn."""
    tok = worker.tokenizer
    filler = tok(" word", add_special_tokens=False)["input_ids"]
    server = server_for(worker, lambda prompt, params: filler * (RESPONSE_LENGTH + 10))
    out = generate(worker, server, rows("sg_search_r1", [one_hop_unknown()]))
    _, ids, mask = sequence(out, 0, tok)
    assert len(ids) == RESPONSE_LENGTH and all(mask)  # one turn, cut at the budget: no feedback
    assert out.non_tensor_batch["episode_truncated"][0] == 1.0 and out.non_tensor_batch["answered"][0] == 0.0
    assert out.batch["rm_scores"][0].sum().item() == 0.0  # EM of an unanswered episode


def test_a_row_without_a_label_is_a_failed_episode_not_a_dead_batch(worker):
    tok = worker.tokenizer
    question = one_hop_unknown()
    _, actions, _, _, _ = play(PROTOCOLS["search_r1"], question)
    batch = rows("sg_search_r1", [question, question])
    batch.non_tensor_batch["extra_info"][1] = {"index": 1}  # no label
    server = server_for(worker, ScriptedText(tok, [a + RAMBLE for a in actions[:-1]] + [actions[-1]]))
    out = generate(worker, server, batch)
    assert out.non_tensor_batch["failed"].tolist() == [0.0, 1.0]
    assert out.batch["rm_scores"][1].sum().item() == 0.0  # EM's reward for a malformed turn
    _, ids, _ = sequence(out, 1, tok)
    assert len(ids) == 1  # one token from the row's own prompt


# -- memory and stores: training rows write them, evaluation rows do not --------------------------------


def test_training_rows_update_the_memory_and_store_and_eval_rows_do_not(worker, files):
    from searchgym.memory import ExperienceMemory

    tok = worker.tokenizer
    env_kwargs = {"protocol": "tool_call"}
    question = one_hop_unknown()
    _, actions, _, _, trajectory = play(env_kwargs, question)
    searches = trajectory.num_searches

    def script():
        return ScriptedText(tok, [a + RAMBLE if a.endswith("</tool_call>") else a for a in actions])

    def minimum():
        from searchgym.envs.rewards.min_tool_calls import MinToolCallStore

        return MinToolCallStore(files["store"]).get(question.id) if files["store"].exists() else None

    memory_before = len(ExperienceMemory(files["memory"])) if files["memory"].exists() else 0
    out = generate(worker, server_for(worker, script()), rows("sg_stores", [question], evaluate=True))
    assert out.non_tensor_batch["searchgym_eval"][0] is True
    assert out.non_tensor_batch["em"][0] == 1.0  # the episode ran ...
    assert (len(ExperienceMemory(files["memory"])) if files["memory"].exists() else 0) == memory_before
    assert minimum() is None  # ... and wrote nothing

    out = generate(worker, server_for(worker, script()), rows("sg_stores", [question]))
    assert out.non_tensor_batch["searchgym_eval"][0] is False and out.non_tensor_batch["em"][0] == 1.0
    assert len(ExperienceMemory(files["memory"])) == memory_before + 1  # the finished episode, recorded
    assert minimum() == searches  # its search count, stored


# -- from searchgym prepare's rows, through verl's own dataset, to the loop ---------------------------------


def test_converted_rows_load_in_verls_dataset_and_run_the_searchgym_loop(
    worker, files, tmp_path, monkeypatch
):
    """``python -m searchgym.trainers.verl.data`` → verl's ``RLHFDataset`` and ``collate_fn`` → the worker.

    The rows name ``agent_name: searchgym``, the packaged loop, which reads its run file from
    ``$SEARCHGYM_AGENT_CONFIG`` as the runtime env sets it.
    """
    from verl.protocol import DataProto
    from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn

    from searchgym.trainers.verl.data import main as convert

    tok = worker.tokenizer
    question = one_hop_unknown()
    _, actions, _, rewards, _ = play(PROTOCOLS["search_r1"], question)
    rows = tmp_path / "rows.jsonl"
    rows.write_text(
        json.dumps({"prompt": question.question, "label": label_of(question), "datasource": "nq"}) + "\n"
    )
    parquet = tmp_path / "val.parquet"
    assert convert([str(rows), str(parquet), "--eval"]) == 0
    monkeypatch.setenv("SEARCHGYM_AGENT_CONFIG", str(files["folder"] / "search_r1.yaml"))

    dataset = RLHFDataset([str(parquet)], tok, worker.config.data)
    batch = DataProto.from_single_dict(collate_fn([dataset[0]]))
    assert batch.non_tensor_batch["agent_name"][0] == "searchgym"
    server = server_for(
        worker, ScriptedText(tok, [a + RAMBLE if a.endswith("</search>") else a for a in actions])
    )
    out = generate(worker, server, batch)
    assert out.batch["rm_scores"][0].sum().item() == sum(rewards) == 1.0
    assert out.non_tensor_batch["searchgym_eval"][0] is True and out.non_tensor_batch["em"][0] == 1.0


# -- verl's own reward computation is skipped: the env's reward is the row's score ----------------------


class LocalRewardHandle:
    """A Ray handle of verl's ``RewardLoopWorker`` as the agent-loop worker calls it
    (``await handle.compute_score.remote(data)``), over verl's real worker in this process."""

    def __init__(self, reward_worker):
        from types import SimpleNamespace

        self.reward_worker, self.calls = reward_worker, 0
        self.compute_score = SimpleNamespace(remote=self._remote)

    async def _remote(self, data):
        self.calls += 1
        running = asyncio.get_running_loop()  # an actor runs its own loop
        self.reward_worker.loop = self.reward_worker.reward_manager.loop = running
        return await self.reward_worker.compute_score(data)


@pytest.fixture(scope="module")
def scored_worker(worker):
    """verl's AgentLoopWorker as a run without a reward model builds it: with the handles of
    verl's reward-loop workers (its default reward manager, keyed on ``data_source``)."""
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker
    from verl.experimental.reward_loop.reward_loop import RewardLoopWorker

    handle = LocalRewardHandle(RewardLoopWorker(worker.config))
    return AgentLoopWorker(worker.config, llm_client=None, reward_loop_worker_handles=[handle]), handle


def test_verls_reward_loop_is_skipped_and_the_env_reward_is_the_score_on_both_trainers(scored_worker):
    """The loop's ``reward_score`` keeps verl's reward workers out (legacy trainer: ``rm_scores``
    in the batch; V1 trainer: ``AgentLoopOutput.as_dict``), so no ``data_source`` scorer runs."""
    from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput

    worker, handle = scored_worker
    handle.calls = 0
    tok = worker.tokenizer
    question = one_hop_unknown()
    _, actions, _, rewards, _ = play(PROTOCOLS["search_r1"], question)
    batch = rows("sg_search_r1", [question])
    batch.non_tensor_batch["data_source"] = np.array(["nq"], dtype=object)  # what data.py writes
    batch.non_tensor_batch["reward_model"] = np.array([{"ground_truth": "wrong"}], dtype=object)
    outputs = []
    postprocess = worker._agent_loop_postprocess

    async def keep(output, validate, **kwargs):
        outputs.append(output.model_copy(deep=True))
        return await postprocess(output, validate, **kwargs)

    worker._agent_loop_postprocess = keep
    try:
        server = server_for(worker, ScriptedText(tok, [a + RAMBLE for a in actions[:-1]] + [actions[-1]]))
        out = generate(worker, server, batch)
    finally:
        del worker._agent_loop_postprocess
    assert handle.calls == 0  # verl's reward workers never ran
    # legacy trainer: extract_reward reads rm_scores, the env's reward at the last response token
    from verl.trainer.ppo.reward import extract_reward

    n = int(out.batch["attention_mask"][0, PROMPT_LENGTH:].sum())
    scores, _ = extract_reward(out)
    assert scores[0, n - 1].item() == scores[0].sum().item() == sum(rewards) == 1.0
    # V1 trainer: the same output as verl's AgentLoopWorkerTQ puts it in its TransferQueue
    fields = outputs[0].as_dict()
    assert fields["rm_scores"].tolist() == [0.0] * (n - 1) + [1.0]
    # the same worker scores a row whose loop leaves reward_score out: the handles are live
    unscored = AgentLoopOutput(
        prompt_ids=[1], response_ids=[2], response_mask=[1], metrics=AgentLoopMetrics()
    )
    with pytest.raises(NotImplementedError):  # verl's default scorer knows no data_source "nq"
        asyncio.run(
            worker._compute_score([unscored], kwargs={k: v[0] for k, v in batch.non_tensor_batch.items()})
        )
    assert handle.calls == 1


def test_the_legacy_trainers_batch_flow_runs_the_loop_and_keeps_its_reward(
    scored_worker, files, tmp_path, monkeypatch
):
    """``trainer.use_v1=false``: ``RayPPOTrainer.fit``'s own steps around the agent loops
    (``_get_gen_batch``, ``repeat``, ``generate_sequences``, ``union``, ``extract_reward``) on
    rows from verl's ``RLHFDataset``: every row reaches the loop with its ``extra_info`` and
    the batch trained on carries the env's reward and the episode's numbers."""
    from verl.protocol import DataProto
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer
    from verl.trainer.ppo.reward import extract_reward
    from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn

    from searchgym.trainers.verl.data import main as convert

    worker, handle = scored_worker
    handle.calls = 0
    tok = worker.tokenizer
    question = one_hop_unknown()
    _, actions, _, rewards, _ = play(PROTOCOLS["search_r1"], question)
    jsonl = tmp_path / "rows.jsonl"
    jsonl.write_text(
        json.dumps({"prompt": question.question, "label": label_of(question), "datasource": "nq"}) + "\n"
    )
    parquet = tmp_path / "train.parquet"
    assert convert([str(jsonl), str(parquet)]) == 0
    monkeypatch.setenv("SEARCHGYM_AGENT_CONFIG", str(files["folder"] / "search_r1.yaml"))
    batch = DataProto.from_single_dict(collate_fn([RLHFDataset([str(parquet)], tok, worker.config.data)[0]]))
    batch.non_tensor_batch["uid"] = np.array(["u0"], dtype=object)
    gen_batch = RayPPOTrainer._get_gen_batch(None, batch)  # as fit does (it reads nothing of self)
    gen_batch = gen_batch.repeat(repeat_times=2, interleave=True)
    script = [a + RAMBLE for a in actions[:-1]] + [actions[-1]]
    server = server_for(worker, ScriptedText(tok, script + script))
    out = generate(worker, server, gen_batch)
    batch = batch.repeat(repeat_times=2, interleave=True).union(out)
    scores, _ = extract_reward(batch)
    assert scores.sum(dim=1).tolist() == [sum(rewards)] * 2 == [1.0, 1.0]
    assert batch.non_tensor_batch["em"].tolist() == [1.0, 1.0] and handle.calls == 0
    assert batch.non_tensor_batch["failed"].tolist() == [0.0, 0.0]
    assert batch.non_tensor_batch["uid"].tolist() == ["u0", "u0"]  # the group TSAS and GRPO read


# -- prompts and contexts that do not fit -----------------------------------------------------------


def test_a_prompt_over_prompt_length_is_a_failed_row_not_a_cut_prompt(files, smollm2_dir, caplog):
    """verl keeps the last ``prompt_length`` tokens of a prompt that is too long; the env's
    prompt (instructions first) would then not be what the model saw. The row fails instead,
    with one log line that says why and what to raise."""
    question = one_hop_unknown()
    prompt, _, _, _, _ = play(PROTOCOLS["search_r1"], question)
    small = make_worker(files, smollm2_dir, 64)
    tok = small.tokenizer
    assert len(tok(ChatFormatter(tok).prompt(prompt), add_special_tokens=False)["input_ids"]) > 64
    server = VerlServerManager(FakeVLLMEngine(tok, ScriptedText(tok, ["x"] * 8)), 64, RESPONSE_LENGTH)
    small.llm_client = server
    with caplog.at_level("WARNING"):
        out = asyncio.run(small.generate_sequences(rows("sg_search_r1", [question])))
    fields = out.non_tensor_batch
    assert fields["failed"][0] == 1.0 and fields["turns"][0] == 0.0
    assert out.batch["rm_scores"][0].sum().item() == 0.0  # EM's reward for a malformed turn
    assert int(out.batch["attention_mask"][0, 64:].sum()) == 1  # one token from the row's own prompt
    assert len(server.calls) == 1 and server.calls[0]["sampling_params"]["max_tokens"] == 1
    (record,) = [r for r in caplog.records if "failed episode" in r.getMessage()]
    assert record.name == "searchgym.trainers.verl"  # the backend's logger
    line = record.getMessage()
    assert "rollout.prompt_length=64" in line and "data.max_prompt_length" in line and "the prompt" in line


def test_an_episode_out_of_context_ends_truncated_without_asking_for_more(files, smollm2_dir):
    """``rollout.max_model_len`` below prompt + response length: verl's server refuses a request
    with no room left in the context (ValueError, which would end the batch); the loop stops
    asking before that and the episode ends truncated."""
    question = one_hop_unknown()
    prompt, _, _, _, _ = play(PROTOCOLS["search_r1"], question)
    probe = make_worker(files, smollm2_dir)
    tok = probe.tokenizer
    prompt_tokens = len(tok(ChatFormatter(tok).prompt(prompt), add_special_tokens=False)["input_ids"])
    context = prompt_tokens + 120
    tight = make_worker(
        files, smollm2_dir, PROMPT_LENGTH, f"actor_rollout_ref.rollout.max_model_len={context}"
    )
    # the model searches with long rambles: each turn runs to the length limit without a stop
    filler = tok(" word", add_special_tokens=False)["input_ids"]
    server = VerlServerManager(
        FakeVLLMEngine(
            tok,
            lambda prompt, params: (
                filler * 50 + tok("<search>x</search>", add_special_tokens=False)["input_ids"]
            ),
        ),
        PROMPT_LENGTH,
        RESPONSE_LENGTH,
        max_model_len=context,
    )
    tight.llm_client = server
    out = asyncio.run(tight.generate_sequences(rows("sg_search_r1", [question])))
    fields = out.non_tensor_batch
    assert fields["failed"][0] == 0.0 and fields["episode_truncated"][0] == 1.0 and fields["turns"][0] >= 1.0
    assert all(len(c["prompt_ids"]) + c["sampling_params"]["max_tokens"] <= context for c in server.calls)
    n = int(out.batch["attention_mask"][0, PROMPT_LENGTH:].sum())
    assert prompt_tokens + n <= context


def test_an_episode_with_no_room_for_a_token_still_carries_its_score(files, smollm2_dir):
    """A prompt that fills ``rollout.max_model_len``: no turn, the episode ends truncated, and
    the row gets one masked EOS for its score (verl's V1 ``AgentLoopOutput.as_dict`` writes
    ``rm_scores[-1]``, which an empty response has not)."""
    question = one_hop_unknown()
    prompt, _, _, _, _ = play(PROTOCOLS["search_r1"], question)
    probe = make_worker(files, smollm2_dir)
    tok = probe.tokenizer
    prompt_tokens = len(tok(ChatFormatter(tok).prompt(prompt), add_special_tokens=False)["input_ids"])
    full = make_worker(
        files, smollm2_dir, PROMPT_LENGTH, f"actor_rollout_ref.rollout.max_model_len={prompt_tokens}"
    )
    server = VerlServerManager(
        FakeVLLMEngine(tok, ScriptedText(tok, ["x"])),
        PROMPT_LENGTH,
        RESPONSE_LENGTH,
        max_model_len=prompt_tokens,
    )
    full.llm_client = server
    outputs = []
    postprocess = full._agent_loop_postprocess

    async def keep(output, validate, **kwargs):
        outputs.append(output.model_copy(deep=True))
        return await postprocess(output, validate, **kwargs)

    full._agent_loop_postprocess = keep
    out = asyncio.run(full.generate_sequences(rows("sg_search_r1", [question])))
    assert server.calls == []  # never asked for a turn it has no room for
    assert out.non_tensor_batch["episode_truncated"][0] == 1.0 and out.non_tensor_batch["failed"][0] == 0.0
    _, ids, mask = sequence(out, 0, tok)
    assert ids == [tok.eos_token_id] and mask == [0]
    assert outputs[0].as_dict()["rm_scores"].tolist() == [0.0]  # EM of an unanswered episode, on the EOS
