"""How each serving runtime loads a `k3_dspark` draft, as data, and what it would do with a checkpoint.

Every rule below carries the public source it was read from (repository + path, or the
note that records the observed behaviour). Where a source could not be found the
rule says so instead of guessing.

`runtime_verdicts(view, runtime)` walks the checkpoint's tensor names through one
runtime's loader rules and gives each tensor a verdict:

- ``loaded``: the runtime claims it (possibly fused into a stacked parameter);
- ``skipped``: the runtime drops it by design (it uses the target's embedding and
  ``lm_head``; the confidence head is training-only);
- ``ignored``: the runtime does not know the name and drops it without failing;
- ``fatal``: the runtime refuses to start (an unknown or missing name raises).

Parameters the runtime builds but no tensor fills get a verdict too (``ignored``:
they stay at their init values; ``fatal``: start-up fails).

`sections["runtimes"]` (JSON)::

    {runtime: {"title", "verdicts": [{"tensor", "verdict", "detail"}],
               "unfilled": [{"parameter", "verdict", "detail"}],
               "counts": {verdict: int}, "serving": {...}, "rules": [{"rule", "source"}]}}

Header level only: no tensor data, no torch.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from dspark_hub._text import plural
from dspark_hub.errors import ContractError
from dspark_hub.format import contract
from dspark_hub.report import Finding, error, info, warning
from dspark_hub.verify.family import methods_text

Verdict = Literal["loaded", "skipped", "ignored", "fatal"]
Policy = Literal["raise", "ignore"]
VERDICTS: tuple[Verdict, ...] = ("loaded", "skipped", "ignored", "fatal")

#: Draft tokens per block of the reference draft. Not a config key: serving engines take it
#: from the command line (k3-dspark-contract.md, "block_size is not a config key";
#: tokenspeed kimi_k3_dspark_config.py docstring "draft seven tokens per block").
REFERENCE_BLOCK_SIZE = 7

LUMEN_NOTES = "ZhangDanyang-AMD/Lumen-RL examples/Kimi_K3_SDDD_MI350_ATOM/TRAIN_FROM_SCRATCH.md"


Evidence = Literal["executed", "read"]


@dataclass(frozen=True)
class Cited:
    """One loader rule and where it was read.

    `id` names the rule so a verdict can say which rule decided it; `evidence` says whether the
    behaviour was run against that runtime (`executed`) or only read in its code (`read`); None
    for rules read from public sources without a pinned version.
    """

    rule: str
    source: str
    evidence: Evidence | None = None
    id: str | None = None

    def to_dict(self) -> dict[str, str | None]:
        return {"id": self.id, "rule": self.rule, "source": self.source, "evidence": self.evidence}


@dataclass(frozen=True)
class ServingRecipe:
    """How to start the runtime with the draft: a command template and where its flags come from."""

    method: str
    template: str          # {target} {draft} {n} placeholders
    source: str
    note: str = ""


@dataclass(frozen=True)
class RuntimeSpec:
    """One runtime's load behaviour for a `k3_dspark` draft."""

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

    def verdicts(self, tensors: Mapping[str, tuple[tuple[int, ...], str]],
                 config: Mapping[str, Any]) -> RuntimeVerdicts:
        """What this runtime's loader does with every tensor (name -> (shape, dtype)) of a checkpoint."""
        return runtime_verdicts(list(tensors), config, self)

    def serving_parameters(self, config: Mapping[str, Any], *, draft: str = "DRAFT",
                           block_size: int | None = None) -> dict[str, Any]:
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


_VLLM_MODEL = "vllm-project/vllm vllm/models/kimi_k3/nvidia/dspark_mla.py"
_TS_MODEL = "lightseekorg/tokenspeed python/tokenspeed/runtime/models/kimi_k3_dspark.py"
_TS_CFG = "lightseekorg/tokenspeed python/tokenspeed/runtime/configs/kimi_k3_dspark_config.py"
_TS_ARGS = "lightseekorg/tokenspeed python/tokenspeed/runtime/utils/server_args.py"
_ATOM_MODEL = "ROCm/ATOM atom/models/kimi_k3_dspark.py"
_ATOM_CORE = "ROCm/ATOM atom/model_loader/loading_core.py"
_ATOM_NAMES = "ROCm/ATOM atom/model_loader/weight_names.py"
_ATOM_SGL = "ROCm/ATOM atom/plugin/sglang/models/kimi_k3_dspark_draft.py"
_FUSED_MLA = {"q_a_proj": "fused_qkv_a_proj", "kv_a_proj_with_mqa": "fused_qkv_a_proj",
              "gate_proj": "gate_up_proj", "up_proj": "gate_up_proj"}

VLLM = RuntimeSpec(
    name="vllm", title="vLLM",
    strip_prefixes=(),
    skip_prefixes=(),
    skip_substrings=("confidence_head", "embed_tokens", "lm_head"),
    fused=_FUSED_MLA,
    unknown="raise", missing="raise",
    rules=(
        Cited("names are looked up bare and prefixed with 'model.' internally (a 'model.' already in the file "
              "becomes 'model.model.' and matches nothing)",
              f"{_VLLM_MODEL}: K3DSparkForCausalLM.hf_to_vllm_mapper orig_to_new_prefix {{'': 'model.'}}"),
        Cited("any name containing confidence_head, embed_tokens or lm_head is dropped (training-only head; the "
              "target's embedding and lm_head are shared)",
              f"{_VLLM_MODEL}: hf_to_vllm_mapper orig_to_new_substr {{...: None}}"),
        Cited("gate_proj/up_proj stack into gate_up_proj; q_a_proj/kv_a_proj_with_mqa into fused_qkv_a_proj "
              "(kv_a_proj_with_mqa is also copied into the cross-layer context_kv_proj)",
              f"{_VLLM_MODEL}: orig_to_new_stacked, _duplicate_context_kv_weights"),
        Cited("an unknown name raises ValueError 'There is no module or parameter named ...'",
              "vllm-project/vllm vllm/model_executor/models/utils.py AutoWeightsLoader (K3DSparkForCausalLM."
              "load_weights uses it)"),
        Cited("a parameter no tensor fills raises ValueError 'Following weights were not initialized from "
              "checkpoint' (unquantized models)",
              "vllm-project/vllm vllm/model_executor/model_loader/default_loader.py (strict loaded-weights check)"),
    ),
    serving=ServingRecipe(
        method="dspark",
        template="vllm serve {target} --speculative-config {vllm_spec}",
        source="vllm-project/vllm vllm/config/speculative.py (method 'dspark'); public K3 DSpark launch configs "
               "use num_speculative_tokens 7",
    ),
)

TOKENSPEED = RuntimeSpec(
    name="tokenspeed", title="tokenspeed",
    strip_prefixes=("model.",),
    skip_prefixes=("embed_tokens.", "lm_head.", "confidence_head."),
    skip_substrings=("rotary_emb.inv_freq",),
    fused=_FUSED_MLA,
    unknown="raise", missing="raise",
    rules=(
        Cited("a leading 'model.' is stripped once (name.removeprefix('model.'))",
              f"{_TS_MODEL}: K3DSparkModel.load_weights"),
        Cited("names starting with embed_tokens., lm_head., confidence_head. are skipped",
              f"{_TS_CFG}: K3_DSPARK_SKIPPED_WEIGHT_PREFIXES"),
        Cited("gate_proj/up_proj stack into gate_up_proj; q_a_proj/kv_a_proj_with_mqa into "
              "fused_qkv_a_proj_with_mqa at offsets 0 and q_lora_rank", f"{_TS_MODEL}: load_weights"),
        Cited("unknown names raise ValueError 'K3 DSpark checkpoint has N unexpected weights'",
              f"{_TS_MODEL}: load_weights"),
        Cited("unfilled parameters raise ValueError 'K3 DSpark checkpoint is missing N weights'",
              f"{_TS_MODEL}: load_weights"),
    ),
    serving=ServingRecipe(
        method="DSPARK",
        template="--speculative-algorithm DSPARK --speculative-draft-model-path {draft} "
                 "--speculative-num-steps {n} --speculative-eagle-topk 1 --speculative-num-draft-tokens {n1}",
        source=f"{_TS_ARGS} (--speculative-algorithm choices, DSPARK requires num_steps == num_draft_tokens - 1); "
               "tokenspeed DSpark recipe docs: 'block_size is the drafted token count', draft tokens = block + 1",
        note="tokenspeed also accepts --speculative-config JSON, but its num_speculative_tokens mapping for a "
             "separate DSpark draft (num_draft_tokens = n) differs from the recipe docs (n + 1); the explicit "
             "flags above follow the docs",
    ),
    notes=("a newer kimi_k3_dspark.py keeps embed_tokens under pipeline parallelism (the draft runs on the last "
           "stage); otherwise it is skipped",),
)

ATOM = RuntimeSpec(
    name="atom", title="ATOM",
    strip_prefixes=(),
    skip_prefixes=("confidence_head.", "embed_tokens.", "lm_head."),
    skip_substrings=("inv_freq",),
    fused=_FUSED_MLA,
    unknown="ignore", missing="ignore",
    rules=(
        Cited("names map 1:1 onto the module tree; no prefix is stripped or added",
              f"{_ATOM_MODEL}: KimiK3DSpark docstring ('no WeightsMapper is needed')"),
        Cited("confidence_head., embed_tokens., lm_head. are skipped", f"{_ATOM_MODEL}: skip_weight_prefixes"),
        Cited("q_a_proj/kv_a_proj_with_mqa -> fused_qkv_a_proj, gate_proj/up_proj -> gate_up_proj",
              f"{_ATOM_MODEL}: packed_modules_mapping"),
        Cited("a name with no matching parameter is dropped and loading goes on (a rank-0 log warning in newer "
              "builds; nothing in the build the public log used)",
              f"{_ATOM_CORE}: dropped_ckpt_keys -> logger.warning; {LUMEN_NOTES} §10.1 (observed: 65 of 68 names "
              "matched, loaded without error, 0.00% acceptance over 3,060 steps)"),
        Cited("a parameter no tensor fills keeps its init value (warning only)",
              f"{_ATOM_CORE}: 'model parameters were NOT loaded ... remain at their init values' (logger.warning)"),
        Cited("a config key rope_interleave is read as is_neox_style (half-split rotation)",
              f"{_ATOM_MODEL}: get_rope(..., is_neox_style=bool(getattr(config, 'rope_interleave', False))); "
              f"{LUMEN_NOTES} §3.1"),
    ),
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
    unknown=ATOM.unknown, missing=ATOM.missing,
    rules=(
        Cited("the K3 DSpark draft class SGLang serves (K3DSparkModel) wraps ATOM's KimiK3DSpark and loads "
              "through ATOM's loader, so ATOM's name rules apply unchanged",
              f"{_ATOM_SGL}: K3DSparkModel.load_weights -> atom.model_loader.loader.load_model_in_plugin_mode"),
        Cited("no native MLA k3_dspark loader was found in sgl-project/sglang; its own DSpark draft is the GQA "
              "Qwen3DSparkModel, which refuses speculators-format checkpoints",
              "sgl-project/sglang python/sglang/srt/models/dspark.py (searched; not found: a native K3 loader)"),
        *ATOM.rules[1:5],
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
RUNTIMES: dict[str, RuntimeSpec] = {spec.name: spec for spec in (VLLM, TOKENSPEED, SGLANG, ATOM)}


def resolve(names: str | list[str]) -> list[RuntimeSpec]:
    """`all`, one name or a list of names -> specs, in registry order."""
    wanted = list(RUNTIMES) if names == "all" or names == ["all"] else ([names] if isinstance(names, str)
                                                                       else names)
    return [RUNTIMES[n] for n in RUNTIMES if n in wanted]


# ---------------------------------------------------------------- verdicts

@dataclass
class RuntimeVerdicts:
    """What one runtime would do with every tensor of a checkpoint.

    `runtime` is any loader spec with `name`, `title`, `rules`, `notes`, `drop_hint`, `fatal_hint`
    (`RuntimeSpec` here, `runtimes_speculators.SpeculatorsLoader` for the speculators format);
    `decided_by` names the rule id behind a verdict, where the loader's rules have ids.
    """

    runtime: Any
    tensors: dict[str, tuple[Verdict, str]] = field(default_factory=dict)     # name -> (verdict, detail)
    unfilled: dict[str, tuple[Verdict, str]] = field(default_factory=dict)    # parameter -> (verdict, detail)
    harmless: set[str] = field(default_factory=set)    # ignored names whose bare form is skipped by design
    decided_by: dict[str, str] = field(default_factory=dict)   # tensor or parameter -> rule id

    def names(self, verdict: Verdict) -> list[str]:
        return [n for n, (v, _) in self.tensors.items() if v == verdict]

    @property
    def loads(self) -> bool:
        return not self.names("fatal") and not any(v == "fatal" for v, _ in self.unfilled.values())

    def counts(self) -> dict[str, int]:
        out = {v: 0 for v in VERDICTS}
        for v, _ in self.tensors.values():
            out[v] += 1
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"title": self.runtime.title,
                "verdicts": [{"tensor": n, "verdict": v, "detail": d, "rule": self.decided_by.get(n)}
                             for n, (v, d) in self.tensors.items()],
                "unfilled": [{"parameter": n, "verdict": v, "detail": d, "rule": self.decided_by.get(n)}
                             for n, (v, d) in self.unfilled.items()],
                "counts": self.counts(),
                "rules": [r.to_dict() for r in self.runtime.rules],
                "notes": list(self.runtime.notes)}


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
    missing_verdict: Verdict = "fatal" if spec.missing == "raise" else "ignored"
    for param in sorted(params - filled):
        how = "start-up fails" if spec.missing == "raise" else "stays at its init value"
        result.unfilled[param] = (missing_verdict, f"no tensor fills it: {how}")
    return result


# ---------------------------------------------------------------- consequences

_CONSEQUENCES = (
    (("context_proj.", "context_norm."), "the context path is dropped"),
    (("final_norm.",), "the final norm is left at its init value"),
    (("markov_head.",), "the Markov head is random"),
    (("layers.",), "draft layers keep their init values"),
)


def consequence(parameters: list[str]) -> str:
    """What serving loses when these contract parameters are never filled."""
    parts = [text for prefixes, text in _CONSEQUENCES if any(p.startswith(prefixes) for p in parameters)]
    return (", ".join(parts) or "weights keep their init values") + " and acceptance collapses"


def _listing(names: list[str], limit: int = 6) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def findings(result: RuntimeVerdicts) -> list[Finding]:
    """Errors for what this runtime would silently drop or refuse; an info line when it loads cleanly."""
    spec = result.runtime
    where = f"runtime:{spec.name}"
    ignored = [n for n in result.names("ignored") if n not in result.harmless]
    unfilled_ignored = [p for p, (v, _) in result.unfilled.items() if v == "ignored"]
    fatal = not result.loads
    out: list[Finding] = []
    if (ignored or unfilled_ignored) and not fatal:    # a load that fails drops nothing silently
        head = f"{spec.title} would ignore {_listing(ignored)}" if ignored else \
            f"{spec.title} would load without {_listing(unfilled_ignored)}"
        out.append(error("RUNTIME_SILENT_DROP", where, f"{head}: {consequence(unfilled_ignored or ignored)}; "
                         "the server log stays healthy", spec.drop_hint))
    if fatal:
        unknown = result.names("fatal")
        missing = [p for p, (v, _) in result.unfilled.items() if v == "fatal"]
        parts = ([f"unknown {_listing(unknown)}"] if unknown else []) + \
            ([f"missing {_listing(missing)}"] if missing else [])
        out.append(error("RUNTIME_LOAD_FAILS", where, f"{spec.title} refuses to start ({'; '.join(parts)}): its "
                         "loader raises on unknown and missing names", spec.fatal_hint))
    if not out:
        c = result.counts()
        out.append(info("RUNTIME_LOADS", where, f"{spec.title} loads {plural(c['loaded'], 'tensor')} and skips "
                        f"{c['skipped']} by design"))
    return out


# ---------------------------------------------------------------- serving parameters

def serving_parameters(config: Mapping[str, Any], spec: RuntimeSpec, *, draft: str = "DRAFT",
                       target: str = "TARGET", block_size: int | None = None) -> dict[str, Any]:
    """The serving parameters the config implies, as a ready-to-paste command fragment.

    Args:
        config: the draft's config.
        spec: the runtime.
        draft: the draft's path or repo id to put in the command.
        target: the target's path or repo id.
        block_size: draft tokens per block; not a config key (default: the reference's 7).
    """
    n = block_size if block_size is not None else REFERENCE_BLOCK_SIZE
    recipe = spec.serving
    draft_id = _draft_id(draft)
    draft = shlex.quote(draft_id)
    vllm_spec = shlex.quote(json.dumps({"method": recipe.method, "model": draft_id, "num_speculative_tokens": n}))
    return {
        "method": recipe.method,
        "num_speculative_tokens": n,
        "block_size_source": "`block_size` as given" if block_size is not None else
        f"default: the reference draft's {REFERENCE_BLOCK_SIZE} (block_size is not a config key)",
        "target_layer_ids": config.get("target_layer_ids"),
        "target_layer_ids_source": "read from config.json target_layer_ids by every runtime (0-based, output of "
                                   "each target layer); no command-line flag",
        "command": recipe.template.format(target=target, draft=draft, n=n, n1=n + 1, vllm_spec=vllm_spec),
        "alternatives": [],
        "source": recipe.source,
        "note": recipe.note or None,
    }


def _draft_id(draft: str) -> str:
    """What a runtime accepts for the draft: a Hub repo id (runtimes do not know our hf:// URLs) or a path."""
    if draft.startswith("hf://"):
        return draft[len("hf://"):].split("@", 1)[0]
    return draft


def runtimes_section(tensors: Mapping[str, tuple[tuple[int, ...], str]] | list[str], config: Mapping[str, Any],
                     specs: list[Any], *, draft: str = "DRAFT",
                     block_size: int | None = None) -> tuple[dict[str, Any], list[Finding]]:
    """`sections["runtimes"]` and the findings for the named runtimes' loaders.

    `tensors` maps name -> (shape, dtype) (a list of names is read as names of unknown shape).
    """
    present = tensors if isinstance(tensors, Mapping) else {name: ((), "") for name in tensors}
    section: dict[str, Any] = {}
    out: list[Finding] = []
    for spec in specs:
        result = spec.verdicts(present, config)
        section[spec.name] = {**result.to_dict(), "supported": True,
                              "serving": spec.serving_parameters(config, draft=draft, block_size=block_size)}
        out.extend(findings(result))
        out.extend(spec.serving_findings(config, block_size))
    return section, out


def extend_report(report: Any, view: Any, names: str | list[str], *, block_size: int | None = None) -> Any:
    """Add `sections["runtimes"]` (and `sections["family"]`) plus the runtime findings to a verify report.

    The loaders are those of the checkpoint's draft format (`verify.formats`); a runtime with no
    loader rules for that format gets a `RUNTIME_NO_RULES` warning instead of verdicts. A folder of
    another draft family, or a config without a roster, gets no runtime verdicts: the family
    finding already says what it is.
    """
    from dspark_hub.verify.formats import detect

    fmt, found = detect(view.config, view.tensors)
    report.sections["family"] = found.to_dict()
    if fmt is None or view.config is None:
        return report
    loaders = fmt.runtimes()
    wanted = list(RUNTIMES) if names == "all" or names == ["all"] else ([names] if isinstance(names, str) else names)
    present = {n: (tuple(info.shape), info.dtype) for n, (_, info) in view.tensors.items()}
    try:
        section, out = runtimes_section(present, view.config, [loaders[n] for n in loaders if n in wanted],
                                        draft=view.location, block_size=block_size)
    except ContractError:
        return report     # ROSTER_UNDECIDABLE is already reported
    explicit = names not in ("all", ["all"])
    for name in (n for n in wanted if n not in loaders):
        title = RUNTIMES[name].title if name in RUNTIMES else name
        section[name] = {"title": title, "supported": False, "verdicts": [], "unfilled": [], "counts": {},
                         "rules": [], "notes": [f"no {title} loader for {fmt.title} checkpoints is known"],
                         "serving": None}
        if explicit:
            out.append(warning("RUNTIME_NO_RULES", f"runtime:{name}", f"dspark-hub knows no {title} loader for "
                               f"{fmt.title} checkpoints ({methods_text(found.spec)}); nothing was judged",
                               "judge it with a runtime that serves this format"))
    report.sections["runtimes"] = section
    report.findings.extend(out)
    return report
