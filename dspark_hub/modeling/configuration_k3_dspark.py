"""Configuration of the `k3_dspark` draft (DSpark speculative decoding for Kimi-K3).

This file imports only `transformers` (and the stdlib) because it is copied verbatim
into checkpoints for `trust_remote_code`; it must work without dspark-hub installed.
The defaults are the published `Inferact/Kimi-K3-DSpark` values, and `config.json` is
written in the published key order (not transformers' sorted order).
"""

from __future__ import annotations

import json
from typing import Any

from transformers import PretrainedConfig

#: Keys of the published `config.json`, in published order. Saving writes known keys in
#: this order and any other key (e.g. `auto_map`) after them.
PUBLISHED_KEY_ORDER = (
    "architectures", "model_type", "hidden_size", "intermediate_size", "num_hidden_layers",
    "num_attention_heads", "num_key_value_heads", "q_lora_rank", "kv_lora_rank",
    "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "mla_use_nope", "mla_use_output_gate",
    "vocab_size", "rms_norm_eps", "max_position_embeddings", "rope_theta", "num_target_layers",
    "target_hidden_size", "target_num_hidden_layers", "target_layer_ids", "mask_token_id",
    "bos_token_id", "eos_token_id", "pad_token_id", "markov_rank", "markov_head_type",
    "enable_confidence_head", "confidence_head_with_markov", "tie_word_embeddings",
    "draft_vocab_size", "_torchspec_version", "torch_dtype", "rope_parameters",
)


def _reference_rope_parameters() -> dict[str, Any]:
    return {
        "rope_type": "yarn",
        "factor": 32.0,
        "original_max_position_embeddings": 32768,
        "rope_theta": 50000.0,
        "beta_fast": 32,
        "beta_slow": 1,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
    }


class K3DSparkConfig(PretrainedConfig):
    """Config of a `k3_dspark` draft: a DeepSeek-V3-style MLA decoder fed by target hidden states.

    Every argument defaults to the published reference value. There is deliberately no
    `rope_interleave` key: the draft always uses the interleaved (GPT-J, adjacent pairs)
    rotation, and runtimes that read that key map it to the wrong rotation.

    Args:
        hidden_size: Draft hidden width D.
        intermediate_size: SwiGLU width of each layer's MLP.
        num_hidden_layers: Number of draft decoder layers.
        num_attention_heads: MLA heads.
        num_key_value_heads: Kept for runtimes that read it; unused by MLA.
        q_lora_rank / kv_lora_rank: Low-rank widths of the query and latent KV paths.
        qk_nope_head_dim / qk_rope_head_dim / v_head_dim: Per-head widths.
        mla_use_nope / mla_use_output_gate: Must stay False (the K3 target's attention style).
        vocab_size / draft_vocab_size: Target vocabulary and the Markov head's output width.
        rms_norm_eps: Epsilon of every RMSNorm.
        max_position_embeddings: Longest position the YaRN table is meant for.
        rope_theta: Top-level RoPE base (a `rope_parameters["rope_theta"]` wins).
        num_target_layers / target_hidden_size: Shape of the concatenated target taps.
        target_num_hidden_layers / target_layer_ids: Which target layers are tapped.
        mask_token_id: Token filling block slots 1..K-1.
        markov_rank / markov_head_type: The Markov bias head (`vanilla` only).
        enable_confidence_head / confidence_head_with_markov: The acceptance-probability head.
        rope_parameters: YaRN parameters (DeepSeek-V3 semantics).
    """

    model_type = "k3_dspark"

    def __init__(
        self,
        hidden_size: int = 7168,
        intermediate_size: int = 14336,
        num_hidden_layers: int = 5,
        num_attention_heads: int = 64,
        num_key_value_heads: int = 64,
        q_lora_rank: int = 1536,
        kv_lora_rank: int = 512,
        qk_nope_head_dim: int = 128,
        qk_rope_head_dim: int = 64,
        v_head_dim: int = 128,
        mla_use_nope: bool = False,
        mla_use_output_gate: bool = False,
        vocab_size: int = 163840,
        rms_norm_eps: float = 1e-5,
        max_position_embeddings: int = 1048576,
        rope_theta: float = 50000.0,
        num_target_layers: int = 5,
        target_hidden_size: int = 7168,
        target_num_hidden_layers: int = 93,
        target_layer_ids: list[int] | None = None,
        mask_token_id: int = 163837,
        bos_token_id: int | None = 163584,
        eos_token_id: int | None = 163586,
        pad_token_id: int | None = 163839,
        markov_rank: int = 256,
        markov_head_type: str = "vanilla",
        enable_confidence_head: bool = True,
        confidence_head_with_markov: bool = True,
        tie_word_embeddings: bool = False,
        draft_vocab_size: int | None = 163840,
        _torchspec_version: str | None = "0.1.0",
        rope_parameters: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads
        self.q_lora_rank = q_lora_rank
        self.kv_lora_rank = kv_lora_rank
        self.qk_nope_head_dim = qk_nope_head_dim
        self.qk_rope_head_dim = qk_rope_head_dim
        self.v_head_dim = v_head_dim
        self.mla_use_nope = mla_use_nope
        self.mla_use_output_gate = mla_use_output_gate
        self.vocab_size = vocab_size
        self.rms_norm_eps = rms_norm_eps
        self.max_position_embeddings = max_position_embeddings
        self.rope_theta = rope_theta
        self.num_target_layers = num_target_layers
        self.target_hidden_size = target_hidden_size
        self.target_num_hidden_layers = target_num_hidden_layers
        self.target_layer_ids = list(target_layer_ids) if target_layer_ids is not None else [2, 23, 47, 71, 89]
        self.mask_token_id = mask_token_id
        self.bos_token_id = bos_token_id
        self.eos_token_id = eos_token_id
        self.pad_token_id = pad_token_id
        self.markov_rank = markov_rank
        self.markov_head_type = markov_head_type
        self.enable_confidence_head = enable_confidence_head
        self.confidence_head_with_markov = confidence_head_with_markov
        self.tie_word_embeddings = tie_word_embeddings
        self.draft_vocab_size = draft_vocab_size if draft_vocab_size is not None else vocab_size
        self._torchspec_version = _torchspec_version
        self.rope_parameters = rope_parameters if rope_parameters is not None else _reference_rope_parameters()
        kwargs.setdefault("architectures", ["K3DSparkModel"])
        kwargs.setdefault("torch_dtype", "bfloat16")
        # Last: the base __post_init__ and validators read the attributes set above.
        super().__init__(**kwargs)

    # With an explicit __init__ the dataclass-generated __eq__ compares only base fields.
    def __eq__(self, other: object) -> bool:
        return isinstance(other, PretrainedConfig) and self.to_dict() == other.to_dict()

    __hash__ = None  # type: ignore[assignment]  # unhashable, as __eq__ compares contents (mypy wants a method)

    @property
    def qk_head_dim(self) -> int:
        """Query/key width per head: nope part plus rope part."""
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    def to_diff_dict(self) -> dict[str, Any]:
        """The keys `config.json` carries, in published order (`torch_dtype`, not `dtype`)."""
        diff = super().to_diff_dict()
        if "dtype" in diff:
            diff["torch_dtype"] = diff.pop("dtype")
        if getattr(self, "transformers_version", None) is None:
            diff.pop("transformers_version", None)
        return ordered_config(diff)

    def to_json_string(self, use_diff: bool = True) -> str:
        """JSON as the published file was written: `indent=2`, published key order, newline."""
        config_dict = self.to_diff_dict() if use_diff else ordered_config(self.to_dict())
        return json.dumps(self._encode_special_floats(config_dict), indent=2) + "\n"


def ordered_config(config: dict[str, Any]) -> dict[str, Any]:
    """`config` with published keys first in published order, then the others in their order."""
    known = {key: config[key] for key in PUBLISHED_KEY_ORDER if key in config}
    return {**known, **{key: value for key, value in config.items() if key not in known}}


__all__ = ["PUBLISHED_KEY_ORDER", "K3DSparkConfig", "ordered_config"]
