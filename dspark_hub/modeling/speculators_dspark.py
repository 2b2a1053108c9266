"""The speculators-format DSpark draft (`speculators` 0.9.0 `DSparkDraftModel`) in plain PyTorch.

No `speculators` import: the forward is written from the library's code and checked against the
outputs its own training forward recorded (`tests/fixtures/specdec/library_forward.safetensors`,
every DSpark variant: sliding and full attention, vanilla/gated/rnn Markov heads, pruned
vocabulary, bonus anchor, no confidence head). The inference side (`propose`) is what vLLM
0.32.0's `DSparkSpeculator` does on the V2 model runner; the acceptance-parity tests compare it
with vLLM's own counts.

For an anchor `x_p` at position `p` (the target has states for positions `0..p-1`):

1. context: `c_t = RMSNorm_hidden_norm(fc(concat_k h_k[t]))` over the taps in the order of
   `aux_hidden_state_layer_ids` (id `k` = the residual after `k` target layers); no
   `input_layernorm` on the context;
2. the block: ids `[x_p, M, ..., M]` (`mask_token_id`), embedded with the TARGET's embedding, at
   positions `p, p+1, ...`;
3. per layer: `u = input_layernorm(h)`; `q = q_norm(q_proj u)`; keys and values of the context rows
   `t < p` (and `t >= p - sliding_window` on `sliding_attention` layers) and of the block rows, with
   the same `k_proj`/`v_proj` and `k_norm`; RoPE (transformers' Qwen3 rotary for the layer
   config's `rope_parameters`, the half-split layout) at the rows' absolute positions; GQA
   attention, non-causal inside the block on full-attention layers, causal on sliding ones unless
   `sliding_window_non_causal`; `o_proj`, residual, `post_attention_layernorm`, SwiGLU MLP, residual;
4. `z = norm(h)`, base logits `lm_head(z)` (the target's `lm_head`, or the saved rows of a pruned
   vocabulary: draft id `d` is target id `d + d2t[d]`);
5. the Markov head adds `W2 e` with `e = markov_w1[prev]` (vanilla), `W2 (sigmoid(gate [z; e]) * e)`
   (gated) or the rnn chain; `prev` is the anchor for the first sampled slot and the previous
   slot's token after it: the truth when teacher-forced (training), the draft's own token when
   proposing (vLLM);
6. confidence `sigmoid(proj [z; e])` (or `[z]` without Markov input), training and adaptive
   verification only.

`sample_from_anchor` (the speculators default): `k = block_size` slots, slot `i` predicts `x_{p+i+1}`.
Without it (the bonus-anchor, DFlash-style layout) slots `1..k` are sampled, slot `i` predicting
`x_{p+i}`, and the block has `1 + k` rows.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from dspark_hub.errors import UsageError
from dspark_hub.format import speculators as spec_format
from dspark_hub.format.contract import CONFIG_NAME
from dspark_hub.format.folder import read_regular
from dspark_hub.format.jsonio import load_json_object
from dspark_hub.format.tensorio import tensor_files


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' Qwen3 RMSNorm: statistics in float32, the weight applied in the input dtype."""
    variance = x.float().pow(2).mean(-1, keepdim=True)
    return weight * (x.float() * torch.rsqrt(variance + eps)).to(x.dtype)


def rotary_embedding(layer: Mapping[str, Any]) -> Any:
    """transformers' Qwen3 rotary embedding for a draft's `transformer_layer_config` (what the library builds)."""
    from transformers import Qwen3Config
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding

    keys = ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "max_position_embeddings",
            "rope_parameters", "rope_scaling", "rope_theta", "partial_rotary_factor")
    return Qwen3RotaryEmbedding(Qwen3Config(**{k: layer[k] for k in keys if layer.get(k) is not None}))


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def read_tensors(folder: str | os.PathLike[str]) -> dict[str, torch.Tensor]:
    """Every tensor of a checkpoint folder (one file, or an index and its shards)."""
    from safetensors.torch import load as load_file

    tensors: dict[str, torch.Tensor] = {}
    for file in sorted(set(tensor_files(folder).values())):
        tensors.update(load_file(read_regular(file)))    # bytes read through open_regular: no native open
    return tensors


@dataclass
class LayerKV:
    """One draft layer's context keys (normed, rotated) and values, for positions `0..n-1`."""

    keys: torch.Tensor      # [n, kv, d]
    values: torch.Tensor    # [n, kv, d]


class SpeculatorsDSpark:
    """A speculators DSpark checkpoint with the target's embedding (and `lm_head`), as one forward.

    Args:
        config: the checkpoint's `config.json`.
        tensors: its tensors (`read_tensors`).
        embed: the target's input embedding `[V, H]` (the draft never saves one).
        lm_head: the target's `lm_head` `[V, H]`; a pruned draft's saved `lm_head` wins.
        dtype: compute dtype (float32 for evaluation: what vLLM runs on CPU).
        markov: False drops the Markov head (a control: what a runtime that ignored it would do).

    Raises:
        UsageError: the config is not a speculators DSpark this forward implements.
    """

    def __init__(self, config: Mapping[str, Any], tensors: Mapping[str, torch.Tensor], embed: torch.Tensor,
                 lm_head: torch.Tensor, *, dtype: torch.dtype = torch.float32, markov: bool = True) -> None:
        if not spec_format.is_dspark(config):
            raise UsageError(f"config.json: {spec_format.TYPE_KEY} is {config.get(spec_format.TYPE_KEY)!r}; "
                             "this forward implements the speculators DSpark only")
        self.config = dict(config)
        self.geometry = spec_format.geometry(config)
        self.dtype = dtype
        self.w = {name: (t.to(dtype) if t.is_floating_point() else t) for name, t in tensors.items()}
        self.embed = embed.to(dtype)
        self.lm_head = self.w.get("lm_head.weight", lm_head.to(dtype))
        self.d2t = self.w.get("d2t")
        self.markov = markov and self.geometry.markov_rank > 0
        layer = spec_format.layer_config(config)
        self.eps = float(layer.get("rms_norm_eps", 1e-6))
        self.layer_types = list(layer.get("layer_types") or ["full_attention"] * self.geometry.layers)
        self.window = layer.get("sliding_window")
        self.non_causal_sliding = bool(config.get("sliding_window_non_causal", False))
        self._rotary = rotary_embedding(layer)

    @classmethod
    def from_folder(cls, folder: str | os.PathLike[str], embed: torch.Tensor, lm_head: torch.Tensor,
                    **options: Any) -> SpeculatorsDSpark:
        return cls(load_json_object(Path(folder) / CONFIG_NAME), read_tensors(folder), embed, lm_head, **options)

    # -- config facts -------------------------------------------------------------------------

    @property
    def block_size(self) -> int:
        return int(self.config.get("block_size", spec_format.DEFAULTS["block_size"]))

    @property
    def sample_from_anchor(self) -> bool:
        return bool(self.config.get("sample_from_anchor", spec_format.DEFAULTS["sample_from_anchor"]))

    @property
    def mask_token_id(self) -> int:
        return int(self.config["mask_token_id"])

    @property
    def aux_ids(self) -> list[int]:
        return list(self.config[spec_format.AUX_IDS_KEY])

    # -- pieces --------------------------------------------------------------------------------

    def rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin `[n, d]` for absolute positions (transformers' computation, float32, then the dtype)."""
        probe = torch.zeros(1, dtype=self.dtype)
        cos, sin = self._rotary(probe, positions[None].long())
        return cos[0].to(self.dtype), sin[0].to(self.dtype)

    def _linear(self, x: torch.Tensor, name: str) -> torch.Tensor:
        return F.linear(x, self.w[f"{name}.weight"], self.w.get(f"{name}.bias"))

    def context(self, taps: torch.Tensor) -> torch.Tensor:
        """`hidden_norm(fc(taps))`: `[n, T*Ht]` concatenated taps -> `[n, H]` context rows."""
        return rms_norm(self._linear(taps.to(self.dtype), "fc"), self.w["hidden_norm.weight"], self.eps)

    def context_kv(self, context: torch.Tensor) -> list[LayerKV]:
        """Per layer, the keys and values of context rows at positions `0..n-1` (what a serving cache holds)."""
        g = self.geometry
        cos, sin = self.rope(torch.arange(context.shape[0]))
        out = []
        for i in range(g.layers):
            p = f"layers.{i}.self_attn."
            k = self._linear(context, p + "k_proj").view(-1, g.kv_heads, g.head_dim)
            k = rms_norm(k, self.w[p + "k_norm.weight"], self.eps)
            k = k * cos[:, None] + _rotate_half(k) * sin[:, None]
            v = self._linear(context, p + "v_proj").view(-1, g.kv_heads, g.head_dim)
            out.append(LayerKV(k, v))
        return out

    def _attention(self, i: int, u: torch.Tensor, positions: torch.Tensor, kv: LayerKV, p: int) -> torch.Tensor:
        g = self.geometry
        pre = f"layers.{i}.self_attn."
        rows = u.shape[0]
        cos, sin = self.rope(positions)
        q = rms_norm(self._linear(u, pre + "q_proj").view(rows, g.heads, g.head_dim), self.w[pre + "q_norm.weight"],
                     self.eps)
        q = q * cos[:, None] + _rotate_half(q) * sin[:, None]
        k = rms_norm(self._linear(u, pre + "k_proj").view(rows, g.kv_heads, g.head_dim),
                     self.w[pre + "k_norm.weight"], self.eps)
        k = k * cos[:, None] + _rotate_half(k) * sin[:, None]
        v = self._linear(u, pre + "v_proj").view(rows, g.kv_heads, g.head_dim)
        sliding = self.layer_types[i] == "sliding_attention"
        low = max(0, p - int(self.window)) if sliding and self.window else 0
        keys = torch.cat([kv.keys[low:p], k]).repeat_interleave(g.heads // g.kv_heads, dim=1)
        values = torch.cat([kv.values[low:p], v]).repeat_interleave(g.heads // g.kv_heads, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q, keys) / math.sqrt(g.head_dim)
        if sliding and not self.non_causal_sliding:
            future = torch.ones(rows, rows, dtype=torch.bool).triu(1)
            scores[:, :, p - low:] = scores[:, :, p - low:].masked_fill(future, float("-inf"))
        weights = torch.softmax(scores.float(), dim=-1).to(self.dtype)
        attended = torch.einsum("hqk,khd->qhd", weights, values).reshape(rows, g.heads * g.head_dim)
        return self._linear(attended, pre + "o_proj")

    def hidden(self, block_ids: torch.Tensor, p: int, kv: list[LayerKV]) -> torch.Tensor:
        """Final-normed hidden states `z` `[n, H]` of a block starting at position `p`.

        Args:
            block_ids: `[n]` the block's token ids (`[x_p, M, ..., M]`).
            p: the anchor's position; only context rows `t < p` of `kv` are read.
            kv: `context_kv` of (at least) positions `0..p-1`.
        """
        positions = torch.arange(p, p + block_ids.shape[0])
        h = self.embed[block_ids]
        for i in range(self.geometry.layers):
            pre = f"layers.{i}."
            h = h + self._attention(i, rms_norm(h, self.w[pre + "input_layernorm.weight"], self.eps), positions,
                                    kv[i], p)
            u = rms_norm(h, self.w[pre + "post_attention_layernorm.weight"], self.eps)
            h = h + self._linear(F.silu(self._linear(u, pre + "mlp.gate_proj")) * self._linear(u, pre + "mlp.up_proj"),
                                 pre + "mlp.down_proj")
        return rms_norm(h, self.w["norm.weight"], self.eps)

    def hidden_many(self, block_ids: torch.Tensor, anchors: torch.Tensor, kv: list[LayerKV]) -> torch.Tensor:
        """`hidden` for A blocks at once: `[A, n]` block ids at anchors `[A]` -> final-normed `z` `[A, n, H]`.

        Block `j` sees the context rows before its anchor (and inside the window on sliding layers) and its own
        rows, never another block's: each row equals `hidden(block_ids[j], anchors[j], kv)`.
        """
        n = block_ids.shape[1]
        positions = anchors[:, None] + torch.arange(n)
        h = self.embed[block_ids]
        for i in range(self.geometry.layers):
            pre = f"layers.{i}."
            h = h + self._attention_many(i, rms_norm(h, self.w[pre + "input_layernorm.weight"], self.eps),
                                         positions, kv[i], anchors)
            u = rms_norm(h, self.w[pre + "post_attention_layernorm.weight"], self.eps)
            h = h + self._linear(F.silu(self._linear(u, pre + "mlp.gate_proj")) * self._linear(u, pre + "mlp.up_proj"),
                                 pre + "mlp.down_proj")
        return rms_norm(h, self.w["norm.weight"], self.eps)

    def _attention_many(self, i: int, u: torch.Tensor, positions: torch.Tensor, kv: LayerKV,
                        anchors: torch.Tensor) -> torch.Tensor:
        g = self.geometry
        pre = f"layers.{i}.self_attn."
        count, n = positions.shape
        cos, sin = self.rope(positions.reshape(-1))
        cos, sin = cos.view(count, n, 1, -1), sin.view(count, n, 1, -1)
        q = rms_norm(self._linear(u, pre + "q_proj").view(count, n, g.heads, g.head_dim),
                     self.w[pre + "q_norm.weight"], self.eps)
        q = q * cos + _rotate_half(q) * sin
        k = rms_norm(self._linear(u, pre + "k_proj").view(count, n, g.kv_heads, g.head_dim),
                     self.w[pre + "k_norm.weight"], self.eps)
        k = k * cos + _rotate_half(k) * sin
        v = self._linear(u, pre + "v_proj").view(count, n, g.kv_heads, g.head_dim)
        repeat = g.heads // g.kv_heads
        context_keys = kv.keys.repeat_interleave(repeat, dim=1)             # [T, h, d]
        context_values = kv.values.repeat_interleave(repeat, dim=1)
        k, v = k.repeat_interleave(repeat, dim=2), v.repeat_interleave(repeat, dim=2)
        scale = math.sqrt(g.head_dim)
        context = torch.einsum("anhd,thd->ahnt", q, context_keys) / scale
        own = torch.einsum("anhd,amhd->ahnm", q, k) / scale
        rows = torch.arange(context_keys.shape[0])
        visible = rows[None] < anchors[:, None]                            # [A, T]
        sliding = self.layer_types[i] == "sliding_attention"
        if sliding and self.window:
            visible &= rows[None] >= (anchors[:, None] - int(self.window))
        context = context.masked_fill(~visible[:, None, None, :], float("-inf"))
        if sliding and not self.non_causal_sliding:
            own = own.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
        weights = torch.softmax(torch.cat([context, own], dim=-1).float(), dim=-1).to(self.dtype)
        split = context_keys.shape[0]
        attended = (torch.einsum("ahnt,thd->anhd", weights[..., :split], context_values)
                    + torch.einsum("ahnm,amhd->anhd", weights[..., split:], v))
        return self._linear(attended.reshape(count, n, g.heads * g.head_dim), pre + "o_proj")

    def base_logits(self, z: torch.Tensor) -> torch.Tensor:
        """`lm_head(z)` in the draft vocabulary, float32."""
        return F.linear(z, self.lm_head).float()

    def markov_step(self, prev: torch.Tensor, z: torch.Tensor, state: torch.Tensor | None
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """One slot of the Markov head: (bias `[Vd]`, embedding `e` `[r]`, the rnn state after it).

        Batched too: `prev` `[A]` and `z` `[A, H]` give a bias `[A, Vd]` (one slot of A blocks).
        """
        e = self.w["markov_head.markov_w1.weight"][prev]
        w2 = self.w["markov_head.markov_w2.weight"]
        kind = self.geometry.markov_head_type
        if kind == "vanilla":
            return F.linear(e, w2).float(), e, state
        if kind == "gated":
            gate = torch.sigmoid(self._linear(torch.cat([z, e], dim=-1), "markov_head.gate_proj"))
            return F.linear(gate * e, w2).float(), e, state
        r = e.shape[-1]
        state = e.new_zeros(e.shape) if state is None else state
        g, c, o = self._linear(torch.cat([state, e, z], dim=-1), "markov_head.joint_proj").split(r, dim=-1)
        gate = torch.sigmoid(g)
        state = gate * state + (1 - gate) * torch.tanh(c)
        return F.linear(torch.tanh(o), w2).float(), e, state

    def confidence_logit(self, z: torch.Tensor, e: torch.Tensor | None) -> torch.Tensor | None:
        if "confidence_head.proj.weight" not in self.w:
            return None
        features = torch.cat([z, e]) if self.geometry.confidence_with_markov and e is not None else z
        return self._linear(features, "confidence_head.proj").float()[0]

    def to_target(self, draft_id: int) -> int:
        return draft_id if self.d2t is None else draft_id + int(self.d2t[draft_id])

    def _block(self, anchor: int, n: int) -> torch.Tensor:
        block = torch.full((n,), self.mask_token_id, dtype=torch.long)
        block[0] = anchor
        return block

    # -- training view (checked against the library) and inference ------------------------------

    @torch.no_grad()
    def teacher_forced(self, taps: torch.Tensor, input_ids: torch.Tensor, p: int, kv: list[LayerKV] | None = None
                       ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The library's training forward for one anchor: logits `[B, Vd]` and confidence logits `[B]`.

        The Markov predecessors are the data's tokens: `[x_p, x_{p+1}, ...]` with
        `sample_from_anchor`, else `[x_p, x_p, x_{p+1}, ...]` (speculators dspark/core.py:156-168).
        `kv`: `context_kv` of the taps, when the caller already has it (many anchors of one sequence).
        """
        b = self.block_size
        kv = self.context_kv(self.context(taps)) if kv is None else kv
        z = self.hidden(self._block(int(input_ids[p]), b), p, kv)
        logits = self.base_logits(z)
        block = input_ids[p:p + b].tolist()
        prev = block if self.sample_from_anchor else [block[0], *block[:-1]]
        confidence, state = [], None
        for i in range(b):
            e = None
            if self.geometry.markov_rank > 0:
                bias, e, state = self.markov_step(torch.tensor(prev[i]), z[i], state)
                if self.markov:
                    logits[i] = logits[i] + bias
            confidence.append(self.confidence_logit(z[i], e))
        scores = [c for c in confidence if c is not None]   # all or none: the head is there or not
        return logits, (torch.stack(scores) if confidence[0] is not None else None)

    @torch.no_grad()
    def path_logits(self, kv: list[LayerKV], chain: list[int], p: int, k: int) -> torch.Tensor:
        """`[k, V]` the draft's raw logits for positions `p+1 .. p+k` over the TARGET vocabulary (-inf off a
        pruned draft vocabulary), its Markov head chained on `chain` = `[x_p, x_{p+1}, ..., x_{p+k-1}]` (the
        tokens of a path: what a probabilistic drafter's accepted drafts are)."""
        anchored = self.sample_from_anchor
        z = self.hidden(self._block(chain[0], k if anchored else 1 + k), p, kv)
        z = z if anchored else z[1:]
        base = self.base_logits(z)
        rows, state = [], None
        for i in range(k):
            logits = base[i]
            if self.markov:
                bias, _, state = self.markov_step(torch.tensor(chain[i]), z[i], state)
                logits = logits + bias
            rows.append(logits)
        draft_rows = torch.stack(rows)
        if self.d2t is None:
            return draft_rows
        target_ids = torch.arange(draft_rows.shape[-1]) + self.d2t.long()
        vocab = int(self.embed.shape[0])
        return torch.full((k, vocab), -torch.inf).index_copy_(1, target_ids, draft_rows)

    @torch.no_grad()
    def propose(self, kv: list[LayerKV], anchor: int, p: int, k: int, margins: list[float] | None = None) -> list[int]:
        """k greedy drafts (target ids) for positions `p+1 .. p+k`, as vLLM's DSpark speculator samples
        (`propose_scored` without the confidence)."""
        return self.propose_scored(kv, anchor, p, k, margins)[0]

    @torch.no_grad()
    def propose_scored(self, kv: list[LayerKV], anchor: int, p: int, k: int, margins: list[float] | None = None
                       ) -> tuple[list[int], list[float] | None]:
        """k greedy drafts (target ids) for positions `p+1 .. p+k`, and the confidence head's estimate per slot
        (None without the head).

        The block has `k` rows with `sample_from_anchor` (every slot sampled, slot i predicting
        `x_{p+i+1}`) and `1 + k` rows without it (slots `1..k` sampled). The Markov head chains on
        the draft's own tokens: `prev` = the anchor, then each drafted token; slot i's confidence reads the
        same `prev` (vLLM's compute_confidence at proposal time). `margins`, when given, gets each slot's lead
        of its top logit over the second (how near a tie the argmax was).
        """
        anchored = self.sample_from_anchor
        z = self.hidden(self._block(anchor, k if anchored else 1 + k), p, kv)
        z = z if anchored else z[1:]
        base = self.base_logits(z)
        drafts: list[int] = []
        scores: list[float] = []
        prev, state = anchor, None
        for i in range(k):
            logits, e = base[i], None
            if self.geometry.markov_rank > 0:
                bias, e, next_state = self.markov_step(torch.tensor(prev), z[i], state)
                if self.markov:
                    logits, state = logits + bias, next_state
            score = self.confidence_logit(z[i], e)
            if score is not None:
                scores.append(float(torch.sigmoid(score)))
            if margins is not None:
                top = torch.topk(logits, 2).values
                margins.append(float(top[0] - top[1]))
            prev = self.to_target(int(logits.argmax()))
            drafts.append(prev)
        return drafts, (scores if len(scores) == k else None)
