"""The GRPO loss: PPO's clipped objective per action token, plus a k3 KL to a reference.

For action token t of a rollout with advantage A, current log-probability ℓ_t, log-prob
at sampling time ℓ_t^old and under the frozen reference model ℓ_t^ref::

    r_t   = exp(ℓ_t − ℓ_t^old)
    pg_t  = −min(r_t · A, clip(r_t, 1 − ε, 1 + ε) · A)
    kl_t  = exp(ℓ_t^ref − ℓ_t) − (ℓ_t^ref − ℓ_t) − 1            (Schulman's k3, ≥ 0)
    L_t   = pg_t + β · kl_t

and the loss is Σ_t w_t · L_t over every action token of the batch, with weights
(:func:`token_weights`) that make the three usual averages:

* ``token_mean``: w = 1 / (action tokens in the batch);
* ``seq_mean_token_mean`` (GRPO): w = 1 / (tokens of its sequence × sequences);
* ``seq_mean_token_sum_norm`` (Dr. GRPO): w = 1 / (sequences × L), L a constant (the
  generation budget), so long answers are not favoured by the division.

Since the weights are fixed per batch before any forward pass, splitting the batch into
micro-batches for gradient accumulation gives the same loss and gradient.
Log-ratios are clamped to ±20 (the ratio) and ±10 (the KL) as OpenRLHF does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

__all__ = [
    "pad_batch",
    "token_logprobs",
    "selected_logprobs",
    "selects_positions",
    "k3_kl",
    "clipped_token_loss",
    "token_weights",
]


def pad_batch(
    sequences: Sequence[Sequence[int]], pad_id: int, device: torch.device | str = "cpu"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad token lists into ``(input_ids, attention_mask)`` of shape (B, T)."""
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(sequences), width), dtype=torch.long)
    for row, seq in enumerate(sequences):
        ids[row, : len(seq)] = torch.tensor(list(seq), dtype=torch.long)
        attention[row, : len(seq)] = 1
    return ids.to(device), attention.to(device)


def pad_values(
    rows: Sequence[Sequence[float]], width: int, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """Right-pad float rows with zeros into a (B, width) tensor."""
    out = torch.zeros((len(rows), width), dtype=torch.float32)
    for row, values in enumerate(rows):
        n = min(len(values), width)
        out[row, :n] = torch.as_tensor(list(values)[:n], dtype=torch.float32)
    return out.to(device)


def token_logprobs(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    temperature: float = 1.0,
    wanted: torch.Tensor | None = None,
) -> torch.Tensor:
    """Log-probability of each token given the ones before it: shape (B, T − 1), float32.

    Entry ``[b, t]`` is log p(input_ids[b, t + 1] | input_ids[b, : t + 1]) under the
    temperature-scaled softmax (the distribution the tokens were sampled from). With
    ``wanted`` (B, T − 1), only its nonzero entries are computed, the rest are 0: the output
    layer then runs on those positions alone (see :func:`selected_logprobs`).
    """
    if wanted is not None and selects_positions(model):
        hidden = model.base_model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
        return selected_logprobs(
            model, hidden.last_hidden_state[:, :-1], input_ids[:, 1:], wanted, temperature
        )
    logits = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits[:, :-1]
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    targets = input_ids[:, 1:].unsqueeze(-1)
    picked = logits.gather(-1, targets).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)


# Configs whose forward changes the logits after the output layer: their log-probabilities
# are computed from the model's own logits at every position.
_LOGIT_TRANSFORMS = ("final_logit_softcapping", "logits_scaling", "logit_scale", "output_multiplier_scale")


def selects_positions(model: Any) -> bool:
    """Whether :func:`selected_logprobs` gives ``model``'s own log-probabilities: its logits
    are its output layer applied to its base model's last hidden state, and nothing more."""
    config = getattr(model, "config", None)
    if any(getattr(config, name, None) not in (None, 1, 1.0) for name in _LOGIT_TRANSFORMS):
        return False
    return (
        hasattr(model, "base_model")
        and model.base_model is not model
        and model.get_output_embeddings() is not None
    )


def selected_logprobs(
    model: Any, hidden: torch.Tensor, targets: torch.Tensor, wanted: torch.Tensor, temperature: float = 1.0
) -> torch.Tensor:
    """Log-probabilities of ``targets`` (B, W) from the hidden states before them, at the
    nonzero entries of ``wanted`` only (0 elsewhere), float32.

    A GRPO sequence of a few hundred tokens holds a few dozen sampled ones: the full
    (B, W, vocabulary) logits in float32, and what the backward pass keeps of them, are
    gigabytes for a real vocabulary (49,152 tokens for SmolLM2), of which these few rows
    are all the loss reads.
    """
    rows, cols = wanted.nonzero(as_tuple=True)
    out = torch.zeros(wanted.shape, dtype=torch.float32, device=hidden.device)
    if rows.numel() == 0:
        return out + hidden.sum() * 0.0  # keeps the graph (and the caller's backward) valid
    logits = model.get_output_embeddings()(hidden[rows, cols]).float()
    if temperature != 1.0:
        logits = logits / temperature
    picked = logits.gather(-1, targets[rows, cols].unsqueeze(-1)).squeeze(-1)
    return out.index_put((rows, cols), picked - torch.logsumexp(logits, dim=-1))


def k3_kl(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Schulman's k3 estimate of KL(π ‖ π_ref) per token: ``exp(d) − d − 1``, d = ℓ_ref − ℓ."""
    d = (ref_logprobs - logprobs).clamp(min=-10.0, max=10.0)
    return torch.exp(d) - d - 1.0


def clipped_token_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    *,
    clip_eps: float,
    ref_logprobs: torch.Tensor | None = None,
    kl_coef: float = 0.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token loss ``pg_t + β·kl_t`` (see the module docstring) and per-token parts.

    Args:
        logprobs: ℓ_t, with gradient, (B, T).
        old_logprobs: ℓ_t^old, (B, T).
        advantages: A per token (the rollout's advantage on each of its tokens), (B, T).
        clip_eps: ε.
        ref_logprobs: ℓ_t^ref, or None when ``kl_coef`` is 0.
        kl_coef: β.

    Returns:
        ``(loss, parts)`` with ``parts`` holding ``pg``, ``kl``, ``ratio`` and ``clipped``
        (1 where the clipped branch was taken), all (B, T).
    """
    log_ratio = (logprobs - old_logprobs).clamp(min=-20.0, max=20.0)
    ratio = torch.exp(log_ratio)
    surr1 = ratio * advantages
    surr2 = ratio.clamp(1.0 - clip_eps, 1.0 + clip_eps) * advantages
    pg = -torch.min(surr1, surr2)
    if ref_logprobs is not None and kl_coef > 0:
        kl = k3_kl(logprobs, ref_logprobs)
        loss = pg + kl_coef * kl
    else:
        kl = torch.zeros_like(pg)
        loss = pg
    parts = {
        "pg": pg.detach(),
        "kl": kl.detach(),
        "ratio": ratio.detach(),
        "clipped": (surr2 < surr1).float(),
    }
    return loss, parts


def token_weights(
    masks: Sequence[Sequence[int]], aggregation: str, norm_length: int = 1
) -> list[list[float]]:
    """Weight of every token of every sequence (0 off the action tokens), for one batch.

    Args:
        masks: Action masks, one per sequence (over the target positions).
        aggregation: ``token_mean``, ``seq_mean_token_mean`` or ``seq_mean_token_sum_norm``.
        norm_length: L of ``seq_mean_token_sum_norm``.

    Raises:
        ValueError: an unknown aggregation.
    """
    counts = [sum(m) for m in masks]
    total = sum(counts)
    n = len(masks)
    out = []
    for mask, count in zip(masks, counts, strict=True):
        if aggregation == "token_mean":
            w = 1.0 / total if total else 0.0
        elif aggregation == "seq_mean_token_mean":
            w = 1.0 / (count * n) if count else 0.0
        elif aggregation == "seq_mean_token_sum_norm":
            w = 1.0 / (n * max(1, norm_length))
        else:
            raise ValueError(f"unknown loss aggregation {aggregation!r}")
        out.append([w * m for m in mask])
    return out
