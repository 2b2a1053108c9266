"""The speculators DSpark objective, as `speculators` 0.9.0 trains it, on our own forward.

The library's training step (`DSparkDraftModel.forward` -> `compute_metrics`, read in
speculators 0.9.0 models/dspark/core.py, models/dflash/core.py, losses/utils.py and checked
against it by tests/test_speculators_objective.py in the library's own virtualenv):

1. a packed row of sequences: taps `[N, T*H]`, ids `[N]`, loss mask `[N]`, the target's last
   hidden state before its final norm `[N, H]`, document ids `[N]` and per-document positions `[N]`;
2. anchors: up to `max_anchors` positions with `loss_mask` set outside the row's last `block_size`
   positions, drawn without replacement and sorted (`library_anchors`);
3. block `j` is `[x[a_j], M, ..., M]` at positions `pos[a_j] .. pos[a_j] + K - 1`; it attends to the
   context rows of its own document before `a_j` (within the window on sliding layers) and to its
   own block (causally on sliding layers unless `sliding_window_non_causal`);
4. targets: the target's logits `lm_head(norm(last))` over the draft vocabulary at rows `a_j + k`
   (`a_j + k - 1` without `sample_from_anchor`); the Markov predecessor of slot `k` is the true
   token at the same row;
5. loss: each term of `loss` (KL by default) is `sum(l * m * w) / (sum(m) + 1e-5)` with
   `w_k = exp(-k / gamma)` (without `sample_from_anchor`: slot 0 is the anchor, weight 0, then
   `exp(-(k - 1) / gamma)`), plus `alpha` times the confidence BCE against the detached overlap (or, with
   `confidence_target`, the acceptance the draft is served with: `objective.CONFIDENCE_TARGETS`)
   `1 - TV` with the same weights (denominator `sum(m) + 1e-8`).

How it differs from the k3_dspark objective (`train.objective`): anchors there need a supervised
next token and a block is voided after its first missing label (here every row of the block counts
if its own loss-mask bit is set); the denominators there are summed over data-parallel ranks.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dspark_hub.errors import UsageError
from dspark_hub.format import speculators as spec_format
from dspark_hub.modeling.speculators_dspark import rms_norm, rotary_embedding
from dspark_hub.train.finetuning.objective import acceptance_target

if TYPE_CHECKING:
    import torch

#: Tensors the library never trains: the target's (embedding, heads, final norm) and the vocabulary maps.
FROZEN = ("embed_tokens.weight", "lm_head.weight", "verifier_lm_head.weight", "verifier_norm.weight", "d2t", "t2d")
#: `speculators` 0.9.0 `LOSS_REDUCTION_EPS` and the confidence term's `_EPS` (losses/utils.py, dspark/metrics.py).
TERM_EPS, CONFIDENCE_EPS = 1e-5, 1e-8
LIBRARY_TERMS = ("kl_div", "rkl", "jsd", "ce", "tv", "nla", "lk_hybrid")


@dataclass
class PackedRow:
    """One packed row in the library's layout (every tensor has a leading length `N`)."""

    taps: torch.Tensor            # [N, T*H]
    input_ids: torch.Tensor       # [N] long
    loss_mask: torch.Tensor       # [N]
    last_hidden: torch.Tensor     # [N, H], before the target's final norm
    document_ids: torch.Tensor    # [N] long, -1 for padding
    positions: torch.Tensor       # [N] long, per document
    final_normed: bool = False    # `last_hidden` is already AFTER the final norm (our rollouts, hidden-state files)


@dataclass
class Objective:
    """The library's training knobs (`get_trainer_kwargs` defaults for DSpark)."""

    loss: Mapping[str, float]
    gamma: float = 4.0
    alpha: float = 1.0
    max_anchors: int = 3072
    #: What the confidence head learns (`objective.CONFIDENCE_TARGETS`; the library's is the overlap).
    confidence_target: str = "overlap"

    def __post_init__(self) -> None:
        unknown = sorted(set(self.loss) - set(LIBRARY_TERMS))
        if unknown or not self.loss:
            raise UsageError(f"loss terms {unknown or '{}'} are not the library's; use {', '.join(LIBRARY_TERMS)}",
                             param="loss")


@dataclass
class LossResult:
    total: torch.Tensor
    terms: dict[str, torch.Tensor]      # unweighted, `{name}_loss` (the library reports them only when >1)
    confidence: torch.Tensor | None
    accept_rate: torch.Tensor           # [A*K] per-slot overlap 1 - TV (detached)
    mask: torch.Tensor                  # [A*K] aligned loss mask


def library_anchors(loss_mask: torch.Tensor, max_anchors: int, block_size: int,
                    generator: torch.Generator | None = None) -> torch.Tensor:
    """Sorted anchors `[n]`: positions with `loss_mask` outside the last `block_size`, at most `max_anchors`."""
    import torch

    valid = loss_mask.bool().clone()
    valid[-block_size:] = False
    candidates = torch.nonzero(valid).flatten()
    chosen = torch.randperm(candidates.numel(), generator=generator)[:max_anchors]
    return candidates[chosen].sort().values


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    import torch

    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin


class SpeculatorsDSparkTrainer:
    """A speculators DSpark's tensors as trainable leaves, with the library's training forward and loss.

    Args:
        config: the checkpoint's `config.json`.
        tensors: its tensors (every saved name; `lm_head.weight` only for a pruned vocabulary).
        embed: the target's input embedding `[V, H]`.
        target_lm_head: the target's `lm_head` `[V, H]` (the embedding when tied).
        target_norm: the target's final norm weight `[H]`.
    """

    def __init__(self, config: Mapping[str, Any], tensors: Mapping[str, torch.Tensor], embed: torch.Tensor,
                 target_lm_head: torch.Tensor, target_norm: torch.Tensor) -> None:
        if not spec_format.is_dspark(config):
            raise UsageError(f"config.json: {spec_format.TYPE_KEY} is {config.get(spec_format.TYPE_KEY)!r}; "
                             "only a speculators DSpark trains with this objective")
        self.config = dict(config)
        self.geometry = spec_format.geometry(config)
        layer = spec_format.layer_config(config)
        self.eps = float(layer.get("rms_norm_eps", 1e-6))
        self.layer_types = list(layer.get("layer_types") or ["full_attention"] * self.geometry.layers)
        self.window = layer.get("sliding_window")
        self.non_causal_sliding = bool(config.get("sliding_window_non_causal", False))
        self.block_size = int(config.get("block_size", spec_format.DEFAULTS["block_size"]))
        self.sample_from_anchor = bool(config.get("sample_from_anchor", spec_format.DEFAULTS["sample_from_anchor"]))
        self.mask_token_id = int(config["mask_token_id"])
        self.weights: dict[str, torch.Tensor] = {}
        for name, tensor in tensors.items():
            trainable = tensor.is_floating_point() and name not in FROZEN
            self.weights[name] = tensor.detach().clone().requires_grad_(trainable)
        self.embed = embed.detach()
        keep = self.weights["t2d"].bool() if "t2d" in self.weights else None
        verifier_head = target_lm_head.detach() if keep is None else target_lm_head.detach()[keep]
        self.verifier_head = verifier_head
        self.lm_head = self.weights.get("lm_head.weight", verifier_head)
        self.target_norm = target_norm.detach()
        self._rotary = rotary_embedding(layer)

    # -- parameters ---------------------------------------------------------------------------

    def parameters(self) -> list[torch.Tensor]:
        """The trainable tensors, in the checkpoint's name order."""
        return [t for _, t in sorted(self.weights.items()) if t.requires_grad]

    def named_trainable(self) -> dict[str, torch.Tensor]:
        return {name: t for name, t in sorted(self.weights.items()) if t.requires_grad}

    def state(self) -> dict[str, torch.Tensor]:
        """Every saved tensor (frozen ones untouched), detached: what a drop-in checkpoint writes."""
        return {name: t.detach() for name, t in self.weights.items()}

    # -- forward --------------------------------------------------------------------------------

    def _linear(self, x: torch.Tensor, name: str) -> torch.Tensor:
        import torch.nn.functional as F

        return F.linear(x, self.weights[f"{name}.weight"], self.weights.get(f"{name}.bias"))

    def rope(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        import torch

        cos, sin = self._rotary(torch.zeros(1, dtype=dtype), positions.reshape(1, -1).long())
        shape = (*positions.shape, cos.shape[-1])
        return cos[0].to(dtype).reshape(shape), sin[0].to(dtype).reshape(shape)

    def _context_mask(self, row: PackedRow, anchors: torch.Tensor, sliding: bool) -> torch.Tensor:
        """`[A, N]`: block `j` sees context row `n` of its document with `n < a_j` (and in the window)."""
        import torch

        n = torch.arange(row.document_ids.shape[0])
        doc = row.document_ids[anchors]
        seen = (row.document_ids[None, :] == doc[:, None]) & (doc[:, None] != -1) & (n[None, :] < anchors[:, None])
        if sliding and self.window is not None:
            seen &= n[None, :] >= anchors[:, None] - int(self.window)
        return seen

    def _block_mask(self, sliding: bool) -> torch.Tensor:
        import torch

        k = self.block_size
        if sliding and not self.non_causal_sliding:
            return torch.ones(k, k, dtype=torch.bool).tril()
        return torch.ones(k, k, dtype=torch.bool)

    def _keys(self, i: int, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Normed, rotated keys of rows `x` `[..., H]`, repeated to the query heads: `[..., heads, d]`."""
        g = self.geometry
        pre = f"layers.{i}.self_attn."
        key = rms_norm(self._linear(x, pre + "k_proj").view(*x.shape[:-1], g.kv_heads, g.head_dim),
                       self.weights[pre + "k_norm.weight"], self.eps)
        return _rotate(key, cos, sin).repeat_interleave(g.heads // g.kv_heads, dim=-2)

    def _values(self, i: int, x: torch.Tensor) -> torch.Tensor:
        g = self.geometry
        value = self._linear(x, f"layers.{i}.self_attn.v_proj").view(*x.shape[:-1], g.kv_heads, g.head_dim)
        return value.repeat_interleave(g.heads // g.kv_heads, dim=-2)

    def _attention(self, i: int, u: torch.Tensor, context: tuple[torch.Tensor, torch.Tensor],
                   rope_block: tuple[torch.Tensor, torch.Tensor], context_mask: torch.Tensor, sliding: bool
                   ) -> torch.Tensor:
        """Attention of blocks `u` `[A, K, H]` over context keys/values `[C, h, d]` (`context_mask` `[A, C]`)."""
        import torch

        g = self.geometry
        a, k, _ = u.shape
        q = rms_norm(self._linear(u, f"layers.{i}.self_attn.q_proj").view(a, k, g.heads, g.head_dim),
                     self.weights[f"layers.{i}.self_attn.q_norm.weight"], self.eps)
        cos, sin = rope_block[0][:, :, None], rope_block[1][:, :, None]
        q = _rotate(q, cos, sin)
        key_c, value_c = context
        scale = g.head_dim ** -0.5
        scores_c = torch.einsum("akhd,nhd->ahkn", q, key_c) * scale
        scores_b = torch.einsum("akhd,ajhd->ahkj", q, self._keys(i, u, cos, sin)) * scale
        scores_c = scores_c.masked_fill(~context_mask[:, None, None, :], float("-inf"))
        scores_b = scores_b.masked_fill(~self._block_mask(sliding)[None, None], float("-inf"))
        n = key_c.shape[0]
        weights = torch.softmax(torch.cat([scores_c, scores_b], dim=-1), dim=-1, dtype=torch.float32).to(q.dtype)
        out = (torch.einsum("ahkn,nhd->akhd", weights[..., :n], value_c)
               + torch.einsum("ahkj,ajhd->akhd", weights[..., n:], self._values(i, u)))
        return self._linear(out.reshape(a, k, g.heads * g.head_dim), f"layers.{i}.self_attn.o_proj")

    @staticmethod
    def _spans(row: PackedRow, anchors: torch.Tensor) -> list[tuple[slice, int, int]]:
        """Anchor groups of one document with the context rows they may see: `(anchor slice, lo, hi)`.

        A block sees only rows of its own document before its anchor, so scores outside
        `[first row of the document, last anchor of the group)` are all masked: skipping them is exact
        and makes the attention cost grow with the document, not the packed row.
        """
        import torch

        docs = row.document_ids[anchors].tolist()
        spans, start = [], 0
        for j in range(1, len(docs) + 1):
            if j == len(docs) or docs[j] != docs[start]:
                lo = int(torch.nonzero(row.document_ids == docs[start])[0]) if docs[start] != -1 else 0
                spans.append((slice(start, j), lo, max(lo, int(anchors[j - 1]))))
                start = j
        return spans

    def block_keys(self, row: PackedRow, anchors: torch.Tensor) -> list[int]:
        """Per anchor, the keys each row of its block attends over: its group's context rows (`_spans`) and
        its own block."""
        return [hi - lo + self.block_size for group, lo, hi in self._spans(row, anchors)
                for _ in range(group.stop - group.start)]

    def slot_rows(self, anchors: torch.Tensor, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """`(rows, target_rows)`, both `[A*K]`: the packed row's index of each block slot, and the row whose
        target distribution that slot is distilled at (the row before it without `sample_from_anchor`)."""
        import torch

        rows = (anchors[:, None] + torch.arange(self.block_size)[None, :]).reshape(-1)
        return rows, rows if self.sample_from_anchor else (rows - 1) % length

    def slot_mask(self, row: PackedRow, anchors: torch.Tensor) -> torch.Tensor:
        """`[A*K]` float: 1 on the block slots whose own row is supervised (slot 0 never, without
        `sample_from_anchor`: it is the anchor), the slots the library's loss counts."""
        rows, _ = self.slot_rows(anchors, row.input_ids.shape[0])
        mask = row.loss_mask[rows].float()
        if not self.sample_from_anchor:
            mask = mask.clone()
            mask[:: self.block_size] = 0
        return mask

    def hidden(self, row: PackedRow, anchors: torch.Tensor) -> torch.Tensor:
        """Final-normed block states `z` `[A, K, H]` for the anchors of one packed row."""
        import torch
        import torch.nn.functional as F

        k = self.block_size
        dtype = self.weights["fc.weight"].dtype
        context = rms_norm(self._linear(row.taps.to(dtype), "fc"), self.weights["hidden_norm.weight"], self.eps)
        block_ids = torch.full((anchors.numel(), k), self.mask_token_id, dtype=torch.long)
        block_ids[:, 0] = row.input_ids[anchors]
        block_positions = row.positions[anchors][:, None] + torch.arange(k)[None, :]
        rope_block, (cos_c, sin_c) = self.rope(block_positions, dtype), self.rope(row.positions, dtype)
        spans = self._spans(row, anchors)
        h = self.embed[block_ids].to(dtype)
        for i in range(self.geometry.layers):
            pre = f"layers.{i}."
            sliding = self.layer_types[i] == "sliding_attention"
            mask = self._context_mask(row, anchors, sliding)
            key_c, value_c = self._keys(i, context, cos_c[:, None], sin_c[:, None]), self._values(i, context)
            u = rms_norm(h, self.weights[pre + "input_layernorm.weight"], self.eps)
            attended = [self._attention(i, u[group], (key_c[lo:hi], value_c[lo:hi]),
                                        (rope_block[0][group], rope_block[1][group]), mask[group, lo:hi], sliding)
                        for group, lo, hi in spans]
            h = h + torch.cat(attended)
            u = rms_norm(h, self.weights[pre + "post_attention_layernorm.weight"], self.eps)
            h = h + self._linear(F.silu(self._linear(u, pre + "mlp.gate_proj")) * self._linear(u, pre + "mlp.up_proj"),
                                 pre + "mlp.down_proj")
        return rms_norm(h, self.weights["norm.weight"], self.eps)

    def markov(self, prev: torch.Tensor, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The Markov bias `[A, K, Vd]` and the predecessor embeddings `e` `[A, K, r]` (library's head types)."""
        import torch
        import torch.nn.functional as F

        w2 = self.weights["markov_head.markov_w2.weight"]
        e = self.weights["markov_head.markov_w1.weight"][prev].to(w2.dtype)
        kind = self.geometry.markov_head_type
        if kind == "vanilla":
            return F.linear(e, w2), e
        z = z.to(e.dtype)
        if kind == "gated":
            gate = torch.sigmoid(self._linear(torch.cat([z, e], dim=-1), "markov_head.gate_proj"))
            return F.linear(gate * e, w2), e
        state = e.new_zeros(e.shape[0], e.shape[-1])
        outputs = []
        for slot in range(e.shape[1]):
            g, c, o = self._linear(torch.cat([state, e[:, slot], z[:, slot]], dim=-1),
                                   "markov_head.joint_proj").chunk(3, dim=-1)
            gate = torch.sigmoid(g)
            state = gate * state + (1.0 - gate) * torch.tanh(c)
            outputs.append(F.linear(torch.tanh(o), w2))
        return torch.stack(outputs, dim=1), e

    def forward(self, row: PackedRow, anchors: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """Draft logits `[A*K, Vd]`, the target's log-probabilities `[A*K, Vd]`, confidence logits `[A*K]`, rows."""
        import torch
        import torch.nn.functional as F

        k = self.block_size
        z = self.hidden(row, anchors)
        logits = F.linear(z, self.lm_head)
        rows, target_rows = self.slot_rows(anchors, row.input_ids.shape[0])
        with torch.no_grad():
            # Overlapping blocks share rows: the target's log-distribution once per distinct row, then gathered.
            distinct, inverse = torch.unique(target_rows, return_inverse=True)
            last = row.last_hidden[distinct].to(self.target_norm.dtype)
            normed = last if row.final_normed else rms_norm(last, self.target_norm, self.eps)
            targets = F.log_softmax(F.linear(normed, self.verifier_head.to(normed.dtype)), -1, dtype=torch.float32)
            targets = targets[inverse]
        block_tokens = row.input_ids[rows].view(-1, k)
        prev = block_tokens if self.sample_from_anchor else torch.cat([block_tokens[:, :1], block_tokens[:, :-1]], 1)
        e = None
        if self.geometry.markov_rank > 0:
            bias, e = self.markov(prev, z)
            logits = logits + bias
        confidence = None
        if "confidence_head.proj.weight" in self.weights:
            features = torch.cat([z, e.to(z.dtype)], dim=-1) if self.geometry.confidence_with_markov and e is not None \
                else z
            confidence = self._linear(features, "confidence_head.proj").reshape(-1)
        return logits.reshape(rows.numel(), -1), targets, confidence, rows

    def loss(self, row: PackedRow, anchors: torch.Tensor, objective: Objective) -> LossResult:
        """The library's total loss and its terms for the given anchors."""
        logits, targets, confidence, _ = self.forward(row, anchors)
        mask = self.slot_mask(row, anchors)
        return library_loss(logits, targets, confidence, mask, self.block_size, objective,
                            sample_from_anchor=self.sample_from_anchor)


def slot_decay(block_size: int, count: int, gamma: float, sample_from_anchor: bool) -> torch.Tensor:
    """`dflash_loss_decay` over `count` rows: `exp(-k/gamma)`, or 0 then `exp(-(k-1)/gamma)` with a bonus anchor."""
    import torch

    k = (torch.arange(count) % block_size).float()
    if sample_from_anchor:
        return torch.exp(-k / gamma)
    return torch.exp(-((k - 1).clamp(min=0)) / gamma) * (k != 0).float()


def term_elementwise(name: str, log_q: torch.Tensor, log_p: torch.Tensor, overlap: torch.Tensor) -> torch.Tensor:
    """Per-row loss of one library term (the definitions of losses/eager.py), `[rows]`.

    `log_q`, `log_p`: the draft's and the target's log-probabilities (float32); `overlap`: `sum min(q, p)`.
    """
    import torch

    if name == "ce":
        return -log_q.gather(-1, log_p.argmax(-1, keepdim=True)).squeeze(-1)
    if name == "kl_div":
        return (log_p.exp() * (log_p - log_q)).sum(-1)
    if name == "rkl":
        return (log_q.exp() * (log_q - log_p)).sum(-1)
    if name == "jsd":
        log_m = torch.logaddexp(log_q, log_p) - math.log(2.0)
        return 0.5 * ((log_p.exp() * (log_p - log_m)).sum(-1) + (log_q.exp() * (log_q - log_m)).sum(-1))
    if name == "tv":
        return 1.0 - overlap
    if name == "nla":
        return -torch.log(overlap.clamp_min(1e-5))
    weight = torch.exp(-3.0 * overlap.detach())                      # lk_hybrid, eta = 3 (the library's default)
    return weight * term_elementwise("kl_div", log_q, log_p, overlap) + (1.0 - weight) * (1.0 - overlap)


def library_loss(logits: torch.Tensor, log_p: torch.Tensor, confidence: torch.Tensor | None, mask: torch.Tensor,
                 block_size: int, objective: Objective, *, sample_from_anchor: bool) -> LossResult:
    """`compound_loss` plus the confidence BCE, as speculators 0.9.0 `dspark/metrics.compute_metrics` sums them."""
    import torch
    import torch.nn.functional as F

    decay = slot_decay(block_size, mask.shape[0], objective.gamma, sample_from_anchor)
    log_q = F.log_softmax(logits, dim=-1, dtype=torch.float32)
    needs_grad = bool(set(objective.loss) & {"tv", "nla", "lk_hybrid"})
    with torch.set_grad_enabled(needs_grad and torch.is_grad_enabled()):
        overlap = torch.minimum(log_q.exp(), log_p.exp()).sum(-1)
    total = torch.zeros((), dtype=torch.float32)
    terms: dict[str, torch.Tensor] = {}
    for name, weight in objective.loss.items():
        elementwise = term_elementwise(name, log_q, log_p, overlap)
        term = (elementwise * mask.to(elementwise.dtype) * decay).sum() / (mask.sum() + TERM_EPS)
        terms[f"{name}_loss"] = term
        total = total + weight * term
    accept_rate = overlap.detach()
    confidence_term = None
    if confidence is not None:
        learned = accept_rate if objective.confidence_target == "overlap" else \
            acceptance_target(log_q.detach().exp(), log_p.exp(), objective.confidence_target)
        bce = F.binary_cross_entropy_with_logits(confidence, learned.to(confidence.dtype), reduction="none")
        confidence_term = (bce * mask.to(bce.dtype) * decay).sum() / (mask.sum() + CONFIDENCE_EPS)
        total = total + objective.alpha * confidence_term
    return LossResult(total=total, terms=terms, confidence=confidence_term, accept_rate=accept_rate, mask=mask)
