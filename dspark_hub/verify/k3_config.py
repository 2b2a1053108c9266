"""The k3_dspark config rules: what serving runtimes check at start-up, plus the contract's own.

`verify.checks.CONFIG_RULES` attaches them to the k3_dspark format; the speculators format has its own
(`verify.speculators`). Each finding names the key (`config.json:KEY`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dspark_hub._text import short_json
from dspark_hub.format import contract
from dspark_hub.format.jsonio import is_int
from dspark_hub.format.taps import tap_layer_findings
from dspark_hub.report import Finding, error, warning

#: Config keys whose absence makes the roster or a runtime rule undecidable.
REQUIRED_KEYS = (
    "architectures", "model_type", "hidden_size", "intermediate_size", "num_hidden_layers",
    "num_attention_heads", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
    "v_head_dim", "vocab_size", "num_target_layers", "target_hidden_size", "target_num_hidden_layers",
    "target_layer_ids", "mask_token_id", "markov_rank", "markov_head_type", "draft_vocab_size",
    "rope_parameters",
)


def _fmt(value: object) -> str:
    return short_json(value)


def _rule(ok: bool, key: str, message: str, hint: str) -> list[Finding]:
    return [] if ok else [error("CONFIG_RULE", f"config.json:{key}", message, hint)]


def _value_rules(config: Mapping[str, Any]) -> list[Finding]:
    out: list[Finding] = []
    layers = config.get("num_hidden_layers")
    out += _rule(is_int(layers) and layers > 0, "num_hidden_layers",
                 f"num_hidden_layers is {_fmt(layers)}; it must be a positive integer (a JSON number)",
                 "set the draft's layer count")
    vocab, mask = config.get("vocab_size"), config.get("mask_token_id")
    out += _rule(is_int(mask) and is_int(vocab) and 0 <= mask < vocab, "mask_token_id",
                 f"mask_token_id is {_fmt(mask)}; it must be an id in [0, vocab_size={_fmt(vocab)})",
                 "use the reserved mask token the draft was trained with")
    head = config.get("markov_head_type")
    if head not in contract.SERVING_MARKOV_HEAD_TYPES:
        known = head in contract.TRAINING_MARKOV_HEAD_TYPES
        out += _rule(False, "markov_head_type", f"markov_head_type is {_fmt(head)}; serving runtimes accept only "
                     f"{sorted(contract.SERVING_MARKOV_HEAD_TYPES)}" + (" (it is a training-only head)" if known
                                                                        else ""),
                     "train with the vanilla Markov head")
    rank = config.get("markov_rank")
    out += _rule(is_int(rank) and rank > 0, "markov_rank", f"markov_rank is {_fmt(rank)}; it must be > 0",
                 "set the rank of markov_head.markov_w1/w2")
    stream = config.get("aux_hidden_stream", "prefix")
    out += _rule(stream in contract.AUX_HIDDEN_STREAMS, "aux_hidden_stream",
                 f"aux_hidden_stream is {_fmt(stream)}; runtimes accept {sorted(contract.AUX_HIDDEN_STREAMS)}",
                 "remove the key (default 'prefix')")
    for key in ("mla_use_nope", "mla_use_output_gate"):
        out += _rule(config.get(key, False) is False, key, f"{key} is {_fmt(config.get(key))}; runtimes require "
                     "false", f"set {key} to false")
    q_rank = config.get("q_lora_rank")
    out += _rule(is_int(q_rank) and q_rank > 0, "q_lora_rank", f"q_lora_rank is {_fmt(q_rank)}; it must be > 0",
                 "the k3_dspark attention always uses a q low-rank projection")
    out += _rope_rules(config.get("rope_parameters"))
    out += _dtype_rules(config)
    return out


def _dtype_rules(config: Mapping[str, Any]) -> list[Finding]:
    """`torch_dtype` / `dtype` name a float dtype loaders know (`"bfloat17"`, `5` or `null` load as the default)."""
    known = ", ".join(contract.TORCH_DTYPE_NAMES)
    return [finding for key, value in contract.unknown_dtypes(config).items()
            for finding in _rule(False, key, f"{key} is {_fmt(value)}; it must be one of {known}",
                                 "write the dtype the tensors are saved in (reference: "
                                 f"{_fmt(contract.REFERENCE_CONFIG['torch_dtype'])})")]


#: What YaRN needs in `rope_parameters`, and the type of each value.
YARN_KEYS: dict[str, tuple[type[int] | type[float], ...]] = {
    "factor": (int, float), "original_max_position_embeddings": (int,), "rope_theta": (int, float),
    "beta_fast": (int, float), "beta_slow": (int, float), "mscale": (int, float), "mscale_all_dim": (int, float)}


def _non_negative(value: object, types: tuple[type[int] | type[float], ...]) -> bool:
    return isinstance(value, types) and not isinstance(value, bool) and value >= 0


def _rope_rules(rope: object) -> list[Finding]:
    """`rope_parameters` must be the YaRN block the draft was trained with; a modeling default never fills it."""
    reference = _fmt(contract.REFERENCE_CONFIG["rope_parameters"])
    hint = f"write the YaRN block the draft was trained with (reference: {reference})"
    if rope is None:
        return []   # a missing or null key is reported by the structure rules
    if not isinstance(rope, dict):
        return _rule(False, "rope_parameters", f"rope_parameters is {_fmt(rope)[:60]}, not an object", hint)
    if rope.get("rope_type") != "yarn":
        return _rule(False, "rope_parameters", f"rope_parameters.rope_type is {_fmt(rope.get('rope_type'))}; "
                     "the k3_dspark attention uses YaRN", hint)
    bad = [key for key, types in YARN_KEYS.items() if not _non_negative(rope.get(key), types)]
    return _rule(not bad, "rope_parameters", f"rope_parameters has missing or non-numeric {', '.join(bad)}", hint)


def _structure_rules(config: Mapping[str, Any]) -> list[Finding]:
    out: list[Finding] = []
    for key, why in contract.FORBIDDEN_KEYS.items():
        if key in config:
            out.append(error("FORBIDDEN_KEY", f"config.json:{key}", f"{key} is not a k3_dspark key: {why}",
                             f"delete {key} (or run 'dspark-hub convert')"))
    model_type = config.get("model_type", contract.MODEL_TYPE)
    if model_type != contract.MODEL_TYPE:
        out.append(error("CONFIG_RULE", "config.json:model_type", f"model_type is {_fmt(model_type)} over a "
                         "k3_dspark body; runtimes resolve the config class from it",
                         f"set model_type to \"{contract.MODEL_TYPE}\""))
    arch = config.get("architectures")
    if arch != [contract.ARCHITECTURE]:
        out.append(error("CONFIG_RULE", "config.json:architectures", f"architectures is {_fmt(arch)}; runtimes "
                         f"resolve the draft class from it", f"set architectures to [\"{contract.ARCHITECTURE}\"]"))
    for key in REQUIRED_KEYS:
        if key not in config and key != "architectures":
            out.append(error("CONFIG_MISSING_KEY", f"config.json:{key}", f"{key} is missing; runtimes either fail "
                             "or fall back to a default the draft was not trained with",
                             f"add {key} (reference value {_fmt(contract.REFERENCE_CONFIG[key])})"))
    for key in contract.REFERENCE_CONFIG:
        if key not in config and key not in REQUIRED_KEYS:
            out.append(warning("CONFIG_MISSING_KEY", f"config.json:{key}", f"{key} is missing",
                               f"add it (reference value {_fmt(contract.REFERENCE_CONFIG[key])})"))
    nulls = [k for k, v in config.items() if v is None and k not in contract.DTYPE_KEYS]   # dtype: `_dtype_rules`
    for key in nulls:
        make = error if key in REQUIRED_KEYS else warning
        out.append(make("CONFIG_NULL_VALUE", f"config.json:{key}", f"{key} is null; runtimes read it as unset "
                        "and fall back to a default", "give it the value the draft was trained with"))
    if config.get("draft_vocab_size", config.get("vocab_size")) != config.get("vocab_size"):
        out.append(warning("DRAFT_VOCAB_PRUNED", "config.json:draft_vocab_size",
                           f"draft_vocab_size {_fmt(config.get('draft_vocab_size'))} differs from vocab_size "
                           f"{_fmt(config.get('vocab_size'))}; the k3_dspark contract has no d2t map for a pruned "
                           "vocabulary", "keep draft_vocab_size equal to vocab_size"))
    return out


def k3_config_findings(config: Mapping[str, Any]) -> list[Finding]:
    """Every config rule serving runtimes apply to a k3_dspark draft at start-up, plus the contract's own."""
    return _structure_rules(config) + tap_layer_findings(config) + _value_rules(config)
