"""The dry run's batch arithmetic: what DeepSpeed and OpenRLHF's ``train()`` assert once a run starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from searchgym.trainers.openrlhf import compose, load_run_config
from searchgym.trainers.openrlhf.flags import FlagError, openrlhf_parser

pytestmark = pytest.mark.skipif(openrlhf_parser() is None, reason="needs openrlhf==0.11.2 (--no-deps)")

# The shape of configs/openrlhf/sem.yaml before it was fixed: one node of 8 GPUs, 8 questions x 5.
RUN = """\
backend: openrlhf
env: {id: searchgym/SyntheticFacts-v1, protocol: sem}
openrlhf:
  actor: {model_name_or_path: m, num_nodes: 1, num_gpus_per_node: 8}
  ref: {num_nodes: 1, num_gpus_per_node: 8}
  vllm: {num_engines: 8, tensor_parallel_size: 1}
  train: {colocate_all: true, batch_size: 40, micro_batch_size: 1}
  rollout: {batch_size: 8, n_samples_per_prompt: 5, micro_batch_size: 5}
  algo: {advantage: {estimator: group_norm}, kl: {use_loss: true, estimator: k3, init_coef: 0.001}}
  data: {prompt_dataset: train.jsonl}
"""


def compose_text(tmp_path: Path, text: str):
    rows = "".join('{"prompt": "q", "label": "{}"}\n' for _ in range(80))  # 10 rollout batches of 8
    (tmp_path / "train.jsonl").write_text(rows)
    path = tmp_path / "run.yaml"
    path.write_text(text)
    return compose(load_run_config(path), basedir=str(tmp_path))


def test_a_consistent_run_passes(tmp_path):
    assert "--train.micro_batch_size" in compose_text(tmp_path, RUN).flags


@pytest.mark.parametrize(
    "change, match, fix",
    [
        # 40 // 2 // 8 = 2 accumulation steps, and DeepSpeed asserts 40 == 2 x 2 x 8 (sem.yaml's crash)
        (
            ("batch_size: 40, micro_batch_size: 1", "batch_size: 40, micro_batch_size: 2"),
            r"train\.batch_size.*multiple of 2 × 8 = 16.*train\.micro_batch_size to 1",
            "batch_size: 40, micro_batch_size: 1",
        ),
        # a batch that no micro batch splits over 8 ranks
        (
            ("batch_size: 40, micro_batch_size: 1", "batch_size: 36, micro_batch_size: 1"),
            r"36 is not a multiple of 1 × 8 = 8\. Set train\.batch_size to a multiple of 8\.",
            "batch_size: 40, micro_batch_size: 1",
        ),
        # 40 samples in experiences of 4: 10 experiences for 8 ranks, two of them get none
        (
            ("n_samples_per_prompt: 5, micro_batch_size: 5", "n_samples_per_prompt: 5, micro_batch_size: 4"),
            r"rollout\.micro_batch_size = 4.*8 data-parallel.*rollout\.micro_batch_size to 1",
            "n_samples_per_prompt: 5, micro_batch_size: 1",
        ),
        # 40 samples per rollout batch, an optimizer step every 80: no step at all
        (
            ("batch_size: 40, micro_batch_size: 1", "batch_size: 80, micro_batch_size: 1"),
            r"rollout\.batch_size × rollout\.n_samples_per_prompt = 40.*train\.batch_size = 80.*Set train\.batch_size to 40",
            "batch_size: 40, micro_batch_size: 1",
        ),
        # colocate_all: 8 actor GPUs but the engines fill 4
        (
            ("num_engines: 8, tensor_parallel_size: 1", "num_engines: 2, tensor_parallel_size: 2"),
            r"vllm\.num_engines × vllm\.tensor_parallel_size must be 8 \(got 2 × 2\).*vllm\.num_engines: 4",
            "num_engines: 4, tensor_parallel_size: 2",
        ),
        (
            ("ref: {num_nodes: 1, num_gpus_per_node: 8}", "ref: {num_nodes: 1, num_gpus_per_node: 4}"),
            r"ref\.num_nodes, ref\.num_gpus_per_node = 1, 4.*Set ref to 1, 8",
            "ref: {num_nodes: 1, num_gpus_per_node: 8}",
        ),
        (
            ("vllm: {num_engines: 8, tensor_parallel_size: 1}", "vllm: {tensor_parallel_size: 1}"),
            r"vllm\.num_engines is not set.*vllm\.num_engines: 8",
            "vllm: {num_engines: 8, tensor_parallel_size: 1}",
        ),
    ],
)
def test_each_fault_names_its_flags_and_a_value_that_works(tmp_path, change, match, fix):
    bad = RUN.replace(*change)
    assert bad != RUN
    with pytest.raises(FlagError, match=match):
        compose_text(tmp_path, bad)
    compose_text(tmp_path, bad.replace(change[1], fix))  # the value the message suggests works


def test_the_actor_gpus_must_split_into_ring_and_tensor_groups(tmp_path):
    with pytest.raises(FlagError, match=r"groups of ds\.ring_attn_size × ds\.tensor_parallel_size = 3"):
        compose_text(tmp_path, RUN + "  ds: {ring_attn_size: 3}\n")


def test_dynamic_batches_leave_deepspeeds_micro_batch_alone(tmp_path):
    text = RUN.replace("micro_batch_size: 1}", "micro_batch_size: 3, dynamic_batch_enable: true}")
    compose_text(tmp_path, text)  # DeepSpeed runs with micro batch 1 then
