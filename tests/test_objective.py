"""The DSpark objective and the acceptance arithmetic, on hand-built tensors."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from dspark_hub import objective
from dspark_hub.errors import UsageError
from dspark_hub.evaluate import AcceptanceStats, ngram_proposer, simulate


def test_parse_loss_accepts_known_terms_and_names_the_bad_one():
    assert objective.parse_loss('{"ce":0.1,"tv":0.9}') == {"ce": 0.1, "tv": 0.9}
    for spec, words in (('{"mse":1}', "unknown term 'mse'"), ('{"ce":-1}', "non-negative"), ("ce", "not JSON")):
        with pytest.raises(UsageError, match=words):
            objective.parse_loss(spec)


def test_anchors_are_continuation_positions_with_a_supervised_next_token():
    mask = torch.tensor([0, 0, 0, 1, 1, 1, 1, 0, 1, 1])
    assert objective.sample_anchors(mask, 10, seed=0).tolist() == [3, 4, 5, 8]
    picked = objective.sample_anchors(mask, 2, seed=5)
    assert len(picked) == 2 and set(picked.tolist()) <= {3, 4, 5, 8} and picked.tolist() == sorted(picked.tolist())
    assert torch.equal(picked, objective.sample_anchors(mask, 2, seed=5))


def test_cosine_schedule_warms_up_then_decays_to_the_floor():
    lr = [objective.cosine_lr(s, total=10, warmup=2, min_ratio=0.1) for s in range(11)]
    assert lr[:3] == [0.5, 1.0, 1.0] and lr[10] == pytest.approx(0.1)
    assert all(a >= b for a, b in zip(lr[2:], lr[3:]))


def _batch(final_hidden, loss_mask):
    return SimpleNamespace(final_hidden=final_hidden, loss_mask=loss_mask)


def test_losses_use_overlap_as_confidence_target_and_decay_the_slots():
    torch.manual_seed(0)
    vocab, hidden, block = 11, 5, 3
    lm_head = torch.randn(vocab, hidden)
    final = torch.randn(1, 8, hidden)
    target_logits = final @ lm_head.T
    positions = torch.tensor([[[2, 3, 4]]])
    labels = torch.tensor([[[4, 6, 2]]])
    batch = _batch(final, torch.ones(1, 8, dtype=torch.bool))
    # A draft that equals the teacher: tv and kl vanish, the overlap (confidence target) is 1.
    same = target_logits[0, 2:5][None, None]
    sums = objective.loss_sums(same, torch.zeros(1, 1, block), labels, positions, batch, lm_head,
                               terms=["ce", "kl", "tv"], gamma=4.0)
    assert sums.terms["tv"].abs() < 1e-6 and sums.terms["kl"].abs() < 1e-5
    weights = torch.exp(-torch.arange(3.0) / 4)
    assert sums.weight == pytest.approx(float(weights.sum()))
    assert sums.stats["overlap"] == pytest.approx(float(sums.stats["slots"]))
    expected_bce = float((torch.nn.functional.binary_cross_entropy_with_logits(
        torch.zeros(3), torch.ones(3), reduction="none") * weights).sum())
    assert float(sums.terms["confidence"]) == pytest.approx(expected_bce, rel=1e-5)
    # An unsupervised label voids the rest of its block (contiguous prefix).
    holes = _batch(final, torch.tensor([[1, 1, 1, 1, 0, 1, 1, 1]], dtype=torch.bool))
    voided = objective.loss_sums(same, None, labels, positions, holes, lm_head, terms=["ce"], gamma=4.0)
    assert float(voided.weight) == pytest.approx(float(weights[:1].sum()))


def test_acceptance_length_is_one_plus_the_sum_of_position_rates():
    stats = AcceptanceStats(4)
    for accepted in (0, 4, 2, 1):
        stats.record(accepted)
    assert stats.per_position == [0.75, 0.5, 0.25, 0.25]
    assert stats.acceptance_length == pytest.approx(1 + sum(stats.per_position)) == 2.75


def test_simulation_counts_a_perfect_drafter_at_k_plus_one_and_a_wrong_one_at_one():
    tokens = torch.arange(40)
    rollout = SimpleNamespace(input_ids=tokens, prompt_length=5, dataset=None)
    perfect = simulate(rollout, lambda p: tokens[p + 1:p + 8].tolist(), 7)
    wrong = simulate(rollout, lambda p: [-1] * 7, 7)
    assert perfect.acceptance_length == 8.0 and wrong.acceptance_length == 1.0
    looping = SimpleNamespace(input_ids=torch.tensor([1, 2, 3] * 20), prompt_length=15, dataset=None)
    copy = simulate(looping, ngram_proposer(looping, 7), 7)
    assert copy.acceptance_length == pytest.approx(8.0)      # a loop is trivially drafted by copying
    assert math.isnan(AcceptanceStats(7).acceptance_length)
