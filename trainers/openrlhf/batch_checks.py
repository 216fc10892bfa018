"""The batch and GPU arithmetic that DeepSpeed and OpenRLHF's ``train()`` assert at start-up.

``flags.check_flags`` runs the checks of ``train_ppo_ray``'s ``__main__`` block; these are
the ones that only fail once Ray has placed the actors and DeepSpeed starts (minutes into
a run), restated here so a dry run catches them. All of them read OpenRLHF 0.11.2:

- DeepSpeed (``DeepspeedStrategy``, ``get_train_ds_config``): gradient accumulation is
  ``train.batch_size // train.micro_batch_size // dp`` and DeepSpeed asserts
  ``train.batch_size == micro_batch_size × accumulation × dp`` with accumulation ≥ 1, where
  ``dp`` = actor GPUs / (``ds.ring_attn_size`` × ``ds.tensor_parallel_size``);
- ``RayActorGroup.async_run_method_batch``: the rollout batch is cut into experiences of
  ``rollout.micro_batch_size`` samples and dealt out in equal chunks to the ``dp`` ranks. A
  rank that gets fewer samples takes fewer optimizer steps and the others wait for it in
  ZeRO's collectives, so every rank must get the same number of samples (:func:`rank_shares`;
  the short last batch of an episode is dropped by :mod:`~searchgym.trainers.openrlhf.epochs`);
- ``PolicyModelActor.ppo_train``: a rank steps the optimizer every ``train.batch_size / dp``
  samples, so a rollout batch that is not a multiple of ``train.batch_size`` leaves a
  partial step (or, when smaller, no step at all);
- ``train()``: under ``train.colocate_all`` the vLLM engines fill the actor's GPUs exactly,
  and colocated actor and reference groups have the same shape.
"""

from __future__ import annotations

from typing import Any

from .flags import FlagError, parsed_value

__all__ = ["check_batch_arithmetic", "rank_shares", "step_line"]


def _divisors_up_to(n: int, limit: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0 and d <= limit]


def _suggest(total: int, per: int, current: int) -> str:
    """A value for a micro batch near ``current`` such that ``total`` splits into ``per`` × it."""
    fits = _divisors_up_to(total // per, max(current, 1))
    return str(fits[-1]) if fits else "1"


def rank_shares(samples: int, micro_batch: int, dp: int) -> list[int]:
    """The samples each data-parallel rank trains on when one rollout batch of ``samples`` is dealt.

    ``RemoteExperienceMaker.split_rollout_samples`` cuts the batch into experiences of
    ``micro_batch`` samples (the last one shorter), and
    ``RayActorGroup.async_run_method_batch`` gives rank ``r`` the experiences
    ``[r·c, (r+1)·c)`` with ``c = ceil(experiences / dp)``.
    """
    sizes = [min(micro_batch, samples - start) for start in range(0, samples, micro_batch)]
    chunk = -(-len(sizes) // dp)
    return [sum(sizes[rank * chunk : (rank + 1) * chunk]) for rank in range(dp)]


def _dp(args: Any) -> int:
    actor_gpus = parsed_value(args, "actor.num_nodes", 1) * parsed_value(args, "actor.num_gpus_per_node", 8)
    return actor_gpus // (
        parsed_value(args, "ds.ring_attn_size", 1) * parsed_value(args, "ds.tensor_parallel_size", 1)
    )


def step_line(args: Any) -> str:
    """What one training step does on each rank, for the dry run (after :func:`check_batch_arithmetic`)."""
    dp = _dp(args)
    samples = parsed_value(args, "rollout.batch_size", 1) * parsed_value(
        args, "rollout.n_samples_per_prompt", 1
    )
    rollout_micro = parsed_value(args, "rollout.micro_batch_size", 1)
    shares = rank_shares(samples, rollout_micro, dp)
    if parsed_value(args, "train.dynamic_batch_enable", False):
        return (
            f"searchgym: each step deals {samples:,} samples to {dp} ranks in length-balanced micro batches "
            "(train.dynamic_batch_enable)."
        )
    micro, batch = (
        parsed_value(args, "train.micro_batch_size", 1),
        parsed_value(args, "train.batch_size", 128),
    )
    accumulation = batch // micro // dp
    micro_steps = shares[0] // micro
    return (
        f"searchgym: each step deals {samples:,} samples as {-(-samples // rollout_micro)} experiences of "
        f"{rollout_micro}, {shares[0]:,} samples to each of {dp} ranks: {micro_steps} micro-steps of {micro} = "
        f"{micro_steps // accumulation} optimizer step(s) of {accumulation} accumulated micro-steps per rank "
        f"(× train.max_epochs = {parsed_value(args, 'train.max_epochs', 1)})."
    )


def check_batch_arithmetic(args: Any) -> None:
    """Raise :class:`FlagError` when DeepSpeed or OpenRLHF would stop the run on its batch sizes.

    Args:
        args: OpenRLHF's parsed, nested args (``check_flags``' first result).
    """
    actor_gpus = parsed_value(args, "actor.num_nodes", 1) * parsed_value(args, "actor.num_gpus_per_node", 8)
    ring, tp = parsed_value(args, "ds.ring_attn_size", 1), parsed_value(args, "ds.tensor_parallel_size", 1)
    vllm_engines = parsed_value(args, "vllm.num_engines")
    if not vllm_engines:
        raise FlagError(
            "openrlhf.vllm.num_engines is not set: the searchgym agent runs inside the vLLM engines. "
            f"Set it, e.g. vllm.num_engines: {actor_gpus} with vllm.tensor_parallel_size: 1."
        )
    if actor_gpus % (ring * tp):
        raise FlagError(
            f"The actor's {actor_gpus} GPUs (actor.num_nodes × actor.num_gpus_per_node) do not split into groups "
            f"of ds.ring_attn_size × ds.tensor_parallel_size = {ring * tp}; make the GPU count a multiple of it."
        )
    dp = actor_gpus // (ring * tp)
    colocate_all = parsed_value(args, "train.colocate_all", False)
    async_enable = parsed_value(args, "train.async_enable", False)
    vllm_tp = parsed_value(args, "vllm.tensor_parallel_size", 1)
    if colocate_all and not async_enable and vllm_engines * vllm_tp != actor_gpus:
        raise FlagError(
            f"train.colocate_all puts the vLLM engines on the actor's {actor_gpus} GPUs, so vllm.num_engines × "
            f"vllm.tensor_parallel_size must be {actor_gpus} (got {vllm_engines} × {vllm_tp}); e.g. "
            f"vllm.num_engines: {actor_gpus // vllm_tp if actor_gpus % vllm_tp == 0 else actor_gpus} "
            f"with vllm.tensor_parallel_size: {vllm_tp if actor_gpus % vllm_tp == 0 else 1}."
        )
    if (colocate_all or parsed_value(args, "train.colocate_actor_ref", False)) and parsed_value(
        args, "algo.kl.init_coef", 0
    ) > 0:
        actor = (parsed_value(args, "actor.num_nodes", 1), parsed_value(args, "actor.num_gpus_per_node", 8))
        ref = (parsed_value(args, "ref.num_nodes", 1), parsed_value(args, "ref.num_gpus_per_node", 8))
        if actor != ref:
            raise FlagError(
                f"Colocated actor and reference models need the same shape: ref.num_nodes, ref.num_gpus_per_node "
                f"= {ref[0]}, {ref[1]}, but the actor has {actor[0]}, {actor[1]}. Set ref to {actor[0]}, {actor[1]}."
            )
    if parsed_value(args, "train.dynamic_batch_enable", False):
        return  # DeepSpeed then runs with micro batch 1 and balanced partitions: none of the below
    batch, micro = (
        parsed_value(args, "train.batch_size", 128),
        parsed_value(args, "train.micro_batch_size", 1),
    )
    if batch % (micro * dp) or batch < micro * dp:
        fix = (
            f"Set train.micro_batch_size to {_suggest(batch, dp, micro)} (or train.batch_size to a multiple of {micro * dp})."
            if batch % dp == 0
            else f"Set train.batch_size to a multiple of {micro * dp}."
        )
        raise FlagError(
            f"DeepSpeed needs train.batch_size = train.micro_batch_size × gradient accumulation × {dp} data-parallel "
            f"ranks, and {batch} is not a multiple of {micro} × {dp} = {micro * dp}. {fix}"
        )
    rollout = parsed_value(args, "rollout.batch_size", 1) * parsed_value(
        args, "rollout.n_samples_per_prompt", 1
    )
    if rollout % batch:
        raise FlagError(
            f"A rollout batch holds rollout.batch_size × rollout.n_samples_per_prompt = {rollout} samples, which is "
            f"not a multiple of train.batch_size = {batch}: the actor would take a partial optimizer step (or none). "
            f"Set train.batch_size to {rollout} (one update per rollout batch) or another divisor of {rollout}."
        )
    rollout_micro = parsed_value(args, "rollout.micro_batch_size", 1)  # rollout is a multiple of dp here
    if rollout % (rollout_micro * dp):
        raise FlagError(
            f"The {rollout} samples of a rollout batch are cut into experiences of rollout.micro_batch_size = "
            f"{rollout_micro} and dealt to {dp} data-parallel ranks; unequal shares make ranks take different "
            f"numbers of steps and hang in ZeRO. Set rollout.micro_batch_size to {_suggest(rollout, dp, rollout_micro)}."
        )
