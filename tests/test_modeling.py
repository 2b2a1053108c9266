"""Numerical oracles for the k3_dspark model: transformers' DeepSeek-V3 pieces, closed forms, references."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import DeepseekV3Config
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.deepseek_v3.modeling_deepseek_v3 import (
    DeepseekV3Attention,
    DeepseekV3MLP,
    DeepseekV3RMSNorm,
    DeepseekV3RotaryEmbedding,
)

from dspark_hub.format import contract
from dspark_hub.modeling import K3DSparkConfig, K3DSparkModel
from dspark_hub.modeling.modeling_k3_dspark import (
    anchor_block_inputs,
    apply_interleaved_rope,
    rope_cos_sin_multiplier,
    rope_inv_freq,
    softmax_scale,
    yarn_correction_range,
)

pytestmark = pytest.mark.torch


def tiny_model(seed: int = 0) -> K3DSparkModel:
    torch.manual_seed(seed)
    model = K3DSparkModel(K3DSparkConfig.from_dict(dict(contract.TINY_CONFIG))).float().eval()
    with torch.no_grad():  # norms away from 1, weights at std 0.1: a wrong piece shows clearly
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.add_(torch.randn_like(param) * 0.2)
            else:
                param.mul_(5.0)
    return model


def deepseek_config(config: K3DSparkConfig, *, interleave: bool = True) -> DeepseekV3Config:
    ds = DeepseekV3Config(
        vocab_size=config.vocab_size, hidden_size=config.hidden_size, intermediate_size=config.intermediate_size,
        num_hidden_layers=1, num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.num_attention_heads, q_lora_rank=config.q_lora_rank,
        kv_lora_rank=config.kv_lora_rank, qk_nope_head_dim=config.qk_nope_head_dim,
        qk_rope_head_dim=config.qk_rope_head_dim, v_head_dim=config.v_head_dim, rms_norm_eps=config.rms_norm_eps,
        max_position_embeddings=config.max_position_embeddings, rope_parameters=dict(config.rope_parameters),
        rope_interleave=interleave, attention_bias=False, n_routed_experts=4, first_k_dense_replace=1,
    )
    ds._attn_implementation = "eager"
    return ds


def hf_attention(model: K3DSparkModel, layer: int, *, interleave: bool = True) -> DeepseekV3Attention:
    attn = DeepseekV3Attention(deepseek_config(model.config, interleave=interleave), layer_idx=0)
    attn.load_state_dict(model.layers[layer].self_attn.state_dict())
    # HF hard-codes eps 1e-6 for the two latent norms; runtimes use the config's rms_norm_eps.
    attn.q_a_layernorm.variance_epsilon = attn.kv_a_layernorm.variance_epsilon = model.config.rms_norm_eps
    return attn.eval()


def hf_norm(norm: torch.nn.Module, eps: float) -> DeepseekV3RMSNorm:
    ref = DeepseekV3RMSNorm(norm.weight.shape[0], eps=eps)
    ref.load_state_dict(norm.state_dict())
    return ref


def reference_forward(model: K3DSparkModel, ids: torch.Tensor, context_states: torch.Tensor,
                      positions: torch.Tensor) -> torch.Tensor:
    """The draft forward assembled from transformers' DeepSeek-V3 modules: context rows and
    normed block rows form one sequence under a non-causal mask; only block rows are read out."""
    cfg, eps = model.config, model.config.rms_norm_eps
    rotary = DeepseekV3RotaryEmbedding(deepseek_config(cfg))
    context = hf_norm(model.context_norm, eps)(context_states @ model.context_proj.weight.T)
    hidden = model.embed_tokens.weight[ids]
    rows = context.shape[1]
    for i, layer in enumerate(model.layers):
        normed = hf_norm(layer.input_layernorm, eps)(hidden)
        sequence = torch.cat((context, normed), dim=1)
        mask = torch.zeros(sequence.shape[0], 1, sequence.shape[1], sequence.shape[1])
        attn, _ = hf_attention(model, i)(sequence, rotary(sequence, positions), mask)
        hidden = hidden + attn[:, rows:]
        mlp = DeepseekV3MLP(deepseek_config(cfg))
        mlp.load_state_dict(layer.mlp.state_dict())
        hidden = hidden + mlp(hf_norm(layer.post_attention_layernorm, eps)(hidden))
    return hf_norm(model.final_norm, eps)(hidden)


# ----------------------------------------------------------------------------- config


def test_default_config_is_the_published_config_byte_for_byte():
    assert K3DSparkConfig().to_json_string().encode() == contract.reference_config_bytes()
    loaded = K3DSparkConfig.from_dict(contract.reference_config())
    assert loaded.to_json_string().encode() == contract.reference_config_bytes()
    assert "rope_interleave" not in loaded.to_diff_dict()


def test_config_keeps_the_input_key_order_and_compares_all_fields():
    tiny = K3DSparkConfig.from_dict(dict(contract.TINY_CONFIG))
    assert list(tiny.to_diff_dict()) == list(contract.TINY_CONFIG)
    assert tiny.to_diff_dict() == contract.TINY_CONFIG
    assert K3DSparkConfig(hidden_size=64) != K3DSparkConfig(hidden_size=128)


# ----------------------------------------------------------------------------- RoPE / YaRN


def test_reference_yarn_numbers_without_building_the_model():
    config = K3DSparkConfig.from_dict(contract.reference_config())
    assert yarn_correction_range(config) == (15, 26)
    assert rope_cos_sin_multiplier(config) == 1.0
    assert softmax_scale(config) == pytest.approx(0.1308608, abs=5e-8)
    # the mscale^2 a public draft missed: logits 1.8133x too cold without it
    assert softmax_scale(config) * math.sqrt(192) == pytest.approx(1.813260, abs=1e-6)


@pytest.mark.parametrize("profile", ["kimi-k3", "tiny"])
def test_yarn_frequencies_and_scales_equal_transformers(profile):
    config = K3DSparkConfig.from_dict(contract.profile_config(profile))
    ds = deepseek_config(config)
    inv_freq, attention_factor = ROPE_INIT_FUNCTIONS["yarn"](ds)
    assert torch.allclose(rope_inv_freq(config), inv_freq, rtol=1e-6, atol=0)
    assert rope_cos_sin_multiplier(config) == pytest.approx(attention_factor, rel=1e-12)
    with torch.device("meta"):  # the scale is a float; no need to allocate the reference weights
        assert softmax_scale(config) == pytest.approx(DeepseekV3Attention(ds, 0).scaling, rel=1e-12)


def test_rope_rotates_adjacent_pairs_not_halves():
    torch.manual_seed(0)
    x, angles = torch.randn(3, 5, 8), torch.rand(3, 5, 4) * 6
    rotated = apply_interleaved_rope(x, angles.cos(), angles.sin())
    as_complex = torch.view_as_complex(x.unflatten(-1, (4, 2)).contiguous()) * torch.polar(torch.ones_like(angles),
                                                                                          angles)
    assert torch.allclose(rotated, torch.view_as_real(as_complex).flatten(-2), atol=1e-6)
    half_split = x * torch.cat((angles, angles), -1).cos() + torch.cat((-x[..., 4:], x[..., :4]), -1) * torch.cat(
        (angles, angles), -1).sin()
    assert (rotated - half_split).abs().max() > 0.1


# ----------------------------------------------------------------------------- layer oracles


@pytest.mark.parametrize("start", [0, 300])  # 300 lies beyond original_max_position_embeddings (256)
def test_attention_equals_deepseek_v3_mla_with_a_non_causal_mask(start):
    model = tiny_model()
    torch.manual_seed(1)
    context, block = torch.randn(2, 9, 64), torch.randn(2, 7, 64)
    positions = torch.arange(start, start + 16).expand(2, -1)
    cos, sin = model.rotary_emb(positions)
    attn = model.layers[0].self_attn
    with torch.no_grad():
        ours = attn(block, cos[:, 9:], sin[:, 9:], attn.latent_kv(context, cos[:, :9], sin[:, :9]))
        sequence = torch.cat((context, block), dim=1)
        mask = torch.zeros(2, 1, 16, 16)
        hf_cos_sin = DeepseekV3RotaryEmbedding(deepseek_config(model.config))(sequence, positions)
        oracle, _ = hf_attention(model, 0)(sequence, hf_cos_sin, mask)
        half_split, _ = hf_attention(model, 0, interleave=False)(sequence, hf_cos_sin, mask)
    assert torch.allclose(ours, oracle[:, 9:], atol=2e-6)
    assert (ours - half_split[:, 9:]).abs().max() > 0.05 * ours.abs().max()


def test_mlp_equals_deepseek_v3_dense_mlp():
    model = tiny_model()
    mlp = DeepseekV3MLP(deepseek_config(model.config))
    mlp.load_state_dict(model.layers[1].mlp.state_dict())
    x = torch.randn(2, 5, 64)
    with torch.no_grad():
        assert torch.allclose(model.layers[1].mlp(x), mlp(x), atol=1e-6)


def test_full_forward_equals_the_deepseek_v3_assembly():
    model = tiny_model()
    ids = torch.tensor([[5, 509, 509, 509, 509, 509, 509], [77, 509, 509, 509, 509, 509, 509]])
    context_states = torch.randn(2, 11, 3 * 64)
    with torch.no_grad():
        ours = model(input_ids=ids, context_states=context_states).last_hidden_state
        oracle = reference_forward(model, ids, context_states, torch.arange(18).expand(2, -1))
    assert ours.shape == (2, 7, 64)
    assert torch.allclose(ours, oracle, atol=1e-5)


def test_block_only_position_ids_place_the_context_at_zero():
    model = tiny_model()
    ids, context_states = torch.randint(0, 500, (1, 7)), torch.randn(1, 6, 192)
    with torch.no_grad():
        default = model(input_ids=ids, context_states=context_states).last_hidden_state
        explicit = model(input_ids=ids, context_states=context_states,
                         position_ids=torch.arange(6, 13)[None]).last_hidden_state
        shifted = model(input_ids=ids, context_states=context_states,
                        position_ids=torch.arange(7, 14)[None]).last_hidden_state
        cached = model(input_ids=ids, context_latents=model.encode_context(context_states)).last_hidden_state
    assert torch.equal(default, explicit)
    assert torch.allclose(default, cached, atol=1e-6)
    assert (default - shifted).abs().max() > 1e-4


# ----------------------------------------------------------------------------- heads and drafting


def test_markov_bias_is_w2_times_w1_row():
    model = tiny_model()
    prev = torch.tensor([[3, 509], [0, 400]])
    w1, w2 = model.markov_head.markov_w1.weight, model.markov_head.markov_w2.weight
    expected = torch.stack([torch.stack([w2 @ w1[x] for x in row]) for row in prev.tolist()])
    assert torch.allclose(model.markov_bias(prev), expected, atol=1e-6)


def test_confidence_is_sigmoid_of_the_head_over_hidden_and_markov_embedding():
    model = tiny_model()
    hidden, prev = torch.randn(3, 64), torch.tensor([1, 2, 3])
    proj = model.confidence_head.proj
    features = torch.cat((hidden, model.markov_head.markov_w1.weight[prev]), dim=-1)
    expected = torch.sigmoid(features @ proj.weight[0] + proj.bias[0])
    assert torch.allclose(model.confidence(hidden, prev), expected, atol=1e-6)


def test_propose_block_chains_the_markov_bias_over_its_own_drafts():
    model = tiny_model()
    rank = model.config.markov_rank
    with torch.no_grad():  # bias(prev) favours every token y with y - 1 == prev (mod rank)
        w1 = torch.zeros_like(model.markov_head.markov_w1.weight)
        w1[torch.arange(w1.shape[0]), torch.arange(w1.shape[0]) % rank] = 1.0
        w2 = torch.zeros_like(model.markov_head.markov_w2.weight)
        w2[torch.arange(w2.shape[0]), (torch.arange(w2.shape[0]) - 1) % rank] = 50.0
        model.markov_head.markov_w1.weight.copy_(w1)
        model.markov_head.markov_w2.weight.copy_(w2)
    lm_head = torch.randn(512, 64) * 0.01
    anchors, context_states = torch.tensor([7, 100]), torch.randn(2, 5, 192)
    proposal = model.propose_block(context_states, anchors, lm_head)
    prev = torch.cat((anchors[:, None], proposal.tokens[:, :-1]), dim=1)
    assert torch.equal(proposal.tokens % rank, (prev + 1) % rank)
    hidden = proposal.last_hidden_state
    assert torch.equal(proposal.tokens, (model.draft_logits(hidden, lm_head, prev)).argmax(-1))
    assert torch.allclose(proposal.confidence, model.confidence(hidden, prev), atol=1e-6)


def test_packed_teacher_forced_blocks_equal_single_block_inference_and_do_not_leak():
    model = tiny_model()
    seq, context_states = torch.randint(0, 500, (2, 24)), torch.randn(2, 24, 192)
    anchors = torch.tensor([[0, 6, 13, 20], [2, 9, 17, 23]])
    lm_head = torch.randn(512, 64)
    with torch.no_grad():
        packed = model.teacher_forced(context_states, seq, anchors, lm_head_weight=lm_head)
        for b in range(2):
            for j, a in enumerate(anchors[b].tolist()):
                single = model.propose_block(context_states[b:b + 1, :a], seq[b, a:a + 1], lm_head)
                assert torch.allclose(packed.last_hidden_state[b, j], single.last_hidden_state[0], atol=1e-5)
        later = context_states.clone()
        later[:, 13:] += 5.0  # context at or after anchor 13 changes
        perturbed = model.teacher_forced(later, seq, anchors).last_hidden_state
    assert torch.equal(perturbed[0, :3], packed.last_hidden_state[0, :3])
    assert (perturbed[0, 3] - packed.last_hidden_state[0, 3]).abs().max() > 1e-3
    labels = packed.labels
    assert labels[0, 1].tolist() == seq[0, 7:14].tolist()
    assert packed.prev_ids[0, 1].tolist() == seq[0, 6:13].tolist()
    assert labels[1, 3].tolist() == [-100] * 7  # anchor 23 is the last token: nothing to draft
    assert torch.allclose(packed.logits, model.draft_logits(packed.last_hidden_state, lm_head, packed.prev_ids))


def test_anchor_mask_respects_document_boundaries():
    ids = torch.arange(10)[None]
    doc = torch.tensor([[0, 0, 0, 0, 1, 1, 1, 1, 1, -1]])
    inputs = anchor_block_inputs(ids, torch.tensor([[2, 6]]), 3, 99, doc_ids=doc)
    mask = inputs["attention_mask"][0]
    assert mask.shape == (6, 10 + 6)
    assert mask[0, :10].tolist() == [True, True] + [False] * 8
    assert mask[3, :10].tolist() == [False] * 4 + [True, True] + [False] * 4
    assert mask[3, 10:].tolist() == [False] * 3 + [True] * 3
    assert inputs["labels"][0, 1].tolist() == [7, 8, -100]  # position 9 is padding (doc -1)


def _teacher_forced_backward(checkpointing: bool) -> tuple[int, dict[str, torch.Tensor]]:
    """Calls of layer 0's MLP `forward` during one teacher-forced forward + backward, and the gradients."""
    torch.manual_seed(1)
    seq, context_states = torch.randint(0, 500, (1, 16)), torch.randn(1, 16, 192)
    lm_head = torch.randn(512, 64)
    model = tiny_model().train()
    if checkpointing:
        model.activation_checkpointing_enable()
    calls = []     # counted in `forward` itself: module hooks do not fire when backward recomputes a layer
    mlp = model.layers[0].mlp
    forward = mlp.forward
    mlp.forward = lambda x: (calls.append(1), forward(x))[1]
    out = model.teacher_forced(context_states, seq, torch.tensor([[3, 9]]), lm_head_weight=lm_head)
    valid = out.labels != -100
    loss = torch.nn.functional.cross_entropy(out.logits[valid], out.labels[valid])
    loss = loss + out.confidence_logits[valid].sigmoid().mean()
    loss.backward()
    return len(calls), {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def test_teacher_forced_pass_trains_with_gradient_checkpointing():
    plain_calls, plain = _teacher_forced_backward(checkpointing=False)
    calls, grads = _teacher_forced_backward(checkpointing=True)
    assert (plain_calls, calls) == (1, 2)        # backward recomputed the layer: checkpointing is on
    assert grads.keys() == plain.keys()
    for name in ("context_proj.weight", "layers.0.self_attn.kv_a_proj_with_mqa.weight",
                 "markov_head.markov_w2.weight", "confidence_head.proj.weight"):
        assert grads[name].abs().sum() > 0, name
    for name, grad in grads.items():             # recomputation changes nothing
        assert torch.allclose(grad, plain[name], rtol=1e-5, atol=1e-6), name


@pytest.mark.parametrize("width_change, rows_dim", [(-1, True), (1, True), (0, False)])
def test_a_wrong_context_width_names_layers_times_width(width_change, rows_dim):
    model = tiny_model()
    cfg = model.config
    width = cfg.num_target_layers * cfg.target_hidden_size + width_change
    context = torch.zeros(1, 3, width) if rows_dim else torch.zeros(3, width)
    expected = f"num_target_layers x target_hidden_size = {cfg.num_target_layers} x {cfg.target_hidden_size}"
    with pytest.raises(ValueError, match=expected):
        model(input_ids=torch.zeros(1, 4, dtype=torch.long), context_states=context)
    with pytest.raises(ValueError, match=expected):
        model.encode_context(context)
