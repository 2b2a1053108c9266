"""One training step's forward: the module DDP / FSDP2 wrap, and which sequences a step reads.

The loss is computed `loss_chunk` (anchor, position) rows at a time (`objective.chunked_loss_sums`;
0 = the whole `[B, A, K, V]` at once). The global batch of a step is drawn from epoch-wise
permutations seeded per epoch, so every rank, and a resumed run, draws the same one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from dspark_hub.train.finetuning import objective

if TYPE_CHECKING:
    from dspark_hub.modeling import K3DSparkModel


def chunkable_draft_logits(model: K3DSparkModel, lm_head_weight: torch.Tensor, hidden: torch.Tensor,
                           prev_ids: torch.Tensor) -> tuple[objective.DraftLogits, tuple[torch.Tensor, ...]]:
    """`model.draft_logits(hidden, lm_head, prev_ids)` split for `objective.chunked_loss_sums`.

    Returns `(draft_logits, inputs)`: the per-slot inputs are the hidden rows and their Markov
    features `markov_w1[prev_ids]`, gathered once here, so a chunk's backward does not build a
    dense `[vocab, markov_rank]` embedding gradient of its own; `draft_logits(hidden_rows,
    feature_rows)` adds `markov_w2(features)` to the lm_head logits.
    """
    markov = model.markov_head

    def draft_logits(rows: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = model.draft_logits(rows, lm_head_weight) + markov.markov_w2(features).float()
        return logits

    return draft_logits, (hidden, markov.markov_w1(prev_ids))


class DraftStep(nn.Module):
    """The unit DDP/FSDP wrap: one packed teacher-forced pass and its loss sums.

    The loss runs inside `forward` because the chunked loss recomputes the draft's logits (and
    so uses the Markov head's weights) in backward; DDP and FSDP only track parameters a
    `forward` uses. Returns `(terms, weight, stats)` of `objective.LossSums` (tensors and dicts,
    which DDP and FSDP can walk).
    """

    def __init__(self, model: K3DSparkModel, block_size: int, *, terms: list[str], gamma: float,
                 loss_chunk: int, confidence_target: str = "overlap") -> None:
        super().__init__()
        self.model = model
        self.block_size = block_size
        self.terms = terms
        self.gamma = gamma
        self.loss_chunk = loss_chunk
        self.confidence_target = confidence_target

    def forward(self, context_states: torch.Tensor, input_ids: torch.Tensor, anchors: torch.Tensor,
                anchor_valid: torch.Tensor, doc_ids: torch.Tensor, final_hidden: torch.Tensor,
                loss_mask: torch.Tensor, lm_head_weight: torch.Tensor) -> tuple[Any, ...]:
        chunked = self.loss_chunk > 0
        out = self.model.teacher_forced(context_states, input_ids, anchors, block_size=self.block_size,
                                        lm_head_weight=None if chunked else lm_head_weight, doc_ids=doc_ids,
                                        anchor_valid=anchor_valid)
        targets = objective.TargetDistributions(final_hidden=final_hidden, loss_mask=loss_mask)
        hidden, prev_ids, labels, positions = out.last_hidden_state, out.prev_ids, out.labels, out.target_positions
        assert hidden is not None and prev_ids is not None and labels is not None and positions is not None
        if chunked:
            draft_logits, inputs = chunkable_draft_logits(self.model, lm_head_weight, hidden, prev_ids)
            sums = objective.chunked_loss_sums(draft_logits, inputs, out.confidence_logits, labels, positions,
                                               targets, lm_head_weight, terms=self.terms, gamma=self.gamma,
                                               chunk_rows=self.loss_chunk, confidence_target=self.confidence_target)
        else:
            assert out.logits is not None   # teacher_forced was given the lm_head
            with torch.autocast(context_states.device.type, enabled=False):
                sums = objective.loss_sums(out.logits.float(), out.confidence_logits, labels, positions, targets,
                                           lm_head_weight, terms=self.terms, gamma=self.gamma,
                                           confidence_target=self.confidence_target)
        return sums.terms, sums.weight, sums.stats


def batch_indices(count: int, batch_size: int, local_step: int, seed: int) -> list[int]:
    """Global batch of a step: epoch-wise permutations (seeded per epoch), last partial batch dropped."""
    per_epoch = max(1, count // batch_size)
    epoch, position = divmod(local_step, per_epoch)
    generator = torch.Generator().manual_seed(seed * 7919 + epoch)
    order = torch.randperm(count, generator=generator).tolist()
    return order[position * batch_size:(position + 1) * batch_size]
