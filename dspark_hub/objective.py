"""The DSpark training objective: anchor sampling, packed batches, and the loss mixture.

Per sequence, anchors are positions `a` with `loss_mask[a]` and `loss_mask[a + 1]` (the anchor is a
continuation token and its first label is supervised; TorchSpec/DeepSpec's rule), up to
`max_anchors` drawn without replacement and sorted. Block j is `[x[a_j], M, ..., M]` at positions
`a_j .. a_j + K - 1`; slot k drafts `x[a_j + k + 1]`, distils the teacher's distribution at row
`a_j + k`, and its Markov predecessor is the true token `x[a_j + k]` (teacher forcing). All blocks
of a sequence run in one packed pass (`K3DSparkModel.teacher_forced`).

Slot weights: `w_k = exp(-k / gamma) * m_k` where `m_k` is the contiguous-prefix mask (a slot whose
label is missing or unsupervised voids the rest of its block). Each term is `sum(w * l) / sum(w)`
with the denominator summed over every data-parallel rank, so a sharded batch gives the same
gradient as one process on the whole batch.

Terms (p = teacher softmax at temperature 1, q = draft softmax with the Markov bias):
  - `ce`: cross-entropy of q against the data token (= argmax p on greedy teacher data);
  - `kl`: KL(p || q);
  - `tv`: total variation 1 - sum_v min(p_v, q_v);
  - confidence: BCE-with-logits of the confidence head against the detached overlap
    `1 - TV(p, q)` (the per-slot acceptance probability of speculative sampling), weight `alpha`.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Sequence

from .errors import UsageError

LOSS_TERMS = ("ce", "kl", "tv")


def parse_loss(spec: str | dict[str, float]) -> dict[str, float]:
    """`'{"ce":0.1,"tv":0.9}'` -> weights; unknown names or non-numbers are a `UsageError`."""
    try:
        weights = json.loads(spec) if isinstance(spec, str) else dict(spec)
    except ValueError as exc:
        raise UsageError(f"--loss: not JSON ({exc}); e.g. '{{\"ce\":0.1,\"tv\":0.9}}'") from exc
    if not isinstance(weights, dict) or not weights:
        raise UsageError("--loss: expected a JSON object of term weights, e.g. '{\"ce\":0.1,\"tv\":0.9}'")
    for name, value in weights.items():
        if name not in LOSS_TERMS:
            raise UsageError(f"--loss: unknown term {name!r}; use {', '.join(LOSS_TERMS)}")
        if not isinstance(value, (int, float)) or value < 0:
            raise UsageError(f"--loss: weight of {name} must be a non-negative number, got {value!r}")
    return {name: float(value) for name, value in weights.items()}


def anchor_seed(seed: int, step: int, prompt_index: int) -> int:
    """Anchor RNG seed of one sequence at one step: independent of rank, batch order and resumes."""
    return (seed * 1_000_003 + step) * 1_000_033 + prompt_index


def sample_anchors(loss_mask: Any, max_anchors: int, seed: int) -> Any:
    """Sorted anchor indices `[n]`, `n = min(max_anchors, candidates)` (see the module docstring)."""
    import torch

    mask = loss_mask.bool()
    candidates = torch.nonzero(mask[:-1] & mask[1:]).flatten()
    if candidates.numel() <= max_anchors:
        return candidates
    generator = torch.Generator().manual_seed(seed)
    chosen = candidates[torch.randperm(candidates.numel(), generator=generator)[:max_anchors]]
    return chosen.sort().values


@dataclass
class Batch:
    """Padded tensors of a (rank-local) batch; padding has `doc_ids == -1` and invalid anchors."""

    input_ids: Any           # [B, T]
    loss_mask: Any           # [B, T] bool
    doc_ids: Any             # [B, T] 0 on tokens, -1 on padding
    context_states: Any      # [B, T, taps * H]
    final_hidden: Any        # [B, T, H]
    anchors: Any             # [B, A]
    anchor_valid: Any        # [B, A] bool

    @property
    def tokens(self) -> int:
        return int(self.loss_mask.sum())


def collate(rollouts: Sequence[Any], anchors: Sequence[Any]) -> Batch:
    """Pad rollouts (from `dspark_hub.rollouts`) and their anchors into one `Batch`."""
    import torch

    rows, length = len(rollouts), max(int(r.input_ids.shape[0]) for r in rollouts)
    width = max(1, max(int(a.numel()) for a in anchors))
    first = rollouts[0]
    input_ids = torch.zeros(rows, length, dtype=torch.long)
    loss_mask = torch.zeros(rows, length, dtype=torch.bool)
    doc_ids = torch.full((rows, length), -1, dtype=torch.long)
    context = torch.zeros(rows, length, first.aux_hidden_states.shape[-1], dtype=first.aux_hidden_states.dtype)
    final = torch.zeros(rows, length, first.final_hidden_states.shape[-1], dtype=first.final_hidden_states.dtype)
    anchor_ids = torch.zeros(rows, width, dtype=torch.long)
    anchor_valid = torch.zeros(rows, width, dtype=torch.bool)
    for i, (r, a) in enumerate(zip(rollouts, anchors)):
        n = int(r.input_ids.shape[0])
        input_ids[i, :n] = r.input_ids
        loss_mask[i, :n] = r.loss_mask.bool()
        doc_ids[i, :n] = 0
        context[i, :n] = r.aux_hidden_states
        final[i, :n] = r.final_hidden_states
        anchor_ids[i, :a.numel()] = a
        anchor_valid[i, :a.numel()] = True
    return Batch(input_ids, loss_mask, doc_ids, context, final, anchor_ids, anchor_valid)


def decay_weights(block_size: int, gamma: float) -> Any:
    """`exp(-k / gamma)` for k = 0..K-1 (1, .779, .607, ... for gamma 4)."""
    import torch

    return torch.exp(-torch.arange(block_size, dtype=torch.float32) / gamma)


@dataclass
class LossSums:
    """Un-normalised, rank-local sums; `weight` is the denominator before the cross-rank sum."""

    terms: dict[str, Any]     # name -> sum(w * l) (tensors with grad), incl. "confidence"
    weight: Any               # sum(w) (no grad)
    stats: dict[str, Any]     # detached sums for logging: "accuracy", "overlap", "slots"


def loss_sums(logits: Any, confidence_logits: Any | None, labels: Any, target_positions: Any, batch: Batch,
              lm_head_weight: Any, *, terms: Sequence[str], gamma: float) -> LossSums:
    """Per-slot losses of a teacher-forced pass, weighted and summed (see the module docstring).

    Args:
        logits: `[B, A, K, V]` float32 draft logits with the teacher-forced Markov bias.
        confidence_logits: `[B, A, K]` or None.
        labels: `[B, A, K]` with -100 where there is no label.
        target_positions: `[B, A, K]` rows of the teacher's final hidden to distil from.
        batch: the collated batch (final hidden, loss mask).
        lm_head_weight: the teacher's lm_head `[V, H]`.
        terms: which of `ce`, `kl`, `tv` to compute.
        gamma: decay constant of the slot weights.
    """
    import torch
    import torch.nn.functional as F

    rows, anchors, block = labels.shape
    flat_positions = target_positions.reshape(rows, -1)
    label_positions = (flat_positions + 1).clamp(max=batch.loss_mask.shape[1] - 1)
    supervised = batch.loss_mask.gather(1, label_positions).reshape_as(labels)
    slot_mask = torch.cumprod(((labels != -100) & supervised).float(), dim=-1)
    weights = slot_mask * decay_weights(block, gamma).to(logits.device)

    hidden = batch.final_hidden.gather(1, flat_positions[..., None].expand(-1, -1, batch.final_hidden.shape[-1]))
    with torch.no_grad():
        target_logits = F.linear(hidden.to(lm_head_weight.dtype), lm_head_weight).float().reshape_as(logits)
        target = target_logits.softmax(-1)
    log_q = logits.log_softmax(-1)
    q = log_q.exp()
    tv = 0.5 * (q - target).abs().sum(-1)
    overlap = (1.0 - tv).detach().clamp(0.0, 1.0)
    safe_labels = labels.clamp(min=0)
    per_slot = {
        "ce": lambda: -log_q.gather(-1, safe_labels[..., None]).squeeze(-1),
        "kl": lambda: (target * (target.clamp_min(1e-30).log() - log_q)).sum(-1),
        "tv": lambda: tv,
    }
    sums = {name: (per_slot[name]() * weights).sum() for name in terms}
    if confidence_logits is not None:
        bce = F.binary_cross_entropy_with_logits(confidence_logits.float(), overlap, reduction="none")
        sums["confidence"] = (bce * weights).sum()
    with torch.no_grad():
        correct = (logits.argmax(-1) == labels).float()
        stats = {"accuracy": (correct * slot_mask).sum(), "overlap": (overlap * slot_mask).sum(),
                 "slots": slot_mask.sum()}
    return LossSums(terms=sums, weight=weights.sum().detach(), stats=stats)


def combine(sums: LossSums, loss_weights: dict[str, float], alpha: float, global_weight: Any,
            world_size: int = 1) -> Any:
    """The scalar to back-propagate on this rank.

    `world_size` undoes DDP's gradient averaging, so the summed gradient is that of the global
    weighted mean.
    """
    total = sum(loss_weights[name] * sums.terms[name] for name in loss_weights)
    if "confidence" in sums.terms and alpha:
        total = total + alpha * sums.terms["confidence"]
    return total * world_size / global_weight.clamp_min(1e-8)


def cosine_lr(step: int, *, total: int, warmup: int, min_ratio: float) -> float:
    """Multiplier of the peak learning rate: linear warmup, then cosine down to `min_ratio`."""
    if warmup and step < warmup:
        return (step + 1) / warmup
    span = max(1, total - warmup)
    progress = min(1.0, (step - warmup) / span)
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
