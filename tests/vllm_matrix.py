"""The conformance matrix: tiny drafts of both DSpark formats, each showing one class of defect.

`CASES` maps a case id to (description, builder); `builder(folder)` writes the draft into `folder` and
returns it. k3_dspark drafts are built from `contract.TINY_CONFIG` with our factories (the tiny config
loads on vLLM's CPU build: MLA head dims and ranks it accepts); speculators drafts are copies of the
checked-in fixtures the real speculators library saved, and mutants of them.

`tests/test_vllm_conformance.py` runs vLLM's own loader over every case (`verify.runtimes.execute_vllm`) and
compares each row with the static rules; `tests/test_runtimes_vllm.py` checks what the rules say about
selected cases without vLLM.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from dspark_hub.format import contract

from .factories import tensors_for, tiny_config, write_checkpoint
from .spec_fixtures import DSPARK, ROOT, add, drop, edit_config, edit_tensors, reshape, set_key

Tensors = dict[str, torch.Tensor]
Builder = Callable[[Path], Path]
TINY = contract.TINY_CONFIG
H, R, V, I_ = TINY["hidden_size"], TINY["markov_rank"], TINY["vocab_size"], TINY["intermediate_size"]


def k3(config: dict[str, Any] | None = None, mutate: Callable[[Tensors], None] | None = None, *,
       tensors_config: dict[str, Any] | None = None, shards: int = 1) -> Builder:
    """A tiny k3_dspark draft: `config` (default the tiny one), its roster's tensors (or `tensors_config`'s)."""
    def build(folder: Path) -> Path:
        cfg = config or TINY
        return write_checkpoint(folder, config=cfg, tensors=tensors_for(tensors_config or cfg), mutate=mutate,
                                shards=shards)
    return build


def spec(fixture: str, *, tensors: Callable[[Tensors], None] | None = None,
         config: Callable[[dict[str, Any]], None] | None = None) -> Builder:
    """A copy of a speculators fixture, its weights and config changed."""
    def build(folder: Path) -> Path:
        shutil.copytree(ROOT / fixture, folder)
        if tensors is not None:
            edit_tensors(folder, tensors)
        if config is not None:
            edit_config(folder, config)
        return folder
    return build


def drops(*names: str) -> Callable[[Tensors], None]:
    def mutate(t: Tensors) -> None:
        for name in names:
            del t[name]
    return mutate


def adds(**shapes: tuple[int, ...]) -> Callable[[Tensors], None]:
    """Add tensors (keyword names use `__` for `.`)."""
    def mutate(t: Tensors) -> None:
        for key, shape in shapes.items():
            t[key.replace("__", ".")] = (torch.randn(shape) * 0.02).to(torch.bfloat16)
    return mutate


def renames(mapping: dict[str, str]) -> Callable[[Tensors], None]:
    def mutate(t: Tensors) -> None:
        for old, new in mapping.items():
            t[new] = t.pop(old)
    return mutate


def prefixed(prefix: str, only: str = "") -> Callable[[Tensors], None]:
    def mutate(t: Tensors) -> None:
        for name in [n for n in t if n.startswith(only)]:
            t[prefix + name] = t.pop(name)
    return mutate


def reshaped(name: str, shape: tuple[int, ...]) -> Callable[[Tensors], None]:
    return lambda t: t.__setitem__(name, torch.zeros(shape, dtype=t[name].dtype))


def chain(*steps: Callable[[Tensors], None]) -> Callable[[Tensors], None]:
    def mutate(t: Tensors) -> None:
        for step in steps:
            step(t)
    return mutate


def fused_gate_up(t: Tensors) -> None:
    """layers.0's gate/up shipped already stacked as gate_up_proj."""
    t["layers.0.mlp.gate_up_proj.weight"] = torch.cat([t.pop("layers.0.mlp.gate_proj.weight"),
                                                       t.pop("layers.0.mlp.up_proj.weight")])


def to_f32(t: Tensors) -> None:
    for name in t:
        t[name] = t[name].float()


L0 = "layers.0."
NORMS = ["final_norm.weight", "context_norm.weight", f"{L0}input_layernorm.weight",
         f"{L0}post_attention_layernorm.weight", f"{L0}self_attn.q_a_layernorm.weight",
         f"{L0}self_attn.kv_a_layernorm.weight"]
PROJECTIONS = ["context_proj.weight", f"{L0}self_attn.q_a_proj.weight", f"{L0}self_attn.kv_a_proj_with_mqa.weight",
               f"{L0}self_attn.q_b_proj.weight", f"{L0}self_attn.kv_b_proj.weight", f"{L0}self_attn.o_proj.weight",
               f"{L0}mlp.gate_proj.weight", f"{L0}mlp.up_proj.weight", f"{L0}mlp.down_proj.weight"]
ROTARY = ["layers.0.self_attn.rotary_emb.inv_freq", "layers.0.self_attn.rotary_pos_emb.inv_freq",
          "layers.0.self_attn.rotary_emb.cos_cached", "layers.0.self_attn.rotary_emb.sin_cached", "rotary_emb.inv_freq"]
CONFIDENCE = ["confidence_head.proj.weight", "confidence_head.proj.bias"]


def _rotary(t: Tensors) -> None:
    for name in ROTARY:
        t[name] = torch.ones(4)


K3_CASES: dict[str, tuple[str, Builder]] = {
    "k3_conforming": ("the conforming tiny draft (dspark-hub init --profile tiny)", k3()),
    "k3_sharded": ("the conforming tiny draft in two shards with an index", k3(shards=2)),
    "k3_float32": ("every tensor F32 instead of BF16", k3(mutate=to_f32)),
    "k3_trainer_names": ("fc / hidden_norm / norm instead of context_proj / context_norm / final_norm",
                         k3(mutate=renames({"context_proj.weight": "fc.weight", "context_norm.weight":
                                            "hidden_norm.weight", "final_norm.weight": "norm.weight"}))),
    "k3_model_prefix_all": ("'model.' on every tensor (enable_confidence_head true)", k3(mutate=prefixed("model."))),
    "k3_model_prefix_all_flag_false": ("'model.' on every tensor, enable_confidence_head false",
                                       k3(tiny_config(enable_confidence_head=False), prefixed("model."),
                                          tensors_config=TINY)),
    "k3_model_prefix_confidence_flag_true": ("only confidence_head.* carry 'model.', flag true",
                                             k3(mutate=prefixed("model.", "confidence_head."))),
    "k3_model_prefix_confidence_flag_false": ("only confidence_head.* carry 'model.', flag false",
                                              k3(tiny_config(enable_confidence_head=False),
                                                 prefixed("model.", "confidence_head."), tensors_config=TINY)),
    "k3_model_prefix_embed_only": ("only embed_tokens carries 'model.'", k3(mutate=prefixed("model.", "embed_tokens"))),
    "k3_extra_lm_head": ("an extra lm_head.weight [V, H]", k3(mutate=adds(lm_head__weight=(V, H)))),
    **{f"k3_missing_{name.replace('layers.0.', 'l0_').replace('.weight', '').replace('.', '_')}":
       (f"missing {name}", k3(mutate=drops(name))) for name in ["embed_tokens.weight", *NORMS, *PROJECTIONS,
                                                                "markov_head.markov_w1.weight",
                                                                "markov_head.markov_w2.weight"]},
    "k3_missing_kv_a_proj_every_layer": ("kv_a_proj_with_mqa missing in both layers",
                                         k3(mutate=drops(*(f"layers.{i}.self_attn.kv_a_proj_with_mqa.weight"
                                                           for i in range(2))))),
    "k3_missing_q_a_and_kv_a": ("both shards of layers.0 fused_qkv_a_proj missing",
                                k3(mutate=drops(f"{L0}self_attn.q_a_proj.weight",
                                                f"{L0}self_attn.kv_a_proj_with_mqa.weight"))),
    "k3_missing_layer1": ("every layers.1.* tensor missing",
                          k3(mutate=lambda t: [t.pop(n) for n in list(t) if n.startswith("layers.1.")])),
    "k3_missing_confidence_flag_true": ("no confidence_head.* tensors, enable_confidence_head true",
                                        k3(mutate=drops(*CONFIDENCE))),
    "k3_missing_confidence_bias_flag_true": ("confidence_head.proj.bias missing, flag true",
                                             k3(mutate=drops("confidence_head.proj.bias"))),
    "k3_missing_confidence_flag_false": ("no confidence_head.* tensors, flag false",
                                         k3(tiny_config(enable_confidence_head=False))),
    "k3_confidence_flag_false": ("confidence tensors present, enable_confidence_head false",
                                 k3(tiny_config(enable_confidence_head=False), tensors_config=TINY)),
    "k3_confidence_flag_absent": ("confidence tensors present, enable_confidence_head absent (vLLM: false)",
                                  k3(tiny_config(enable_confidence_head=...), tensors_config=TINY)),
    "k3_confidence_with_markov_false": ("confidence_head_with_markov false, head [1, H+R] in the file",
                                        k3(tiny_config(confidence_head_with_markov=False), tensors_config=TINY)),
    "k3_confidence_with_markov_absent": ("confidence_head_with_markov absent (vLLM: false), head [1, H+R]",
                                         k3(tiny_config(confidence_head_with_markov=...), tensors_config=TINY)),
    "k3_bias_context_proj": ("an extra context_proj.bias (the module has none)",
                             k3(mutate=adds(context_proj__bias=(H,)))),
    "k3_bias_final_norm": ("an extra final_norm.bias (RMSNorm)", k3(mutate=adds(final_norm__bias=(H,)))),
    "k3_bias_markov_w1": ("an extra markov_head.markov_w1.bias",
                          k3(mutate=adds(markov_head__markov_w1__bias=(R,)))),
    "k3_bias_gate_proj": ("an extra layers.0.mlp.gate_proj.bias (stacked module)",
                          k3(mutate=adds(layers__0__mlp__gate_proj__bias=(I_,)))),
    "k3_bias_kv_a_proj": ("an extra kv_a_proj_with_mqa.bias (stacked, and copied to context_kv_proj)",
                          k3(mutate=adds(layers__0__self_attn__kv_a_proj_with_mqa__bias=(24,)))),
    "k3_bias_unknown_module": ("an extra foo.bias (no such module)", k3(mutate=adds(foo__bias=(H,)))),
    "k3_bias_unknown_submodule": ("an extra layers.0.self_attn.foo.bias",
                                  k3(mutate=adds(layers__0__self_attn__foo__bias=(H,)))),
    "k3_rotary_buffers": ("rotary buffers: rotary_emb.inv_freq / cos_cached / sin_cached, rotary_pos_emb.inv_freq",
                          k3(mutate=_rotary)),
    "k3_unknown_top": ("an extra foo.weight", k3(mutate=adds(foo__weight=(4, 4)))),
    "k3_unknown_in_layer": ("an extra layers.0.self_attn.foo.weight",
                            k3(mutate=adds(layers__0__self_attn__foo__weight=(4, 4)))),
    "k3_unknown_param_known_module": ("an extra context_proj.weight_scale",
                                      k3(mutate=adds(context_proj__weight_scale=(1,)))),
    "k3_unknown_param_stacked_module": ("an extra layers.0.mlp.gate_proj.weight_scale",
                                        k3(mutate=adds(layers__0__mlp__gate_proj__weight_scale=(1,)))),
    "k3_extra_layer": ("a layers.2.* copy beyond num_hidden_layers 2",
                       k3(mutate=lambda t: t.update({n.replace("layers.1.", "layers.2."): v.clone()
                                                     for n, v in list(t.items()) if n.startswith("layers.1.")}))),
    "k3_fused_gate_up": ("layers.0.mlp.gate_up_proj.weight shipped already stacked", k3(mutate=fused_gate_up)),
    "k3_shape_final_norm": ("final_norm.weight [32] instead of [64]", k3(mutate=reshaped("final_norm.weight", (32,)))),
    "k3_shape_context_proj": ("context_proj.weight [64, 128] instead of [64, 192]",
                              k3(mutate=reshaped("context_proj.weight", (H, 128)))),
    "k3_shape_gate_proj": ("layers.0.mlp.gate_proj.weight [64, 64] (one shard of gate_up_proj)",
                           k3(mutate=reshaped(f"{L0}mlp.gate_proj.weight", (64, H)))),
    "k3_shape_markov_w2": ("markov_w2 [256, R] under draft_vocab_size 512",
                           k3(mutate=reshaped("markov_head.markov_w2.weight", (256, R)))),
    "k3_pruned_vocab": ("draft_vocab_size 256 < vocab_size 512 (markov_w2 [256, R])",
                        k3(tiny_config(draft_vocab_size=256))),
    **{f"k3_cfg_{key}": (f"{key} true", k3(tiny_config(**{key: True}), tensors_config=TINY))
       for key in ("mla_use_qk_norm", "mla_use_nope", "mla_use_output_gate", "dspark_bonus_anchor")},
    "k3_cfg_two_unsupported": ("mla_use_nope and mla_use_qk_norm both true (one joined message)",
                               k3(tiny_config(mla_use_nope=True, mla_use_qk_norm=True), tensors_config=TINY)),
    "k3_cfg_q_lora_rank_null": ("q_lora_rank null", k3(tiny_config(q_lora_rank=None), tensors_config=TINY)),
    "k3_cfg_target_layer_ids_empty": ("target_layer_ids []", k3(tiny_config(target_layer_ids=[]), tensors_config=TINY)),
    "k3_cfg_target_layers_len_mismatch": ("4 target_layer_ids for num_target_layers 3",
                                          k3(tiny_config(target_layer_ids=[1, 2, 3, 4]), tensors_config=TINY)),
    "k3_cfg_target_layer_id_out_of_range": ("target_layer_ids [1, 3, 40] for a 6-layer target (not checked)",
                                            k3(tiny_config(target_layer_ids=[1, 3, 40]))),
    "k3_cfg_target_layer_ids_unsorted": ("target_layer_ids [4, 1, 3] (not checked)",
                                         k3(tiny_config(target_layer_ids=[4, 1, 3]))),
    "k3_cfg_mask_token_out_of_range": ("mask_token_id 9999 (not checked)", k3(tiny_config(mask_token_id=9999))),
    "k3_cfg_markov_head_type_gated": ("markov_head_type gated (never read: a vanilla head is built)",
                                      k3(tiny_config(markov_head_type="gated"))),
    "k3_cfg_rope_interleave": ("rope_interleave true (ignored)", k3(tiny_config(rope_interleave=True))),
    "k3_cfg_no_rope_parameters": ("rope_parameters absent", k3(tiny_config(rope_parameters=...))),
}

_SP = "layers.0."
_SPEC_MISSING = ["fc.weight", "hidden_norm.weight", "norm.weight", f"{_SP}input_layernorm.weight",
                 f"{_SP}self_attn.k_norm.weight", f"{_SP}self_attn.q_proj.weight", f"{_SP}self_attn.v_proj.weight",
                 f"{_SP}mlp.gate_proj.weight", f"{_SP}mlp.down_proj.weight", "markov_head.markov_w1.weight",
                 "markov_head.markov_w2.weight"]
_SPEC_V, _SPEC_H = 256, 64      # the dspark fixture's vocabulary and hidden size


def _spec_prefix(t: Tensors) -> None:
    for name in list(t):
        t["model." + name] = t.pop(name)


def _spec_rotary(t: Tensors) -> None:
    for name in ("layers.0.self_attn.rotary_emb.inv_freq", "rotary_emb.inv_freq", "layers.1.self_attn.rotary_emb."
                 "cos_cached"):
        t[name] = torch.ones(4)


SPEC_CASES: dict[str, tuple[str, Builder]] = {
    **{f"sp_{name.replace('-', '_')}": (f"the speculators fixture {name}", spec(name)) for name in DSPARK},
    **{f"sp_missing_{n.replace('layers.0.', 'l0_').replace('.weight', '').replace('.', '_')}":
       (f"dspark without {n}", spec("dspark", tensors=drop(n))) for n in _SPEC_MISSING},
    "sp_missing_confidence_flag_true": ("no confidence tensors, enable_confidence_head true (vLLM deletes the head)",
                                        spec("dspark", tensors=drops(*CONFIDENCE))),
    "sp_missing_confidence_bias_flag_true": ("confidence_head.proj.bias missing, flag true",
                                             spec("dspark", tensors=drop("confidence_head.proj.bias"))),
    "sp_confidence_flag_false": ("confidence tensors present, enable_confidence_head false",
                                 spec("dspark", config=set_key("enable_confidence_head", False))),
    "sp_confidence_flag_absent": ("confidence tensors present, enable_confidence_head absent",
                                  spec("dspark", config=set_key("enable_confidence_head", ...))),
    "sp_confidence_with_markov_false": ("confidence_head_with_markov false, head [1, H+R]",
                                        spec("dspark", config=set_key("confidence_head_with_markov", False))),
    "sp_target_hidden_size_128": ("target_hidden_size 128: fc is [64, 384] to vLLM",
                                  spec("dspark", config=set_key("target_hidden_size", 128))),
    "sp_two_aux_ids": ("two aux ids for a three-tap fc", spec("dspark", config=set_key("aux_hidden_state_layer_ids",
                                                                                       [1, 3]))),
    "sp_markov_rank_8": ("markov_rank 8 for rank-16 tensors", spec("dspark", config=set_key("markov_rank", 8))),
    "sp_markov_head_type_rnn": ("markov_head_type rnn over vanilla tensors (never read)",
                                spec("dspark", config=set_key("markov_head_type", "rnn"))),
    "sp_k3_names": ("the k3_dspark names context_proj / context_norm / final_norm",
                    spec("dspark", tensors=renames({"fc.weight": "context_proj.weight", "hidden_norm.weight":
                                                    "context_norm.weight", "norm.weight": "final_norm.weight"}))),
    "sp_model_prefix_all": ("'model.' on every tensor", spec("dspark", tensors=_spec_prefix)),
    "sp_bias_known": ("extra fc.bias and layers.0.self_attn.q_proj.bias",
                      spec("dspark", tensors=chain(add("fc.bias", (_SPEC_H,)),
                                                   add("layers.0.self_attn.q_proj.bias", (64,))))),
    "sp_bias_unknown_module": ("an extra foo.bias", spec("dspark", tensors=add("foo.bias", (_SPEC_H,)))),
    "sp_unknown_top": ("an extra foo.weight", spec("dspark", tensors=add("foo.weight", (4, 4)))),
    "sp_rotary_buffers": ("rotary buffers", spec("dspark", tensors=_spec_rotary)),
    "sp_extra_embed_tokens": ("an extra embed_tokens.weight [V, H] (kept as the draft's own)",
                              spec("dspark", tensors=add("embed_tokens.weight", (_SPEC_V, _SPEC_H)))),
    "sp_extra_lm_head": ("an extra full-vocabulary lm_head.weight (kept as the draft's own)",
                         spec("dspark", tensors=add("lm_head.weight", (_SPEC_V, _SPEC_H)))),
    "sp_mask_embedding": ("a mask_embedding tensor", spec("dspark", tensors=add("mask_embedding", (_SPEC_H,)))),
    "sp_shape_fc": ("fc.weight [64, 128]", spec("dspark", tensors=reshape("fc.weight", (_SPEC_H, 128)))),
    "sp_pruned_missing_d2t": ("pruned vocabulary without d2t", spec("dspark-pruned-vocab", tensors=drop("d2t"))),
    "sp_pruned_missing_lm_head": ("pruned vocabulary without lm_head",
                                  spec("dspark-pruned-vocab", tensors=drop("lm_head.weight"))),
    "sp_pruned_missing_t2d": ("pruned vocabulary without t2d", spec("dspark-pruned-vocab", tensors=drop("t2d"))),
    "sp_full_vocab_d2t": ("a d2t in a full-vocabulary draft", spec("dspark", tensors=lambda t: t.__setitem__(
        "d2t", torch.zeros(_SPEC_V, dtype=torch.int64)))),
}

#: Every case: id -> (description, builder).
CASES: dict[str, tuple[str, Builder]] = {**K3_CASES, **SPEC_CASES}


def build(case: str, folder: Path) -> Path:
    """Write case `case` into `folder` (which must not exist)."""
    return CASES[case][1](folder)


__all__ = ["CASES", "K3_CASES", "SPEC_CASES", "build"]
