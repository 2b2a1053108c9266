"""The `k3_dspark` tensor roster as one function of the config: which modules exist and their shapes.

Both sides of the contract read this file: `format.contract.roster()` (what `verify` demands of a
checkpoint) and `K3DSparkModel.__init__` (which modules the model builds, checked against
`tensor_shapes` before the constructor returns). So a config cannot make the model build a
tensor the roster lacks, or the other way round.

Self-contained and stdlib only: `dspark-hub export-code` copies this file verbatim into a
checkpoint next to `modeling_k3_dspark.py`, which imports it relatively, so it must work
without dspark-hub installed (`dspark_hub/modeling/roster_k3_dspark.py` re-exports it for the
package).

`config` is a `config.json` mapping or a config object (`K3DSparkConfig`); the values are
used as they are. `format.contract.roster()` validates them first.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeAlias

if TYPE_CHECKING:
    from transformers import PretrainedConfig

#: A `config.json` mapping or a config object (`K3DSparkConfig`, vLLM's `hf_config`).
Config: TypeAlias = "Mapping[str, Any] | PretrainedConfig"

#: What `enable_confidence_head` and `confidence_head_with_markov` mean when the key is absent:
#: True, the published reference's value and `K3DSparkConfig`'s default (transformers fills an
#: absent key with the constructor default, so the model and the roster agree). Runtimes differ
#: on the default: vLLM's is False for both, so without the first it drops the head, and without
#: the second it builds a [1, H] head the reference's [1, H+R] tensor does not fit (`verify --runtime
#: vllm` says so); `verify` warns about a missing key. A present key counts by truthiness, as
#: runtimes read it (`if config.enable_confidence_head:`), so `null` means no head.
HEAD_FLAG_DEFAULT = True


def _value(config: Config, key: str, default: Any = None) -> Any:
    if isinstance(config, Mapping):
        return config.get(key, default)
    return getattr(config, key, default)


def confidence_head_enabled(config: Config) -> bool:
    """Whether the draft has a `confidence_head` (`enable_confidence_head`)."""
    return bool(_value(config, "enable_confidence_head", HEAD_FLAG_DEFAULT))


def confidence_head_with_markov(config: Config) -> bool:
    """Whether the confidence head also reads `markov_w1[previous token]` (`confidence_head_with_markov`)."""
    return bool(_value(config, "confidence_head_with_markov", HEAD_FLAG_DEFAULT))


def confidence_head_width(config: Config) -> int | None:
    """Input width of `confidence_head.proj`: H (+ `markov_rank` with Markov), or None without the head."""
    if not confidence_head_enabled(config):
        return None
    width: int = _value(config, "hidden_size")
    return width + _value(config, "markov_rank") if confidence_head_with_markov(config) else width


def layer_shapes(config: Config, i: int) -> dict[str, tuple[int, ...]]:
    """The 12 tensors of decoder layer `i`, name -> shape, in module order."""
    h, inter = _value(config, "hidden_size"), _value(config, "intermediate_size")
    n = _value(config, "num_attention_heads")
    dn, dr, dv = (_value(config, k) for k in ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"))
    rq, rkv = _value(config, "q_lora_rank"), _value(config, "kv_lora_rank")
    p = f"layers.{i}."
    return {
        p + "input_layernorm.weight": (h,),
        p + "self_attn.q_a_proj.weight": (rq, h),
        p + "self_attn.q_a_layernorm.weight": (rq,),
        p + "self_attn.q_b_proj.weight": (n * (dn + dr), rq),
        p + "self_attn.kv_a_proj_with_mqa.weight": (rkv + dr, h),
        p + "self_attn.kv_a_layernorm.weight": (rkv,),
        p + "self_attn.kv_b_proj.weight": (n * (dn + dv), rkv),
        p + "self_attn.o_proj.weight": (h, n * dv),
        p + "post_attention_layernorm.weight": (h,),
        p + "mlp.gate_proj.weight": (inter, h),
        p + "mlp.up_proj.weight": (inter, h),
        p + "mlp.down_proj.weight": (h, inter),
    }


def tensor_shapes(config: Config) -> dict[str, tuple[int, ...]]:
    """Every tensor of a draft with this config, name -> shape (no `model.` prefix), in module order."""
    h, v = _value(config, "hidden_size"), _value(config, "vocab_size")
    r = _value(config, "markov_rank")
    shapes: dict[str, tuple[int, ...]] = {
        "embed_tokens.weight": (v, h),
        "context_proj.weight": (h, _value(config, "num_target_layers") * _value(config, "target_hidden_size")),
        "context_norm.weight": (h,),
    }
    for i in range(_value(config, "num_hidden_layers")):
        shapes.update(layer_shapes(config, i))
    shapes["final_norm.weight"] = (h,)
    shapes["markov_head.markov_w1.weight"] = (v, r)
    shapes["markov_head.markov_w2.weight"] = (_value(config, "draft_vocab_size"), r)
    width = confidence_head_width(config)
    if width is not None:
        shapes["confidence_head.proj.weight"] = (1, width)
        shapes["confidence_head.proj.bias"] = (1,)
    return shapes


__all__ = ["HEAD_FLAG_DEFAULT", "confidence_head_enabled", "confidence_head_width", "confidence_head_with_markov",
           "layer_shapes", "tensor_shapes"]
