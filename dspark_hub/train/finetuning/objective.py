"""The DSpark training objective: anchor sampling, packed batches, and the loss mixture.

Per sequence, anchors are positions `a` with `loss_mask[a]` and `loss_mask[a + 1]` (the anchor is a
continuation token and its first label is supervised; TorchSpec/DeepSpec's rule), up to
`max_anchors` drawn without replacement and sorted. Block j is `[x[a_j], M, ..., M]` at positions
`a_j .. a_j + K - 1`; slot k drafts `x[a_j + k + 1]`, distils the target's distribution at row
`a_j + k`, and its Markov predecessor is the true token `x[a_j + k]` (teacher forcing). All blocks
of a sequence run in one packed pass (`K3DSparkModel.teacher_forced`).

Slot weights: `w_k = exp(-k / gamma) * m_k` where `m_k` is the contiguous-prefix mask (a slot whose
label is missing or unsupervised voids the rest of its block). Each term is `sum(w * l) / sum(w)`
with the denominator summed over every data-parallel rank, so a sharded batch gives the same
gradient as one process on the whole batch.

Terms (p = target softmax at temperature 1, q = draft softmax with the Markov bias):
  - `ce`: cross-entropy of q against the data token (= argmax p on greedy target data);
  - `kl`: KL(p || q);
  - `tv`: total variation 1 - sum_v min(p_v, q_v);
  - confidence: BCE-with-logits of the confidence head against a detached per-slot acceptance, weight
    `alpha`: by default the overlap `1 - TV(p, q)` (the acceptance probability of speculative sampling with
    drafts sampled from q, speculators' target), or the acceptance the draft is served with
    (`CONFIDENCE_TARGETS`, `confidence_target`).

`loss_sums` takes the full `[B, A, K, V]` draft logits; `chunked_loss_sums` computes the same sums
and gradients from the draft's hidden rows a chunk of (anchor, position) rows at a time, so memory
is bounded in the vocabulary dimension (163,840 at K3 scale: ~2.3 GB per tensor for 512 anchors).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from dspark_hub.errors import CheckpointFormatError, UsageError
from dspark_hub.format import contract
from dspark_hub.format.jsonio import loads_strict

# torch is imported inside each function: the CLI imports this module (`parse_loss`,
# `DEFAULT_LOSS_CHUNK`) for `--help`, which must not load torch.

if TYPE_CHECKING:
    import torch

    from dspark_hub.train.target.generate import Rollout

LOSS_TERMS = ("ce", "kl", "tv")
#: What the confidence head is trained to estimate at a slot, given the slots before it accepted (`finetune
#: --confidence-target`; p the target's softmax at temperature 1, q the draft's):
CONFIDENCE_TARGETS = {
    "overlap": "1 - TV(p, q) = sum min(p, q): the acceptance of speculative sampling at temperature 1 with drafts "
               "sampled from q (speculators' and the DSpark paper's target)",
    "greedy": "argmax q == argmax p: the acceptance at temperature 0, greedy verification",
    "greedy_drafts": "p(argmax q): the acceptance at temperature 1 of a greedy draft (vLLM's default "
                     "draft_sample_method)",
}
DraftLogits = Callable[["torch.Tensor", "torch.Tensor"], "torch.Tensor"]
#: Default rows per loss chunk: one float32 `[rows, V]` tensor at the K3 vocabulary is ~256 MiB.
DEFAULT_LOSS_CHUNK = (256 << 20) // (4 * contract.REFERENCE_CONFIG["draft_vocab_size"])


def parse_loss(spec: str | dict[str, float], terms: Sequence[str] | None = LOSS_TERMS) -> dict[str, float]:
    """`'{"ce":0.1,"tv":0.9}'` -> weights; names outside `terms` or non-numbers are a `UsageError`.

    `terms=None` takes any name: the command line parses `--loss` before it knows the base's format,
    and the format's trainer checks the names it computes (`objective_speculators.Objective`).
    """
    try:
        weights = loads_strict(spec, path="loss") if isinstance(spec, str) else dict(spec)
    except CheckpointFormatError as exc:
        raise UsageError(f"{exc.detail}; e.g. '{{\"ce\":0.1,\"tv\":0.9}}'", param="loss") from None
    if not isinstance(weights, dict) or not weights:
        raise UsageError("expected a JSON object of term weights, e.g. '{\"ce\":0.1,\"tv\":0.9}'", param="loss")
    for name, value in weights.items():
        if terms is not None and name not in terms:
            raise UsageError(f"unknown term {name!r}; use {', '.join(terms)}", param="loss")
        if not isinstance(value, (int, float)) or value < 0:
            raise UsageError(f"weight of {name} must be a non-negative number, got {value!r}", param="loss")
    return {name: float(value) for name, value in weights.items()}


def anchor_seed(seed: int, step: int, prompt_index: int) -> int:
    """Anchor RNG seed of one sequence at one step: independent of rank, batch order and resumes."""
    return (seed * 1_000_003 + step) * 1_000_033 + prompt_index


def sample_anchors(loss_mask: torch.Tensor, max_anchors: int, seed: int) -> torch.Tensor:
    """Sorted anchor indices `[n]`, `n = min(max_anchors, candidates)` (see the module docstring)."""
    import torch

    mask = loss_mask.bool()
    candidates = torch.nonzero(mask[:-1] & mask[1:]).flatten()
    if candidates.numel() <= max_anchors:
        return candidates
    generator = torch.Generator().manual_seed(seed)
    chosen = candidates[torch.randperm(candidates.numel(), generator=generator)[:max_anchors]]
    return chosen.sort().values


class Targets(Protocol):
    """What the loss reads of a batch: the target's final hidden rows and the supervised tokens."""

    @property
    def final_hidden(self) -> torch.Tensor: ...        # [B, T, H]
    @property
    def loss_mask(self) -> torch.Tensor: ...           # [B, T] bool


@dataclass(frozen=True)
class TargetDistributions:
    """`Targets` on their own (the trainer's step hands the loss only these two)."""

    final_hidden: torch.Tensor
    loss_mask: torch.Tensor


@dataclass
class Batch:
    """Padded tensors of a (rank-local) batch; padding has `doc_ids == -1` and invalid anchors."""

    input_ids: torch.Tensor           # [B, T]
    loss_mask: torch.Tensor           # [B, T] bool
    doc_ids: torch.Tensor             # [B, T] 0 on tokens, -1 on padding
    context_states: torch.Tensor      # [B, T, taps * H]
    final_hidden: torch.Tensor        # [B, T, H]
    anchors: torch.Tensor             # [B, A]
    anchor_valid: torch.Tensor        # [B, A] bool

    @property
    def tokens(self) -> int:
        return int(self.loss_mask.sum())

    def to(self, device: torch.device | str) -> Batch:
        """The same batch on `device` (non-blocking copies; a no-op on the tensors' own device)."""
        return Batch(*(getattr(self, name).to(device, non_blocking=True) for name in
                       ("input_ids", "loss_mask", "doc_ids", "context_states", "final_hidden", "anchors",
                        "anchor_valid")))


def collate(rollouts: Sequence[Rollout], anchors: Sequence[torch.Tensor]) -> Batch:
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
    for i, (r, a) in enumerate(zip(rollouts, anchors, strict=True)):
        n = int(r.input_ids.shape[0])
        input_ids[i, :n] = r.input_ids
        loss_mask[i, :n] = r.loss_mask.bool()
        doc_ids[i, :n] = 0
        context[i, :n] = r.aux_hidden_states
        final[i, :n] = r.final_hidden_states
        anchor_ids[i, :a.numel()] = a
        anchor_valid[i, :a.numel()] = True
    return Batch(input_ids, loss_mask, doc_ids, context, final, anchor_ids, anchor_valid)


def decay_weights(block_size: int, gamma: float) -> torch.Tensor:
    """`exp(-k / gamma)` for k = 0..K-1 (1, .779, .607, ... for gamma 4)."""
    import torch

    return torch.exp(-torch.arange(block_size, dtype=torch.float32) / gamma)


@dataclass
class LossSums:
    """Un-normalised, rank-local sums; `weight` is the denominator before the cross-rank sum."""

    terms: dict[str, torch.Tensor]     # name -> sum(w * l) (tensors with grad), incl. "confidence"
    weight: torch.Tensor               # sum(w) (no grad)
    stats: dict[str, Any]     # detached sums for logging: "accuracy", "overlap", "slots"


def slot_weights(labels: torch.Tensor, target_positions: torch.Tensor, loss_mask: torch.Tensor,
                 gamma: float) -> tuple[torch.Tensor, torch.Tensor]:
    """`(slot_mask, weights)`, both `[B, A, K]`: the contiguous supervised prefix, and it times the decay."""
    import torch

    rows, _, block = labels.shape
    label_positions = (target_positions.reshape(rows, -1) + 1).clamp(max=loss_mask.shape[1] - 1)
    supervised = loss_mask.gather(1, label_positions).reshape_as(labels)
    slot_mask = torch.cumprod(((labels != -100) & supervised).float(), dim=-1)
    return slot_mask, slot_mask * decay_weights(block, gamma).to(labels.device)


def supervised_slots(loss_mask: torch.Tensor, anchors: torch.Tensor, anchor_valid: torch.Tensor,
                     block_size: int) -> int:
    """The block slots of a batch whose label counts in the loss (`slot_weights`' contiguous prefix), counted
    from the batch alone: per valid anchor `a`, slots `k = 0, 1, ...` while `x[a + k + 1]` is a supervised token
    of the sequence. What `finetune` plans before step 1; the step's own count is `LossSums.stats["slots"]`."""
    import torch

    rows, length = loss_mask.shape
    label_positions = anchors.long()[..., None] + torch.arange(1, block_size + 1, device=anchors.device)
    inside = label_positions < length
    supervised = loss_mask.bool().gather(1, label_positions.clamp(max=length - 1).reshape(rows, -1))
    kept = torch.cumprod((supervised.reshape_as(label_positions) & inside).int(), dim=-1)
    return int((kept * anchor_valid.bool()[..., None]).sum())


def _target_distribution(final_hidden: torch.Tensor, lm_head_weight: torch.Tensor) -> torch.Tensor:
    import torch
    import torch.nn.functional as F

    with torch.no_grad():
        return F.linear(final_hidden.to(lm_head_weight.dtype), lm_head_weight).float().softmax(-1)


def acceptance_target(q: torch.Tensor, p: torch.Tensor, name: str) -> torch.Tensor:
    """The per-slot acceptance `CONFIDENCE_TARGETS[name]` of draft distributions `q` under target ones `p`
    (`[..., V]` each), detached: what the confidence head learns to estimate.

    Raises:
        UsageError: an unknown name.
    """
    import torch

    with torch.no_grad():
        if name == "overlap":
            return torch.minimum(q, p).sum(-1).clamp(0.0, 1.0)
        guess = q.argmax(-1, keepdim=True)
        if name == "greedy":
            return (guess == p.argmax(-1, keepdim=True)).float()[..., 0]
        if name == "greedy_drafts":
            return p.gather(-1, guess)[..., 0]
    raise UsageError(f"confidence target {name!r}; use one of {', '.join(CONFIDENCE_TARGETS)}",
                     param="confidence_target")


def _slot_losses(logits: torch.Tensor, target: torch.Tensor, labels: torch.Tensor, terms: Sequence[str],
                 confidence_target: str = "overlap"
                 ) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-slot `{term: loss}`, the detached overlap `1 - TV`, argmax hits and the confidence head's target
    (`acceptance_target`), all shaped like `labels`."""
    import torch

    log_q = logits.log_softmax(-1)
    q = log_q.exp()
    tv = 0.5 * (q - target).abs().sum(-1)
    overlap = (1.0 - tv).detach().clamp(0.0, 1.0)
    accept = overlap if confidence_target == "overlap" else acceptance_target(q, target, confidence_target)
    safe_labels = labels.clamp(min=0)
    per_slot = {
        "ce": lambda: -log_q.gather(-1, safe_labels[..., None]).squeeze(-1),
        "kl": lambda: (target * (target.clamp_min(1e-30).log() - log_q)).sum(-1),
        "tv": lambda: tv,
    }
    with torch.no_grad():
        correct = (logits.argmax(-1) == labels).float()
    return {name: per_slot[name]() for name in terms}, overlap, correct, accept


def _finish(sums: dict[str, torch.Tensor], confidence_logits: torch.Tensor | None, overlap: torch.Tensor,
            hits: torch.Tensor, slot_mask: torch.Tensor, weights: torch.Tensor,
            accept: torch.Tensor | None = None) -> LossSums:
    """The sums with the confidence BCE against `accept` (default: the overlap) added, and the stats."""
    import torch
    import torch.nn.functional as F

    if confidence_logits is not None:
        bce = F.binary_cross_entropy_with_logits(confidence_logits.float(), overlap if accept is None else accept,
                                                 reduction="none")
        sums["confidence"] = (bce * weights).sum()
    with torch.no_grad():
        stats = {"accuracy": hits, "overlap": (overlap * slot_mask).sum(),
                 "slots": slot_mask.sum()}
    return LossSums(terms=sums, weight=weights.sum().detach(), stats=stats)


def loss_sums(logits: torch.Tensor, confidence_logits: torch.Tensor | None, labels: torch.Tensor,
              target_positions: torch.Tensor, batch: Targets, lm_head_weight: torch.Tensor, *, terms: Sequence[str],
              gamma: float, confidence_target: str = "overlap") -> LossSums:
    """Per-slot losses of a teacher-forced pass, weighted and summed (see the module docstring).

    Holds `[B, A, K, V]` logits and targets at once; `chunked_loss_sums` is the memory-bounded twin.

    Args:
        logits: `[B, A, K, V]` float32 draft logits with the teacher-forced Markov bias.
        confidence_logits: `[B, A, K]` or None.
        labels: `[B, A, K]` with -100 where there is no label.
        target_positions: `[B, A, K]` rows of the target's final hidden to distil from.
        batch: the collated batch (final hidden, loss mask).
        lm_head_weight: the target's lm_head `[V, H]`.
        terms: which of `ce`, `kl`, `tv` to compute.
        gamma: decay constant of the slot weights.
        confidence_target: what the confidence head learns (`CONFIDENCE_TARGETS`).
    """
    import torch

    slot_mask, weights = slot_weights(labels, target_positions, batch.loss_mask, gamma)
    flat_positions = target_positions.reshape(labels.shape[0], -1)
    hidden = batch.final_hidden.gather(1, flat_positions[..., None].expand(-1, -1, batch.final_hidden.shape[-1]))
    target = _target_distribution(hidden, lm_head_weight).reshape_as(logits)
    losses, overlap, correct, accept = _slot_losses(logits, target, labels, terms, confidence_target)
    sums = {name: (loss * weights).sum() for name, loss in losses.items()}
    with torch.no_grad():
        hits = (correct * slot_mask).sum()
    return _finish(sums, confidence_logits, overlap, hits, slot_mask, weights, accept)


def _chunk_sums(draft_logits: DraftLogits, lm_head_weight: torch.Tensor, terms: Sequence[str], confidence_target: str,
                target_hidden: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor,
                *draft_rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """`([sum(w * l) per term], overlap [n], hits, the confidence target [n])` of n rows; nothing vocabulary-sized
    outlives it."""
    import torch

    logits = draft_logits(*draft_rows).float()
    # As `loss_sums` after an autocast forward: bf16 may shape the draft logits, never the loss arithmetic.
    with torch.autocast(logits.device.type, enabled=False):
        target = _target_distribution(target_hidden, lm_head_weight)
        losses, overlap, correct, accept = _slot_losses(logits, target, labels, terms, confidence_target)
        sums = [(losses[name] * weights).sum() for name in terms]
    return torch.stack(sums) if sums else weights.new_zeros(0), overlap, correct.sum(), accept


def chunked_loss_sums(draft_logits: DraftLogits, draft_inputs: Sequence[torch.Tensor],
                      confidence_logits: torch.Tensor | None, labels: torch.Tensor, target_positions: torch.Tensor,
                      batch: Targets, lm_head_weight: torch.Tensor, *,
                      terms: Sequence[str], gamma: float, chunk_rows: int,
                      confidence_target: str = "overlap") -> LossSums:
    """`loss_sums` without ever holding more than `chunk_rows` rows of `[rows, V]` logits or targets.

    Only supervised slots (non-zero weight) are computed; they are taken `chunk_rows` at a time,
    and each chunk runs under `torch.utils.checkpoint`, so its logits, softmaxes and target
    targets are freed after its forward and recomputed, one chunk at a time, in backward.

    Args:
        draft_logits: `(*rows) -> [n, V]` Markov-corrected draft logits of n rows of each of
            `draft_inputs` (e.g. the hidden rows and their Markov features `markov_w1[prev]`:
            gather the features once, outside, so no chunk back-propagates a `[vocab, rank]`
            embedding gradient of its own).
        draft_inputs: `[B, A, K, ...]` per-slot tensors `draft_logits` reads.
        confidence_logits, labels, target_positions, batch, lm_head_weight, terms, gamma, confidence_target: as
            in `loss_sums`.
        chunk_rows: (anchor, position) rows per chunk, >= 1.
    """
    import torch
    from torch.utils.checkpoint import checkpoint

    if chunk_rows < 1:
        raise UsageError(f"{chunk_rows} rows per chunk; use a positive number (0 = no chunking)",
                         param="loss_chunk")
    slot_mask, weights = slot_weights(labels, target_positions, batch.loss_mask, gamma)
    rows = torch.nonzero(slot_mask.flatten()).flatten()
    sequence = torch.arange(labels.shape[0], device=labels.device)[:, None, None].expand_as(labels)
    target_hidden = batch.final_hidden[sequence.flatten()[rows], target_positions.flatten()[rows]]
    inputs = [target_hidden, labels.flatten()[rows], weights.flatten()[rows]]
    inputs += [tensor.flatten(0, labels.dim() - 1)[rows] for tensor in draft_inputs]
    term_sums, overlaps, hits, accepts = [], [], [], []
    # At least one (possibly empty) chunk, so a rank without supervised slots still back-propagates.
    for start in range(0, max(rows.numel(), 1), chunk_rows):
        part = [tensor[start:start + chunk_rows] for tensor in inputs]
        chunk = checkpoint(_chunk_sums, draft_logits, lm_head_weight, terms, confidence_target, *part,
                           use_reentrant=False, preserve_rng_state=False)
        term_sums.append(chunk[0])
        overlaps.append(chunk[1])
        hits.append(chunk[2])
        accepts.append(chunk[3])
    totals = torch.stack(term_sums).sum(0)
    sums = {name: totals[i] for i, name in enumerate(terms)}
    overlap, accept = torch.zeros(labels.numel(), device=labels.device), torch.zeros(labels.numel(),
                                                                                       device=labels.device)
    overlap[rows] = torch.cat(overlaps)
    accept[rows] = torch.cat(accepts)
    return _finish(sums, confidence_logits, overlap.reshape_as(slot_mask), torch.stack(hits).sum(), slot_mask,
                   weights, accept.reshape_as(slot_mask))


def combine(sums: LossSums, loss_weights: dict[str, float], alpha: float, global_weight: torch.Tensor,
            world_size: int = 1) -> torch.Tensor:
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
