"""The `k3_dspark` draft model: DSpark block drafting for Kimi-K3, as serving runtimes compute it.

This file imports only torch, transformers and its sibling files (relative imports of
`configuration_k3_dspark` and `roster_k3_dspark`, the stdlib-only roster the contract shares),
because it is copied verbatim into checkpoints for `trust_remote_code`.

One draft step (inference):
  1. The target's tap hidden states `C[t]` (the outputs of `target_layer_ids`, concatenated, width
     `num_target_layers * target_hidden_size`) for positions `t < p` go through `context_proj` and
     `context_norm`.
  2. Every layer turns that context into its own latent KV rows (`kv_a_proj_with_mqa`,
     `kv_a_layernorm` on the latent part, RoPE on the rope part). Context rows skip `input_layernorm`.
  3. The block `[x_p, M, ..., M]` (anchor then `mask_token_id`, positions `p..p+K-1`) is embedded
     with `embed_tokens` and runs through pre-norm decoder layers: DeepSeek-V3-style MLA with YaRN
     RoPE (interleaved GPT-J pair rotation, softmax scale `qk_head_dim**-0.5 * mscale**2`),
     attending non-causally to every context row and every block row; then a SwiGLU MLP.
  4. `final_norm`. Logits use the target's `lm_head` plus the Markov bias
     `markov_w2(markov_w1[previous token])`; the confidence head is
     `sigmoid(proj([hidden ; markov_w1[previous token]]))`.

Training runs many anchor blocks of one sequence in a single pass: see `anchor_block_inputs` and
`K3DSparkModel.teacher_forced`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel
from transformers import initialization as init
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import BaseModelOutput
from transformers.utils.generic import ModelOutput

from .configuration_k3_dspark import K3DSparkConfig
from .roster_k3_dspark import confidence_head_width, confidence_head_with_markov, tensor_shapes

IGNORE_INDEX = -100


# ----------------------------------------------------------------------------- RoPE / YaRN


def _rope_parameters(config: K3DSparkConfig) -> dict[str, Any]:
    params = dict(getattr(config, "rope_parameters", None) or {})
    params.setdefault("rope_theta", getattr(config, "rope_theta", 10000.0))
    params.setdefault("rope_type", params.get("type", "default"))
    return params


def yarn_get_mscale(scale: float, mscale: float = 1.0) -> float:
    """DeepSeek/YaRN magnitude correction: `0.1 * mscale * ln(scale) + 1` (1 when not scaled)."""
    if scale <= 1:
        return 1.0
    return 0.1 * mscale * math.log(scale) + 1.0


def _uses_yarn(params: dict[str, Any]) -> bool:
    return bool(params["rope_type"] == "yarn")


def yarn_correction_range(config: K3DSparkConfig) -> tuple[float, float]:
    """The (low, high) rotary-pair indices between which YaRN blends interpolation and extrapolation.

    `corr(n) = d * ln(L0 / (2 pi n)) / (2 ln theta)`; low = floor(corr(beta_fast)), high =
    ceil(corr(beta_slow)), clamped to [0, d - 1] (DeepSeek-V3's truncating variant).
    For the reference config this is (15, 26).
    """
    params = _rope_parameters(config)
    dim, base = config.qk_rope_head_dim, params["rope_theta"]
    original = params["original_max_position_embeddings"]

    def correction_dim(rotations: float) -> float:
        return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low = correction_dim(params.get("beta_fast") or 32)
    high = correction_dim(params.get("beta_slow") or 1)
    if params.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    return max(low, 0), min(high, dim - 1)


def rope_inv_freq(config: K3DSparkConfig, device: torch.device | str | None = None) -> torch.Tensor:
    """Per-pair angular frequencies `[qk_rope_head_dim // 2]` (float32), YaRN-blended when configured."""
    params = _rope_parameters(config)
    dim, base = config.qk_rope_head_dim, params["rope_theta"]
    exponents = torch.arange(0, dim, 2, dtype=torch.float32, device=device) / dim
    extrapolated: torch.Tensor = 1.0 / (base ** exponents)
    if not _uses_yarn(params):
        return extrapolated
    interpolated = extrapolated / params["factor"]
    low, high = yarn_correction_range(config)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float32, device=device) - low) / (high - low)).clamp(0, 1)
    # ramp 0 (high-frequency pairs) keeps the original frequency; ramp 1 fully interpolates.
    blended: torch.Tensor = extrapolated * (1 - ramp) + interpolated * ramp
    return blended


def rope_cos_sin_multiplier(config: K3DSparkConfig) -> float:
    """YaRN's cos/sin magnitude factor: `mscale(s, mscale) / mscale(s, mscale_all_dim)` (1.0 for K3)."""
    params = _rope_parameters(config)
    if not _uses_yarn(params):
        return 1.0
    if params.get("attention_factor") is not None:
        return float(params["attention_factor"])
    factor, mscale, mscale_all_dim = params["factor"], params.get("mscale"), params.get("mscale_all_dim")
    if mscale and mscale_all_dim:
        return yarn_get_mscale(factor, mscale) / yarn_get_mscale(factor, mscale_all_dim)
    return yarn_get_mscale(factor)


def softmax_scale(config: K3DSparkConfig) -> float:
    """MLA softmax scale: `qk_head_dim ** -0.5 * mscale(factor, mscale_all_dim) ** 2`.

    0.1308608 for the reference config. Dropping the mscale**2 makes logits 1.81x too cold.
    """
    scale = float((config.qk_nope_head_dim + config.qk_rope_head_dim) ** -0.5)
    params = _rope_parameters(config)
    mscale_all_dim = params.get("mscale_all_dim") or 0
    if params["rope_type"] != "default" and mscale_all_dim:
        scale *= float(yarn_get_mscale(params["factor"], mscale_all_dim)) ** 2
    return scale


def apply_interleaved_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate adjacent channel pairs (2i, 2i+1) by angle i (GPT-J / DeepSeek MLA style).

    Args:
        x: `[..., d]`; pairs are interleaved, not split into halves.
        cos, sin: `[..., d // 2]`, broadcastable to `x[..., ::2]`.

    Returns:
        A tensor of `x`'s shape and dtype, in the same channel layout. Computed in float32.
    """
    pairs = x.float().unflatten(-1, (-1, 2))
    even, odd = pairs[..., 0], pairs[..., 1]
    cos, sin = cos.float(), sin.float()
    rotated = torch.stack((even * cos - odd * sin, odd * cos + even * sin), dim=-1)
    return rotated.flatten(-2).to(x.dtype)


class K3DSparkRotary(nn.Module):
    """Holds the RoPE frequencies (non-persistent) and turns positions into cos/sin of pair angles."""

    inv_freq: torch.Tensor

    def __init__(self, config: K3DSparkConfig) -> None:
        super().__init__()
        self.config = config
        self.multiplier = rope_cos_sin_multiplier(config)
        # No explicit device: under from_pretrained this is built on meta and refilled by reset_frequencies.
        self.register_buffer("inv_freq", rope_inv_freq(config), persistent=False)

    @torch.no_grad()
    def reset_frequencies(self) -> None:
        """Recompute `inv_freq` (needed after meta-device construction leaves it uninitialised)."""
        init.copy_(self.inv_freq, rope_inv_freq(self.config, device=self.inv_freq.device))

    def forward(self, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`position_ids [B, N]` -> `(cos, sin)`, each `[B, N, qk_rope_head_dim // 2]` float32."""
        angles = position_ids[..., None].float() * self.inv_freq.float()
        return angles.cos() * self.multiplier, angles.sin() * self.multiplier


# ----------------------------------------------------------------------------- layers


class K3DSparkRMSNorm(nn.Module):
    """`w * x / sqrt(mean(x^2) + eps)`, normalised in float32 (as DeepSeek-V3)."""

    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        dtype = hidden_states.dtype
        hidden = hidden_states.float()
        hidden = hidden * torch.rsqrt(hidden.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * hidden.to(dtype)


class K3DSparkMLP(nn.Module):
    """SwiGLU: `down(silu(gate(x)) * up(x))`."""

    def __init__(self, config: K3DSparkConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
        return out


class K3DSparkAttention(nn.Module):
    """DeepSeek-V3 MLA without causality: block queries attend to context rows plus all block rows."""

    def __init__(self, config: K3DSparkConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads = config.num_attention_heads
        self.kv_lora_rank = config.kv_lora_rank
        self.qk_nope_head_dim = config.qk_nope_head_dim
        self.qk_rope_head_dim = config.qk_rope_head_dim
        self.v_head_dim = config.v_head_dim
        qk_head_dim = self.qk_nope_head_dim + self.qk_rope_head_dim
        h, eps = config.hidden_size, config.rms_norm_eps
        self.q_a_proj = nn.Linear(h, config.q_lora_rank, bias=False)
        self.q_a_layernorm = K3DSparkRMSNorm(config.q_lora_rank, eps)
        self.q_b_proj = nn.Linear(config.q_lora_rank, self.num_heads * qk_head_dim, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(h, self.kv_lora_rank + self.qk_rope_head_dim, bias=False)
        self.kv_a_layernorm = K3DSparkRMSNorm(self.kv_lora_rank, eps)
        self.kv_b_proj = nn.Linear(self.kv_lora_rank, self.num_heads * (self.qk_nope_head_dim + self.v_head_dim),
                                   bias=False)
        self.o_proj = nn.Linear(self.num_heads * self.v_head_dim, h, bias=False)
        self.scaling = softmax_scale(config)

    def latent_kv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Cacheable latent rows `[B, N, kv_lora_rank + qk_rope_head_dim]`: normed latent | roped key.

        Rows depend only on the input row and its position, so context rows can be computed once
        and reused by every later block.
        """
        latent, k_pe = self.kv_a_proj_with_mqa(x).split([self.kv_lora_rank, self.qk_rope_head_dim], dim=-1)
        return torch.cat((self.kv_a_layernorm(latent), apply_interleaved_rope(k_pe, cos, sin)), dim=-1)

    def forward(
        self,
        hidden_states: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        context_latent: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Attention output for the block rows.

        Args:
            hidden_states: `[B, S, D]` block rows after `input_layernorm`.
            cos, sin: `[B, S, rope/2]` for the block rows' positions.
            context_latent: `[B, C, kv_lora_rank + rope]` from `latent_kv` (keys come first), or None.
            attention_mask: `[B, 1, S, C + S]` bool (True = may attend) or additive float; None = all.
        """
        batch, seq, _ = hidden_states.shape
        q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(hidden_states)))
        q = q.view(batch, seq, self.num_heads, -1).transpose(1, 2)
        q_nope, q_pe = q.split([self.qk_nope_head_dim, self.qk_rope_head_dim], dim=-1)
        q_pe = apply_interleaved_rope(q_pe, cos[:, None], sin[:, None])

        latent = self.latent_kv(hidden_states, cos, sin)
        if context_latent is not None:
            latent = torch.cat((context_latent.to(latent.dtype), latent), dim=1)
        rows = latent.shape[1]
        compressed, k_pe = latent.split([self.kv_lora_rank, self.qk_rope_head_dim], dim=-1)
        kv = self.kv_b_proj(compressed).view(batch, rows, self.num_heads, -1).transpose(1, 2)
        k_nope, value = kv.split([self.qk_nope_head_dim, self.v_head_dim], dim=-1)
        k_pe = k_pe[:, None].expand(-1, self.num_heads, -1, -1)  # one rope key shared by all heads

        query = torch.cat((q_nope, q_pe), dim=-1)
        key = torch.cat((k_nope, k_pe), dim=-1)
        out = F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, scale=self.scaling)
        projected: torch.Tensor = self.o_proj(out.transpose(1, 2).reshape(batch, seq, self.num_heads * self.v_head_dim))
        return projected


class K3DSparkDecoderLayer(GradientCheckpointingLayer):
    """Pre-norm residual layer: `h += attn(input_layernorm(h), context)`; `h += mlp(post_norm(h))`."""

    def __init__(self, config: K3DSparkConfig, layer_idx: int) -> None:
        super().__init__()
        self.input_layernorm = K3DSparkRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = K3DSparkAttention(config, layer_idx)
        self.post_attention_layernorm = K3DSparkRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = K3DSparkMLP(config)

    def forward(
        self,
        hidden_states: torch.Tensor,
        context_hidden: torch.Tensor | None,
        context_latent: torch.Tensor | None,
        block_cos: torch.Tensor,
        block_sin: torch.Tensor,
        context_cos: torch.Tensor | None,
        context_sin: torch.Tensor | None,
        attention_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Block rows `[B, S, D]` in, block rows out. Context enters as projected hidden
        (`context_hidden`, turned into this layer's latent rows here, without `input_layernorm`)
        or as precomputed `context_latent`."""
        if context_latent is None and context_hidden is not None:
            assert context_cos is not None and context_sin is not None   # they come with context_hidden
            context_latent = self.self_attn.latent_kv(context_hidden, context_cos, context_sin)
        residual = hidden_states
        attn = self.self_attn(self.input_layernorm(hidden_states), block_cos, block_sin, context_latent,
                              attention_mask)
        hidden_states = residual + attn
        out: torch.Tensor = hidden_states + self.mlp(self.post_attention_layernorm(hidden_states))
        return out


class K3DSparkMarkovHead(nn.Module):
    """Vanilla Markov bias: `markov_w2(markov_w1[previous token])` -> `[..., draft_vocab_size]`."""

    def __init__(self, config: K3DSparkConfig) -> None:
        super().__init__()
        self.markov_w1 = nn.Embedding(config.vocab_size, config.markov_rank)
        self.markov_w2 = nn.Linear(config.markov_rank, config.draft_vocab_size, bias=False)

    def forward(self, prev_ids: torch.Tensor) -> torch.Tensor:
        bias: torch.Tensor = self.markov_w2(self.markov_w1(prev_ids))
        return bias


class K3DSparkConfidenceHead(nn.Module):
    """`proj([hidden ; markov_w1[prev]])` (or `proj(hidden)` without Markov): a logit per slot."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.proj = nn.Linear(width, 1, bias=True)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        # float32 like vLLM's compute_confidence; the head is tiny.
        return F.linear(features.float(), self.proj.weight.float(), self.proj.bias.float()).squeeze(-1)


# ----------------------------------------------------------------------------- outputs


@dataclass
class K3DSparkProposal(ModelOutput):
    """A greedily drafted block.

    Attributes:
        tokens: `[B, K]` drafted tokens d_0..d_{K-1} (slot k drafts position p + k + 1).
        logits: `[B, K, draft_vocab_size]` float32 Markov-corrected logits each draft was taken from.
        confidence: `[B, K]` acceptance probabilities, or None without a confidence head.
        last_hidden_state: `[B, K, hidden_size]` after `final_norm`.
    """

    tokens: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    confidence: torch.Tensor | None = None
    last_hidden_state: torch.Tensor | None = None


@dataclass
class K3DSparkTeacherForcedOutput(ModelOutput):
    """All anchor blocks of a packed teacher-forced pass, reshaped per block.

    Attributes:
        last_hidden_state: `[B, A, K, D]` after `final_norm`.
        labels: `[B, A, K]` token slot k should draft, `x[a + k + 1]`; `-100` where there is none
            (past the sequence end, across a document boundary, or an invalid anchor).
        prev_ids: `[B, A, K]` teacher-forced Markov predecessors `x[a + k]` (slot 0: the anchor).
        target_positions: `[B, A, K]` `a + k`, the row of the target's logits to distil slot k from
            (clamped into the sequence; only meaningful where `labels != -100`).
        logits: `[B, A, K, draft_vocab_size]` float32 Markov-corrected logits (if an lm_head was given).
        confidence_logits: `[B, A, K]` pre-sigmoid confidence (if the model has a confidence head).
    """

    last_hidden_state: torch.Tensor | None = None
    labels: torch.Tensor | None = None
    prev_ids: torch.Tensor | None = None
    target_positions: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    confidence_logits: torch.Tensor | None = None


# ----------------------------------------------------------------------------- packed training inputs


def anchor_block_inputs(
    input_ids: torch.Tensor,
    anchors: torch.Tensor,
    block_size: int,
    mask_token_id: int,
    *,
    context_position_ids: torch.Tensor | None = None,
    doc_ids: torch.Tensor | None = None,
    anchor_valid: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """Build the packed many-anchor input of one teacher-forced pass (block-sparse, non-causal).

    Every position `t` of the sequence is a context row (its taps are `context_states[:, t]`);
    after them come A blocks of K rows, block j = `[x[a_j], M, ..., M]` at positions
    `pos[a_j] + 0..K-1`. Block j's rows may see context row t iff `t < a_j` (strictly before the
    anchor, exactly the cache rows serving would hold) and, with `doc_ids`, `doc[t] == doc[a_j]`
    and `doc[t] >= 0`; plus all K rows of block j. Never other blocks, never later context.

    Args:
        input_ids: `[B, T]` sequence tokens.
        anchors: `[B, A]` anchor indices into the sequence (0 <= a < T).
        block_size: K, rows per block (7 for Kimi-K3 serving).
        mask_token_id: Token for slots 1..K-1.
        context_position_ids: `[B, T]` RoPE positions of the context rows (default `0..T-1`;
            pass per-document positions for packed rows).
        doc_ids: `[B, T]` document id per position (-1 = padding), for packed sequences.
        anchor_valid: `[B, A]` bool; invalid (padding) anchors still get rows but no labels.

    Returns:
        A dict with `input_ids [B, A*K]`, `position_ids [B, T + A*K]` (context then blocks),
        `attention_mask [B, A*K, T + A*K]` bool, and per-slot `labels`, `prev_ids`,
        `target_positions` (`[B, A, K]`, see `K3DSparkTeacherForcedOutput`). Feed the first three
        to `K3DSparkModel.forward` together with `context_states [B, T, ...]`.
    """
    batch, seq = input_ids.shape
    device = input_ids.device
    num_anchors = anchors.shape[1]
    anchors = anchors.long()
    offsets = torch.arange(block_size, device=device)
    slot_pos = anchors[..., None] + offsets  # [B, A, K] sequence index a + k

    block_ids = torch.full((batch, num_anchors, block_size), mask_token_id, dtype=input_ids.dtype, device=device)
    block_ids[..., 0] = input_ids.gather(1, anchors)

    if context_position_ids is None:
        context_position_ids = torch.arange(seq, device=device).expand(batch, seq)
    block_positions = context_position_ids.gather(1, anchors)[..., None] + offsets
    position_ids = torch.cat((context_position_ids, block_positions.reshape(batch, -1)), dim=1)

    visible = torch.arange(seq, device=device)[None, None, :] < anchors[..., None]  # [B, A, T]
    if doc_ids is not None:
        anchor_doc = doc_ids.gather(1, anchors)
        visible &= (doc_ids[:, None, :] == anchor_doc[..., None]) & (doc_ids[:, None, :] >= 0)
    own_block = torch.eye(num_anchors, dtype=torch.bool, device=device)[None, :, :, None]
    own_block = own_block.expand(batch, -1, -1, block_size).reshape(batch, num_anchors, num_anchors * block_size)
    per_block = torch.cat((visible, own_block), dim=-1)  # [B, A, T + A*K]
    attention_mask = per_block.repeat_interleave(block_size, dim=1)

    label_pos = slot_pos + 1
    in_range = label_pos < seq
    clamped_label = label_pos.clamp(max=seq - 1)
    labels = input_ids.gather(1, clamped_label.reshape(batch, -1)).reshape_as(label_pos)
    keep = in_range
    if doc_ids is not None:
        anchor_doc = doc_ids.gather(1, anchors)[..., None]
        keep = keep & (doc_ids.gather(1, clamped_label.reshape(batch, -1)).reshape_as(label_pos) == anchor_doc)
    if anchor_valid is not None:
        keep = keep & anchor_valid[..., None].bool()
    labels = labels.masked_fill(~keep, IGNORE_INDEX)
    clamped_slot = slot_pos.clamp(max=seq - 1)
    prev_ids = input_ids.gather(1, clamped_slot.reshape(batch, -1)).reshape_as(slot_pos)
    return {
        "input_ids": block_ids.reshape(batch, -1),
        "position_ids": position_ids,
        "attention_mask": attention_mask,
        "labels": labels,
        "prev_ids": prev_ids,
        "target_positions": clamped_slot,
    }


def _prepare_attention_mask(mask: torch.Tensor | None, batch: int, rows: int, keys: int,
                            dtype: torch.dtype) -> torch.Tensor | None:
    if mask is None:
        return None
    if mask.dim() == 2:
        mask = mask[None, None]
    elif mask.dim() == 3:
        mask = mask[:, None]
    if mask.shape[-2:] != (rows, keys):
        raise ValueError(f"attention_mask: last two dims must be (block rows {rows}, context + block rows {keys}), "
                         f"got {tuple(mask.shape)}")
    return mask if mask.dtype == torch.bool else mask.to(dtype)


# ----------------------------------------------------------------------------- models


class K3DSparkPreTrainedModel(PreTrainedModel):
    config_class = K3DSparkConfig
    base_model_prefix = ""
    main_input_name = "input_ids"
    supports_gradient_checkpointing = True
    # Instance-level in PreTrainedModel's declarations (so not ClassVar); never mutated.
    _no_split_modules: list[str] = ["K3DSparkDecoderLayer"]  # noqa: RUF012
    _tied_weights_keys: dict[str, str] = {}  # noqa: RUF012

    def _init_weights(self, module: nn.Module) -> None:
        super()._init_weights(module)  # type: ignore[no-untyped-call]  # transformers leaves it untyped
        if isinstance(module, K3DSparkRotary):
            module.reset_frequencies()


class K3DSparkModel(K3DSparkPreTrainedModel):
    """The `k3_dspark` draft. State-dict names equal the published checkpoint's (no prefix).

    Python interface:
      - `model(input_ids=[B, S], context_states=[B, C, T*Ht])` -> `.last_hidden_state [B, S, D]`.
      - `model.markov_bias(prev_ids)`, `model.confidence(hidden, prev_ids)`,
        `model.draft_logits(hidden, lm_head_weight, prev_ids)`.
      - `model.propose_block(context_states, anchor_ids, lm_head_weight)`: greedy block drafting.
      - `model.teacher_forced(context_states, input_ids, anchors, ...)`: packed training pass.
    """

    def __init__(self, config: K3DSparkConfig) -> None:
        super().__init__(config)
        if config.markov_head_type != "vanilla":
            raise ValueError(f"markov_head_type: {config.markov_head_type!r} is not supported; use 'vanilla'")
        if config.mla_use_nope or config.mla_use_output_gate:
            raise ValueError("mla_use_nope / mla_use_output_gate: the k3_dspark draft uses RoPE MLA without a gate")
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.context_proj = nn.Linear(config.num_target_layers * config.target_hidden_size, config.hidden_size,
                                      bias=False)
        self.context_norm = K3DSparkRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.layers = nn.ModuleList(K3DSparkDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.final_norm = K3DSparkRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary_emb = K3DSparkRotary(config)
        self.markov_head = K3DSparkMarkovHead(config)
        # The roster decides which heads exist (the contract reads the same function).
        width = confidence_head_width(config)
        self.confidence_head = K3DSparkConfidenceHead(width) if width is not None else None
        self._check_roster(config)
        self.gradient_checkpointing = False
        self.post_init()  # type: ignore[no-untyped-call]  # transformers leaves it untyped

    def _check_roster(self, config: K3DSparkConfig) -> None:
        """Refuse to build a model whose state dict differs from the checkpoint roster of its config."""
        built = {name: tuple(tensor.shape) for name, tensor in self.state_dict().items()}
        expected = tensor_shapes(config)
        if built != expected:
            differing = sorted(n for n in built.keys() | expected.keys() if built.get(n) != expected.get(n))
            raise ValueError(f"K3DSparkModel: modules differ from the config's roster at {', '.join(differing[:5])}; "
                             "roster_k3_dspark.tensor_shapes and the model must change together")

    def get_input_embeddings(self) -> nn.Module:
        return self.embed_tokens

    def set_input_embeddings(self, value: nn.Module) -> None:
        # transformers' signature takes any Module; what it passes here is the resized nn.Embedding
        self.embed_tokens = value   # type: ignore[assignment]

    # -- context ----------------------------------------------------------------------------

    def project_context(self, context_states: torch.Tensor) -> torch.Tensor:
        """`context_norm(context_proj(C))`: `[B, C, T*Ht]` -> `[B, C, D]`.

        Raises:
            ValueError: `context_states` is not `[B, C, num_target_layers x target_hidden_size]`.
        """
        self.check_context(context_states)
        context: torch.Tensor = self.context_norm(self.context_proj(context_states.to(self.context_proj.weight.dtype)))
        return context

    def check_context(self, context_states: torch.Tensor) -> None:
        """Refuse context states whose width is not `num_target_layers x target_hidden_size`.

        Raises:
            ValueError: naming both widths, before any shape error deep inside a matmul.
        """
        config = self.config
        width = config.num_target_layers * config.target_hidden_size
        if context_states.dim() != 3 or context_states.shape[-1] != width:
            raise ValueError(
                f"context_states has shape {list(context_states.shape)}; expected [batch, rows, {width}]: "
                f"num_target_layers x target_hidden_size = {config.num_target_layers} x {config.target_hidden_size}, "
                f"the {config.num_target_layers} tapped target layers (target_layer_ids "
                f"{list(config.target_layer_ids)}) concatenated in ascending order")

    def encode_context(self, context_states: torch.Tensor,
                       position_ids: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
        """Per-layer latent KV rows of the context (what a serving cache holds).

        Args:
            context_states: `[B, C, T*Ht]` concatenated target taps.
            position_ids: `[B, C]` positions (default `0..C-1`).

        Returns:
            One `[B, C, kv_lora_rank + qk_rope_head_dim]` tensor per layer; pass them back as
            `forward(context_latents=...)` to reuse them across blocks.
        """
        batch, rows = context_states.shape[:2]
        if position_ids is None:
            position_ids = torch.arange(rows, device=context_states.device).expand(batch, rows)
        cos, sin = self.rotary_emb(position_ids)
        hidden = self.project_context(context_states)
        return tuple(cast(K3DSparkDecoderLayer, layer).self_attn.latent_kv(hidden, cos, sin) for layer in self.layers)

    # -- forward ----------------------------------------------------------------------------

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        context_states: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        context_latents: tuple[torch.Tensor, ...] | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs: Any,
    ) -> BaseModelOutput | tuple[Any, ...]:
        """Run the block rows through the draft, attending to the context.

        Args:
            input_ids: `[B, S]` block tokens (anchor then mask tokens; or many packed blocks).
            context_states: `[B, C, num_target_layers * target_hidden_size]` target taps.
            position_ids: `[B, C + S]` (context rows then block rows) or `[B, S]` (block rows only;
                context rows then get `0..C-1`). Default: context `0..C-1`, block `C..C+S-1`.
            attention_mask: `[B, S, C + S]` (or `[B, 1, S, C + S]`, or `[S, C + S]`) over keys
                ordered context then block; bool True = may attend, or an additive float mask.
                Default None: every block row sees every context and block row (non-causal).
                Every row must see at least one key.
            inputs_embeds: `[B, S, D]` instead of `input_ids`.
            context_latents: per-layer rows from `encode_context`, instead of `context_states`.
            output_hidden_states: also return the block rows entering each layer, and the output.

        Returns:
            `BaseModelOutput` with `last_hidden_state [B, S, D]` after `final_norm`.
        """
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("pass exactly one of input_ids and inputs_embeds")
        if context_states is not None and context_latents is not None:
            raise ValueError("pass at most one of context_states and context_latents")
        if context_states is not None:
            self.check_context(context_states)
        hidden = self.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds
        batch, seq = hidden.shape[:2]
        if context_states is not None:
            context_rows = context_states.shape[1]
        elif context_latents is not None:
            context_rows = context_latents[0].shape[1]
        else:
            context_rows = 0

        context_pos, block_pos = self._split_positions(position_ids, batch, context_rows, seq, hidden.device)
        block_cos, block_sin = self.rotary_emb(block_pos)
        context_cos = context_sin = context_hidden = None
        if context_states is not None:
            context_cos, context_sin = self.rotary_emb(context_pos)
            context_hidden = self.project_context(context_states)
        mask = _prepare_attention_mask(attention_mask, batch, seq, context_rows + seq, hidden.dtype)

        all_hidden: list[torch.Tensor] | None = [] if output_hidden_states else None
        for i, layer in enumerate(self.layers):
            if all_hidden is not None:
                all_hidden.append(hidden)
            latent = context_latents[i] if context_latents is not None else None
            hidden = layer(hidden, context_hidden, latent, block_cos, block_sin, context_cos, context_sin, mask)
        hidden = self.final_norm(hidden)
        if all_hidden is not None:
            all_hidden.append(hidden)
        output = BaseModelOutput(last_hidden_state=hidden,
                                 hidden_states=tuple(all_hidden) if all_hidden is not None else None)
        return output if return_dict is not False else output.to_tuple()

    @staticmethod
    def _split_positions(position_ids: torch.Tensor | None, batch: int, context_rows: int, seq: int,
                         device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        if position_ids is None:
            position_ids = torch.arange(context_rows + seq, device=device)
        if position_ids.dim() == 1:
            position_ids = position_ids[None]
        position_ids = position_ids.expand(batch, -1)
        if position_ids.shape[-1] == context_rows + seq:
            return position_ids[:, :context_rows], position_ids[:, context_rows:]
        if position_ids.shape[-1] == seq:
            return torch.arange(context_rows, device=device).expand(batch, context_rows), position_ids
        raise ValueError(f"position_ids: expected {context_rows + seq} (context + block) or {seq} (block) "
                         f"positions, got {position_ids.shape[-1]}")

    # -- heads ------------------------------------------------------------------------------

    def markov_bias(self, prev_ids: torch.Tensor) -> torch.Tensor:
        """Vanilla Markov bias `markov_w2(markov_w1[prev_ids])`: `[...]` -> `[..., draft_vocab_size]`."""
        bias: torch.Tensor = self.markov_head(prev_ids)
        return bias

    def confidence_logits(self, hidden: torch.Tensor, prev_ids: torch.Tensor) -> torch.Tensor:
        """Pre-sigmoid confidence `proj([hidden ; markov_w1[prev_ids]])`, float32, shape `hidden[..., 0]`."""
        if self.confidence_head is None:
            raise ValueError("confidence_logits: this draft has no confidence head (enable_confidence_head is false)")
        features = hidden
        if confidence_head_with_markov(self.config):
            markov = self.markov_head.markov_w1(prev_ids)
            features = torch.cat((hidden.float(), markov.float()), dim=-1)
        confidence: torch.Tensor = self.confidence_head(features)
        return confidence

    def confidence(self, hidden: torch.Tensor, prev_ids: torch.Tensor) -> torch.Tensor:
        """Estimated acceptance probability of each slot's draft, given its Markov predecessor.

        Args:
            hidden: `[..., D]` final-normed block rows.
            prev_ids: `[...]` the token preceding each slot's draft (anchor for slot 0).
        """
        return torch.sigmoid(self.confidence_logits(hidden, prev_ids))

    def draft_logits(self, hidden: torch.Tensor, lm_head_weight: torch.Tensor,
                     prev_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Float32 logits `hidden @ lm_head.T (+ markov_bias(prev_ids))`.

        Args:
            hidden: `[..., D]` final-normed block rows.
            lm_head_weight: the target's lm_head weight `[draft_vocab_size, D]` (not in the checkpoint).
            prev_ids: `[...]` Markov predecessors, or None for the base logits only.
        """
        if lm_head_weight.shape[0] != self.config.draft_vocab_size:
            raise ValueError(f"lm_head_weight: {lm_head_weight.shape[0]} rows, expected draft_vocab_size "
                             f"{self.config.draft_vocab_size}")
        logits = F.linear(hidden.to(lm_head_weight.dtype), lm_head_weight).float()
        if prev_ids is not None:
            logits = logits + self.markov_bias(prev_ids).float()
        return logits

    # -- drafting / training ------------------------------------------------------------------

    @torch.no_grad()
    def propose_block(
        self,
        context_states: torch.Tensor | None,
        anchor_ids: torch.Tensor,
        lm_head_weight: torch.Tensor,
        *,
        block_size: int = 7,
        position_ids: torch.Tensor | None = None,
        context_latents: tuple[torch.Tensor, ...] | None = None,
    ) -> K3DSparkProposal:
        """Greedy block proposal: one forward, then the Markov chain over the block's own drafts.

        The block is `[anchor, M, ..., M]`; by default the context rows are positions `0..C-1`
        and the anchor sits at `C` (the context holds the taps of every token before the anchor).
        Slot k's logits are `lm_head(z_k) + markov_bias(prev_k)` with `prev_0 = anchor` and
        `prev_k = d_{k-1}`; `confidence_k` uses the same `prev_k`.

        Args:
            context_states: `[B, C, T*Ht]` taps of positions before the anchor (or None with
                `context_latents`).
            anchor_ids: `[B]` the newest target token x_p.
            lm_head_weight: `[draft_vocab_size, D]` the target's lm_head weight.
            block_size: K drafts per block.
            position_ids: as in `forward` (`[B, C + K]` or `[B, K]`).
            context_latents: per-layer rows from `encode_context`, instead of `context_states`.
        """
        hidden = self(input_ids=self.draft_block(anchor_ids, block_size), context_states=context_states,
                      position_ids=position_ids, context_latents=context_latents).last_hidden_state
        return self.decode_block(hidden, anchor_ids, lm_head_weight)

    def draft_block(self, anchor_ids: torch.Tensor, block_size: int) -> torch.Tensor:
        """The block's input ids `[anchor, M, ..., M]`: `[B]` -> `[B, block_size]`."""
        block = torch.full((anchor_ids.shape[0], block_size), self.config.mask_token_id, dtype=torch.long,
                           device=anchor_ids.device)
        block[:, 0] = anchor_ids
        return block

    @torch.no_grad()
    def decode_block(self, hidden: torch.Tensor, anchor_ids: torch.Tensor,
                     lm_head_weight: torch.Tensor) -> K3DSparkProposal:
        """Greedy drafts from a block's final rows: the lm_head, then the Markov chain (`propose_block`).

        Args:
            hidden: `[B, K, D]` final-normed block rows (`forward`'s `last_hidden_state`).
            anchor_ids: `[B]` each block's anchor, the first Markov predecessor.
            lm_head_weight: `[draft_vocab_size, D]` the target's lm_head weight.
        """
        block_size = hidden.shape[1]
        base = self.draft_logits(hidden, lm_head_weight)
        prev = anchor_ids.long()
        tokens, logits, confidence = [], [], []
        for k in range(block_size):
            step = base[:, k] + self.markov_bias(prev).float()
            if self.confidence_head is not None:
                confidence.append(self.confidence(hidden[:, k], prev))
            prev = step.argmax(dim=-1)
            tokens.append(prev)
            logits.append(step)
        return K3DSparkProposal(
            tokens=torch.stack(tokens, dim=1),
            logits=torch.stack(logits, dim=1),
            confidence=torch.stack(confidence, dim=1) if confidence else None,
            last_hidden_state=hidden,
        )

    def teacher_forced(
        self,
        context_states: torch.Tensor,
        input_ids: torch.Tensor,
        anchors: torch.Tensor,
        *,
        block_size: int = 7,
        lm_head_weight: torch.Tensor | None = None,
        context_position_ids: torch.Tensor | None = None,
        doc_ids: torch.Tensor | None = None,
        anchor_valid: torch.Tensor | None = None,
    ) -> K3DSparkTeacherForcedOutput:
        """Teacher-forced training pass: A anchor blocks of each sequence in ONE forward.

        Each block j sees only the context rows before its anchor (see `anchor_block_inputs`), so
        its output equals a separate inference call with `context_states[:, :a_j]`. The Markov
        predecessor of slot k is the data token `x[a + k]` (teacher forcing), as TorchSpec,
        DeepSpec and speculators train.

        Args:
            context_states: `[B, T, T*Ht]` target taps of every sequence position.
            input_ids: `[B, T]` sequence tokens.
            anchors: `[B, A]` anchor indices (sorted or not), `0 <= a < T`.
            block_size: K rows per block.
            lm_head_weight: target lm_head `[draft_vocab_size, D]`; if given, `logits` is filled.
            context_position_ids, doc_ids, anchor_valid: see `anchor_block_inputs`.

        Returns:
            `K3DSparkTeacherForcedOutput` with per-block `[B, A, K, ...]` tensors; build the losses
            from `logits`, `labels`, `confidence_logits` and the target's logits at
            `target_positions`.
        """
        packed = anchor_block_inputs(input_ids, anchors, block_size, self.config.mask_token_id,
                                     context_position_ids=context_position_ids, doc_ids=doc_ids,
                                     anchor_valid=anchor_valid)
        hidden = self(input_ids=packed["input_ids"], context_states=context_states,
                      position_ids=packed["position_ids"], attention_mask=packed["attention_mask"]).last_hidden_state
        hidden = hidden.unflatten(1, (anchors.shape[1], block_size))
        prev_ids = packed["prev_ids"]
        logits = self.draft_logits(hidden, lm_head_weight, prev_ids) if lm_head_weight is not None else None
        confidence_logits = (self.confidence_logits(hidden, prev_ids)
                             if self.confidence_head is not None else None)
        return K3DSparkTeacherForcedOutput(
            last_hidden_state=hidden,
            labels=packed["labels"],
            prev_ids=prev_ids,
            target_positions=packed["target_positions"],
            logits=logits,
            confidence_logits=confidence_logits,
        )


__all__ = [
    "K3DSparkModel",
    "K3DSparkPreTrainedModel",
    "K3DSparkProposal",
    "K3DSparkTeacherForcedOutput",
    "anchor_block_inputs",
    "apply_interleaved_rope",
    "rope_cos_sin_multiplier",
    "rope_inv_freq",
    "softmax_scale",
    "yarn_correction_range",
    "yarn_get_mscale",
]
