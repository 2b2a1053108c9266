"""How each serving runtime loads a draft, as data: the loader specs and their registry.

`RuntimeSpec` is a loader read in its public sources (tokenspeed, SGLang, ATOM below: each `Cited`
names the file, the commit read and `evidence="read"`; where a source could not be found the rule
says so instead of guessing). vLLM's loaders are their own modules: `vllm_rules` (a k3_dspark draft,
rules executed against vLLM 0.32.0's own loader) and `speculators_rules` (a speculators DSpark).
`RUNTIMES` names every k3_dspark loader; `loaders_for(fmt)` gives the loaders of a draft format.

`runtime_verdicts(names, config, spec)` walks the checkpoint's tensor names through one runtime's
loader rules and gives each tensor a verdict (`verdicts`: ``loaded``, ``skipped``, ``ignored``,
``fatal``), and each parameter the runtime builds that no tensor fills an ``unfilled`` verdict
(``fatal``: start-up fails; ``ignored``: the server starts with it uninitialised or at its init
value). What a report says about them is `report`'s.

Header level only: no tensor data, no torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dspark_hub.format import contract
from dspark_hub.format.registry import K3, SPECULATORS, DraftFormat
from dspark_hub.report import Finding, ServingCommand, Verdict
from dspark_hub.verify.runtimes.speculators_rules import RUNTIMES as SPECULATORS_RUNTIMES
from dspark_hub.verify.runtimes.verdicts import (
    Cited,
    Policy,
    RuntimeLoader,
    RuntimeVerdicts,
    ServingRecipe,
    recipe_parameters,
)
from dspark_hub.verify.runtimes.vllm_rules import VLLM, VllmK3Loader

LUMEN_NOTES = "ZhangDanyang-AMD/Lumen-RL examples/Kimi_K3_SDDD_MI350_ATOM/TRAIN_FROM_SCRATCH.md"


@dataclass(frozen=True)
class RuntimeSpec:
    """One runtime's load behaviour for a `k3_dspark` draft, read in its source."""

    name: str
    title: str
    strip_prefixes: tuple[str, ...]      # removed once before lookup
    skip_prefixes: tuple[str, ...]       # dropped by design when the name starts with one
    skip_substrings: tuple[str, ...]     # dropped by design when the name contains one
    fused: Mapping[str, str]             # checkpoint module -> stacked runtime parameter
    unknown: Policy
    missing: Policy
    rules: tuple[Cited, ...]
    serving: ServingRecipe
    notes: tuple[str, ...] = ()
    drop_hint: str = "rename the tensors to the contract names ('dspark-hub convert') and verify again"
    fatal_hint: str = "export exactly the contract names"
    unfilled_state: str = "at its init value"
    #: The coverage check records the stacked parameter once any shard loads, so a missing half is not seen.
    stacked_counted_once: bool = False

    def verdicts(self, tensors: Mapping[str, tuple[tuple[int, ...], str]],
                 config: Mapping[str, Any]) -> RuntimeVerdicts:
        """What this runtime's loader does with every tensor (name -> (shape, dtype)) of a checkpoint."""
        return runtime_verdicts(list(tensors), config, self)

    def serving_parameters(self, config: Mapping[str, Any], *, draft: str = "DRAFT",
                           block_size: int | None = None) -> ServingCommand:
        return serving_parameters(config, self, draft=draft, block_size=block_size)

    def serving_findings(self, config: Mapping[str, Any], block_size: int | None) -> list[Finding]:
        """Findings about how the draft must be served (none: N comes from the command line)."""
        return []

    def skips(self, name: str) -> bool:
        return name.startswith(self.skip_prefixes) or any(s in name for s in self.skip_substrings)

    def strip(self, name: str) -> str:
        for prefix in self.strip_prefixes:
            if name.startswith(prefix):
                return name[len(prefix):]
        return name


#: The commits read for the rules below (the public code index's stored versions).
_TS = "lightseekorg/tokenspeed@08b221df"
_TS_MODEL = f"{_TS} python/tokenspeed/runtime/models/kimi_k3_dspark.py"
_TS_CFG = f"{_TS} python/tokenspeed/runtime/configs/kimi_k3_dspark_config.py"
_TS_ARGS = "lightseekorg/tokenspeed python/tokenspeed/runtime/utils/server_args.py"
_TS_CLI = "lightseekorg/tokenspeed python/tokenspeed/cli/__main__.py (usage: 'tokenspeed serve --model <path>')"
_ATOM_MODEL = "ROCm/ATOM@0ac8d193 atom/models/kimi_k3_dspark.py"
_ATOM_CORE = "ROCm/ATOM@48d0f4e5 atom/model_loader/loading_core.py"
_ATOM_DISPATCH = "ROCm/ATOM@dbafcffe atom/model_loader/weight_dispatch.py"
_ATOM_NAMES = "ROCm/ATOM atom/model_loader/weight_names.py"
_ATOM_SGL = "ROCm/ATOM atom/plugin/sglang/models/kimi_k3_dspark_draft.py"
_FUSED_MLA = {"q_a_proj": "fused_qkv_a_proj", "kv_a_proj_with_mqa": "fused_qkv_a_proj",
              "gate_proj": "gate_up_proj", "up_proj": "gate_up_proj"}


def _read(rule_id: str, text: str, source: str) -> Cited:
    return Cited(rule=text, source=source, evidence="read", id=rule_id)


TOKENSPEED = RuntimeSpec(
    name="tokenspeed", title="tokenspeed",
    strip_prefixes=("model.",),
    skip_prefixes=("embed_tokens.", "lm_head.", "confidence_head."),
    skip_substrings=("rotary_emb.inv_freq",),
    fused=_FUSED_MLA,
    unknown="raise", missing="raise", unfilled_state="uninitialised", stacked_counted_once=True,
    rules=(
        _read("model_prefix", "a leading 'model.' is stripped once (name.removeprefix('model.'))",
              f"{_TS_MODEL}: K3DSparkModel.load_weights"),
        _read("skipped_prefixes", "names starting with embed_tokens., lm_head., confidence_head. are skipped, "
              "whatever enable_confidence_head says (no confidence head is built)",
              f"{_TS_CFG}: K3_DSPARK_SKIPPED_WEIGHT_PREFIXES; {_TS_MODEL}: K3DSparkModel.__init__"),
        _read("rotary", "only names containing rotary_emb.inv_freq are skipped; rotary_pos_emb.inv_freq, "
              "cos_cached and sin_cached are unexpected names", f"{_TS_MODEL}: load_weights"),
        _read("stacked", "gate_proj/up_proj stack into gate_up_proj; q_a_proj/kv_a_proj_with_mqa into "
              "fused_qkv_a_proj_with_mqa at offsets 0 and q_lora_rank", f"{_TS_MODEL}: load_weights"),
        _read("unknown_raises", "unknown names, a .bias included (no bias tolerance), raise ValueError 'K3 DSpark "
              "checkpoint has N unexpected weights'", f"{_TS_MODEL}: load_weights"),
        _read("missing_raises", "unfilled parameters raise ValueError 'K3 DSpark checkpoint is missing N weights'",
              f"{_TS_MODEL}: load_weights"),
        _read("stacked_counted_once", "the missing check sees a stacked parameter as loaded once either half "
              "loads (loaded.add(target)), so a missing gate_proj, up_proj, q_a_proj or kv_a_proj_with_mqa next to "
              "its present partner starts with those rows uninitialised", f"{_TS_MODEL}: load_weights"),
        _read("config_checked", "validate_k3_dspark_config refuses the config at start-up (verify's CONFIG_RULE "
              "findings)", f"{_TS_CFG}: validate_k3_dspark_config"),
    ),
    serving=ServingRecipe(
        method="DSPARK",
        template="tokenspeed serve --model {target} --speculative-algorithm DSPARK "
                 "--speculative-draft-model-path {draft} --speculative-num-steps {n} --speculative-eagle-topk 1 "
                 "--speculative-num-draft-tokens {n1}",
        source=f"{_TS_CLI}; {_TS_ARGS} (--speculative-algorithm choices, DSPARK requires num_steps == "
               "num_draft_tokens - 1); tokenspeed DSpark recipe docs: 'block_size is the drafted token count', draft "
               "tokens = block + 1",
        note="tokenspeed also accepts --speculative-config JSON, but its num_speculative_tokens mapping for a "
             "separate DSpark draft (num_draft_tokens = n) differs from the recipe docs (n + 1); the explicit "
             "flags above follow the docs",
    ),
    notes=("a newer kimi_k3_dspark.py keeps embed_tokens under pipeline parallelism (the draft runs on the last "
           "stage); otherwise it is skipped",),
)

_ATOM_RULES = (
    _read("names_one_to_one", "names map 1:1 onto the module tree; no prefix is stripped or added",
          f"{_ATOM_MODEL}: KimiK3DSpark docstring ('no WeightsMapper is needed')"),
    _read("skipped_prefixes", "confidence_head., embed_tokens., lm_head. are skipped, whatever "
          "enable_confidence_head says (the head is training-only there)", f"{_ATOM_MODEL}: skip_weight_prefixes"),
    _read("stacked", "q_a_proj/kv_a_proj_with_mqa -> fused_qkv_a_proj, gate_proj/up_proj -> gate_up_proj",
          f"{_ATOM_MODEL}: packed_modules_mapping"),
    _read("unknown_dropped", "a name with no matching parameter (a .bias, rotary cos/sin caches included) is "
          "dropped and loading goes on (a rank-0 log warning in newer builds; nothing in the build the public log "
          "used)", f"{_ATOM_CORE}: dropped_ckpt_keys -> logger.warning; {_ATOM_DISPATCH}: _parameter; "
          f"{LUMEN_NOTES} §10.1 (observed: 65 of 68 names matched, loaded without error, 0.00% acceptance over "
          "3,060 steps)"),
    _read("inv_freq_benign", "names containing inv_freq are dropped as benign (not even warned about)",
          f"{_ATOM_CORE}: benign_substrings"),
    _read("missing_warned", "a parameter no tensor fills keeps its init value (warning only)",
          f"{_ATOM_CORE}: 'model parameters were NOT loaded ... remain at their init values' (logger.warning)"),
    _read("stacked_counted_once", "the packed path records the stacked parameter as soon as one shard loads, so "
          "a missing half of a stacked pair is not even warned about", f"{_ATOM_DISPATCH}: _dispatch_packed "
          "-> _record(param_name)"),
    _read("rope_interleave", "a config key rope_interleave is read as is_neox_style (half-split rotation)",
          f"{_ATOM_MODEL}: get_rope(..., is_neox_style=bool(getattr(config, 'rope_interleave', False))); "
          f"{LUMEN_NOTES} §3.1"),
)

ATOM = RuntimeSpec(
    name="atom", title="ATOM",
    strip_prefixes=(),
    skip_prefixes=("confidence_head.", "embed_tokens.", "lm_head."),
    skip_substrings=("inv_freq",),
    fused=_FUSED_MLA,
    unknown="ignore", missing="ignore", stacked_counted_once=True,
    rules=_ATOM_RULES,
    serving=ServingRecipe(
        method="dspark",
        template="python -m atom.entrypoints.openai_server --model {target} --method dspark --draft-model {draft} "
                 "--num-speculative-tokens {n}",
        source="ROCm/ATOM engine arg parser help: '--draft-model ... needed for the DFlash-backbone drafts such as "
               "Kimi-K3-DSpark'; public ATOM K3 launch scripts use --method dspark --draft-model",
    ),
    notes=(f"name rewriting rules: {_ATOM_NAMES} (CheckpointNameRewriter)",),
)

SGLANG = RuntimeSpec(
    name="sglang", title="SGLang",
    strip_prefixes=ATOM.strip_prefixes,
    skip_prefixes=ATOM.skip_prefixes,
    skip_substrings=ATOM.skip_substrings,
    fused=_FUSED_MLA,
    unknown=ATOM.unknown, missing=ATOM.missing, stacked_counted_once=True,
    rules=(
        _read("atom_plugin", "the K3 DSpark draft class SGLang serves (K3DSparkModel) wraps ATOM's KimiK3DSpark and "
              "loads through ATOM's loader, so ATOM's name rules apply unchanged",
              f"{_ATOM_SGL}: K3DSparkModel.load_weights -> atom.model_loader.loader.load_model_in_plugin_mode"),
        _read("no_native_loader", "no native MLA k3_dspark loader was found in sgl-project/sglang; its own DSpark "
              "draft is the GQA Qwen3DSparkModel, which refuses speculators-format checkpoints (and, unlike vLLM, "
              "treats an absent enable_confidence_head as true)",
              "sgl-project/sglang python/sglang/srt/models/dspark.py (searched; not found: a native K3 loader)"),
        *_ATOM_RULES[1:7],
    ),
    serving=ServingRecipe(
        method="DSPARK",
        template="python -m sglang.launch_server --model-path {target} --speculative-algorithm DSPARK "
                 "--speculative-draft-model-path {draft} --speculative-dspark-block-size {n}",
        source="public SGLang Kimi-K3 DSpark launch scripts (--speculative-dspark-block-size 7); the flag was not "
               "read in sglang's server_args.py itself",
    ),
)

#: The registry the CLI derives `--runtime` choices from.
RUNTIMES: dict[str, RuntimeLoader] = {spec.name: spec for spec in (VLLM, TOKENSPEED, SGLANG, ATOM)}


def resolve(names: str | list[str]) -> list[RuntimeLoader]:
    """`all`, one name or a list of names -> specs, in registry order."""
    wanted = list(RUNTIMES) if names == "all" or names == ["all"] else ([names] if isinstance(names, str)
                                                                       else names)
    return [RUNTIMES[n] for n in RUNTIMES if n in wanted]


# ---------------------------------------------------------------- verdicts

def _fused_target(spec: RuntimeSpec, name: str) -> str | None:
    for module, stacked in spec.fused.items():
        if f".{module}." in name:
            return stacked
    return None


def _bare(name: str) -> str:
    """A name with any wrapper prefix removed (what the contract would call it)."""
    for prefix in contract.FOREIGN_PREFIXES:
        if name.startswith(prefix):
            return name[len(prefix):]
    return name


def expected_parameters(spec: RuntimeSpec, config: Mapping[str, Any]) -> list[str]:
    """Contract names the runtime builds a parameter for (everything it does not skip by design)."""
    return [n for n in contract.roster(config) if not spec.skips(n)]


def _stacked_name(spec: RuntimeSpec, name: str) -> str | None:
    """The stacked parameter a contract name feeds (`layers.0.mlp.gate_up_proj.weight`), if any."""
    for module, stacked in spec.fused.items():
        if f".{module}." in name:
            return name.replace(f".{module}.", f".{stacked}.")
    return None


def runtime_verdicts(tensor_names: list[str], config: Mapping[str, Any], spec: RuntimeSpec) -> RuntimeVerdicts:
    """Walk tensor names through one runtime's loader rules.

    Args:
        tensor_names: the checkpoint's tensor names (as stored).
        config: the draft's `config.json` (the runtime builds its parameters from it).
        spec: the runtime.

    Raises:
        ContractError: the config cannot produce a roster.
    """
    params = set(expected_parameters(spec, config))
    result = RuntimeVerdicts(runtime=spec)
    filled: set[str] = set()
    unknown_verdict: Verdict = "fatal" if spec.unknown == "raise" else "ignored"
    for name in tensor_names:
        lookup = spec.strip(name)
        if spec.skips(lookup):
            result.tensors[name] = ("skipped", "dropped by design (the runtime uses the target's embedding and "
                                    "lm_head; confidence_head is training-only)")
        elif lookup in params:
            stacked = _fused_target(spec, lookup)
            filled.add(lookup)
            detail = f"stacked into {stacked}" if stacked else "loaded as is"
            if lookup != name:
                detail += f" (after stripping {name[:len(name) - len(lookup)]!r})"
            result.tensors[name] = ("loaded", detail)
        else:
            how = "start-up fails" if spec.unknown == "raise" else "dropped without an error"
            result.tensors[name] = (unknown_verdict, f"no parameter of that name: {how}")
            if spec.skips(_bare(name)):
                result.harmless.add(name)
    loaded_stacks = {_stacked_name(spec, p) for p in filled} - {None}
    for param in sorted(params - filled):
        stack = _stacked_name(spec, param)
        if spec.stacked_counted_once and stack in loaded_stacks:
            result.unfilled[param] = ("ignored", f"no tensor fills it, and the load check counts {stack} as loaded "
                                      f"once its other half loads: {spec.title} starts with these rows "
                                      f"{spec.unfilled_state}")
        elif spec.missing == "raise":
            result.unfilled[param] = ("fatal", "no tensor fills it: start-up fails")
        else:
            result.unfilled[param] = ("ignored", f"no tensor fills it: it stays {spec.unfilled_state}")
    return result


def serving_parameters(config: Mapping[str, Any], spec: RuntimeSpec | VllmK3Loader, *, draft: str = "DRAFT",
                       target: str = "TARGET", block_size: int | None = None) -> ServingCommand:
    """The serving parameters a k3_dspark config implies for `spec` (`verdicts.recipe_parameters`)."""
    return recipe_parameters(config, spec.serving, draft=draft, target=target, block_size=block_size)


def loaders_for(fmt: DraftFormat) -> Mapping[str, RuntimeLoader]:
    """Runtime name -> loader rules for checkpoints of `fmt` (a runtime absent here has none for it)."""
    by_format: dict[str, Mapping[str, RuntimeLoader]] = {K3.name: RUNTIMES, SPECULATORS.name: SPECULATORS_RUNTIMES}
    return by_format[fmt.name]
