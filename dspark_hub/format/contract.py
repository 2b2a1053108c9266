"""The `k3_dspark` checkpoint contract as pure data and derivations.

Ground truth: the published `Inferact/Kimi-K3-DSpark` artifact. Everything here
is stdlib only so header-level commands never pay for torch.

- `REFERENCE_CONFIG`: the published `config.json`, all 35 keys in published order;
  `reference_config_bytes()` reproduces the file byte for byte.
- `roster(config)`: name -> `TensorSpec` for *any* `k3_dspark` config.
- `parameter_counts(config)`, `expected_header(config, metadata)`,
  `expected_file_size(config, metadata)`.
- `REFERENCE_ARTIFACT`: pinned facts (revision, sizes, digests).
- `KNOWN_MISNAMES`, `FOREIGN_PREFIXES`, `SKIPPED_EXTRAS`: the wrong layouts seen in the wild.
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dspark_hub.documents import Document
from dspark_hub.errors import ContractError
from dspark_hub.format import roster_k3_dspark
from dspark_hub.format.reader import DTYPE_SIZES

MODEL_TYPE = "k3_dspark"
#: Draft tokens per block of the reference draft. Not a config key: serving engines take it
#: from the command line (k3-dspark-contract.md, "block_size is not a config key";
#: tokenspeed kimi_k3_dspark_config.py docstring "draft seven tokens per block").
REFERENCE_BLOCK_SIZE = 7
ARCHITECTURE = "K3DSparkModel"
WEIGHTS_NAME = "model.safetensors"
INDEX_NAME = "model.safetensors.index.json"
CONFIG_NAME = "config.json"
TORCHSPEC_METADATA = {"torchspec_version": "0.1.0"}
#: The most bytes of a `config.json` read (a real one is under 4 kB, the speculators one included), and of an
#: index or a tokenizer's JSON (a 1T-parameter target's index is about 10 MB): a file said to be larger, by a
#: folder or by a Hub listing, is read only that far and reported (`FILE_TOO_LARGE`).
MAX_CONFIG_BYTES = 4 * 1024 * 1024
MAX_JSON_BYTES = 64 * 1024 * 1024

#: The published `config.json` of `Inferact/Kimi-K3-DSpark`, in published key order.
REFERENCE_CONFIG: dict[str, Any] = {
    "architectures": ["K3DSparkModel"],
    "model_type": "k3_dspark",
    "hidden_size": 7168,
    "intermediate_size": 14336,
    "num_hidden_layers": 5,
    "num_attention_heads": 64,
    "num_key_value_heads": 64,
    "q_lora_rank": 1536,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "mla_use_nope": False,
    "mla_use_output_gate": False,
    "vocab_size": 163840,
    "rms_norm_eps": 1e-05,
    "max_position_embeddings": 1048576,
    "rope_theta": 50000.0,
    "num_target_layers": 5,
    "target_hidden_size": 7168,
    "target_num_hidden_layers": 93,
    "target_layer_ids": [2, 23, 47, 71, 89],
    "mask_token_id": 163837,
    "bos_token_id": 163584,
    "eos_token_id": 163586,
    "pad_token_id": 163839,
    "markov_rank": 256,
    "markov_head_type": "vanilla",
    "enable_confidence_head": True,
    "confidence_head_with_markov": True,
    "tie_word_embeddings": False,
    "draft_vocab_size": 163840,
    "_torchspec_version": "0.1.0",
    "torch_dtype": "bfloat16",
    "rope_parameters": {
        "rope_type": "yarn",
        "factor": 32.0,
        "original_max_position_embeddings": 32768,
        "rope_theta": 50000.0,
        "beta_fast": 32,
        "beta_slow": 1,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
    },
}

#: A small conforming config for demos and tests: same keys, same order, same rules.
TINY_CONFIG: dict[str, Any] = {
    **REFERENCE_CONFIG,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "q_lora_rank": 32,
    "kv_lora_rank": 16,
    "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 8,
    "v_head_dim": 16,
    "vocab_size": 512,
    "max_position_embeddings": 2048,
    "num_target_layers": 3,
    "target_hidden_size": 64,
    "target_num_hidden_layers": 6,
    "target_layer_ids": [1, 3, 4],
    "mask_token_id": 509,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 511,
    "markov_rank": 16,
    "draft_vocab_size": 512,
    "rope_parameters": {
        **REFERENCE_CONFIG["rope_parameters"],
        "factor": 8.0,
        "original_max_position_embeddings": 256,
    },
}

PROFILES: dict[str, dict[str, Any]] = {"kimi-k3": REFERENCE_CONFIG, "tiny": TINY_CONFIG}
#: Bundled references accepted by `--drop-in`.
REFERENCES: dict[str, dict[str, Any]] = {"kimi-k3": REFERENCE_CONFIG}


@dataclass(frozen=True)
class ReferenceArtifact:
    """Pinned facts of a published draft (what `--drop-in kimi-k3` and `init` reproduce)."""

    repo_id: str
    revision: str
    weights_file: str
    file_size: int
    header_length: int
    metadata: Mapping[str, str]
    weights_sha256: str
    config_size: int
    config_sha256: str
    tensor_count: int
    total_parameters: int
    trained_parameters: int
    frozen_parameters: int


REFERENCE_ARTIFACT = ReferenceArtifact(
    repo_id="Inferact/Kimi-K3-DSpark",
    revision="cf6b8244620e7ea4b0651d214f28e89eac75bed6",
    weights_file=WEIGHTS_NAME,
    file_size=7_124_633_450,
    header_length=7_520,
    metadata=TORCHSPEC_METADATA,
    weights_sha256="f9972a636d92a11994cdcfc88fd4c5b5d50d6eb2a89af016031593b8c65c2053",
    config_size=1_251,
    config_sha256="5a3c2f4f91c965ed93b14de5f12a4e9c17fd98d8c99916ed2deb26ce8702f970",
    tensor_count=68,
    total_parameters=3_562_312_961,
    trained_parameters=2_387_907_841,
    frozen_parameters=1_174_405_120,
)

CONTRACT_DTYPE = "BF16"
TORCH_DTYPE_NAMES: dict[str, str] = {"bfloat16": "BF16", "float16": "F16", "float32": "F32"}
#: The config keys that declare it (`dtype` is transformers 5's name for `torch_dtype`).
DTYPE_KEYS = ("torch_dtype", "dtype")


def unknown_dtypes(config: Mapping[str, Any]) -> dict[str, Any]:
    """Each dtype key `config` holds whose value is not a name of `TORCH_DTYPE_NAMES` (`"bfloat17"`, `5`, `null`)."""
    return {key: config[key] for key in DTYPE_KEYS
            if key in config and not (isinstance(config[key], str) and config[key] in TORCH_DTYPE_NAMES)}

#: Tensors that are part of the checkpoint but never trained (a copy of the target's embedding).
FROZEN_TENSORS = ("embed_tokens.weight",)
#: Where a target checkpoint keeps the embedding the draft must copy bit for bit.
TARGET_EMBED_NAMES = ("embed_tokens.weight", "model.embed_tokens.weight", "language_model.model.embed_tokens.weight",
                      "model.language_model.embed_tokens.weight")

#: Golden-vector fixtures ship in this subfolder: runtimes glob the top-level `*.safetensors` as weights.
GOLDEN_DIR = "golden"

#: Trainer-internal names that load silently in some runtimes and serve at 0% acceptance.
KNOWN_MISNAMES: dict[str, str] = {
    "fc.weight": "context_proj.weight",
    "hidden_norm.weight": "context_norm.weight",
    "norm.weight": "final_norm.weight",
}
#: Prefixes left by wrappers (HF `model.`, DDP `module.`) that no runtime strips for this draft.
FOREIGN_PREFIXES = ("model.", "module.", "_orig_mod.")
#: Tensors some exports ship that are not in the contract; runtimes skip them (they use the target's).
SKIPPED_EXTRAS = ("lm_head.weight",)

#: Start-up values runtimes accept (tokenspeed `validate_k3_dspark_config`).
SERVING_MARKOV_HEAD_TYPES = frozenset({"vanilla"})
TRAINING_MARKOV_HEAD_TYPES = frozenset({"vanilla", "gated", "rnn"})
AUX_HIDDEN_STREAMS = frozenset({"prefix", "attn_res"})
#: Keys a runtime reads that change numerics but are absent from the reference (never emit them).
FORBIDDEN_KEYS: dict[str, str] = {
    "rope_interleave": "ATOM maps it to the half-split rotation the draft was not trained with "
                       "(6% acceptance instead of 26% in a public log)",
}

#: A draft has a handful of layers; beyond this a config is a typo, and its roster would not fit in memory.
MAX_DRAFT_LAYERS = 1024

@dataclass(frozen=True)
class TensorSpec:
    """One contract tensor: its name, shape and dtype."""

    name: str
    shape: tuple[int, ...]
    dtype: str = CONTRACT_DTYPE

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * DTYPE_SIZES[self.dtype]


@dataclass(frozen=True)
class ParameterCounts(Document):
    """Parameters of a roster: everything, what is frozen, and what training owns.

    `maps` counts the elements of integer/boolean vocabulary maps (a speculators draft's
    `d2t`/`t2d`), which are stored beside the weights but are not parameters.
    """

    KEYS = ("total", "trained", "frozen", "maps")

    total: int
    frozen: int
    trained: int
    maps: int = 0


def reference_config() -> dict[str, Any]:
    """A deep copy of the published reference config (safe to mutate)."""
    return copy.deepcopy(REFERENCE_CONFIG)


def profile_config(name: str) -> dict[str, Any]:
    """A deep copy of a named profile config (`kimi-k3` or `tiny`)."""
    try:
        return copy.deepcopy(PROFILES[name])
    except KeyError:
        raise ContractError(f"unknown profile {name!r}; choose one of {', '.join(sorted(PROFILES))}") from None


def config_bytes(config: Mapping[str, Any]) -> bytes:
    """Serialize a config the way the published file was written (`indent=2` plus a newline)."""
    return (json.dumps(config, indent=2) + "\n").encode("utf-8")


def reference_config_bytes() -> bytes:
    """The published `config.json`, byte for byte (SHA-256 `5a3c2f4f...`)."""
    return config_bytes(REFERENCE_CONFIG)


def _int(config: Mapping[str, Any], key: str) -> int:
    value = config.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ContractError(f"config.json: {key!r} must be a positive integer, got {json.dumps(value)}", key=key)
    return value


#: Keys the roster reads, validated in this order (the layer count is bounded before the layer keys).
_ROSTER_KEYS = ("hidden_size", "vocab_size", "num_target_layers", "target_hidden_size", "markov_rank",
                "draft_vocab_size", "num_hidden_layers")
_LAYER_KEYS = ("hidden_size", "intermediate_size", "num_attention_heads", "qk_nope_head_dim", "qk_rope_head_dim",
               "v_head_dim", "q_lora_rank", "kv_lora_rank")


def layer_roster(config: Mapping[str, Any], i: int) -> list[TensorSpec]:
    """The 12 tensors of decoder layer `i`, in module order.

    Raises:
        ContractError: a key the layer depends on is missing or not a positive integer.
    """
    for key in _LAYER_KEYS:
        _int(config, key)
    return [TensorSpec(name, shape) for name, shape in roster_k3_dspark.layer_shapes(config, i).items()]


def roster(config: Mapping[str, Any]) -> dict[str, TensorSpec]:
    """Every tensor a checkpoint with this config must hold, sorted by name (file order).

    The names and shapes are `roster_k3_dspark.tensor_shapes(config)`, the function
    `K3DSparkModel` builds its modules from; `enable_confidence_head` and
    `confidence_head_with_markov` default to true when absent (`HEAD_FLAG_DEFAULT`).

    Raises:
        ContractError: a key the roster depends on is missing or not a positive integer.
    """
    for key in _ROSTER_KEYS:
        _int(config, key)
    layers = config["num_hidden_layers"]
    if layers > MAX_DRAFT_LAYERS:
        raise ContractError(f"config.json: num_hidden_layers is {layers:,}; a draft has a few layers (the reference "
                            f"5), more than {MAX_DRAFT_LAYERS} is a typo", key="num_hidden_layers")
    for key in _LAYER_KEYS:
        _int(config, key)
    shapes = roster_k3_dspark.tensor_shapes(config)
    return {name: TensorSpec(name, shapes[name]) for name in sorted(shapes)}


def is_frozen(name: str) -> bool:
    return name in FROZEN_TENSORS


def count_parameters(shapes: Mapping[str, tuple[int, ...]] | Mapping[str, TensorSpec]) -> ParameterCounts:
    """Total, frozen (`embed_tokens`) and trained parameters of a name -> shape (or spec) map."""
    total = frozen = 0
    for name, shape in shapes.items():
        numel = shape.numel if isinstance(shape, TensorSpec) else math.prod(shape)
        total += numel
        if is_frozen(name):
            frozen += numel
    return ParameterCounts(total=total, frozen=frozen, trained=total - frozen)


def parameter_counts(config: Mapping[str, Any]) -> ParameterCounts:
    """Parameter counts of the roster this config implies."""
    return count_parameters(roster(config))


def header_bytes(specs: Mapping[str, TensorSpec] | list[TensorSpec],
                 metadata: Mapping[str, str] | None = None) -> bytes:
    """The safetensors header (JSON, space-padded to 8 bytes) for tensors laid out in the given order.

    Matches what the `safetensors` library writes for same-dtype tensors in sorted-name order.
    """
    items = list(specs.values()) if isinstance(specs, Mapping) else list(specs)
    header: dict[str, Any] = {}
    if metadata is not None:
        header["__metadata__"] = dict(metadata)
    offset = 0
    for spec in items:
        header[spec.name] = {"dtype": spec.dtype, "shape": list(spec.shape),
                             "data_offsets": [offset, offset + spec.nbytes]}
        offset += spec.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
    return raw + b" " * (-len(raw) % 8)


def expected_header(config: Mapping[str, Any], metadata: Mapping[str, str] | None = TORCHSPEC_METADATA) -> bytes:
    """The header a single-file export of this config carries."""
    return header_bytes(roster(config), metadata)


def expected_file_size(config: Mapping[str, Any], metadata: Mapping[str, str] | None = TORCHSPEC_METADATA) -> int:
    """Bytes of a single `model.safetensors` for this config: 8 + header + tensor data."""
    specs = roster(config)
    return 8 + len(header_bytes(specs, metadata)) + sum(s.nbytes for s in specs.values())
