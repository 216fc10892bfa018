"""Every step of an episode deals equal shares and whole accumulation windows, through OpenRLHF's own code.

OpenRLHF 0.11.2's ``prepare_datasets`` (which applies ``--data.max_samples``),
``SamplesGenerator.generate_samples`` (which draws the rollout batches and keeps a short
last one), ``RemoteExperienceMaker.split_rollout_samples`` (experiences of
``rollout.micro_batch_size``) and ``RayActorGroup.async_run_method_batch`` (the chunks each
rank gets) run here as installed. The modules that import DeepSpeed are not importable on a
CPU, so those functions are compiled from their installed source; what stands in is the
world outside them: Ray's ``put``/``get``/``wait`` as plain values, vLLM engines that return
``n`` responses per prompt, the actors that receive a chunk, and DeepSpeed's data loader
(``setup_dataloader`` without ``torch.distributed``: a shuffled loader of batch 1).
"""

from __future__ import annotations

import ast
import copy
import importlib.util
import json
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from searchgym.trainers.openrlhf import compose, load_run_config
from searchgym.trainers.openrlhf.batch_checks import rank_shares
from searchgym.trainers.openrlhf.flags import FlagError, check_flags, openrlhf_parser

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(openrlhf_parser() is None, reason="needs openrlhf==0.11.2 (--no-deps)")

ROOT = Path(__file__).resolve().parents[2]


# -- OpenRLHF's code, with the world outside it -------------------------------------------------------


def _openrlhf_file(relative: str) -> Path:
    import openrlhf

    return Path(openrlhf.__file__).parent / relative


def openrlhf_function(relative: str, qualname: str, namespace: dict[str, Any]) -> Any:
    """A function or method of an installed OpenRLHF file, compiled from its source into ``namespace``."""
    path = _openrlhf_file(relative)
    tree = ast.parse(path.read_text(encoding="utf-8"))
    *owner, name = qualname.split(".")
    body = tree.body
    for cls in owner:
        body = next(n for n in body if isinstance(n, ast.ClassDef) and n.name == cls).body
    node = next(n for n in body if isinstance(n, ast.FunctionDef) and n.name == name)
    node.decorator_list = []
    exec(compile(ast.Module(body=[node], type_ignores=[]), str(path), "exec"), namespace)
    return namespace[name]


FAKE_RAY = types.SimpleNamespace(
    put=lambda value: value,
    get=lambda refs: refs,
    wait=lambda refs, num_returns=1, timeout=None: (refs[:num_returns], refs[num_returns:]),
)


class _Remote:
    def __init__(self, fn):
        self.remote = fn


class FakeEngine:
    """A vLLM rollout actor: ``n`` agent responses per prompt, as OpenRLHF's executor returns them."""

    def __init__(self) -> None:
        self.generate_responses = _Remote(self._generate)
        self.get_num_unfinished_requests = _Remote(lambda: 0)

    @staticmethod
    def _generate(prompt, label, sampling_params, max_length, hf_tokenizer, num_samples, images=None):
        return [
            {
                "prompt": prompt,
                "label": label,
                "observation_tokens": [1, 2, 3, 4],
                "action_ranges": [(2, 4)],
                "rollout_log_probs": None,
                "reward": 0.5,
                "scores": 0.5,
                "extra_logs": {},
            }
            for _ in range(num_samples)
        ]


class FakeActor:
    """A trainer rank: records the experiences ``execute_batch`` hands it."""

    def __init__(self, received: list[Any]) -> None:
        self.execute_batch = _Remote(lambda method, chunk, start, end: received.append(chunk["experience"]))


class Rows(list):
    """The part of a ``datasets.Dataset`` that ``prepare_datasets`` uses."""

    def select(self, indices):
        return Rows(self[i] for i in indices)


@pytest.fixture(scope="module")
def openrlhf_code():
    """OpenRLHF's sample generator (imported, with a stand-in ``vllm`` module) and its other pieces."""
    fake = {
        "vllm": types.ModuleType("vllm"),
        "vllm.inputs": types.ModuleType("vllm.inputs"),
        "vllm.utils": types.ModuleType("vllm.utils"),
    }
    fake["vllm"].SamplingParams = lambda **kwargs: types.SimpleNamespace(**kwargs)
    fake["vllm"].__version__ = "0.29.0"
    fake["vllm.inputs"].TokensPrompt = dict
    fake["vllm.utils"].random_uuid = lambda: "0"
    saved = {name: sys.modules.get(name) for name in fake}
    sys.modules.update(fake)
    try:
        import openrlhf.trainer.ppo_utils.samples_generator as samples_generator
        from openrlhf.trainer.ppo_utils.experience import Experience
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module
    # openrlhf/datasets/__init__ imports the datasets package for other datasets; this file needs only torch
    spec = importlib.util.spec_from_file_location(
        "openrlhf_prompts", _openrlhf_file("datasets/prompts_dataset.py")
    )
    prompts = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(prompts)
    PromptDataset = prompts.PromptDataset
    samples_generator.ray = FAKE_RAY
    samples_generator.batch_vllm_engine_call = lambda engines, method, *a, **k: None  # wake_up / sleep
    return types.SimpleNamespace(
        SamplesGenerator=samples_generator.SamplesGenerator,
        PromptDataset=PromptDataset,
        Experience=Experience,
        prepare_datasets=openrlhf_function(
            "trainer/ppo_trainer.py",
            "prepare_datasets",
            {"blending_datasets": _blend, "PromptDataset": PromptDataset},
        ),
        split=openrlhf_function(
            "trainer/ppo_utils/experience_maker.py",
            "RemoteExperienceMaker.split_rollout_samples",
            {"Experience": Experience},
        ),
        deal=openrlhf_function(
            "trainer/ray/launcher.py", "RayActorGroup.async_run_method_batch", {"ray": FAKE_RAY}
        ),
    )


def _blend(datasets, probabilities, strategy, seed=42, max_count=1e8, dataset_split="train"):
    """``blending_datasets`` for local JSON Lines files: each capped at ``max_count``, then concatenated."""
    out = Rows()
    for part in datasets.split(","):
        rows = [json.loads(line) for line in Path(part.strip()).read_text().splitlines() if line.strip()]
        out.extend(rows[: int(min(max_count, len(rows)))])
    return out


class _Strategy:
    def __init__(self, args):
        self.args = args

    def print(self, *_):
        pass

    def is_rank_0(self):
        return True

    def setup_dataloader(
        self,
        dataset,
        batch_size,
        pin_memory=False,
        shuffle=True,
        collate_fn=None,
        drop_last=True,
        num_workers=0,
        **_,
    ):
        generator = torch.Generator().manual_seed(self.args.train.seed)
        return torch.utils.data.DataLoader(
            dataset,
            batch_size=batch_size,
            shuffle=shuffle,
            drop_last=drop_last,
            collate_fn=collate_fn,
            generator=generator,
        )


def episode_shares(code, args) -> list[list[int] | None]:
    """One episode as ``PPOTrainer.fit`` runs it: the samples each rank receives, step by step
    (``None`` for a step that OpenRLHF refuses to deal)."""
    strategy = _Strategy(args)
    dataloader, _, _ = code.prepare_datasets(strategy, types.SimpleNamespace(pad_token_id=0))
    dp = (
        args.actor.num_nodes
        * args.actor.num_gpus_per_node
        // args.ds.ring_attn_size
        // args.ds.tensor_parallel_size
    )
    generator = code.SamplesGenerator(
        strategy, dataloader, None, None, [FakeEngine() for _ in range(args.vllm.num_engines)]
    )
    # Every response is the same four tokens, so OpenRLHF's conversion (1.4 ms a call on this
    # loaded CPU) runs once and each sample gets its own copy with its prompt and label.
    template = generator._process_response_into_experience(FakeEngine._generate("", "", None, 0, None, 1)[0])

    def to_experience(response, **_):
        experience = copy.copy(template)
        experience.prompts, experience.labels = [response["prompt"]], [response["label"]]
        return experience

    generator._process_response_into_experience = to_experience
    maker = types.SimpleNamespace(args=args, tokenizer=types.SimpleNamespace(pad_token_id=0))
    steps = []
    while True:
        samples, _, _, exhausted = generator.generate_samples()
        if not samples:
            if exhausted:
                break
            continue
        experiences = code.split(maker, samples)
        received: list[Any] = []
        group = types.SimpleNamespace(
            _actor_handlers=[FakeActor(received) for _ in range(dp)], duplicate_actors=1
        )
        try:
            code.deal(group, method_name="append", experience=experiences)
        except ValueError:  # "Insufficient batch size": fewer experiences than ranks
            steps.append(None)
        else:
            steps.append([sum(len(e.sequences) for e in chunk) for chunk in received])
        if exhausted:
            break
    return steps


def write_prompts(path: Path, rows: int) -> None:
    path.write_text(
        "".join(
            json.dumps({"prompt": f"q{i}", "label": json.dumps({"id": str(i)})}) + "\n" for i in range(rows)
        )
    )


def lightsearcher_run(tmp_path: Path, rows: int, extra: str = "") -> Path:
    """configs/openrlhf/lightsearcher.yaml (192 questions × 12, 8 ranks), launched from ``tmp_path``."""
    (tmp_path / "data").mkdir(exist_ok=True)
    write_prompts(tmp_path / "data" / "lightsearcher_train.jsonl", rows)
    run = tmp_path / "run.yaml"
    run.write_text(f"extends: {ROOT / 'configs' / 'openrlhf' / 'lightsearcher.yaml'}\n{extra}")
    return run


def test_the_tail_of_7000_rows_desynchronises_the_ranks_in_openrlhf(openrlhf_code, tmp_path, monkeypatch):
    """The issue's numbers: the launched run's flags without the ``--data.max_samples`` that trims the tail."""
    monkeypatch.chdir(tmp_path)
    flags = compose(load_run_config(lightsearcher_run(tmp_path, 7000)), basedir=str(tmp_path)).flags
    if "--data.max_samples" in flags:
        at = flags.index("--data.max_samples")
        flags = flags[:at] + flags[at + 2 :]
    args, _ = check_flags(flags, openrlhf_parser())
    steps = episode_shares(openrlhf_code, args)
    assert len(steps) == 37 and steps[:36] == [[288] * 8] * 36
    assert [s // 16 for s in steps[36]] == [9, 9, 9, 9, 9, 9, 9, 3]  # 1,056 samples, 66 experiences
    assert rank_shares(88 * 12, 16, 8) == steps[36]


def test_every_step_of_the_launched_run_is_whole(openrlhf_code, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = load_run_config(lightsearcher_run(tmp_path, 7000))
    plan = compose(config, basedir=str(tmp_path))
    args, _ = check_flags(plan.flags, openrlhf_parser())
    assert args.data.max_samples == 6912  # 36 × 192: the 88-row tail is dropped
    steps = episode_shares(openrlhf_code, args)
    dp = 8
    accumulation = args.train.batch_size // args.train.micro_batch_size // dp  # 72
    assert len(steps) == 36
    for shares in steps:  # every rank the same micro-steps, each a whole number of accumulation windows
        assert len(set(shares)) == 1 and (shares[0] // args.train.micro_batch_size) % accumulation == 0
    notes = "\n".join(plan.notes)
    assert "7,000 rows" in notes and "the last 88 rows" in notes and "--data.max_samples 6912" in notes
    assert "72 micro-steps of 4 = 1 optimizer step" in notes and "360 steps over 10 episode" in notes


@pytest.mark.parametrize(
    "rows, batch, n, micro, gpus",
    [(101, 8, 5, 5, 8), (1000, 16, 8, 8, 4), (64, 16, 8, 4, 8), (200, 24, 3, 7, 8)],
)
def test_the_dry_runs_shares_are_openrlhfs(openrlhf_code, tmp_path, rows, batch, n, micro, gpus):
    """``rank_shares`` against the real dealing, for full and short batches."""
    path = tmp_path / "p.jsonl"
    write_prompts(path, rows)
    flags = [
        "--data.prompt_dataset",
        str(path),
        "--rollout.batch_size",
        str(batch),
        "--vllm.num_engines",
        "1",
    ]
    flags += [
        "--actor.model_name_or_path",
        "m",
        "--train.batch_size",
        str(batch * n),
        "--train.agent_func_path",
        "a.py",
    ]
    flags += ["--data.input_key", "prompt", "--data.label_key", "label"]
    flags += ["--rollout.n_samples_per_prompt", str(n), "--rollout.micro_batch_size", str(micro)]
    args, _ = check_flags(flags + ["--actor.num_gpus_per_node", str(gpus)], openrlhf_parser())
    steps = episode_shares(openrlhf_code, args)

    def shares(samples):  # OpenRLHF stops when a batch has fewer experiences than ranks
        return rank_shares(samples, micro, gpus) if -(-samples // micro) >= gpus else None

    expected = [shares(batch * n)] * (rows // batch) + ([shares(rows % batch * n)] if rows % batch else [])
    assert steps == expected


def test_a_file_of_fewer_rows_than_a_batch_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(
        FlagError, match=r"gives 100 rows, fewer than one rollout batch \(rollout.batch_size = 192\)"
    ):
        compose(load_run_config(lightsearcher_run(tmp_path, 100)), basedir=str(tmp_path))


def test_a_smaller_max_samples_is_rounded_down_to_whole_batches(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run = lightsearcher_run(tmp_path, 7000, "openrlhf: {data: {max_samples: 1000}}\n")
    plan = compose(load_run_config(run), basedir=str(tmp_path))
    args, _ = check_flags(plan.flags, openrlhf_parser())
    assert args.data.max_samples == 960  # 5 × 192
    assert "keeps the first 1,000" in "\n".join(plan.notes)


def test_dynamic_filtering_is_refused(tmp_path, monkeypatch):
    """Its last batch is short by however many prompts were filtered: no trim can fix it."""
    monkeypatch.chdir(tmp_path)
    run = lightsearcher_run(tmp_path, 6912, "openrlhf: {algo: {dynamic_filtering_enable: true}}\n")
    with pytest.raises(FlagError, match="dynamic_filtering_enable: false"):
        compose(load_run_config(run), basedir=str(tmp_path))


def test_a_dataset_it_cannot_count_needs_max_samples(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run = lightsearcher_run(tmp_path, 10, "openrlhf: {data: {prompt_dataset: org/some-dataset}}\n")
    with pytest.raises(FlagError, match=r"cannot count the rows of org/some-dataset.*multiple of 192"):
        compose(load_run_config(run), basedir=str(tmp_path))
    run.write_text(run.read_text().replace("}}", ", max_samples: 1920}}"))
    plan = compose(load_run_config(run), basedir=str(tmp_path))
    assert "--data.max_samples" in plan.flags and "1920" in plan.flags


def test_a_missing_prompt_file_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run = lightsearcher_run(tmp_path, 7000)
    (tmp_path / "data" / "lightsearcher_train.jsonl").unlink()
    with pytest.raises(
        Exception, match=r"openrlhf.data.prompt_dataset: .*lightsearcher_train.jsonl' does not exist"
    ):
        compose(load_run_config(run), basedir=str(tmp_path))
