"""How vLLM 0.32.0 loads a `k3_dspark` draft (`K3DSparkForCausalLM`), as rules found by running it.

Every rule is a `Cited` with an `id`, its `source` (vLLM 0.32.0 file:line) and its `evidence`:
**executed** means `verify.runtimes.execute_vllm` ran vLLM's own draft loader on CPU over a draft showing the
behaviour (the conformance matrix in `tests/test_vllm_conformance.py` re-runs every one in CI);
**read** means it was only read in the code. Each verdict names the rule that decided it.

What vLLM does, in the order its loader applies it:

1. the config is parsed by `K3DSparkConfig`, which refuses ``mla_use_nope``, ``mla_use_output_gate``,
   ``mla_use_qk_norm``, ``dspark_bonus_anchor`` (any truthy value), ``q_lora_rank`` null, a
   ``draft_vocab_size`` other than ``vocab_size``, and empty or mis-counted ``target_layer_ids``: the
   server does not start and no tensor is read (`refusal`);
2. ``kv_a_proj_with_mqa`` of layer i is also copied into shard i of the cross-layer ``context_kv_proj``;
3. names containing ``embed_tokens`` or ``lm_head`` (the target's are shared), ``confidence_head``
   unless ``enable_confidence_head`` is truthy (absent: false), and the four rotary buffers are
   dropped by design;
4. ``gate_proj``/``up_proj`` stack into ``gate_up_proj``, ``q_a_proj``/``kv_a_proj_with_mqa`` into
   ``fused_qkv_a_proj``; ``model.`` is prepended (a ``model.`` already there matches nothing);
5. the name is looked up in the module tree (`ModuleTree.load`): a parameter of the right shape is
   loaded; a ``.bias`` on an existing module without one is ignored; anything else raises;
6. the strict check raises for a never-written RMSNorm weight or ``markov_w1``; every linear and
   vocabulary-parallel parameter is exempt, so vLLM starts and serves with it uninitialised.

`ModuleTree` is that lookup (vLLM's `AutoWeightsLoader`), shared with the speculators-format loader.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeAlias

from dspark_hub.format import contract
from dspark_hub.report import Evidence, Finding, ServingCommand, Verdict
from dspark_hub.verify.runtimes.verdicts import (
    Cited,
    RuntimeVerdicts,
    ServingRecipe,
    by_id,
    recipe_parameters,
)
from dspark_hub.vllm.pin import PINNED_VERSION

VERSION = f"vLLM {PINNED_VERSION}"
_MLA = "vllm/models/kimi_k3/nvidia/dspark_mla.py"
_CFG = "vllm/transformers_utils/configs/k3_dspark.py"
_UTILS = "vllm/model_executor/models/utils.py"
_LOADER = "vllm/model_executor/model_loader/default_loader.py"
_LINEAR = "vllm/model_executor/layers/linear.py"
_VOCAB = "vllm/model_executor/layers/vocab_parallel_embedding.py"
_WUTILS = "vllm/model_executor/model_loader/weight_utils.py"
_DSPARK = "vllm/model_executor/models/qwen3_dspark.py"


def rule(rule_id: str, text: str, source: str, evidence: Evidence = "executed") -> Cited:
    """A vLLM rule: `source` is file:line in vLLM 0.32.0."""
    return Cited(rule=text, source=f"{VERSION} {source}", evidence=evidence, id=rule_id)


RULES: dict[str, Cited] = by_id((
    rule("config_refused", "K3DSparkConfig refuses, at config parse, a truthy mla_use_nope, mla_use_output_gate, "
         "mla_use_qk_norm or dspark_bonus_anchor, q_lora_rank null, a draft_vocab_size other than vocab_size, and "
         "target_layer_ids empty or not num_target_layers long; nothing starts and no tensor is read",
         f"{_CFG}:44-77"),
    rule("config_unchecked", "target_layer_ids range and order, mask_token_id, markov_head_type and rope_interleave "
         "are not checked: such a draft starts (a gated head is served as vanilla; K3 MLA always rotates "
         "interleaved)", f"{_MLA}:188-193; models/kimi_k3/nvidia/mla.py:170-176"),
    rule("context_kv_copy", "layers.i.self_attn.kv_a_proj_with_mqa is also loaded into shard i of the cross-layer "
         "context_kv_proj", f"{_MLA}:39-58, 530-534"),
    rule("target_shared", "a name containing embed_tokens or lm_head is dropped: the target's embedding and lm_head "
         "are shared after loading", f"{_MLA}:437-444; v1/worker/gpu/spec_decode/dspark/utils.py:124-149"),
    rule("confidence_flag", "confidence_head.* is dropped unless enable_confidence_head is truthy (absent: false); "
         "with it the head is built and loaded like any other module", f"{_MLA}:194-205, 437-441, 459-464"),
    rule("confidence_width", "the confidence head's input is hidden_size + markov_rank only when "
         "confidence_head_with_markov is truthy (absent: false), so the reference's [1, H+R] head under a config "
         "without the key fails the shape check", f"{_MLA}:196-199"),
    rule("rotary_dropped", "rotary_emb.inv_freq, rotary_pos_emb.inv_freq, rotary_emb.cos_cached and "
         "rotary_emb.sin_cached are dropped at any depth", f"{_UTILS}:233-243, 471"),
    rule("stacked", "gate_proj/up_proj stack into gate_up_proj and q_a_proj/kv_a_proj_with_mqa into "
         "fused_qkv_a_proj, by substring", f"{_MLA}:446-451; {_UTILS}:125-129"),
    rule("model_prefix", "'model.' is prepended to every name, so one already in the file becomes 'model.model.' "
         "and matches nothing", f"{_MLA}:445"),
    rule("shape_checked", "a tensor whose shape differs from its parameter (or shard) raises AssertionError",
         f"{_WUTILS}:1485; {_LINEAR}:400-405; {_VOCAB}:515"),
    rule("dtype_cast", "a tensor in another dtype (F32 in a BF16 draft) is cast to its parameter's dtype and loaded "
         "(one warning per tensor); a gate_up_proj already stacked in the file is loaded whole",
         f"{_UTILS}:324-340; {_LINEAR}:972-987"),
    rule("bias_ignored", "a name ending in .bias on an existing module that has no bias is dropped without an "
         "error (debug log only)", f"{_UTILS}:294-297, 425-436, 458; {_LINEAR}:985-986, 1339-1340"),
    rule("unknown_raises", "any other name raises ValueError 'There is no module or parameter named ...' (a "
         "stacked module raises AttributeError)", f"{_UTILS}:436-448; {_LINEAR}:972-987"),
    rule("strict_checked", "after loading, the strict check raises ValueError 'Following weights were not "
         "initialized from checkpoint' for a never-written RMSNorm weight or markov_w1 (modules without a "
         "quant_method)", f"{_LOADER}:505-518, 520-567"),
    rule("strict_exempt", "every parameter of a linear or vocabulary-parallel module (context_proj, each "
         "projection, context_kv_proj, markov_w2, the confidence head) is exempt from the strict check: never "
         "written, vLLM starts and serves with it uninitialised", f"{_LOADER}:529-561; {_LINEAR}:165, 206; "
         f"{_VOCAB}:39, 67"),
    rule("cpu_serving", "serving DSpark needs Model Runner V2, which needs Triton, which the CPU build lacks, so "
         "that build refuses a DSpark config; with Triton's interpreter standing in (train.evaluation.vllm_eval) a "
         "k3_dspark draft then fails at load on CPU: the CPU linear post-processing empties kv_b_proj.weight and the "
         "MLA check raises 'kv_b_proj weight (0,) vs kv_lora_rank=512' (serving it needs a GPU, not run here)",
         "vllm/config/vllm.py:723-727, 2976-2979, 3190, 3197-3202; "
         "vllm/model_executor/layers/attention/mla_attention.py:416-420"),
))

#: Name rules of `K3DSparkForCausalLM.hf_to_vllm_mapper` and the loader's rotary mapper, in vLLM's order.
_TARGET_SHARED = ("embed_tokens", "lm_head")
ROTARY_BUFFERS = ("rotary_pos_emb.inv_freq", "rotary_emb.inv_freq", "rotary_emb.cos_cached", "rotary_emb.sin_cached")
#: A shard of a stacked vLLM parameter: 0/1 (gate_up, fused_qkv_a) or "q"/"k"/"v" (qkv_proj).
ShardId: TypeAlias = int | str
_K3_STACKED: tuple[tuple[str, str, ShardId], ...] = (
    (".gate_proj", ".gate_up_proj", 0), (".up_proj", ".gate_up_proj", 1),
    (".q_a_proj", ".fused_qkv_a_proj", 0), (".kv_a_proj_with_mqa", ".fused_qkv_a_proj", 1))
_KV_MARKER = ".self_attn.kv_a_proj_with_mqa."


def truthy(config: Mapping[str, Any], key: str, default: Any = False) -> bool:
    """How vLLM reads a flag: `getattr(config, key, default)`, by Python truthiness."""
    return bool(config.get(key, default))


# ---------------------------------------------------------------- the module tree (AutoWeightsLoader)

@dataclass(frozen=True)
class Load:
    """What loading one (mapped) name does."""

    verdict: Verdict
    rule: str
    detail: str
    fills: tuple[str, ...] = ()


@dataclass
class ModuleTree:
    """vLLM's parameters for a draft, in checkpoint names, and the lookup `AutoWeightsLoader` does.

    `params`: path -> (shape, strict-checked); `stacked`: module path -> (leaf, shard id) -> (checkpoint key,
    shard shape), for the modules with their own `load_weights` (MergedColumnParallelLinear,
    QKVParallelLinear). Keys of never-written parameters are what `unfilled` lists.
    """

    params: dict[str, tuple[tuple[int, ...], bool]] = field(default_factory=dict)
    stacked: dict[str, dict[tuple[str, ShardId], tuple[str, tuple[int, ...]]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.modules = {""}
        for path in [*self.params, *(f"{m}.weight" for m in self.stacked)]:
            parts = path.split(".")
            self.modules.update(".".join(parts[:i]) for i in range(1, len(parts)))

    def add(self, name: str, shape: tuple[int, ...], *, checked: bool = False,
            stacked: tuple[str, ShardId] | None = None) -> None:
        """Add a parameter; `stacked` = (stacked module path, shard id) for one shard of a stacked module."""
        if stacked is None:
            self.params[name] = (shape, checked)
        else:
            leaf = name.rsplit(".", 1)[-1].split("[", 1)[0]     # `context_kv_proj.weight[shard 0]`: weight
            self.stacked.setdefault(stacked[0], {})[(leaf, stacked[1])] = (name, shape)

    def keys(self) -> dict[str, bool]:
        """Every parameter (stacked ones per shard), checkpoint-named -> whether the strict check covers it."""
        out = {path: checked for path, (shape, checked) in self.params.items() if 0 not in shape}
        for shards in self.stacked.values():
            out.update({key: False for key, shape in shards.values() if 0 not in shape})
        return out      # a zero-size parameter (markov_rank 0) has nothing to write

    def load(self, path: str, shard: ShardId | None, shape: tuple[int, ...]) -> Load:
        """Walk `path` (relative to the model the loader starts at) as `AutoWeightsLoader._load_module` does."""
        parts = path.split(".")
        current = ""
        for i, part in enumerate(parts):
            child = f"{current}.{part}" if current else part
            rest = ".".join(parts[i + 1:])
            if child in self.stacked:
                return self._stacked(child, rest, shard, shape)
            if child in self.params:
                if rest:
                    return _bias_or_unknown(path, f"{child} is a parameter, not a module")
                return self._param(child, shape)
            if child in self.modules:
                current = child
                continue
            if part == "bias":
                return Load("ignored", "bias_ignored", f"{current or 'the model'} has no bias: dropped without an "
                            "error")
            return Load("fatal", "unknown_raises", f"no module or parameter named {child!r}: the load raises "
                        "(ValueError)")
        return Load("fatal", "unknown_raises", f"{path!r} names a module, not a parameter: the load raises")

    def _param(self, path: str, shape: tuple[int, ...]) -> Load:
        expected = self.params[path][0]
        if shape and tuple(shape) != expected:
            return Load("fatal", "shape_checked", f"shape {list(shape)}, the parameter is {list(expected)}: the "
                        "load raises (AssertionError)")
        return Load("loaded", "shape_checked", "loaded as is", (path,))

    def _stacked(self, module: str, rest: str, shard: ShardId | None, shape: tuple[int, ...]) -> Load:
        shards = {s: entry for (leaf, s), entry in self.stacked[module].items() if leaf == rest}
        short = module.rsplit(".", 1)[-1]
        if not shards and rest == "bias":
            return Load("ignored", "bias_ignored", f"{short} has no bias: the stacked module skips it without an "
                        "error")
        if not shards or (shard is not None and shard not in shards):
            return Load("fatal", "unknown_raises", f"{short} has no parameter {rest!r}: the load raises")
        if shard is None:
            expected = (sum(s[0] for _, s in shards.values()), *next(iter(shards.values()))[1][1:])
            keys = tuple(key for key, _ in shards.values())
            detail = f"loaded whole into {short}"
        else:
            key, expected = shards[shard]
            keys = (key,)
            detail = f"stacked into {short} (shard {shard})"
        if shape and tuple(shape) != tuple(expected):
            return Load("fatal", "shape_checked", f"shape {list(shape)}, the {short} shard is {list(expected)}: the "
                        "load raises (AssertionError)")
        return Load("loaded", "stacked", detail, keys)


def _bias_or_unknown(path: str, why: str) -> Load:
    if path.endswith(".bias"):
        return Load("ignored", "bias_ignored", f"{why}; a name ending in .bias is dropped without an error")
    return Load("fatal", "unknown_raises", f"{why}: the load raises (ValueError)")


# ---------------------------------------------------------------- K3DSparkForCausalLM

def config_refusal(config: Mapping[str, Any]) -> str | None:
    """The message `K3DSparkConfig.__init__` raises for this config, or None (k3_dspark.py:44-77)."""
    unsupported = [k for k in ("mla_use_nope", "mla_use_output_gate", "mla_use_qk_norm", "dspark_bonus_anchor")
                   if truthy(config, k)]
    if "q_lora_rank" in config and config["q_lora_rank"] is None:
        unsupported.append("q_lora_rank=None")
    if unsupported:
        return "MLA DSpark does not support " + ", ".join(unsupported) + "."
    vocab = config.get("vocab_size")
    if (config.get("draft_vocab_size") or vocab) != vocab:
        return ("MLA DSpark requires draft_vocab_size to equal vocab_size when sharing the target embedding and "
                "LM head.")
    ids = config.get("target_layer_ids")
    if not ids or (isinstance(ids, list) and config.get("num_target_layers") != len(ids)):
        return "MLA DSpark requires non-empty target_layer_ids and a matching num_target_layers."
    return None


def k3_tree(config: Mapping[str, Any]) -> ModuleTree:
    """The parameters `K3DSparkForCausalLM` builds for this config (vLLM's flag defaults), checkpoint-named.

    Raises:
        ContractError: the config cannot produce a roster.
    """
    flags = {"enable_confidence_head": truthy(config, "enable_confidence_head"),
             "confidence_head_with_markov": truthy(config, "confidence_head_with_markov")}
    shapes = {name: spec.shape for name, spec in contract.roster({**config, **flags}).items()}
    shapes.pop("embed_tokens.weight")
    tree = ModuleTree()
    for name, shape in shapes.items():
        tree.add(name, shape, checked=name.endswith("norm.weight") or name == "markov_head.markov_w1.weight",
                 stacked=stacked_module(name, _K3_STACKED))
    kv = shapes["layers.0.self_attn.kv_a_proj_with_mqa.weight"]
    for i in range(config["num_hidden_layers"]):
        tree.add(f"context_kv_proj.weight[shard {i}]", kv, stacked=("context_kv_proj", i))
    tree.__post_init__()
    return tree


def stacked_module(name: str, rules: tuple[tuple[str, str, ShardId], ...]) -> tuple[str, ShardId] | None:
    """(stacked module, shard id) a checkpoint parameter name loads into, by a model's stacking rules."""
    module = name.rsplit(".", 1)[0]
    for orig, new, shard in rules:
        if f"{module}.".endswith(f"{orig}.") or f".{module}.".endswith(f"{orig}."):
            return module[: len(module) - len(orig.lstrip("."))] + new.lstrip("."), shard
    return None


def _map(name: str, confidence: bool) -> tuple[str | None, ShardId | None, str]:
    """(path under the draft model, shard id, rule) after vLLM's name rules; path None: dropped by design."""
    if "confidence_head" in name and not confidence:
        return None, None, "confidence_flag"
    if any(s in name for s in _TARGET_SHARED):
        return None, None, "target_shared"
    if any(s in name for s in ROTARY_BUFFERS):
        return None, None, "rotary_dropped"
    shard: ShardId | None = None
    for orig, new, s in _K3_STACKED:
        if orig in name:
            name, shard = name.replace(orig, new, 1), s
    return name, shard, "model_prefix"


def _context_copy(name: str, layers: int) -> tuple[str, int] | None:
    """The cross-layer copy `_duplicate_context_kv_weights` makes of a kv_a_proj_with_mqa tensor."""
    layer_prefix, marker, leaf = name.partition(_KV_MARKER)
    index = layer_prefix.rsplit(".", 1)[-1]
    if not marker or not index.isdecimal() or int(index) >= layers:
        return None
    return f"context_kv_proj.{leaf}", int(index)


_SKIP_DETAIL = {"target_shared": "dropped by design (the target's embedding and lm_head are shared)",
                "confidence_flag": "dropped by design: enable_confidence_head is not true (vLLM's default is false)",
                "rotary_dropped": "dropped by design (a rotary buffer vLLM recomputes)"}
SERVING = ServingRecipe(
    method="dspark",
    template="vllm serve {target} --speculative-config {vllm_spec}",
    source=f"{VERSION} vllm/config/speculative.py (method 'dspark'); public K3 DSpark launch configs use "
           "num_speculative_tokens 7",
)
_UNFILLED_FATAL = "no tensor fills it: the strict check raises and start-up fails"
_UNFILLED_SILENT = ("no tensor fills it: vLLM starts and serves with it uninitialised (the strict check exempts "
                    "linear and vocabulary-parallel parameters)")


@dataclass(frozen=True)
class VllmK3Loader:
    """vLLM's `K3DSparkForCausalLM` loader, as the spec `report.runtimes_section` walks (`loaders.RUNTIMES["vllm"]`)."""

    name: str = "vllm"
    title: str = "vLLM"
    rules: tuple[Cited, ...] = tuple(RULES.values())
    notes: tuple[str, ...] = (f"{VERSION} model class K3DSparkForCausalLM ({_MLA}); every loader rule was "
                              "executed on CPU through vLLM's own draft loader "
                              "(dspark_hub.verify.runtimes.execute_vllm); serving was executed on CPU too and fails at "
                              "load in the MLA path (cpu_serving), so serving a k3_dspark draft needs a GPU "
                              "(not run here)",)
    drop_hint: str = "export every contract tensor under its contract name ('dspark-hub convert') and verify again"
    fatal_hint: str = "export exactly the contract names and shapes, with a config vLLM accepts"
    unfilled_state: str = "uninitialised"
    serving: ServingRecipe = field(default_factory=lambda: SERVING)

    def verdicts(self, tensors: Mapping[str, tuple[tuple[int, ...], str]],
                 config: Mapping[str, Any]) -> RuntimeVerdicts:
        """What vLLM's loader does with every tensor (name -> (shape, dtype)).

        Raises:
            ContractError: the config cannot produce a roster.
        """
        result = RuntimeVerdicts(runtime=self)
        refused = config_refusal(config)
        if refused is not None:
            result.refusal = {"stage": "config", "message": refused, "rule": "config_refused",
                              "source": RULES["config_refused"].source}
            return result
        tree = k3_tree(config)
        confidence = truthy(config, "enable_confidence_head")
        filled: set[str] = set()
        for name, (shape, _) in tensors.items():
            path, shard, why = _map(name, confidence)
            if path is None:
                result.tensors[name] = ("skipped", _SKIP_DETAIL[why])
                result.decided_by[name] = why
                continue
            load = tree.load(path, shard, tuple(shape))
            detail, fills = load.detail, set(load.fills)
            copy = _context_copy(name, config["num_hidden_layers"]) if load.verdict == "loaded" else None
            if copy is not None:
                extra = tree.load(copy[0], copy[1], tuple(shape))
                fills.update(extra.fills)
                detail += f"; also copied into context_kv_proj (shard {copy[1]})"
            if path.startswith("model.") and load.verdict == "fatal":
                detail += " ('model.' in the file becomes 'model.model.')"
            result.tensors[name] = (load.verdict, detail)
            result.decided_by[name] = load.rule
            filled |= fills
        for key, checked in tree.keys().items():
            if key not in filled:
                result.unfilled[key] = ("fatal", _UNFILLED_FATAL) if checked else ("ignored", _UNFILLED_SILENT)
                result.unfilled_by[key] = "strict_checked" if checked else "strict_exempt"
        return result

    def serving_parameters(self, config: Mapping[str, Any], *, draft: str = "DRAFT",
                           block_size: int | None = None) -> ServingCommand:
        return recipe_parameters(config, self.serving, draft=draft, block_size=block_size)

    def serving_findings(self, config: Mapping[str, Any], block_size: int | None) -> list[Finding]:
        return []


VLLM = VllmK3Loader()
