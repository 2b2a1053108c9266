"""Config rules of a speculators-format DSpark checkpoint: what speculators 0.9.0 and vLLM 0.32.0 enforce.

Every rule is data (`RULES`): an id, what it demands, where it was found (file:line in
speculators 0.9.0 `S/` or vLLM 0.32.0 `V/`), and whether that behaviour was **executed**
(run against the library with the fixtures in `tests/fixtures/speculators/`) or only **read** in
the code. A finding names its rule's source and evidence in its message.

Findings use the same codes as the k3_dspark rules: `CONFIG_RULE` (error; a warning where the
two libraries disagree on an absent key but neither fails), `CONFIG_MISSING_KEY`, and
`SERVING_UNSUPPORTED` (warning: a valid speculators checkpoint vLLM 0.32.0 refuses to load).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from dspark_hub._text import short_json
from dspark_hub.documents import Document
from dspark_hub.format import contract, speculators
from dspark_hub.format.jsonio import is_int
from dspark_hub.format.taps import aux_id_findings
from dspark_hub.report import Finding, error, warning
from dspark_hub.vllm.pin import PINNED_VERSION

Evidence = Literal["executed", "read"]
S = "speculators 0.9.0 "
V = f"vLLM {PINNED_VERSION} "


@dataclass(frozen=True)
class ConfigRule(Document):
    """One config rule, where it comes from, and how we know."""

    id: str
    rule: str
    source: str
    evidence: Evidence

    @property
    def note(self) -> str:
        return f"[{self.source}; {self.evidence}]"


RULES: dict[str, ConfigRule] = {r.id: r for r in (
    ConfigRule("layer_config", "transformer_layer_config is an object of a decoder type the DSpark roster is derived "
               "for (qwen3: vLLM serves the draft as Qwen3DSparkModel)",
               S + "models/dflash/config.py:84-100 (type must be a transformers config); "
               + V + "transformers_utils/configs/speculators/algos.py:175-186 (Qwen3DSparkModel)", "executed"),
    ConfigRule("required", "keys the roster or the loaders need are present",
               S + "models/dflash/core.py:122-126 (aux ids), core.py:309-317 (mask id); "
               + V + "algos.py:192-195 (aux ids, KeyError), base.py:77-94", "executed"),
    ConfigRule("gqa_heads", "num_attention_heads is a multiple of num_key_value_heads",
               S + "train/cli.py:195-211", "read"),
    ConfigRule("markov_head_type", "markov_head_type is vanilla, gated or rnn", S + "models/dspark/config.py:48",
               "executed"),
    ConfigRule("vanilla_only", "vLLM loads only the vanilla Markov head (a gated or rnn checkpoint fails on "
               "markov_head.gate_proj / joint_proj)", V + "model_executor/models/qwen3_dspark.py:48-81", "executed"),
    ConfigRule("markov_rank", "markov_rank is an integer; 0 (or less) means no Markov head",
               S + "models/dspark/config.py:41-47, core.py:44-51", "executed"),
    ConfigRule("confidence_needs_markov", "confidence_head_with_markov needs markov_rank > 0",
               S + "models/dspark/core.py:55-58", "executed"),
    ConfigRule("aux_ids", "aux_hidden_state_layer_ids: non-empty, distinct, >= 0",
               S + "models/utils.py:99-140; " + V + "algos.py:192-195", "executed"),
    ConfigRule("mask_token", "mask_token_id is set, and an id of the vocabulary (neither library checks the range: "
               "99999 is accepted; a dspark-hub rule)", S + "models/dflash/core.py:309-317; "
               + V + "v1/worker/gpu/spec_decode/utils.py:92-114 (read)", "executed"),
    ConfigRule("draft_vocab", "draft_vocab_size is at most the vocabulary (a larger one needs embed_tokens in "
               "vLLM, which speculators never saves)", V + "model_executor/models/qwen3_dspark.py:341-347",
               "executed"),
    ConfigRule("target_hidden_size", "target_hidden_size is null or the hidden size: speculators sizes fc with "
               "the hidden size, vLLM with target_hidden_size", S + "models/dflash/config.py:51-54 (unused); "
               + V + "model_executor/models/qwen3_dflash.py:108-117", "executed"),
    ConfigRule("block_size", "block_size is a positive integer (2.5 is rejected when the config is parsed, "
               "executed; 0 is accepted there and fails when anchors are drawn, read)",
               S + "pydantic, models/dflash/utils.py:41-42", "read"),
    ConfigRule("flags", "the head and layout flags are JSON booleans (pydantic reads 'false' as false, vLLM copies "
               "the raw string, which Python reads as true)", S + "pydantic lax mode; " + V + "algos.py:197-209",
               "executed"),
    ConfigRule("speculators_config", "speculators_config: proposal_methods (greedy, speculative_tokens >= 1, "
               "verifier_accept_k >= 1, accept_tolerance >= 0), default_proposal_method naming one of them, "
               "verifier with name_or_path and architectures",
               S + "config.py:40-161, proposals/greedy.py:24-72", "executed"),
    ConfigRule("speculative_tokens", "speculative_tokens is what training writes for the block layout: block_size, "
               "or block_size - 1 without sample_from_anchor (vllm serve DRAFT uses speculative_tokens; "
               "--speculative-config without a count uses block_size)",
               S + "models/dflash/core.py:256-259; " + V + "config/speculative.py:1481-1488", "executed"),
    ConfigRule("sample_from_anchor", "sample_from_anchor is written: absent, speculators reads true and vLLM false",
               S + "models/dspark/config.py:28-38; " + V + "algos.py:188-190", "executed"),
    ConfigRule("enable_confidence_head", "enable_confidence_head is written: absent, speculators builds the head "
               "and vLLM drops its tensors", S + "models/dspark/config.py:57-60; "
               + V + "model_executor/models/qwen3_dspark.py:220, 366-368", "executed"),
    ConfigRule("sliding_window_non_causal", "sliding_window_non_causal is not carried over to vLLM (its block is "
               "causal on sliding-window layers)", V + "algos.py:197-209", "executed"),
    ConfigRule("dtype", "dtype names the float dtype of the tensors", S + "train/finetuning/checkpointer.py:282-298 "
               "(patch_config_dtype)", "read"),
)}

#: Top-level keys without which the roster or a loader cannot work.
REQUIRED = ("transformer_layer_config", "aux_hidden_state_layer_ids", "draft_vocab_size", "mask_token_id",
            "block_size", "speculators_config")
#: Decoder keys the roster reads (head_dim and num_key_value_heads have defaults).
REQUIRED_LAYER_KEYS = ("hidden_size", "num_attention_heads", "intermediate_size", "num_hidden_layers", "vocab_size")
#: Keys with a speculators default whose absence vLLM may read differently.
DEFAULTED = ("markov_rank", "markov_head_type", "confidence_head_with_markov")
BOOLEAN_FLAGS = ("enable_confidence_head", "confidence_head_with_markov", "sample_from_anchor",
                 "sliding_window_non_causal")


def _fmt(value: object) -> str:
    return short_json(value)


def _rule(rule_id: str, key: str, message: str, hint: str, *, severity: str = "error",
          code: str = "CONFIG_RULE") -> Finding:
    make = error if severity == "error" else warning
    return make(code, f"config.json:{key}", f"{message} {RULES[rule_id].note}", hint)


def _layer_rules(tl: object) -> list[Finding]:
    key = speculators.LAYER_CONFIG_KEY
    if not isinstance(tl, Mapping):
        return [_rule("layer_config", key, f"{key} is {_fmt(tl)}, not an object", "save the draft with "
                      "speculators, which writes the decoder config here")]
    out: list[Finding] = []
    model_type = tl.get("model_type", "qwen3")
    if model_type not in speculators.LAYER_MODEL_TYPES:
        out.append(_rule("layer_config", f"{key}.model_type", f"{key}.model_type is {_fmt(model_type)}; vLLM "
                         "serves a speculators DSpark with Qwen3 decoder layers", "train with qwen3 draft layers"))
    for name in REQUIRED_LAYER_KEYS:
        value = tl.get(name)
        if name not in tl:
            out.append(_rule("required", f"{key}.{name}", f"{key}.{name} is missing; the roster's shapes depend on "
                             "it", f"write {key}.{name}", code="CONFIG_MISSING_KEY"))
        elif not is_int(value) or value <= 0:
            out.append(_rule("required", f"{key}.{name}", f"{key}.{name} is {_fmt(value)}; it must be a positive "
                             "integer", "write the value the draft was trained with"))
    heads, kv = tl.get("num_attention_heads"), tl.get("num_key_value_heads", tl.get("num_attention_heads"))
    if is_int(heads) and is_int(kv) and heads > 0 and (kv <= 0 or heads % kv):
        out.append(_rule("gqa_heads", f"{key}.num_key_value_heads", f"num_attention_heads {heads} is not a multiple "
                         f"of num_key_value_heads {kv}", "use a key/value head count that divides the heads"))
    return out


def _head_rules(config: Mapping[str, Any]) -> list[Finding]:
    out: list[Finding] = []
    head = config.get("markov_head_type", speculators.DEFAULTS["markov_head_type"])
    if head not in speculators.MARKOV_HEAD_TYPES:
        out.append(_rule("markov_head_type", "markov_head_type", f"markov_head_type is {_fmt(head)}; speculators "
                         f"knows {', '.join(speculators.MARKOV_HEAD_TYPES)}", "write vanilla, gated or rnn"))
    elif head != "vanilla":
        out.append(_rule("vanilla_only", "markov_head_type", f"markov_head_type is {head!r}: speculators trains and "
                         f"loads it, but {V}serves only the vanilla head and refuses this checkpoint",
                         "train with the vanilla Markov head to serve with vLLM", severity="warning",
                         code="SERVING_UNSUPPORTED"))
    rank = config.get("markov_rank", speculators.DEFAULTS["markov_rank"])
    if not is_int(rank):
        out.append(_rule("markov_rank", "markov_rank", f"markov_rank is {_fmt(rank)}; it must be an integer",
                         "write the rank of markov_head.markov_w1/w2 (0: no Markov head)"))
    elif rank < 0:
        out.append(_rule("markov_rank", "markov_rank", f"markov_rank is {rank}; speculators reads a negative rank as "
                         "no Markov head", "write 0 for no Markov head", severity="warning"))
    conf = bool(config.get("enable_confidence_head", speculators.DEFAULTS["enable_confidence_head"]))
    with_markov = bool(config.get("confidence_head_with_markov", speculators.DEFAULTS["confidence_head_with_markov"]))
    if conf and with_markov and is_int(rank) and rank <= 0:
        out.append(_rule("confidence_needs_markov", "confidence_head_with_markov", f"confidence_head_with_markov is "
                         f"true but markov_rank is {rank}; speculators refuses to build the model",
                         "set confidence_head_with_markov to false, or give the Markov head a rank"))
    for key in BOOLEAN_FLAGS:
        if key in config and not isinstance(config[key], bool):
            out.append(_rule("flags", key, f"{key} is {_fmt(config[key])}, not true or false",
                             "write a JSON boolean"))
    return out


def _vocab_rules(config: Mapping[str, Any], tl: Mapping[str, Any]) -> list[Finding]:
    out: list[Finding] = []
    vocab = tl.get("vocab_size")
    vocab = vocab if is_int(vocab) and vocab > 0 else None
    draft = config.get("draft_vocab_size")
    if "draft_vocab_size" in config and (not is_int(draft) or draft <= 0):
        out.append(_rule("required", "draft_vocab_size", f"draft_vocab_size is {_fmt(draft)}; it must be a positive "
                         "integer", "write the draft vocabulary size (the vocabulary size when not pruned)"))
    elif is_int(draft) and vocab is not None and draft > vocab:
        out.append(_rule("draft_vocab", "draft_vocab_size", f"draft_vocab_size {draft} is larger than the vocabulary "
                         f"{vocab}", "a draft vocabulary is the verifier's or a subset of it"))
    mask = config.get("mask_token_id")
    if "mask_token_id" in config and not (is_int(mask) and (vocab is None or 0 <= mask < vocab)):
        out.append(_rule("mask_token", "mask_token_id", f"mask_token_id is {_fmt(mask)}; it must be an id in "
                         f"[0, {vocab if vocab is not None else 'vocab_size'})",
                         "use the reserved mask token the draft was trained with"))
    width, hidden = config.get("target_hidden_size"), tl.get("hidden_size")
    if width is not None and width != hidden:
        out.append(_rule("target_hidden_size", "target_hidden_size", f"target_hidden_size is {_fmt(width)} but the "
                         f"hidden size is {_fmt(hidden)}; vLLM then expects an fc the library never writes",
                         "write null (the hidden size)"))
    return out


def _proposal_rules(config: Mapping[str, Any]) -> list[Finding]:
    spec = config.get("speculators_config")
    where = "speculators_config"
    if spec is None and where not in config:
        return []    # reported as a missing key
    if not isinstance(spec, Mapping):
        return [_rule("speculators_config", where, f"{where} is {_fmt(spec)}, not an object",
                      "save with speculators, which writes the algorithm, proposal methods and verifier")]
    out: list[Finding] = []
    methods = spec.get("proposal_methods")
    if not isinstance(methods, list) or not methods or not all(isinstance(m, Mapping) for m in methods):
        out.append(_rule("speculators_config", f"{where}.proposal_methods", f"proposal_methods is {_fmt(methods)}; "
                         "it must list at least one method", "write the greedy proposal method"))
        methods = []
    for i, method in enumerate(methods):
        at = f"{where}.proposal_methods[{i}]"
        checks = (("proposal_type", lambda v: v == "greedy", "'greedy' (the one registered type)"),
                  ("speculative_tokens", lambda v: is_int(v) and v >= 1, "an integer >= 1"),
                  ("verifier_accept_k", lambda v: is_int(v) and v >= 1, "an integer >= 1"),
                  ("accept_tolerance", lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0,
                   "a number >= 0"))
        for key, ok, want in checks:
            if key in method and not ok(method[key]):
                out.append(_rule("speculators_config", f"{at}.{key}", f"{key} is {_fmt(method[key])}; it must be "
                                 f"{want}", f"write {key} as {want}"))
        if "speculative_tokens" not in method:
            out.append(_rule("required", f"{at}.speculative_tokens", "speculative_tokens is missing; vllm serve "
                             "DRAFT reads it", "write the number of tokens drafted per step",
                             code="CONFIG_MISSING_KEY"))
    default = spec.get("default_proposal_method")
    if methods and default not in {m.get("proposal_type") for m in methods}:
        out.append(_rule("speculators_config", f"{where}.default_proposal_method", f"default_proposal_method is "
                         f"{_fmt(default)}; it must name one of the proposal types", "write 'greedy'"))
    verifier = spec.get("verifier")
    if not isinstance(verifier, Mapping) or not {"name_or_path", "architectures"} <= set(verifier):
        out.append(_rule("speculators_config", f"{where}.verifier", f"verifier is {_fmt(verifier)}; it must hold "
                         "name_or_path and architectures", "record the verifier the draft was trained against"))
    return out


def _serving_rules(config: Mapping[str, Any]) -> list[Finding]:
    out: list[Finding] = []
    block = config.get("block_size")
    if "block_size" in config and (not is_int(block) or block <= 0):
        out.append(_rule("block_size", "block_size", f"block_size is {_fmt(block)}; it must be a positive integer",
                         "write the number of query slots the draft was trained with"))
    written, declared = speculators.written_speculative_tokens(config), speculators.speculative_tokens(config)
    if written is not None and declared is not None and written != declared:
        anchor = config.get("sample_from_anchor", speculators.DEFAULTS["sample_from_anchor"])
        out.append(_rule("speculative_tokens", "speculators_config.proposal_methods[0].speculative_tokens",
                         f"speculative_tokens is {declared} but training writes {written} for block_size {block} "
                         f"with sample_from_anchor {json.dumps(bool(anchor))}; vLLM then drafts a different number "
                         "of tokens by each route", "give the serving command the count the draft was trained for",
                         severity="warning"))
    if "sample_from_anchor" not in config:
        out.append(_rule("sample_from_anchor", "sample_from_anchor", "sample_from_anchor is missing: speculators "
                         "trains as if true, vLLM serves as if false (the block layout differs)",
                         "write sample_from_anchor explicitly", severity="warning", code="CONFIG_MISSING_KEY"))
    if "enable_confidence_head" not in config:
        out.append(_rule("enable_confidence_head", "enable_confidence_head", "enable_confidence_head is missing: "
                         "speculators builds the confidence head, vLLM drops its tensors",
                         "write enable_confidence_head explicitly", severity="warning", code="CONFIG_MISSING_KEY"))
    if config.get("sliding_window_non_causal") is True:
        out.append(_rule("sliding_window_non_causal", "sliding_window_non_causal", "sliding_window_non_causal is "
                         "true: the block was bidirectional in training, but vLLM makes it causal on sliding-window "
                         "layers", "train with full-attention layers instead, or serve where the flag is honoured",
                         severity="warning", code="SERVING_UNSUPPORTED"))
    for key in DEFAULTED:
        if key not in config:
            out.append(_rule("required", key, f"{key} is missing; speculators falls back to "
                             f"{_fmt(speculators.DEFAULTS[key])}", "write it explicitly", severity="warning",
                             code="CONFIG_MISSING_KEY"))
    unknown = contract.unknown_dtypes(config)
    for key, value in unknown.items():
        out.append(_rule("dtype", key, f"{key} is {_fmt(value)}; it must be one of "
                         f"{', '.join(contract.TORCH_DTYPE_NAMES)}", "write the dtype the tensors are saved in"))
    if not unknown and speculators.float_dtype(config) is None:
        out.append(_rule("dtype", "dtype", "dtype is missing; the roster assumes bfloat16",
                         "write the dtype the tensors are saved in", severity="warning"))
    return out


def check_config(config: Mapping[str, Any]) -> list[Finding]:
    """Every rule speculators 0.9.0 and vLLM 0.32.0 apply to a speculators DSpark `config.json`."""
    out = [_rule("required", key, f"{key} is missing", f"write {key} (the speculators library always does)",
                 code="CONFIG_MISSING_KEY") for key in REQUIRED if key not in config]
    tl = config.get(speculators.LAYER_CONFIG_KEY)
    if speculators.LAYER_CONFIG_KEY in config:
        out += _layer_rules(tl)
    tl = tl if isinstance(tl, Mapping) else {}
    out += _head_rules(config)
    if speculators.AUX_IDS_KEY in config:
        out += aux_id_findings(config.get(speculators.AUX_IDS_KEY))
    out += _vocab_rules(config, tl)
    out += _proposal_rules(config)
    out += _serving_rules(config)
    return out
