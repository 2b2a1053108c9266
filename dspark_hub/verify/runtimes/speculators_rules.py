"""How vLLM loads a speculators-format DSpark checkpoint, as data, and the serving commands its config implies.

The loader is `Qwen3DSparkForCausalLM.load_weights` (`vllm/model_executor/models/qwen3_dspark.py`,
on top of `qwen3_dflash.py` and `models/utils.py` `AutoWeightsLoader`) in vLLM 0.32.0. Every rule
below is a `Cited` with an `id`, its `source` (file:line in vLLM 0.32.0) and its `evidence`:
**executed** means `verify.runtimes.execute_vllm` ran vLLM's own draft loader on CPU over the fixtures in
`tests/fixtures/speculators/` and mutated copies showing the behaviour (the conformance matrix in
`tests/test_vllm_conformance.py` re-runs them in CI); **read** means it was only read in the code.
Each verdict names the rule that decided it (`"rule"` in the JSON).

What vLLM does, in order:

1. ``t2d`` is skipped (vLLM maps draft ids with ``d2t`` alone); ``d2t`` loads into
   ``draft_id_to_target_id``; ``lm_head.*`` stays top-level; every other name gets ``model.``;
2. a pruned vocabulary (``draft_vocab_size`` below the target's) without ``lm_head`` or without
   ``d2t`` is refused before any tensor is loaded (`refusal`);
3. ``mask_embedding``, ``confidence_head.*`` unless ``enable_confidence_head`` is truthy, and the
   rotary buffers are dropped by design; with the flag but no confidence tensor at all, vLLM deletes
   the head (adaptive verification is then off) rather than leaving it unfilled;
4. ``q/k/v_proj`` stack into ``qkv_proj`` and ``gate/up_proj`` into ``gate_up_proj`` (also under
   ``markov_head``: a gated head's ``gate_proj`` becomes an unknown ``gate_up_proj``);
5. the name is looked up in the module tree (`vllm_rules.ModuleTree`): loaded when the shape
   matches, a ``.bias`` on an existing module without one ignored, anything else raises; an
   ``embed_tokens`` or a full-vocabulary ``lm_head`` in the file is loaded and kept as the draft's own;
6. **no strict check runs** (``load_weights`` returns None): every parameter no tensor fills, norms
   and ``markov_w1`` included, starts uninitialised.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dspark_hub.format import speculators
from dspark_hub.format.jsonio import is_int
from dspark_hub.format.registry import serving_facts
from dspark_hub.format.taps import taps_from_aux_ids
from dspark_hub.report import Finding, ServingCommand, warning
from dspark_hub.verify.runtimes.verdicts import Cited, RuntimeVerdicts, by_id, draft_id
from dspark_hub.verify.runtimes.vllm_rules import ROTARY_BUFFERS, VERSION, ModuleTree, ShardId, stacked_module, truthy
from dspark_hub.verify.runtimes.vllm_rules import rule as _rule

_DSPARK = "vllm/model_executor/models/qwen3_dspark.py"
_DFLASH = "vllm/model_executor/models/qwen3_dflash.py"
_UTILS = "vllm/model_executor/models/utils.py"
_ALGOS = "vllm/transformers_utils/configs/speculators/algos.py"
_BASE = "vllm/transformers_utils/configs/speculators/base.py"
_ARGS = "vllm/engine/arg_utils.py"
_SPEC = "vllm/config/speculative.py"
_LOADER = "vllm/model_executor/model_loader/default_loader.py"


RULES: dict[str, Cited] = by_id((
    _rule("type_supported", "speculators_model_type must be eagle3, peagle, dflash, dflash2 or dspark (mtp and "
          "xpress are rejected)", f"{_BASE}:51-56", "executed"),
    _rule("config_translated", "the config is translated by update_dspark: aux ids become "
          "eagle_aux_hidden_state_layer_ids and target_layer_ids = ids - 1; draft_vocab_size, target_hidden_size, "
          "mask_token_id, markov_rank, markov_head_type, block_size and the confidence flags are copied when not "
          "null; sliding_window_non_causal is not copied", f"{_ALGOS}:152-209", "executed"),
    _rule("confidence_dropped", "confidence_head.* is dropped without an error unless enable_confidence_head is "
          "true (absent: false)", f"{_DSPARK}:219-230, 366-368", "executed"),
    _rule("confidence_deleted", "with enable_confidence_head true but no confidence_head tensor in the file, vLLM "
          "deletes the head (confidence_head = None): nothing is left unfilled, and adaptive verification is off",
          f"{_DSPARK}:331-332, 366-368", "executed"),
    _rule("t2d_skipped", "t2d is skipped; a pruned draft vocabulary is mapped with d2t (draft_id_to_target_id)",
          f"{_DSPARK}:319-324", "executed"),
    _rule("pruned_vocab", "a draft vocabulary smaller than the target's needs lm_head and d2t; without either "
          "load_weights refuses the checkpoint before loading any tensor", f"{_DSPARK}:259-268, 348-357", "executed"),
    _rule("larger_vocab", "a draft vocab_size larger than the target's needs embed_tokens (never saved by "
          "speculators)", f"{_DSPARK}:341-347", "read"),
    _rule("own_embed_lm_head", "an embed_tokens or a full-vocabulary lm_head in the file is loaded and kept as the "
          "draft's own (has_own_embed_tokens / has_own_lm_head) instead of the target's", f"{_DSPARK}:327-336; "
          f"{_UTILS}:1122-1142; v1/worker/gpu/spec_decode/dspark/utils.py:133-149", "executed"),
    _rule("mask_embedding_dropped", "a mask_embedding tensor is dropped: the mask is the vocabulary row",
          f"{_DSPARK}:338, 359", "executed"),
    _rule("rotary_dropped", "rotary_emb.inv_freq, rotary_pos_emb.inv_freq, rotary_emb.cos_cached and "
          "rotary_emb.sin_cached are dropped at any depth", f"{_UTILS}:233-243, 471", "executed"),
    _rule("model_prefix", "'model.' is prepended to every name but lm_head and d2t, so one already in the file "
          "matches nothing", f"{_DSPARK}:322-326", "executed"),
    _rule("stacked", "q_proj/k_proj/v_proj stack into qkv_proj and gate_proj/up_proj into gate_up_proj, by name, "
          "also under markov_head", f"{_DFLASH}:416-431", "executed"),
    _rule("vanilla_markov", "the Markov head is vanilla only (markov_w1 [V, r], markov_w2 [Vd, r]); "
          "markov_head_type is never read, so a gated head's gate_proj (renamed gate_up_proj) and an rnn head's "
          "joint_proj, biases included, are unknown names; markov_rank 0 builds a rank-0 head that needs no tensors",
          f"{_DSPARK}:48-81, 209-218", "executed"),
    _rule("shape_checked", "a tensor whose shape differs from its parameter fails the load (AssertionError): fc is "
          "[H, (target_hidden_size or H) * len(aux ids)], confidence_head.proj.weight [1, H + r * with_markov] "
          "(with_markov absent: false)", f"{_DFLASH}:108-117, 495-504; {_DSPARK}:164-189, 219-230", "executed"),
    _rule("bias_ignored", "a name ending in .bias on an existing module without one is ignored without an error",
          f"{_UTILS}:294-297, 425-436, 458; vllm/model_executor/layers/linear.py:1339-1340", "executed"),
    _rule("unknown_raises", "any other unknown name raises ValueError 'There is no module or parameter named ...'",
          f"{_UTILS}:436-448", "executed"),
    _rule("no_strict_check", "no strict check runs: load_weights returns None, so DefaultModelLoader skips "
          "track_weights_loading; every parameter no tensor fills (norms and markov_w1 included) starts "
          "uninitialised", f"{_DSPARK}:312-372; {_LOADER}:505-518", "executed"),
    _rule("serving_tokens", "N: an explicit num_speculative_tokens / --spec-tokens wins; vllm serve DRAFT takes "
          "speculators_config.proposal_methods[0].speculative_tokens; --speculative-config without N takes "
          "block_size (no check of N against block_size)", f"{_SPEC}:1481-1488, 1503-1507; {_BASE}:97-137",
          "executed"),
    _rule("spec_flags", "--spec-method/--spec-model/--spec-tokens are merged into the --speculative-config dict; a "
          "key given both ways is an error", f"{_ARGS}:1830-1835, 2060-2081", "executed"),
))

_STACKED_RULES: tuple[tuple[str, str, ShardId], ...] = (
    (".q_proj", ".qkv_proj", "q"), (".k_proj", ".qkv_proj", "k"), (".v_proj", ".qkv_proj", "v"),
    (".gate_proj", ".gate_up_proj", 0), (".up_proj", ".gate_up_proj", 1))
#: `DFlashQwen3Model.hf_to_vllm_mapper` renames (qwen3_dflash.py:416-424).
_RENAMES = (("midlayer.", "layers.0."), ("encoder.output_norm_enc.", "hidden_norm."), ("encoder.fc.", "fc."))


def vllm_confidence(config: Mapping[str, Any]) -> bool:
    """Whether vLLM builds the confidence head: only when `enable_confidence_head` is true (default false)."""
    return truthy(config, "enable_confidence_head")


@dataclass
class _Load:
    """The two module trees `Qwen3DSparkForCausalLM` loads into, and what the names in the file switch on."""

    root: ModuleTree              # lm_head, draft_id_to_target_id
    model: ModuleTree             # Qwen3DSparkModel: the DFlash body and the heads
    kept: set[str] = field(default_factory=set)     # parameter keys that count (shipped or always built)
    head_kept: bool = False
    refusal: str | None = None


def _plan(config: Mapping[str, Any], names: list[str]) -> _Load:
    g = speculators.geometry(config)
    loaded = [n for n in names if "t2d" not in n]
    has_embed = any("embed_tokens" in n for n in loaded)
    has_lm_head = any("lm_head" in n for n in loaded if "d2t" not in n)
    has_d2t = any("d2t" in n for n in loaded)
    head_kept = vllm_confidence(config) and any("confidence_head" in n for n in loaded)
    reduced = g.draft_vocab_size < g.vocab_size
    refusal = None
    if reduced and not has_lm_head:
        refusal = ("Reduced-vocabulary Qwen3 DSpark checkpoints must include lm_head weights; the full target "
                   "lm_head cannot be shared.")
    elif reduced and not has_d2t:
        refusal = ("Reduced-vocabulary Qwen3 DSpark checkpoints must include a d2t mapping so sampled draft ids "
                   "can be converted to target ids.")
    root, model = ModuleTree(), ModuleTree()
    root.add("lm_head.weight", (g.draft_vocab_size, g.hidden_size))
    if reduced:
        root.add("draft_id_to_target_id", (g.draft_vocab_size,))
    model.add("embed_tokens.weight", (g.vocab_size, g.hidden_size))
    for name, shape in speculators.tensor_shapes(g).items():
        if name in ("t2d", "d2t", "lm_head.weight") or name.startswith(("markov_head.gate_proj",
                                                                         "markov_head.joint_proj",
                                                                         "confidence_head.")):
            continue
        model.add(name, shape, stacked=stacked_module(name, _STACKED_RULES) if "markov_head" not in name else None)
    if head_kept:
        width = g.hidden_size + (g.markov_rank if truthy(config, "confidence_head_with_markov") else 0)
        model.add("confidence_head.proj.weight", (1, width))
        model.add("confidence_head.proj.bias", (1,))
    root.__post_init__()
    model.__post_init__()
    kept = set(root.keys()) | set(model.keys())
    if not has_embed:
        kept.discard("embed_tokens.weight")       # the target's is aliased after loading
    if not has_lm_head:
        kept.discard("lm_head.weight")
    return _Load(root=root, model=model, kept=kept, head_kept=head_kept, refusal=refusal)


def _route(name: str, plan: _Load, confidence: bool) -> tuple[str | None, str, ShardId | None]:
    """(tree, path, shard) of a name after vLLM's renames; tree None: dropped by design (path = the rule)."""
    if "t2d" in name:
        return None, "t2d_skipped", None
    if "d2t" in name:
        full = name.replace("d2t", "draft_id_to_target_id")
    elif "lm_head" in name:
        full = name
    else:
        full = "model." + name
    if "mask_embedding" in full:
        return None, "mask_embedding_dropped", None
    if "confidence_head" in full and not plan.head_kept:
        return None, "confidence_dropped" if not confidence else "confidence_deleted", None
    if any(r in full for r in ROTARY_BUFFERS):
        return None, "rotary_dropped", None
    if full != "model" and not full.startswith("model."):
        return "root", full, None
    path = full[len("model."):]
    for orig, new in _RENAMES:
        if orig in path:
            path = path.replace(orig, new, 1)
    shard: ShardId | None = None
    for orig, new, s in _STACKED_RULES:
        if orig in path:
            path, shard = path.replace(orig, new, 1), s
    return "model", path, shard


_SKIPPED = {"t2d_skipped": "skipped: vLLM maps draft ids with d2t",
            "mask_embedding_dropped": "dropped by design: the mask is the vocabulary row",
            "confidence_dropped": "dropped: enable_confidence_head is not true (vLLM's default is false)",
            "confidence_deleted": "dropped: the head has no tensor to load, so vLLM deletes it",
            "rotary_dropped": "dropped by design (a rotary buffer vLLM recomputes)"}


@dataclass(frozen=True)
class SpeculatorsLoader:
    """vLLM's loader for a speculators DSpark, as the same kind of spec `loaders.runtime_verdicts` walks."""

    name: str = "vllm"
    title: str = "vLLM"
    method: str = "dspark"
    rules: tuple[Cited, ...] = tuple(RULES.values())
    notes: tuple[str, ...] = (f"{VERSION} model class Qwen3DSparkForCausalLM ({_DSPARK}); every loader rule was "
                              "executed on CPU through vLLM's own draft loader "
                              "(dspark_hub.verify.runtimes.execute_vllm); serving it was executed on CPU too "
                              "(dspark_hub.train.evaluation.vllm_eval: Model Runner V2 through Triton's interpreter)",)
    drop_hint: str = "save the checkpoint with the speculators library's names"
    fatal_hint: str = "save the names and shapes the config implies (vLLM loads only the vanilla Markov head)"
    unfilled_state: str = "uninitialised"

    def verdicts(self, tensors: Mapping[str, tuple[tuple[int, ...], str]],
                 config: Mapping[str, Any]) -> RuntimeVerdicts:
        """Walk every tensor (name -> (shape, dtype)) through vLLM's speculators DSpark loader.

        Raises:
            ContractError: the config cannot produce a roster.
        """
        # vLLM stops at the first tensor that raises; like the executed engine, judge the rest without it.
        # Which names are present switches parts of the load (a confidence head, a refusal), so repeat until
        # the set of raising names is stable.
        fatal: dict[str, tuple[str, str]] = {}       # name -> (detail, rule) of the round it raised in
        while True:
            result, filled, plan = self._judge(tensors, config, set(fatal))
            new = [n for n in result.names("fatal") if n not in fatal]
            if result.refusal is not None or not new:
                break
            fatal.update({n: (result.tensors[n][1], result.decided_by[n]) for n in new})
        if result.refusal is not None:
            return result
        for name, (detail, rule) in fatal.items():
            result.tensors[name] = ("fatal", detail)
            result.decided_by[name] = rule
        for key in sorted(plan.kept - filled):
            shown = "d2t" if key == "draft_id_to_target_id" else key
            result.unfilled[shown] = ("ignored", "no tensor fills it: vLLM runs no strict check for this format, so it "
                                      "starts and serves with it uninitialised")
            result.unfilled_by[shown] = "no_strict_check"
        return result

    def _judge(self, tensors: Mapping[str, tuple[tuple[int, ...], str]], config: Mapping[str, Any],
               fatal: set[str]) -> tuple[RuntimeVerdicts, set[str], _Load]:
        """One load with the names in `fatal` judged fatal and left out (as the engine's next round does)."""
        plan = _plan(config, [n for n in tensors if n not in fatal])
        result = RuntimeVerdicts(runtime=self)
        if plan.refusal is not None:
            result.refusal = {"stage": "load", "message": plan.refusal, "rule": "pruned_vocab",
                              "source": RULES["pruned_vocab"].source}
            return result, set(), plan
        confidence = vllm_confidence(config)
        filled: set[str] = set()
        for name, (shape, _) in tensors.items():
            tree, path, shard = _route(name, plan, confidence)
            if tree is None:
                result.tensors[name] = ("skipped", _SKIPPED[path])
                result.decided_by[name] = path
                continue
            load = (plan.root if tree == "root" else plan.model).load(path, shard, tuple(shape))
            rule = load.rule
            if load.verdict == "fatal" and name.startswith("markov_head.") and rule == "unknown_raises":
                rule = "vanilla_markov"
            elif load.verdict == "fatal" and name.startswith("model."):
                rule = "model_prefix"
            elif load.verdict == "loaded" and name in ("embed_tokens.weight", "lm_head.weight") and not (
                    name == "lm_head.weight" and "draft_id_to_target_id" in plan.root.params):
                rule = "own_embed_lm_head"
            result.tensors[name] = (load.verdict, load.detail)
            result.decided_by[name] = rule
            if name not in fatal:
                filled |= set(load.fills)
        return result, filled, plan

    def serving_parameters(self, config: Mapping[str, Any], *, draft: str = "DRAFT",
                           block_size: int | None = None) -> ServingCommand:
        return serving_parameters(config, draft=draft, block_size=block_size)

    def serving_findings(self, config: Mapping[str, Any], block_size: int | None) -> list[Finding]:
        """A warning for a bonus-anchor draft, whose token count is not its block size."""
        facts = serving_facts(config)
        block = config.get("block_size")
        anchored = config.get("sample_from_anchor", speculators.DEFAULTS["sample_from_anchor"])
        if not is_int(block):   # missing or not a number: the config rules report it (block_size)
            return []
        if anchored or facts.num_speculative_tokens is None or facts.num_speculative_tokens == block:
            return []
        return [warning("SERVING_TOKEN_COUNT", "runtime:vllm", f"a bonus-anchor draft (sample_from_anchor false) "
                        f"drafts {facts.num_speculative_tokens} tokens per step, not its block_size {block}; vLLM "
                        f"given no count takes block_size and runs {block + 1} query slots on a draft trained with "
                        f"{block} [{RULES['serving_tokens'].source}; executed]",
                        f"pass num_speculative_tokens {facts.num_speculative_tokens} explicitly (the commands do)")]


def serving_parameters(config: Mapping[str, Any], *, draft: str = "DRAFT", target: str | None = None,
                       block_size: int | None = None) -> ServingCommand:
    """Both spellings of the vLLM serving command the config implies, with N given explicitly.

    `vllm serve VERIFIER --speculative-config '{"method": "dspark", "model": DRAFT, "num_speculative_tokens": N}'`
    and the seed card's `vllm serve VERIFIER --spec-method dspark --spec-model DRAFT --spec-tokens N` (the same
    dict in vLLM 0.32.0). VERIFIER is `speculators_config.verifier.name_or_path` unless `target` is given;
    N is `proposal_methods[0].speculative_tokens` unless `block_size` overrides it.
    """
    facts = serving_facts(config)
    n = block_size if block_size is not None else facts.num_speculative_tokens
    verifier = target or facts.verifier or "VERIFIER"
    model_id = draft_id(draft)
    spec = json.dumps({"method": facts.method, "model": model_id, "num_speculative_tokens": n})
    ids = config.get(speculators.AUX_IDS_KEY)
    ours = taps_from_aux_ids(ids) if isinstance(ids, list) and all(isinstance(i, int) for i in ids) else None
    return {
        "method": facts.method,
        "num_speculative_tokens": n,
        "block_size_source": "the given block size (overrides the config)" if block_size is not None else facts.source,
        "target_layer_ids": ids,
        "target_layer_ids_source": f"{speculators.AUX_IDS_KEY}, read by vLLM from config.json (residual after k "
                                   f"layers; our target_layer_ids: {ours})",
        "verifier": verifier,
        "command": f"vllm serve {shlex.quote(verifier)} --speculative-config {shlex.quote(spec)}",
        "alternatives": [f"vllm serve {shlex.quote(verifier)} --spec-method {facts.method} --spec-model "
                         f"{shlex.quote(model_id)} --spec-tokens {n}"],
        "source": f"{RULES['serving_tokens'].source}; {RULES['spec_flags'].source}; the --spec-* spelling is the "
                  "one on the RedHatAI/Kimi-K3-speculator.dspark card",
        "note": "; ".join(facts.notes) or None,
    }


#: The runtimes with loader rules for a speculators DSpark (only vLLM was found to load the format).
RUNTIMES: dict[str, SpeculatorsLoader] = {"vllm": SpeculatorsLoader()}
