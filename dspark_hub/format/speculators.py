"""The speculators-format DSpark contract (vllm-project/speculators 0.9.0) as data and derivations.

A DSpark draft trained with the `speculators` library (`RedHatAI/Kimi-K3-speculator.dspark`)
is saved in that library's own format, not as `k3_dspark`: a `config.json` with
`speculators_model_type: "dspark"`, a nested Qwen3 `transformer_layer_config`, and a GQA body
named `fc`, `hidden_norm`, `norm`, `layers.N.self_attn.{q,k,v,o}_proj`, `q_norm`/`k_norm`,
plus the `markov_head.*` and `confidence_head.*` heads. Everything here was read from the
library and checked by running it (`tests/fixtures/speculators/`, saved by the library's own
`save_pretrained`; see that folder's `make_fixtures.py`). Stdlib only.

- `geometry(config)`: the numbers the roster depends on (`ContractError` naming the key otherwise).
- `roster(config)`: name -> `TensorSpec`, exactly what `save_pretrained` writes.
- `tensor_role(name)`: `trained`, `frozen` (the verifier's `lm_head` rows of a pruned draft) or
  `map` (`d2t`/`t2d`, integer and boolean vocabulary maps, not parameters).
- `count_parameters(shapes)`: total/trained/frozen parameters, maps counted apart.
- `speculative_tokens(config)`, `written_speculative_tokens(config)`, `verifier_name(config)`.
- `k3_counterpart(name)`: the `k3_dspark` tensor a speculators tensor maps onto one to one, if any.

Roster (H = draft hidden size, n/kv heads of width d, I = MLP width, L = draft layers,
V = `transformer_layer_config.vocab_size`, Vd = `draft_vocab_size`, T = number of aux ids,
Ht = `target_hidden_size` or H, r = `markov_rank`)::

    fc.weight [H, T*Ht]   hidden_norm.weight [H]   norm.weight [H]
    layers.i.{input,post_attention}_layernorm.weight [H]
    layers.i.self_attn.q_proj.weight [n*d, H]  k_proj/v_proj [kv*d, H]  o_proj [H, n*d]  q_norm/k_norm [d]
    layers.i.mlp.{gate,up}_proj.weight [I, H]  down_proj [H, I]
    if Vd != V: lm_head.weight [Vd, H] (frozen verifier rows), d2t [Vd] I64, t2d [V] BOOL
    if r > 0:  markov_head.markov_w1.weight [V, r], markov_w2.weight [Vd, r]
               gated: markov_head.gate_proj.{weight [r, H+r], bias [r]}
               rnn:   markov_head.joint_proj.{weight [3r, 2r+H], bias [3r]}
    if enable_confidence_head: confidence_head.proj.{weight [1, H + r*with_markov], bias [1]}
    never: embed_tokens (the verifier's, frozen, never saved)

speculators itself sizes `fc` with H and never reads `target_hidden_size`; vLLM sizes it with
`target_hidden_size or H` (vLLM 0.32.0 qwen3_dflash.py:108-117, executed). The roster follows
vLLM, and a `target_hidden_size` other than null or H is a config rule violation.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from dspark_hub.errors import ContractError
from dspark_hub.format import contract
from dspark_hub.format.contract import ParameterCounts, TensorSpec
from dspark_hub.format.jsonio import is_int

#: The config key that names a speculators checkpoint's algorithm (the pydantic discriminator).
TYPE_KEY = "speculators_model_type"
DSPARK = "dspark"
#: Every type speculators 0.9.0 registers (`SpeculatorModelConfig.registry`, executed).
REGISTERED_TYPES = ("dflash", "dflash2", "dspark", "eagle3", "mtp", "peagle", "xpress")
LAYER_CONFIG_KEY = "transformer_layer_config"
AUX_IDS_KEY = "aux_hidden_state_layer_ids"
MARKOV_HEAD_TYPES = ("vanilla", "gated", "rnn")
#: Decoder-layer types this roster is derived for (vLLM serves a speculators DSpark as Qwen3DSparkModel).
LAYER_MODEL_TYPES = ("qwen3",)
#: Field defaults of `DSparkSpeculatorConfig` in speculators 0.9.0 (models/dspark/config.py, dflash/config.py).
DEFAULTS: dict[str, Any] = {
    "markov_rank": 256,
    "markov_head_type": "vanilla",
    "enable_confidence_head": True,
    "confidence_head_with_markov": True,
    "sample_from_anchor": True,
    "block_size": 8,
    "sliding_window_non_causal": False,
    "target_hidden_size": None,
}

#: Integer and boolean vocabulary maps of a pruned draft: `target_id = draft_id + d2t[draft_id]`; `t2d`
#: marks the target ids the draft can emit. Not parameters: counted apart.
VOCAB_MAPS: dict[str, str] = {"d2t": "I64", "t2d": "BOOL"}
#: Saved but never trained: a pruned draft's `lm_head` is the verifier's rows picked by `t2d`
#: (speculators model.py:172-185; frozen in training, model.py:63-71).
FROZEN_TENSORS = ("lm_head.weight",)

Role = Literal["trained", "frozen", "map"]


@dataclass(frozen=True)
class Geometry:
    """The numbers a speculators DSpark roster depends on."""

    hidden_size: int               # H, the draft's (and the verifier's) hidden size
    heads: int                     # n
    kv_heads: int                  # kv
    head_dim: int                  # d
    intermediate_size: int         # I
    layers: int                    # L
    vocab_size: int                # V, the verifier's vocabulary
    draft_vocab_size: int          # Vd
    taps: int                      # T, number of aux hidden states
    tap_width: int                 # Ht = target_hidden_size or H
    markov_rank: int               # r (<= 0: no Markov head)
    markov_head_type: str
    confidence: bool
    confidence_with_markov: bool
    attention_bias: bool
    mlp_bias: bool

    @property
    def pruned(self) -> bool:
        """A draft vocabulary smaller (or other) than the verifier's: lm_head, d2t and t2d are saved."""
        return self.draft_vocab_size != self.vocab_size


def is_speculators(config: Mapping[str, Any] | None) -> bool:
    """Whether a config is a speculators-format config (any algorithm)."""
    return config is not None and TYPE_KEY in config


def is_dspark(config: Mapping[str, Any] | None) -> bool:
    return config is not None and config.get(TYPE_KEY) == DSPARK


def layer_config(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """The nested decoder config (`ContractError` when it is not an object)."""
    tl = config.get(LAYER_CONFIG_KEY)
    if not isinstance(tl, Mapping):
        raise ContractError(f"config.json: {LAYER_CONFIG_KEY} is {_show(tl)}, not an object; the roster's shapes "
                            "come from it", key=LAYER_CONFIG_KEY)
    return tl


def _show(value: Any) -> str:
    return json.dumps(value)[:60]



def _positive(mapping: Mapping[str, Any], key: str, where: str) -> int:
    value = mapping.get(key)
    if not is_int(value) or value <= 0:
        raise ContractError(f"config.json: {where} must be a positive integer, got {_show(value)}", key=where)
    return value


def _flag(config: Mapping[str, Any], key: str) -> bool:
    value = config.get(key, DEFAULTS[key])
    return bool(value)


def geometry(config: Mapping[str, Any]) -> Geometry:
    """The roster's numbers, read from `transformer_layer_config` and the top-level keys.

    Raises:
        ContractError: a key the roster depends on is missing or ill-typed (`key` is its dotted path).
    """
    tl = layer_config(config)
    nested = f"{LAYER_CONFIG_KEY}."
    model_type = tl.get("model_type", "qwen3")
    if model_type not in LAYER_MODEL_TYPES:
        raise ContractError(f"config.json: {nested}model_type is {_show(model_type)}; the DSpark roster is "
                            f"derived for {', '.join(LAYER_MODEL_TYPES)} decoder layers (vLLM serves the draft as "
                            "Qwen3DSparkModel)", key=f"{nested}model_type")
    h = _positive(tl, "hidden_size", f"{nested}hidden_size")
    n = _positive(tl, "num_attention_heads", f"{nested}num_attention_heads")
    kv = tl.get("num_key_value_heads")
    kv = n if kv is None else _positive(tl, "num_key_value_heads", f"{nested}num_key_value_heads")
    d = tl.get("head_dim")
    d = h // n if d is None else _positive(tl, "head_dim", f"{nested}head_dim")
    if d <= 0:
        raise ContractError(f"config.json: {nested}head_dim is unset and hidden_size {h} < num_attention_heads {n}",
                            key=f"{nested}head_dim")
    inter = _positive(tl, "intermediate_size", f"{nested}intermediate_size")
    layers = _positive(tl, "num_hidden_layers", f"{nested}num_hidden_layers")
    if layers > contract.MAX_DRAFT_LAYERS:
        raise ContractError(f"config.json: {nested}num_hidden_layers is {layers:,}; a draft has a few layers, more "
                            f"than {contract.MAX_DRAFT_LAYERS} is a typo", key=f"{nested}num_hidden_layers")
    vocab = _positive(tl, "vocab_size", f"{nested}vocab_size")
    draft_vocab = _positive(config, "draft_vocab_size", "draft_vocab_size")
    ids = config.get(AUX_IDS_KEY)
    if not isinstance(ids, list) or not ids:
        raise ContractError(f"config.json: {AUX_IDS_KEY} is {_show(ids)}; fc's width is the number of aux ids",
                            key=AUX_IDS_KEY)
    width = config.get("target_hidden_size")
    width = h if width is None else _positive(config, "target_hidden_size", "target_hidden_size")
    rank = config.get("markov_rank", DEFAULTS["markov_rank"])
    if not is_int(rank):
        raise ContractError(f"config.json: markov_rank must be an integer, got {_show(rank)}", key="markov_rank")
    head = config.get("markov_head_type", DEFAULTS["markov_head_type"])
    if head not in MARKOV_HEAD_TYPES:
        raise ContractError(f"config.json: markov_head_type is {_show(head)}; speculators knows "
                            f"{', '.join(MARKOV_HEAD_TYPES)}", key="markov_head_type")
    confidence = _flag(config, "enable_confidence_head")
    with_markov = _flag(config, "confidence_head_with_markov")
    if confidence and with_markov and rank <= 0:
        raise ContractError("config.json: confidence_head_with_markov needs markov_rank > 0 (speculators refuses "
                            "to build the model)", key="confidence_head_with_markov")
    return Geometry(hidden_size=h, heads=n, kv_heads=kv, head_dim=d, intermediate_size=inter, layers=layers,
                    vocab_size=vocab, draft_vocab_size=draft_vocab, taps=len(ids), tap_width=width,
                    markov_rank=rank, markov_head_type=head, confidence=confidence,
                    confidence_with_markov=with_markov, attention_bias=bool(tl.get("attention_bias", False)),
                    mlp_bias=bool(tl.get("mlp_bias", False)))


def float_dtype(config: Mapping[str, Any]) -> str | None:
    """The safetensors dtype the config declares for float tensors (`dtype`, or `torch_dtype`), if any."""
    declared = config.get("dtype", config.get("torch_dtype"))
    return contract.TORCH_DTYPE_NAMES.get(declared) if isinstance(declared, str) else None


def layer_shapes(g: Geometry, i: int) -> dict[str, tuple[int, ...]]:
    """The Qwen3 decoder layer `i` of the DFlash body, in module order."""
    h, n, kv, d, inter = g.hidden_size, g.heads, g.kv_heads, g.head_dim, g.intermediate_size
    p = f"layers.{i}."
    out: dict[str, tuple[int, ...]] = {
        p + "input_layernorm.weight": (h,),
        p + "self_attn.q_proj.weight": (n * d, h),
        p + "self_attn.k_proj.weight": (kv * d, h),
        p + "self_attn.v_proj.weight": (kv * d, h),
        p + "self_attn.o_proj.weight": (h, n * d),
        p + "self_attn.q_norm.weight": (d,),
        p + "self_attn.k_norm.weight": (d,),
        p + "post_attention_layernorm.weight": (h,),
        p + "mlp.gate_proj.weight": (inter, h),
        p + "mlp.up_proj.weight": (inter, h),
        p + "mlp.down_proj.weight": (h, inter),
    }
    if g.attention_bias:
        out.update({p + "self_attn.q_proj.bias": (n * d,), p + "self_attn.k_proj.bias": (kv * d,),
                    p + "self_attn.v_proj.bias": (kv * d,), p + "self_attn.o_proj.bias": (h,)})
    if g.mlp_bias:
        out.update({p + "mlp.gate_proj.bias": (inter,), p + "mlp.up_proj.bias": (inter,),
                    p + "mlp.down_proj.bias": (h,)})
    return out


def tensor_shapes(g: Geometry) -> dict[str, tuple[int, ...]]:
    """Every saved tensor's shape, in module order (body, vocabulary, heads)."""
    h, r = g.hidden_size, g.markov_rank
    out: dict[str, tuple[int, ...]] = {
        "fc.weight": (h, g.taps * g.tap_width),
        "hidden_norm.weight": (h,),
    }
    for i in range(g.layers):
        out.update(layer_shapes(g, i))
    out["norm.weight"] = (h,)
    if g.pruned:
        out["lm_head.weight"] = (g.draft_vocab_size, h)
        out["d2t"] = (g.draft_vocab_size,)
        out["t2d"] = (g.vocab_size,)
    if r > 0:
        out["markov_head.markov_w1.weight"] = (g.vocab_size, r)
        out["markov_head.markov_w2.weight"] = (g.draft_vocab_size, r)
        if g.markov_head_type == "gated":
            out["markov_head.gate_proj.weight"] = (r, h + r)
            out["markov_head.gate_proj.bias"] = (r,)
        elif g.markov_head_type == "rnn":
            out["markov_head.joint_proj.weight"] = (3 * r, 2 * r + h)
            out["markov_head.joint_proj.bias"] = (3 * r,)
    if g.confidence:
        out["confidence_head.proj.weight"] = (1, h + (r if g.confidence_with_markov else 0))
        out["confidence_head.proj.bias"] = (1,)
    return out


def roster(config: Mapping[str, Any], *, dtype: str | None = None) -> dict[str, TensorSpec]:
    """Every tensor a speculators DSpark checkpoint with this config holds, sorted by name.

    Args:
        config: the checkpoint's `config.json`.
        dtype: the float dtype (default: the config's `dtype`, else BF16, the trainer's checkpoint dtype).
            `d2t` is always I64 and `t2d` BOOL.

    Raises:
        ContractError: a key the roster depends on is missing or ill-typed.
    """
    floats = dtype or float_dtype(config) or contract.CONTRACT_DTYPE
    shapes = tensor_shapes(geometry(config))
    return {name: TensorSpec(name, shapes[name], VOCAB_MAPS.get(name, floats)) for name in sorted(shapes)}


def tensor_role(name: str) -> Role:
    """`map` for d2t/t2d, `frozen` for a pruned draft's lm_head, `trained` for everything else."""
    if name in VOCAB_MAPS:
        return "map"
    return "frozen" if name in FROZEN_TENSORS else "trained"


def count_parameters(shapes: Mapping[str, tuple[int, ...]] | Mapping[str, TensorSpec]) -> ParameterCounts:
    """Parameters of a name -> shape (or spec) map: d2t/t2d are maps, not parameters; lm_head is frozen."""
    total = frozen = maps = 0
    for name, shape in shapes.items():
        numel = shape.numel if isinstance(shape, TensorSpec) else math.prod(shape)
        role = tensor_role(name)
        if role == "map":
            maps += numel
            continue
        total += numel
        if role == "frozen":
            frozen += numel
    return ParameterCounts(total=total, frozen=frozen, trained=total - frozen, maps=maps)


# ---------------------------------------------------------------- serving facts

def proposal(config: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The first proposal method (what `vllm serve DRAFT` reads, vLLM 0.32.0 base.py:77-94), if well formed."""
    spec = config.get("speculators_config")
    methods = spec.get("proposal_methods") if isinstance(spec, Mapping) else None
    first = methods[0] if isinstance(methods, list) and methods else None
    return first if isinstance(first, Mapping) else None


def speculative_tokens(config: Mapping[str, Any]) -> int | None:
    """`speculators_config.proposal_methods[0].speculative_tokens`, when it is a positive integer."""
    n = (proposal(config) or {}).get("speculative_tokens")
    return n if is_int(n) and n > 0 else None


def written_speculative_tokens(config: Mapping[str, Any]) -> int | None:
    """What training writes as `speculative_tokens`: `block_size`, or `block_size - 1` for a bonus-anchor
    (`sample_from_anchor: false`) draft (speculators models/dflash/core.py:256-259)."""
    block = config.get("block_size", DEFAULTS["block_size"])
    if not is_int(block) or block <= 0:
        return None
    return block if config.get("sample_from_anchor", DEFAULTS["sample_from_anchor"]) else block - 1


def verifier_name(config: Mapping[str, Any]) -> str | None:
    """`speculators_config.verifier.name_or_path`: the model the draft was trained against."""
    spec = config.get("speculators_config")
    verifier = spec.get("verifier") if isinstance(spec, Mapping) else None
    name = verifier.get("name_or_path") if isinstance(verifier, Mapping) else None
    return name if isinstance(name, str) and name else None


# ---------------------------------------------------------------- the k3_dspark crosswalk

#: Layer modules with the same name, shape formula and role in both formats.
SHARED_LAYER_MODULES = ("input_layernorm.weight", "post_attention_layernorm.weight", "mlp.gate_proj.weight",
                        "mlp.up_proj.weight", "mlp.down_proj.weight")
#: Heads with the same names in both formats.
SHARED_HEADS = ("markov_head.markov_w1.weight", "markov_head.markov_w2.weight", "confidence_head.proj.weight",
                "confidence_head.proj.bias")
_LAYER = re.compile(r"^layers\.(\d+)\.(.+)$")


def k3_counterpart(name: str) -> str | None:
    """The `k3_dspark` tensor a speculators DSpark tensor maps onto one to one (same role, same shape
    formula), or None: the GQA attention, the pruned-vocabulary tensors and the gated/rnn heads have none.

    The context path and final norm are the trainer names of `contract.KNOWN_MISNAMES`.
    """
    if name in contract.KNOWN_MISNAMES:
        return contract.KNOWN_MISNAMES[name]
    if name in SHARED_HEADS:
        return name
    m = _LAYER.match(name)
    return name if m and m.group(2) in SHARED_LAYER_MODULES else None


def speculators_counterpart(k3_name: str) -> str | None:
    """Inverse of `k3_counterpart`: the speculators DSpark tensor a `k3_dspark` tensor maps onto, or None
    (the MLA attention has no GQA counterpart; `embed_tokens` is never saved by speculators)."""
    back = {v: k for k, v in contract.KNOWN_MISNAMES.items()}
    if k3_name in back:
        return back[k3_name]
    return k3_name if k3_counterpart(k3_name) == k3_name else None
