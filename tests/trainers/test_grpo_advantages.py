"""Group-advantage estimators and the loss pieces, against values worked out by hand."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from searchgym.error import InvalidArgumentError  # noqa: E402
from searchgym.trainers.advantages import (  # noqa: E402
    GroupFigures,
    dr_grpo,
    group_advantages,
    group_norm,
    tsas,
)
from searchgym.trainers.grpo.loss import clipped_token_loss, k3_kl, token_weights  # noqa: E402


def test_group_norm_by_hand():
    # rewards 1, 0, 0, 1: mean 0.5, deviations ±0.5, sample variance (4 · 0.25) / 3 = 1/3,
    # std 0.577350…, so the advantages are ±0.5 / 0.577350 = ±0.866025.
    assert group_norm([1, 0, 0, 1]) == pytest.approx([0.866025, -0.866025, -0.866025, 0.866025], abs=1e-6)
    # rewards 0.2, 0.5, 0.8: mean 0.5, sample std sqrt((0.09 + 0 + 0.09) / 2) = 0.3 → −1, 0, 1.
    assert group_norm([0.2, 0.5, 0.8]) == pytest.approx([-1.0, 0.0, 1.0], abs=1e-6)


def test_group_norm_of_equal_rewards_is_zero():
    assert group_norm([0.7, 0.7, 0.7]) == [0.0, 0.0, 0.0]
    assert group_norm([3.0]) == [0.0]


def test_group_norm_matches_openrlhfs_formula():
    # OpenRLHF 0.11.2: (r - r.mean(-1)) / (r.std(-1) + 1e-9), torch's std being Bessel-corrected.
    rewards = [0.1, -1.0, 0.9, 0.35, 0.0]
    r = torch.tensor(rewards, dtype=torch.float64)
    expected = ((r - r.mean()) / (r.std() + 1e-9)).tolist()
    assert group_norm(rewards) == pytest.approx(expected, abs=1e-12)


def test_dr_grpo_by_hand():
    # rewards 1, 0, 0.5: mean 0.5 → 0.5, −0.5, 0 (no division by the std).
    assert dr_grpo([1, 0, 0.5]) == pytest.approx([0.5, -0.5, 0.0])


FIGURES = GroupFigures(rewards=(1.0, 0.0), searches=(1.0, 0.0), reasoning=(2.0, 0.0))


def test_tsas_stage_one_by_hand():
    # mean R = 0.5. Rollout 1: 0.5 + ln 2 + 0.01 · ln 3 = 0.5 + 0.693147 + 0.010986 = 1.204133.
    # Rollout 2: −0.5 + ln 1 + 0.01 · ln 1 = −0.5.
    assert tsas(FIGURES, step=0, warmup_steps=150) == pytest.approx([1.204133, -0.5], abs=1e-6)


def test_tsas_stage_two_by_hand():
    # A+ = ±0.5; population std of S = (1, 0) is 0.5; S+ = (ln 2 − 0.5, −0.5) = (0.193147, −0.5);
    # T+ = (ln 3, 0) = (1.098612, 0); σ = sigmoid(±0.5) − 0.5 = ±0.122459.
    # A1 = 0.5 + 0.122459 · (0.193147 + 1.098612) = 0.5 + 0.122459 · 1.291759 = 0.658188
    # A2 = −0.5 + (−0.122459)(−0.5) + 0 = −0.438771
    assert tsas(FIGURES, step=150, warmup_steps=150) == pytest.approx([0.658188, -0.438771], abs=1e-6)


def test_tsas_eq2_variant_by_hand_and_through_group_advantages():
    # Eq. 2 reading (docs/methods.md#light-search-readings): σ+ = max(0, ±0.122459); A1 = 0.5 − 0.122459 · 1.291759
    # = 0.5 − 0.158188 = 0.341812; A2 = −0.5 (σ+ = 0).
    assert tsas(FIGURES, step=150, variant="eq2") == pytest.approx([0.341812, -0.5], abs=1e-6)
    got = group_advantages("tsas", FIGURES, step=150, tsas_variant="eq2")
    assert got == pytest.approx([0.341812, -0.5], abs=1e-6)


def test_tsas_switches_stage_exactly_at_the_warmup_step():
    stage1, stage2 = [1.204133, -0.5], [0.658188, -0.438771]
    assert tsas(FIGURES, step=9, warmup_steps=10) == pytest.approx(stage1, abs=1e-6)
    assert tsas(FIGURES, step=10, warmup_steps=10) == pytest.approx(stage2, abs=1e-6)
    assert tsas(FIGURES, step=0, warmup_steps=0) == pytest.approx(stage2, abs=1e-6)  # no warm-up at all


def test_tsas_alpha_scales_only_the_reasoning_term_of_stage_one():
    # With α = 0.5 rollout 1 gets 0.5 + ln 2 + 0.5 · ln 3 = 0.5 + 0.693147 + 0.549306 = 1.742453.
    assert tsas(FIGURES, step=0, alpha=0.5)[0] == pytest.approx(1.742453, abs=1e-6)


def test_group_advantages_dispatches_and_refuses_unknown_estimators():
    figures = GroupFigures(rewards=(1.0, 0.0, 0.0, 1.0), searches=(0, 0, 0, 0), reasoning=(0, 0, 0, 0))
    assert group_advantages("dr_grpo", figures) == pytest.approx([0.5, -0.5, -0.5, 0.5])
    assert group_advantages("group_norm", figures)[0] == pytest.approx(0.866025, abs=1e-6)
    with pytest.raises(InvalidArgumentError, match="group_norm, dr_grpo, tsas; got 'grpo'"):
        group_advantages("grpo", figures)


def test_estimators_refuse_non_finite_rewards():
    with pytest.raises(InvalidArgumentError, match=r"rewards\[1\] must be a finite number, got nan"):
        group_norm([0.0, math.nan])
    with pytest.raises(InvalidArgumentError, match="at least one reward"):
        dr_grpo([])


# -- the loss ----------------------------------------------------------------------------------


def test_clipped_loss_by_hand():
    # ratio 1.5, A = 1:  −min(1.5, 1.2) = −1.2 (the clipped branch).
    # ratio 0.5, A = −1: −min(−0.5, −0.8) = 0.8 (clipped).
    # ratio 1.1, A = 2:  −min(2.2, 2.2) = −2.2 (inside the clip range).
    # ratio 0.5, A = 1:  −min(0.5, 0.8) = −0.5 (the unclipped branch is the smaller).
    ratios = torch.tensor([[1.5, 0.5, 1.1, 0.5]])
    old = torch.zeros_like(ratios)
    logprobs = torch.log(ratios)
    advantages = torch.tensor([[1.0, -1.0, 2.0, 1.0]])
    loss, parts = clipped_token_loss(logprobs, old, advantages, clip_eps=0.2)
    assert loss.tolist()[0] == pytest.approx([-1.2, 0.8, -2.2, -0.5], abs=1e-6)
    assert parts["clipped"].tolist()[0] == [1.0, 1.0, 0.0, 0.0]


def test_k3_kl_by_hand():
    # d = ℓ_ref − ℓ = ln 2: 2 − ln 2 − 1 = 0.306853. d = 0: 0. d = −ln 2: 0.5 + ln 2 − 1 = 0.193147.
    logprobs = torch.tensor([0.0, 0.0, math.log(2)])
    ref = torch.tensor([math.log(2), 0.0, 0.0])
    assert k3_kl(logprobs, ref).tolist() == pytest.approx([0.306853, 0.0, 0.193147], abs=1e-6)


def test_kl_term_enters_the_loss_with_its_coefficient():
    logprobs, old = torch.tensor([[0.0]]), torch.tensor([[0.0]])
    ref = torch.tensor([[math.log(2)]])
    loss, _ = clipped_token_loss(
        logprobs, old, torch.tensor([[1.0]]), clip_eps=0.2, ref_logprobs=ref, kl_coef=0.1
    )
    # pg = −1 (ratio 1, A = 1), kl = 0.306853 → −1 + 0.1 · 0.306853 = −0.969315.
    assert float(loss) == pytest.approx(-0.969315, abs=1e-6)


def test_token_weights_by_hand():
    masks = [[1, 1, 0], [0, 1]]
    # token_mean: 3 action tokens in the batch → 1/3 each.
    expected = {
        "token_mean": [[1 / 3, 1 / 3, 0], [0, 1 / 3]],
        # GRPO: per sequence, then over 2 sequences → 1/(2·2) for the first, 1/(1·2) for the second.
        "seq_mean_token_mean": [[0.25, 0.25, 0], [0, 0.5]],
        # Dr. GRPO with L = 4: 1/(2·4) = 0.125 per action token.
        "seq_mean_token_sum_norm": [[0.125, 0.125, 0], [0, 0.125]],
    }
    for aggregation, rows in expected.items():
        got = token_weights(masks, aggregation, 4)
        assert [pytest.approx(r) for r in rows] == got, aggregation
    with pytest.raises(ValueError, match="unknown loss aggregation"):
        token_weights(masks, "mean")
