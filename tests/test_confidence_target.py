"""`finetune --confidence-target`: what the confidence head learns, in both objectives (hand-built tensors).

The default is the overlap `1 - TV`, speculators' target; `greedy` and `greedy_drafts` are the acceptance the
draft is served with at temperature 0 and at temperature 1 with greedy drafts. Each target is checked on a slot
where the three differ, so a loss that ignored the option (the twin: the overlap everywhere) fails.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from dspark_hub.errors import UsageError
from dspark_hub.train.finetuning import objective
from dspark_hub.train.finetuning.config import TrainConfig
from dspark_hub.train.finetuning.objective_speculators import Objective, library_loss
from tests.test_objective import _batch, _draft_case

P = torch.tensor([0.6, 0.3, 0.1])          # the target: argmax 0
Q = torch.tensor([0.2, 0.7, 0.1])          # the draft: argmax 1
EXPECTED = {"overlap": 0.6, "greedy": 0.0, "greedy_drafts": 0.3}


@pytest.mark.parametrize(("name", "value"), EXPECTED.items())
def test_each_target_is_the_acceptance_it_names(name, value):
    assert float(objective.acceptance_target(Q, P, name)) == pytest.approx(value)
    agreeing = torch.tensor([0.5, 0.4, 0.1])
    assert float(objective.acceptance_target(agreeing, P, "greedy")) == 1.0


@pytest.mark.parametrize("name", ["sampled", "", "Greedy"])
def test_an_unknown_target_is_refused(name):
    with pytest.raises(UsageError, match="confidence target"):
        objective.acceptance_target(Q, P, name)
    with pytest.raises(UsageError, match="confidence target") as info:
        TrainConfig(base="b", out="o", confidence_target=name)
    assert info.value.param == "confidence_target"


def _bce(logit: float, target: float) -> float:
    return float(F.binary_cross_entropy_with_logits(torch.tensor(logit), torch.tensor(target)))


@pytest.mark.parametrize(("name", "value"), EXPECTED.items())
def test_the_k3_objective_trains_the_head_toward_the_chosen_target(name, value):
    hidden_size = 3
    lm_head = torch.eye(hidden_size)
    final = torch.log(P)[None, None].repeat(1, 4, 1)          # the target's softmax at every row is P
    batch = _batch(final, torch.ones(1, 4, dtype=torch.bool))
    logits = torch.log(Q)[None, None, None]                   # one slot, the draft's softmax is Q
    sums = objective.loss_sums(logits, torch.zeros(1, 1, 1), torch.tensor([[[2]]]), torch.tensor([[[1]]]), batch,
                               lm_head, terms=["kl"], gamma=4.0, confidence_target=name)
    assert float(sums.terms["confidence"]) == pytest.approx(_bce(0.0, value), rel=1e-5)
    assert float(sums.stats["overlap"]) == pytest.approx(0.6, rel=1e-5)      # the logged overlap stays the overlap


@pytest.mark.parametrize("name", list(EXPECTED))
def test_the_chunked_loss_trains_toward_the_same_target(name):
    model, lm_head, hidden, prev_ids, labels, positions, batch = _draft_case()
    from dspark_hub.train.finetuning.trainer import chunkable_draft_logits

    confidence = model.confidence_logits(hidden, prev_ids)
    whole = objective.loss_sums(model.draft_logits(hidden, lm_head, prev_ids), confidence, labels, positions, batch,
                                lm_head, terms=["kl"], gamma=4.0, confidence_target=name)
    draft_logits, inputs = chunkable_draft_logits(model, lm_head, hidden, prev_ids)
    chunked = objective.chunked_loss_sums(draft_logits, inputs, confidence, labels, positions, batch, lm_head,
                                          terms=["kl"], gamma=4.0, chunk_rows=5, confidence_target=name)
    assert torch.allclose(chunked.terms["confidence"], whole.terms["confidence"], rtol=1e-5, atol=1e-6)
    overlap = objective.loss_sums(model.draft_logits(hidden, lm_head, prev_ids), confidence, labels, positions,
                                  batch, lm_head, terms=["kl"], gamma=4.0)
    assert (name == "overlap") == bool(torch.allclose(whole.terms["confidence"], overlap.terms["confidence"]))


@pytest.mark.parametrize(("name", "value"), EXPECTED.items())
def test_the_speculators_objective_trains_the_head_toward_the_chosen_target(name, value):
    logits, log_p = torch.log(Q)[None], torch.log(P)[None]
    result = library_loss(logits, log_p, torch.zeros(1), torch.ones(1, dtype=torch.bool), 1,
                          Objective(loss={"kl_div": 1.0}, confidence_target=name), sample_from_anchor=True)
    assert float(result.confidence) == pytest.approx(_bce(0.0, value), rel=1e-5)
    assert float(result.accept_rate[0]) == pytest.approx(0.6, rel=1e-5)
