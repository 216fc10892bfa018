"""The built-in GRPO trainer on CPU with the offline tiny model: updates, masks, resume."""

from __future__ import annotations

import importlib.util
import json
import math
import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import gymnasium as gym  # noqa: E402

from searchgym.envs.records import Trajectory  # noqa: E402
from searchgym.envs.rewards import RewardScheme  # noqa: E402
from searchgym.error import DataFileError  # noqa: E402
from searchgym.memory import ExperienceMemory  # noqa: E402
from searchgym.policies import good_and_bad_trajectories  # noqa: E402
from searchgym.policies.tiny import build_tiny_lm  # noqa: E402
from searchgym.trainers.config import ConfigError, TrainConfig  # noqa: E402
from searchgym.trainers.grpo import GRPOTrainer, Sampled, list_checkpoints, sample_actions  # noqa: E402
from searchgym.trainers.grpo.envs import question_schedule  # noqa: E402
from searchgym.trainers.grpo.generation import SamplingSettings, eos_token_ids  # noqa: E402
from searchgym.trainers.grpo.model import transformer_blocks  # noqa: E402

ENV_ID = "searchgym/SyntheticFacts-v1"
REPO = Path(__file__).resolve().parents[2]


class CharReward(RewardScheme):
    """A reward the untrained tiny model varies in (its answers are never right): characters written / 100."""

    name = "test_chars"

    def __call__(self, trajectory: Trajectory) -> float:
        return min(trajectory.action_chars, 150) / 100.0


@pytest.fixture(scope="module")
def tiny_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("tiny")
    build_tiny_lm(root, hidden_size=64, num_layers=2)  # what model.tiny below asks for
    return root


def make_config(tiny_root: Path, out: Path, **sections) -> TrainConfig:
    data = {
        "output_dir": str(out),
        "steps": 2,
        "seed": 0,
        "env": {"id": ENV_ID, "kwargs": {"reward": CharReward(), "max_turns": 2}},
        "model": {"tiny": {"dir": str(tiny_root), "hidden_size": 64, "num_layers": 2}},
        "rollout": {
            "group_size": 3,
            "questions_per_step": 2,
            "max_new_tokens": 8,
            "max_context_tokens": 1024,
        },
        "algo": {"lr": 1e-3, "kl_coef": 0.05, "micro_batch_size": 4},
        "checkpoint": {"every": 0},
    }
    for key, value in sections.items():
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key] = {**data[key], **value}
        else:
            data[key] = value
    return TrainConfig.from_dict(data)


def params(model) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in model.named_parameters()}


# -- updates -----------------------------------------------------------------------------------


def test_a_few_grpo_steps_change_the_parameters_and_keep_the_loss_finite(tiny_root, tmp_path):
    trainer = GRPOTrainer(make_config(tiny_root, tmp_path / "run", steps=3), progress=False)
    trainer.setup()
    before = params(trainer.model)
    state = trainer.train()
    trainer.close()
    after = params(trainer.model)
    assert state.step == 3 and len(state.history) == 3
    changed = [n for n in before if not torch.equal(before[n], after[n])]
    assert len(changed) == len(before)  # every tensor of a dense model gets a gradient
    assert all(torch.isfinite(p).all() for p in after.values())
    for record in state.history:
        assert math.isfinite(record["train"]["loss"]) and math.isfinite(record["train"]["grad_norm"])
    # Step 1 compares the policy with its own copy: k3 of equal log-probabilities is exactly 0.
    assert state.history[0]["train"]["kl"] == 0.0
    assert state.history[1]["train"]["kl"] > 0.0  # after one update the policy has moved away
    # The reference model is frozen.
    assert all(torch.equal(p, before[n]) for n, p in trainer.ref_model.named_parameters())
    # The rewards vary within groups, so the advantages are not all zero.
    assert any(record["rollout"]["reward"] > 0 for record in state.history)


def test_train_layers_updates_the_top_blocks_only(tiny_root, tmp_path):
    trainer = GRPOTrainer(make_config(tiny_root, tmp_path / "run", model={"train_layers": 1}), progress=False)
    trainer.setup()
    blocks = transformer_blocks(trainer.model)
    assert len(blocks) == 2
    names = {id(p): n for n, p in trainer.model.named_parameters()}
    frozen = {
        names[id(p)] for p in [*blocks[0].parameters(), *trainer.model.get_input_embeddings().parameters()]
    }
    top = {names[id(p)] for p in blocks[1].parameters()}
    before = params(trainer.model)
    trainer.train()
    trainer.close()
    after = params(trainer.model)
    changed = {n for n in before if not torch.equal(before[n], after[n])}
    assert top <= changed and not (frozen & changed)
    trained = [p for group in trainer.optimizer.param_groups for p in group["params"]]
    assert {names[id(p)] for p in trained} == {
        n for n, p in trainer.model.named_parameters() if p.requires_grad
    }
    assert not frozen & {names[id(p)] for p in trained}


def test_train_layers_beyond_the_models_blocks_is_refused(tiny_root, tmp_path):
    trainer = GRPOTrainer(make_config(tiny_root, tmp_path / "run", model={"train_layers": 3}), progress=False)
    with pytest.raises(ConfigError, match=r"model\.train_layers.*2 transformer blocks"):
        trainer.setup()
    trainer.close()


def test_bfloat16_autocast_computes_in_bfloat16_and_keeps_float32_weights(tiny_root, tmp_path):
    config = make_config(tiny_root, tmp_path / "run", steps=2, model={"autocast": "bfloat16"})
    trainer = GRPOTrainer(config, progress=False)
    trainer.setup()
    seen: dict[str, set] = {"forward": set(), "backward": set()}
    layer = trainer.model.lm_head
    layer.register_forward_hook(lambda module, args, out: seen["forward"].add(out.dtype))
    layer.register_full_backward_hook(
        lambda module, grad_in, grad_out: seen["backward"].add(grad_out[0].dtype)
    )
    before = params(trainer.model)
    state = trainer.train()
    trainer.close()
    assert seen == {"forward": {torch.bfloat16}, "backward": {torch.bfloat16}}
    assert all(p.dtype == torch.float32 for p in trainer.model.parameters())
    moments = [s["exp_avg"] for s in trainer.optimizer.state.values()]
    assert moments and all(m.dtype == torch.float32 for m in moments)
    after = params(trainer.model)
    assert all(not torch.equal(before[n], after[n]) for n in before)  # every tensor was updated
    assert all(math.isfinite(r["train"]["loss"]) for r in state.history)


def test_without_autocast_every_pass_is_float32(tiny_root, tmp_path):
    trainer = GRPOTrainer(make_config(tiny_root, tmp_path / "run", steps=1), progress=False)
    trainer.setup()
    seen = set()
    trainer.model.lm_head.register_forward_hook(lambda module, args, out: seen.add(out.dtype))
    trainer.train()
    trainer.close()
    assert seen == {torch.float32}


@pytest.mark.parametrize(
    ("advantage", "loss_agg"), [("group_norm", "auto"), ("dr_grpo", "auto"), ("tsas", "token_mean")]
)
def test_micro_batches_do_not_change_the_gradient(tiny_root, tmp_path, advantage, loss_agg):
    # One optimizer step per training step: after it, .grad holds the whole batch's gradient.
    grads = []
    for micro in (1, 6):
        algo = {"micro_batch_size": micro, "advantage": advantage, "loss_agg": loss_agg}
        trainer = GRPOTrainer(
            make_config(tiny_root, tmp_path / f"m{micro}", steps=1, algo=algo), progress=False
        )
        trainer.train()
        trainer.close()
        grads.append({n: p.grad.clone() for n, p in trainer.model.named_parameters()})
    for name in grads[0]:
        assert grads[0][name].abs().max() > 0, name
        torch.testing.assert_close(grads[0][name], grads[1][name], rtol=1e-4, atol=1e-7)


def test_micro_batches_group_episodes_by_length_and_keep_each_episodes_log_probabilities(tiny_root, tmp_path):
    from searchgym.trainers.grpo.trainer import by_length

    config = make_config(tiny_root, tmp_path / "run", algo={"micro_batch_size": 2})
    trainer = GRPOTrainer(config, progress=False)
    trainer.setup()
    episodes = trainer.collector.collect([0, 1], 3, seed=0)
    lengths = [len(e.token_ids) for e in episodes]
    assert len(set(lengths)) > 1 and lengths != sorted(lengths)  # arrival order is not length order
    order = by_length(episodes, range(len(episodes)))
    assert sorted(order) == list(range(len(episodes))) and [lengths[i] for i in order] == sorted(lengths)
    batched = trainer._logprobs(trainer.model, episodes)
    for episode, logprobs in zip(episodes, batched, strict=True):
        alone = trainer._logprobs(trainer.model, [episode])[0]
        assert logprobs.shape == (len(episode.token_ids) - 1,)
        torch.testing.assert_close(logprobs, alone, rtol=1e-4, atol=1e-5)
    trainer.close()


def test_the_envs_share_one_reward_scheme(tiny_root, tmp_path):
    config = make_config(
        tiny_root, tmp_path / "run", env={"id": ENV_ID, "kwargs": {"reward": "lightsearcher"}}
    )
    trainer = GRPOTrainer(config, progress=False)
    trainer.setup()
    trainer.collector.collect([0, 1], 3, seed=0)
    schemes = {id(env.unwrapped.reward_scheme) for env in trainer.collector.envs}
    trainer.close()
    assert schemes == {id(trainer.reward_scheme)}
    assert trainer.reward_scheme.name == "lightsearcher"


def test_question_schedule_covers_every_question_once_per_epoch():
    steps = [question_schedule(5, 2, step, seed=3) for step in range(5)]
    flat = [q for s in steps for q in s]
    assert sorted(flat[:5]) == [0, 1, 2, 3, 4] and sorted(flat[5:]) == [0, 1, 2, 3, 4]
    assert flat[:5] != flat[5:]  # a new permutation each epoch (seed 3: they differ)
    assert question_schedule(5, 2, 3, seed=3) == steps[3]  # a step is known without the ones before


# -- masks -------------------------------------------------------------------------------------


def token_span(tokenizer, text: str, start: int, end: int) -> list[int]:
    """Indices of the tokens of ``text`` that overlap characters [start, end)."""
    offsets = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    return [i for i, (a, b) in enumerate(offsets) if a < end and b > start]


def check_segments(episode, tokenizer) -> None:
    """The mask is 1 exactly on action segments, and the segments tile the tokens."""
    assert episode.segments[0].kind == "prompt" and episode.segments[0].start == 0
    for left, right in zip(episode.segments, episode.segments[1:], strict=False):
        assert left.end == right.start
    assert episode.segments[-1].end == len(episode.token_ids) == len(episode.action_mask)
    for seg in episode.segments:
        assert set(episode.action_mask[seg.start : seg.end]) <= ({1} if seg.kind == "action" else {0})
        if seg.kind != "action":  # env text is stored exactly as tokenised
            assert (
                episode.token_ids[seg.start : seg.end]
                == tokenizer(seg.text, add_special_tokens=False)["input_ids"]
            )


@pytest.fixture()
def memory_store(tmp_path) -> Path:
    """An experience store whose bank was written from scripted Good (oracle) and Bad (direct) episodes."""
    path = tmp_path / "store"
    memory = ExperienceMemory(path)
    for trajectory in good_and_bad_trajectories(gym.make(ENV_ID, reward="f1"), 6):
        memory.add(trajectory)
    assert memory.update().outcome == "written"
    return path


def test_environment_and_memory_tokens_are_masked(tiny_root, tmp_path, memory_store):
    config = make_config(
        tiny_root,
        tmp_path / "run",
        env={"id": ENV_ID, "kwargs": {"reward": "f1", "max_turns": 3}},
        memory={"kind": "lightsearcher", "path": str(memory_store)},
    )
    trainer = GRPOTrainer(config, progress=False)
    trainer.setup()
    tok = trainer.tokenizer
    episodes = trainer.collector.collect([3, 7], 2, seed=11)
    trainer.close()
    feedback_seen = 0
    for ep in episodes:
        check_segments(ep, tok)
        prompt = ep.segments[0]
        kinds = [prompt.text[a : a + len("<experience>")] for a, _ in prompt.memory_spans]
        assert kinds[0] == "<experience>" and "<example>" in prompt.text  # the wrapper's blocks are there
        for a, b in prompt.memory_spans:
            positions = token_span(tok, prompt.text, a, b)
            assert positions and all(ep.action_mask[prompt.start + i] == 0 for i in positions)
        turns = ep.trajectory.turns
        actions = [s for s in ep.segments if s.kind == "action"]
        feedbacks = [s for s in ep.segments if s.kind == "feedback"]
        assert [t.action_text for t in turns] == [s.text for s in actions]
        for seg, turn in zip(feedbacks, turns, strict=False):
            observation = turn.observation.strip()
            at = seg.text.find(observation)
            assert observation and at >= 0
            positions = token_span(tok, seg.text, at, at + len(observation))
            assert positions and all(ep.action_mask[seg.start + i] == 0 for i in positions)
            feedback_seen += 1
        # The trained tokens are exactly the sampled ones: each action decodes to (at least) what the env got.
        for seg in actions:
            assert tok.decode(ep.token_ids[seg.start : seg.end], skip_special_tokens=True).startswith(
                seg.text
            )
    assert feedback_seen > 0


def test_a_group_shares_its_few_shot_example_when_asked(tiny_root, tmp_path, memory_store):
    prompts = {}
    for per in ("rollout", "group"):
        config = make_config(
            tiny_root,
            tmp_path / per,
            env={"id": ENV_ID, "kwargs": {"reward": "f1", "max_turns": 3}},
            memory={"kind": "lightsearcher", "path": str(memory_store), "example_per": per},
        )
        trainer = GRPOTrainer(config, progress=False)
        trainer.setup()
        episodes = trainer.collector.collect([3, 7, 9], 4, seed=11)
        trainer.close()
        prompts[per] = [{ep.segments[0].text for ep in episodes if ep.group == g} for g in range(3)]
    assert all(len(group) == 1 for group in prompts["group"])
    assert any(len(group) > 1 for group in prompts["rollout"])
    examples = {text.split("<example>")[1] for group in prompts["group"] for text in group}
    assert len(examples) > 1  # each group draws its own


def _shared_prompt_batch(tok):
    """Three prompts of different lengths, four rows each with its own continuation."""
    rows, prefixes = [], []
    for g in range(3):
        prompt = tok(f"Question {g}: where was person {g} born? " * (g + 2), add_special_tokens=False)
        for k in range(4):
            rest = tok(" <search> place" * k, add_special_tokens=False)["input_ids"]
            rows.append(prompt["input_ids"] + rest)
            prefixes.append(len(prompt["input_ids"]))
    return rows, prefixes


@pytest.mark.parametrize(
    ("model_name", "temperature"),
    [("tiny", 1.0), ("tiny", 0.0), pytest.param("smollm2", 1.0, marks=pytest.mark.slow)],
)
def test_a_shared_prompt_encoded_once_gives_the_same_tokens_and_logits(
    tiny_root, tmp_path, request, temperature, model_name
):
    from searchgym.trainers.grpo.generation import generate_batch

    if model_name == "tiny":
        trainer = GRPOTrainer(make_config(tiny_root, tmp_path / "run"), progress=False)
        trainer.setup()
        model, tok = trainer.model, trainer.tokenizer
        trainer.close()
    else:
        from transformers import AutoModelForCausalLM

        from searchgym.policies.tiny import load_tokenizer

        folder = request.getfixturevalue("smollm2_dir")
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
        tok = load_tokenizer(folder)
    rows, prefixes = _shared_prompt_batch(tok)
    settings = SamplingSettings(temperature=temperature)
    runs = []
    for shared in (None, prefixes):
        torch.manual_seed(0)
        new, _, output = generate_batch(
            model, tok, rows, [10] * len(rows), ["</answer>"], settings, shared,
            output_logits=True, return_dict_in_generate=True,
        )  # fmt: skip
        runs.append((new, torch.stack(output.logits, dim=1)))
    (whole, whole_logits), (shared_ids, shared_logits) = runs
    assert shared_ids == whole
    torch.testing.assert_close(shared_logits, whole_logits, atol=1e-4, rtol=1e-4)
    # the log-probabilities of the sampled tokens agree too
    picked = torch.tensor(whole).unsqueeze(-1)
    torch.testing.assert_close(
        shared_logits.log_softmax(-1).gather(-1, picked),
        whole_logits.log_softmax(-1).gather(-1, picked),
        atol=1e-5,
        rtol=1e-5,
    )


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_update_logprobs_and_gradients_are_the_same_with_a_shared_prompt(tiny_root, tmp_path, temperature):
    from searchgym.trainers.grpo.loss import pad_batch, token_logprobs
    from searchgym.trainers.grpo.prefix import sequence_logprobs

    trainer = GRPOTrainer(make_config(tiny_root, tmp_path / "run"), progress=False)
    trainer.setup()
    model, tok = trainer.model, trainer.tokenizer
    trainer.close()
    rows, prefixes = _shared_prompt_batch(tok)
    rows[5] = rows[5][:-1]  # rows of one group end at different lengths
    ids, attention = pad_batch(rows, tok.pad_token_id)
    inside = attention[:, 1:]  # entries past a row's end are not used
    weights = torch.rand(inside.shape, generator=torch.Generator().manual_seed(0)) * inside
    results = []
    for shared in (None, prefixes):
        model.zero_grad()
        lp = sequence_logprobs(model, rows, tok.pad_token_id, torch.device("cpu"), temperature, shared)
        (lp * weights).sum().backward()
        results.append((lp.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
    (whole, whole_grads), (shared_lp, shared_grads) = results
    with torch.no_grad():
        reference = token_logprobs(model, ids, attention, temperature)
    torch.testing.assert_close(whole * inside, reference * inside)  # no sharing: the plain computation
    torch.testing.assert_close(shared_lp * inside, whole * inside, atol=1e-5, rtol=1e-5)
    for name, grad in whole_grads.items():
        torch.testing.assert_close(shared_grads[name], grad, atol=1e-4, rtol=1e-3)


@pytest.mark.parametrize("share", [False, True])
def test_logprobs_of_the_wanted_tokens_only_equal_the_full_computation_there(tiny_root, tmp_path, share):
    """The update asks for the sampled tokens' log-probabilities only: the output layer runs on
    those positions alone, and values and gradients equal the full computation's."""
    from searchgym.trainers.grpo.loss import pad_batch, pad_values
    from searchgym.trainers.grpo.prefix import sequence_logprobs

    trainer = GRPOTrainer(make_config(tiny_root, tmp_path / "run"), progress=False)
    trainer.setup()
    model, tok = trainer.model, trainer.tokenizer
    trainer.close()
    rows, prefixes = _shared_prompt_batch(tok)
    rows[5] = rows[5][:-1]
    shared = prefixes if share else None
    _, attention = pad_batch(rows, tok.pad_token_id)
    rng = torch.Generator().manual_seed(1)
    wanted = [
        [0] * p + [int(torch.rand(1, generator=rng) < 0.5) for _ in row[p + 1 :]]
        for row, p in zip(rows, prefixes, strict=True)
    ]
    flags = pad_values(wanted, attention.shape[1] - 1, "cpu")
    weights = torch.rand(flags.shape, generator=rng) * flags
    seen = []
    hook = model.get_output_embeddings().register_forward_hook(
        lambda m, args, out: seen.append(args[0].shape)
    )
    results = []
    for asked in (None, wanted):
        model.zero_grad()
        seen.clear()
        lp = sequence_logprobs(model, rows, tok.pad_token_id, torch.device("cpu"), 0.7, shared, wanted=asked)
        (lp * weights).sum().backward()
        results.append((lp.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}, list(seen)))
    hook.remove()
    (full, full_grads, full_seen), (part, part_grads, part_seen) = results
    torch.testing.assert_close(part, full * flags, atol=1e-5, rtol=1e-5)
    assert (part[flags == 0] == 0).all()
    for name, grad in full_grads.items():
        torch.testing.assert_close(part_grads[name], grad, atol=1e-4, rtol=1e-3)
    assert [s[0] for s in part_seen] == [int(flags.sum())]  # one call, on the wanted positions only
    assert sum(s[:-1].numel() for s in full_seen) > 5 * int(flags.sum())


def test_models_that_rescale_their_logits_get_the_full_computation(tiny_root):
    from searchgym.trainers.grpo.loss import pad_batch, selects_positions, token_logprobs
    from searchgym.trainers.grpo.model import load_model, model_source

    config = make_config(tiny_root, tiny_root / "unused").model
    model = load_model(config, model_source(config), torch.device("cpu"))
    assert selects_positions(model)
    model.config.final_logit_softcapping = 30.0  # Gemma 2's: tanh after the output layer
    assert not selects_positions(model)
    ids, attention = pad_batch([[5, 9, 14, 3, 7]], 0)
    wanted = torch.tensor([[0, 0, 1, 1]])
    lp = token_logprobs(model, ids, attention, wanted=wanted)
    assert lp.shape == (1, 4) and (lp[0, :2] != 0).all()  # every entry computed, from the model's logits


def test_group_prefix_lengths_are_the_groups_common_prompt():
    from searchgym.trainers.grpo.rollout import Episode, group_prefix_lengths

    def episode(group, prompt, rest=(99,)):
        ep = Episode(question_index=0, group=group)
        ep._append("prompt", prompt, "", ())
        ep._append("action", rest, "", ())
        return ep

    episodes = [
        episode(0, [1, 2, 3, 4]),
        episode(0, [1, 2, 3, 4], rest=(5, 6)),  # the same prompt: all 4 tokens shared
        episode(1, [1, 2, 7, 8, 9]),
        episode(1, [1, 2, 7, 5]),  # differs at the fourth token: 3 shared
        episode(1, [1, 2, 7, 8]),
        episode(2, [4, 4]),  # alone in its group: its whole prompt
    ]
    assert group_prefix_lengths(episodes) == [4, 4, 3, 3, 3, 2]


@pytest.mark.parametrize("per", ["group", "rollout"])
def test_rollouts_are_the_same_with_and_without_the_shared_prompt(tiny_root, tmp_path, memory_store, per):
    """A memory arm's step, collected with each group's prompt encoded once and with every
    rollout encoding its own: the same episodes, token for token."""
    collected = []
    for share in (True, False):
        config = make_config(
            tiny_root,
            tmp_path / f"{per}-{share}",
            env={"id": ENV_ID, "kwargs": {"reward": "f1", "max_turns": 3}},
            memory={"kind": "lightsearcher", "path": str(memory_store), "example_per": per},
            rollout={
                "group_size": 4,
                "questions_per_step": 3,
                "max_new_tokens": 12,
                "max_context_tokens": 1024,
            },
        )
        trainer = GRPOTrainer(config, progress=False)
        trainer.setup()
        trainer.collector.sampling = SamplingSettings(share_prefix=share)
        episodes = trainer.collector.collect([3, 7, 9], 4, seed=11)
        trainer.close()
        collected.append([(ep.token_ids, ep.action_mask, ep.reward) for ep in episodes])
    assert collected[0] == collected[1]
    assert any(len(ids) > 100 for ids, _, _ in collected[0])  # prompts with the memory's blocks


def scripted_sampler(tokenizer, eos: bool):
    """A stand-in for the policy that searches once, then answers, with real token ids."""

    def sample(model, tok, contexts, budgets, stops, settings):
        out = []
        for context in contexts:
            searched = "Doc 1 (Title:" in tok.decode(context)  # the instructions name the tags too
            text = (
                "<answer> unknown </answer>"
                if searched
                else "<think>look it up</think><search> capital city </search>"
            )
            ids = tok(text, add_special_tokens=False)["input_ids"]
            if eos:
                ids = ids + [tok.eos_token_id]
            out.append(Sampled(ids=ids, text=text, finish="eos" if eos else "stop"))
        return out

    return sample


@pytest.mark.parametrize("eos", [False, True])
def test_retrieved_documents_are_masked_and_the_turn_closes_once(tiny_root, tmp_path, eos):
    config = make_config(tiny_root, tmp_path / "run", env={"id": ENV_ID, "kwargs": {"reward": "f1"}})
    trainer = GRPOTrainer(config, progress=False)
    trainer.setup()
    tok = trainer.tokenizer
    trainer.collector.sampler = scripted_sampler(tok, eos)
    episodes = trainer.collector.collect([0], 2, seed=0)
    trainer.close()
    for ep in episodes:
        check_segments(ep, tok)
        search, answer = ep.trajectory.turns
        assert search.action.kind == "search" and search.docs and answer.action.kind == "answer"
        feedback = next(s for s in ep.segments if s.kind == "feedback")
        for doc in search.docs:  # every retrieved passage is in the feedback, and masked
            at = feedback.text.find(doc.text)
            positions = token_span(tok, feedback.text, at, at + len(doc.text))
            assert at >= 0 and positions and all(ep.action_mask[feedback.start + i] == 0 for i in positions)
        text = tok.decode(ep.token_ids)
        assert "</search><|im_end|>\n<|im_start|>user\n<information>" in text
        assert "<|im_end|><|im_end|>" not in text
        assert sum(ep.action_mask) == sum(s.end - s.start for s in ep.segments if s.kind == "action")
        assert ep.reward == 0.0 and ep.trajectory.reward == 0.0


@pytest.mark.parametrize("reasoning", ["steps", "tokens"])
def test_tsas_reads_searches_and_reasoning_from_the_episodes(tiny_root, tmp_path, reasoning):
    config = make_config(
        tiny_root,
        tmp_path / "run",
        env={"id": ENV_ID, "kwargs": {"reward": "f1"}},
        algo={"advantage": "tsas", "tsas_warmup_steps": 1, "tsas_reasoning": reasoning},
    )
    trainer = GRPOTrainer(config, progress=False)
    trainer.setup()
    tok = trainer.tokenizer
    trainer.collector.sampler = scripted_sampler(tok, eos=False)
    episodes = trainer.collector.collect([0, 1], 2, seed=0)
    trainer.close()
    # Every rollout: R = 0 (answer "unknown"), S = 1 search, and one <think> block "look it up".
    t = 1 if reasoning == "steps" else len(tok("look it up", add_special_tokens=False)["input_ids"])
    assert reasoning == "steps" or t > 1
    # Stage 1 (step 0 < M1 = 1): A = 0 + ln 2 + 0.01 · ln(T + 1) for each of the four rollouts.
    assert trainer.advantages(episodes, step=0) == pytest.approx([math.log(2) + 0.01 * math.log(t + 1)] * 4)
    # Stage 2: A+ = 0, so σ = sigmoid(0) − 0.5 = 0 and every advantage is 0.
    assert trainer.advantages(episodes, step=1) == pytest.approx([0.0] * 4)


def test_a_spent_context_budget_ends_the_episode_with_empty_actions(tiny_root, tmp_path):
    config = make_config(
        tiny_root, tmp_path / "run", env={"id": ENV_ID, "kwargs": {"reward": "f1", "max_turns": 3}}
    )
    trainer = GRPOTrainer(config, progress=False)
    trainer.setup()
    first = trainer.collector.collect([0], 2, seed=0)
    trainer.collector.max_context_tokens = first[0].prompt_tokens + 3
    episodes = trainer.collector.collect([0], 2, seed=0)
    trainer.close()
    for ep in episodes:
        actions = [s for s in ep.segments if s.kind == "action"]
        assert len(actions) == 1 and actions[0].end - actions[0].start <= 3
        turns = ep.trajectory.turns
        if len(turns) > 1:  # the first action did not end the episode: the rest were empty
            assert ep.context_exhausted and all(t.action_text == "" for t in turns[1:])
            assert len(turns) == 3 and ep.trajectory.truncated
        assert ep.trajectory.reward is not None and ep.reward == ep.trajectory.reward


def test_sampling_stops_right_after_a_stop_string(tiny_root, tmp_path):
    trainer = GRPOTrainer(make_config(tiny_root, tmp_path / "run"), progress=False)
    trainer.setup()
    model, tok = trainer.model, trainer.tokenizer
    contexts = [tok(f"Question {i}: where", add_special_tokens=False)["input_ids"] for i in range(12)]
    torch.manual_seed(0)
    out = sample_actions(model, tok, contexts, [30] * 12, ["e"], SamplingSettings(batch_size=5))
    trainer.close()
    eos = set(eos_token_ids(model, tok))
    assert {s.finish for s in out} >= {"stop"}
    for s in out:
        decoded = tok.decode(s.ids, skip_special_tokens=True)
        if s.finish == "stop":
            assert s.text.endswith("e") and "e" not in s.text[:-1]
            assert "e" in decoded and "e" not in tok.decode(s.ids[:-1], skip_special_tokens=True)
        elif s.finish == "eos":
            assert s.ids[-1] in eos and "e" not in decoded
        else:
            assert len(s.ids) == 30 and "e" not in decoded


# -- checkpoints and resume --------------------------------------------------------------------


def resume_config(tiny_root: Path, out: Path, store: Path) -> TrainConfig:
    return make_config(
        tiny_root,
        out,
        steps=4,
        env={"id": ENV_ID, "kwargs": {"reward": CharReward(), "max_turns": 2}},
        algo={
            "mini_batches": 2,
            "ppo_epochs": 1,
            "kl_coef": 0.05,
            "lr_schedule": "cosine",
            "warmup_steps": 1,
        },
        memory={
            "kind": "lightsearcher",
            "path": str(store),
            "update_every": 2,
            "good_reward": 0.5,
            "theta_r": 0.3,
        },
        checkpoint={"every": 2, "keep_last": 5},
    )


def test_a_resumed_run_reaches_the_same_parameters_as_an_uninterrupted_one(
    tiny_root, tmp_path, memory_store, monkeypatch
):
    # Bit-exact only on one thread (CPU reductions over several threads, such as the
    # embedding's backward, can sum in another order); the trainer pins one thread for the
    # tiny model unless OMP_NUM_THREADS is set, which the test environment must not decide.
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    # Both runs start from a copy of a store with a bank, so the prompts carry experience and examples.
    stores = {name: shutil.copytree(memory_store, tmp_path / f"store_{name}") for name in ("whole", "cut")}
    whole = GRPOTrainer(resume_config(tiny_root, tmp_path / "whole", stores["whole"]), progress=False)
    whole.train()
    whole.close()

    crashing = GRPOTrainer(resume_config(tiny_root, tmp_path / "cut", stores["cut"]), progress=False)
    real_update = crashing.update

    def update_then_crash(episodes, advantages, step):
        if step == 2:  # step 3 crashes after its rollouts went into the memory store
            raise KeyboardInterrupt("simulated crash")
        return real_update(episodes, advantages, step)

    crashing.update = update_then_crash
    with pytest.raises(KeyboardInterrupt):
        crashing.train()
    crashing.close()
    assert [s for s, _ in list_checkpoints(tmp_path / "cut")] == [2]

    resumed = GRPOTrainer(resume_config(tiny_root, tmp_path / "cut", stores["cut"]), progress=False)
    state = resumed.train()
    resumed.close()
    assert resumed.resumed_from is not None and resumed.resumed_from.name == "step_000002"
    assert state.step == 4 and [r["step"] for r in state.history] == [1, 2, 3, 4]
    expected = params(whole.model)
    got = params(resumed.model)
    for name in expected:
        assert torch.equal(expected[name], got[name]), name
    for a, b in zip(whole.state.history, state.history, strict=True):
        assert a["rollout"] == b["rollout"]
    assert whole.memory.steps == resumed.memory.steps == 4
    assert len(whole.memory.experience) > 0 and whole.memory.pool_size > 0
    assert {span for ep in whole.last_episodes for span in ep.segments[0].memory_spans}  # prompts had memory
    assert len(whole.memory) == len(resumed.memory)  # the crashed step's rollouts were rolled back
    assert [r.bank.to_dict() for r in whole.memory.history_records()] == [
        r.bank.to_dict() for r in resumed.memory.history_records()
    ]


def test_a_checkpoint_is_a_loadable_model_folder_with_the_run_state(tiny_root, tmp_path):
    trainer = GRPOTrainer(make_config(tiny_root, tmp_path / "run", steps=1), progress=False)
    trainer.train()
    trainer.close()
    ((step, folder),) = list_checkpoints(tmp_path / "run")
    assert step == 1
    names = {p.name for p in folder.iterdir()}
    assert {
        "model",
        "optimizer.pt",
        "scheduler.pt",
        "rng.pt",
        "reward.json",
        "config.yaml",
        "trainer_state.json",
    } <= names
    from transformers import AutoModelForCausalLM

    reloaded = AutoModelForCausalLM.from_pretrained(folder / "model")
    for name, p in reloaded.named_parameters():
        assert torch.equal(p, dict(trainer.model.named_parameters())[name])
    assert not any(p.name.startswith(".") for p in folder.parent.iterdir())  # no staging folder left


def test_resume_never_refuses_a_folder_with_checkpoints_and_a_bad_path_is_named(tiny_root, tmp_path):
    trainer = GRPOTrainer(make_config(tiny_root, tmp_path / "run", steps=1), progress=False)
    trainer.train()
    trainer.close()
    again = GRPOTrainer(
        make_config(tiny_root, tmp_path / "run", checkpoint={"resume": "never"}), progress=False
    )
    with pytest.raises(ConfigError, match=r"checkpoint.resume: got 'never'.*already holds checkpoints"):
        again.setup()
    missing = tmp_path / "nowhere" / "step_000001"
    bad = GRPOTrainer(
        make_config(tiny_root, tmp_path / "other", checkpoint={"resume": str(missing)}), progress=False
    )
    with pytest.raises(DataFileError, match="nowhere/step_000001.*not a complete checkpoint"):
        bad.setup()


# -- replay (PPO-ptx) --------------------------------------------------------------------------


def test_ptx_nll_is_the_cross_entropy_of_the_completion_tokens_only(tiny_root):
    from searchgym.trainers.grpo.model import load_model, model_source
    from searchgym.trainers.grpo.ptx import PtxExample, ptx_nll

    config = make_config(tiny_root, tiny_root / "unused").model
    model = load_model(config, model_source(config), torch.device("cpu")).requires_grad_(False)
    pad_id = 0
    ids = (5, 9, 14, 3, 7, 2)
    example = PtxExample(ids, prompt_len=3)
    logprobs = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0, :-1].float(), -1)
    expected = -sum(float(logprobs[t - 1, ids[t]]) for t in range(3, len(ids))) / 3
    other = PtxExample((5, 9, 14, 3), prompt_len=1)  # a shorter one in the batch: padding is not trained
    got = float(ptx_nll(model, [example], pad_id, "cpu"))
    assert got == pytest.approx(expected, rel=1e-5)
    both = float(ptx_nll(model, [example, other], pad_id, "cpu"))
    lp2 = torch.log_softmax(model(input_ids=torch.tensor([other.token_ids])).logits[0, :-1].float(), -1)
    expected_both = (expected * 3 - sum(float(lp2[t - 1, other.token_ids[t]]) for t in range(1, 4))) / 6
    assert both == pytest.approx(expected_both, rel=1e-5)


def test_ptx_backward_in_micro_batches_gives_the_whole_batchs_gradient(tiny_root):
    from searchgym.trainers.grpo.model import load_model, model_source
    from searchgym.trainers.grpo.ptx import PtxExample, ptx_backward, ptx_nll

    config = make_config(tiny_root, tiny_root / "unused").model
    model = load_model(config, model_source(config), torch.device("cpu"))
    batch = [
        PtxExample((5, 9, 14, 3, 7, 2), 3),
        PtxExample((5, 9, 14, 3), 1),
        PtxExample((4, 8, 6, 11, 12), 1),
    ]
    ptx_nll(model, batch, 0, "cpu").backward()
    whole = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    expected = float(ptx_nll(model, batch, 0, "cpu"))
    model.zero_grad(set_to_none=True)
    loss = ptx_backward(model, batch, 0, "cpu", micro_batch_size=2)  # 3 + 3 and 4 completion tokens
    parts = [p.grad for p in model.parameters() if p.grad is not None]
    assert loss == pytest.approx(expected, rel=1e-5)
    assert len(parts) == len(whole) and all(
        torch.allclose(a, b, atol=1e-6) for a, b in zip(parts, whole, strict=True)
    )


def test_ptx_nll_runs_the_output_layer_on_the_completion_positions_only(tiny_root):
    from searchgym.trainers.grpo.model import load_model, model_source
    from searchgym.trainers.grpo.ptx import PtxExample, ptx_nll

    config = make_config(tiny_root, tiny_root / "unused").model
    model = load_model(config, model_source(config), torch.device("cpu"))
    rows = []
    model.get_output_embeddings().register_forward_hook(lambda m, args, out: rows.append(args[0].shape[0]))
    long_prompt = PtxExample(tuple(range(5, 305)) + (7, 2), prompt_len=300)  # 300 prompt tokens, 2 trained
    short = PtxExample((5, 9, 14, 3), prompt_len=1)  # 3 trained
    ptx_nll(model, [long_prompt, short], 0, "cpu").backward()
    assert rows == [5]  # not 2 x 301 positions
    assert model.get_output_embeddings().weight.grad is not None


def test_replayed_examples_are_learned_during_grpo(tiny_root, tmp_path):
    from searchgym.trainers.grpo.ptx import load_ptx_examples, ptx_nll, write_ptx_examples

    data = tmp_path / "replay.jsonl"
    write_ptx_examples(data, [("Question: Where was Ada Quill born? Answer:", " Lindmark")])
    nll = {}
    for coef in (0.0, 5.0):
        algo = {"ptx_coef": coef, "ptx_data": str(data), "ptx_batch_size": 2}
        trainer = GRPOTrainer(
            make_config(tiny_root, tmp_path / f"c{coef}", steps=3, algo=algo), progress=False
        )
        state = trainer.train()
        trainer.close()
        examples = load_ptx_examples(data, trainer.tokenizer)
        with torch.no_grad():
            nll[coef] = float(ptx_nll(trainer.model, examples, trainer.tokenizer.pad_token_id, "cpu"))
        assert ("ptx_loss" in state.history[-1]["train"]) == (coef > 0)
    assert nll[5.0] < 0.7 * nll[0.0]  # measured: 3.6 against 6.7


def test_ptx_lines_marked_eos_false_end_without_the_end_token(tiny_root, tmp_path):
    from searchgym.trainers.grpo.model import load_tokenizer_for, model_source
    from searchgym.trainers.grpo.ptx import load_ptx_examples, write_ptx_examples

    model = make_config(tiny_root, tmp_path / "t").model
    tokenizer = load_tokenizer_for(model, model_source(model))
    pair = [("Question: Where was Ada Quill born?", "<think>Recall: Lindmark.</think>")]
    with_end, without = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    write_ptx_examples(with_end, pair)
    write_ptx_examples(without, pair, eos=False)
    (ended,), (open_,) = load_ptx_examples(with_end, tokenizer), load_ptx_examples(without, tokenizer)
    assert ended.token_ids == open_.token_ids + (tokenizer.eos_token_id,)
    assert ended.prompt_len == open_.prompt_len
    without.write_text('{"prompt": "Q", "completion": " A", "eos": "no"}\n', encoding="utf-8")
    with pytest.raises(DataFileError, match="boolean 'eos'"):
        load_ptx_examples(without, tokenizer)


def test_bad_ptx_data_is_named(tiny_root, tmp_path):
    from searchgym.trainers.grpo.model import load_tokenizer_for, model_source
    from searchgym.trainers.grpo.ptx import load_ptx_examples

    model = make_config(tiny_root, tmp_path / "t").model
    tokenizer = load_tokenizer_for(model, model_source(model))
    with pytest.raises(DataFileError, match="cannot read"):
        load_ptx_examples(tmp_path / "missing.jsonl", tokenizer)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "Q", "completion": " A"}\n{"prompt": "Q"\n', encoding="utf-8")
    with pytest.raises(DataFileError, match="line 2"):
        load_ptx_examples(bad, tokenizer)
    bad.write_text('{"prompt": "Q", "completion": ""}\n', encoding="utf-8")
    with pytest.raises(DataFileError, match="line 1"):
        load_ptx_examples(bad, tokenizer)
    bad.write_text("\n\n", encoding="utf-8")
    with pytest.raises(DataFileError, match="no examples"):
        load_ptx_examples(bad, tokenizer)
    with pytest.raises(ConfigError, match="algo.ptx_data"):
        make_config(tiny_root, tmp_path / "u", algo={"ptx_coef": 0.1})
    with pytest.raises(ConfigError, match="algo.ptx_coef"):
        make_config(tiny_root, tmp_path / "u", algo={"ptx_coef": -1.0, "ptx_data": str(bad)})
    trainer = GRPOTrainer(
        make_config(tiny_root, tmp_path / "v", algo={"ptx_coef": 0.1, "ptx_data": str(bad)})
    )
    with pytest.raises(DataFileError, match="no examples"):
        trainer.setup()


def test_the_shared_prompt_table_is_generated_from_its_committed_result():
    spec = importlib.util.spec_from_file_location("shared_prompt", REPO / "benchmarks" / "shared_prompt.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    report = json.loads(module.RESULT.read_text(encoding="utf-8"))
    assert all(r["same_episodes_every_step"] for r in report["results"])
    page = module.PAGE.read_text(encoding="utf-8")
    assert f"<!-- table:{module.TABLE} -->\n{module.render(report)}\n" in page


@pytest.mark.parametrize("native", [False, True], ids=["avx2_cpu", "bfloat16_cpu"])
def test_bfloat16_autocast_on_a_cpu_that_emulates_it_is_warned_about(
    tiny_root, tmp_path, monkeypatch, caplog, native
):
    from searchgym.trainers.grpo import model as model_module

    monkeypatch.setattr(model_module, "cpu_has_bfloat16", lambda: native)  # the CPU's features
    config = make_config(tiny_root, tmp_path / "run", model={"autocast": "bfloat16", "device": "cpu"})
    trainer = GRPOTrainer(config, progress=False)
    with caplog.at_level("WARNING", logger="searchgym.trainers"):
        trainer.setup()
    trainer.close()
    warned = [r.getMessage() for r in caplog.records if "no bfloat16 units" in r.getMessage()]
    assert len(warned) == (0 if native else 1)
    off = make_config(tiny_root, tmp_path / "off", model={"device": "cpu"})
    assert model_module.autocast_warning(off.model, torch.device("cpu")) is None


def test_the_cpu_bfloat16_check_answers_on_this_machine():
    from searchgym.trainers.grpo.model import cpu_has_bfloat16

    assert isinstance(cpu_has_bfloat16(), bool)
