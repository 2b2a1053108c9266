"""How vLLM loads a speculators-format DSpark checkpoint, as data, and the serving commands its config implies.

The loader is `Qwen3DSparkForCausalLM.load_weights` (`vllm/model_executor/models/qwen3_dspark.py`,
on top of `qwen3_dflash.py` and `models/utils.py` `AutoWeightsLoader`) in vLLM 0.32.0. Every rule
below is a `Cited` with an `id`, its `source` (file:line in vLLM 0.32.0) and its `evidence`:
**executed** means the behaviour was observed by running that loader on the fixtures in
`tests/fixtures/speculators/` (CPU build: config translation, `SpeculativeConfig`, and
`load_weights` of every DSpark fixture and of mutated copies); **read** means it was only read in
the code. Each per-tensor verdict names the rule that decided it (`"rule"` in the JSON), so a
conformance harness that runs the real loader can compare rule by rule.

Verdicts, first rule that applies:

1. ``confidence_head.*`` is dropped (``skipped``) unless ``enable_confidence_head`` is true
   (vLLM's default when the key is absent: false);
2. ``t2d`` is ``skipped`` (vLLM maps draft ids with ``d2t`` alone);
3. a name vLLM builds a parameter for is ``loaded`` (``q/k/v_proj`` stacked into ``qkv_proj``,
   ``gate/up_proj`` into ``gate_up_proj``) when its shape matches, else ``fatal`` (AssertionError);
4. any other name ending in ``.bias`` is ``ignored``;
5. any other name is ``fatal`` (ValueError). A gated head's ``markov_head.gate_proj.weight`` is
   renamed ``gate_up_proj`` by the stacking mapper and fails here; an rnn head's ``joint_proj`` too.

Parameters vLLM builds: the DFlash body (``fc`` sized ``[H, (target_hidden_size or H) * T]``),
``markov_w1``/``markov_w2`` when ``markov_rank > 0`` (vanilla only; ``markov_head_type`` is never
read), the confidence head when enabled, ``lm_head`` and ``d2t`` when the draft vocabulary is
pruned. One no tensor fills is ``fatal`` (read).
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dspark_hub.format import speculators
from dspark_hub.report import Finding, warning
from dspark_hub.verify.formats import ServingFacts
from dspark_hub.verify.rules import taps_from_aux_ids
from dspark_hub.verify.runtimes import Cited, RuntimeVerdicts, Verdict, _draft_id

VERSION = "vLLM 0.32.0"
_DSPARK = "vllm/model_executor/models/qwen3_dspark.py"
_DFLASH = "vllm/model_executor/models/qwen3_dflash.py"
_UTILS = "vllm/model_executor/models/utils.py"
_ALGOS = "vllm/transformers_utils/configs/speculators/algos.py"
_BASE = "vllm/transformers_utils/configs/speculators/base.py"
_ARGS = "vllm/engine/arg_utils.py"
_SPEC = "vllm/config/speculative.py"


def _rule(rule_id: str, rule: str, source: str, evidence: str) -> Cited:
    return Cited(rule=rule, source=f"{VERSION} {source}", evidence=evidence, id=rule_id)  # type: ignore[arg-type]


RULES: dict[str, Cited] = {r.id: r for r in (  # type: ignore[misc]
    _rule("type_supported", "speculators_model_type must be eagle3, peagle, dflash, dflash2 or dspark (mtp and "
          "xpress are rejected)", f"{_BASE}:51-56", "executed"),
    _rule("config_translated", "the config is translated by update_dspark: aux ids become "
          "eagle_aux_hidden_state_layer_ids and target_layer_ids = ids - 1; draft_vocab_size, target_hidden_size, "
          "mask_token_id, markov_rank, markov_head_type, block_size and the confidence flags are copied when not "
          "null; sliding_window_non_causal is not copied", f"{_ALGOS}:152-209", "executed"),
    _rule("confidence_dropped", "confidence_head.* is dropped without an error unless enable_confidence_head is "
          "true (absent: false)", f"{_DSPARK}:220, 366-368", "executed"),
    _rule("t2d_skipped", "t2d is skipped; a pruned draft vocabulary is mapped with d2t", f"{_DSPARK}:319-324, "
          "348-357", "executed"),
    _rule("pruned_vocab", "a draft vocabulary smaller than the target's needs lm_head and d2t",
          f"{_DSPARK}:319-324, 348-357", "executed"),
    _rule("larger_vocab", "a draft vocab_size larger than the target's needs embed_tokens (never saved by "
          "speculators)", f"{_DSPARK}:341-347", "executed"),
    _rule("stacked", "q_proj/k_proj/v_proj stack into qkv_proj and gate_proj/up_proj into gate_up_proj, by name, "
          "also under markov_head", f"{_DFLASH}:413-430", "executed"),
    _rule("vanilla_markov", "the Markov head is vanilla only (markov_w1 [V, r], markov_w2 [Vd, r]); "
          "markov_head_type is never read, so a gated head's gate_proj (renamed gate_up_proj) and an rnn head's "
          "joint_proj are unknown names; markov_rank 0 builds a rank-0 head that needs no tensors",
          f"{_DSPARK}:48-81, 209-218", "executed"),
    _rule("shape_checked", "a tensor whose shape differs from its parameter fails the load (AssertionError): fc is "
          "[H, (target_hidden_size or H) * len(aux ids)], confidence_head.proj.weight [1, H + r * with_markov]",
          f"{_DFLASH}:108-117, 495-504; {_DSPARK}:164-189, 219-230", "executed"),
    _rule("bias_ignored", "an unknown name ending in .bias is ignored without an error", f"{_UTILS}:458",
          "executed"),
    _rule("unknown_raises", "any other unknown name raises ValueError 'There is no module or parameter named ...'",
          f"{_UTILS}:443-448", "executed"),
    _rule("unfilled_raises", "a parameter no tensor fills raises ValueError 'Following weights were not "
          "initialized from checkpoint' (the default loader's strict check; line not recorded)",
          "vllm/model_executor/model_loader/default_loader.py", "read"),
    _rule("serving_tokens", "N: an explicit num_speculative_tokens / --spec-tokens wins; vllm serve DRAFT takes "
          "speculators_config.proposal_methods[0].speculative_tokens; --speculative-config without N takes "
          "block_size (no check of N against block_size)", f"{_SPEC}:1481-1488, 1503-1507; {_BASE}:97-137",
          "executed"),
    _rule("spec_flags", "--spec-method/--spec-model/--spec-tokens are merged into the --speculative-config dict; a "
          "key given both ways is an error", f"{_ARGS}:1830-1835, 2060-2081", "executed"),
)}

_STACKED = {"q_proj": "qkv_proj", "k_proj": "qkv_proj", "v_proj": "qkv_proj", "gate_proj": "gate_up_proj",
            "up_proj": "gate_up_proj"}


def vllm_confidence(config: Mapping[str, Any]) -> bool:
    """Whether vLLM builds the confidence head: only when `enable_confidence_head` is true (default false)."""
    return bool(config.get("enable_confidence_head", False))


def vllm_parameters(config: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    """The checkpoint names vLLM builds a parameter for, with their shapes.

    Raises:
        ContractError: the config cannot produce a roster.
    """
    g = speculators.geometry(config)
    shapes = speculators.tensor_shapes(g)
    out = {}
    for name, shape in shapes.items():
        if name == "t2d" or name.startswith(("markov_head.gate_proj", "markov_head.joint_proj")):
            continue
        if name.startswith("confidence_head.") and not vllm_confidence(config):
            continue
        out[name] = shape
    return out


@dataclass(frozen=True)
class SpeculatorsLoader:
    """vLLM's loader for a speculators DSpark, as the same kind of spec `verify.runtimes` walks."""

    name: str = "vllm"
    title: str = "vLLM"
    method: str = "dspark"
    rules: tuple[Cited, ...] = tuple(RULES.values())
    notes: tuple[str, ...] = (f"{VERSION} model class Qwen3DSparkForCausalLM ({_DSPARK}); serving itself was not "
                              "run (the CPU build refuses DSpark), the loader and config translation were",)
    drop_hint: str = "save the checkpoint with the speculators library's names"
    fatal_hint: str = "save the names and shapes the config implies (vLLM loads only the vanilla Markov head)"

    def verdicts(self, tensors: Mapping[str, tuple[tuple[int, ...], str]],
                 config: Mapping[str, Any]) -> RuntimeVerdicts:
        """Walk every tensor (name -> (shape, dtype)) through vLLM's speculators DSpark loader."""
        params = vllm_parameters(config)
        result = RuntimeVerdicts(runtime=self)
        filled: set[str] = set()

        def decide(name: str, verdict: Verdict, detail: str, rule: str) -> None:
            result.tensors[name] = (verdict, detail)
            result.decided_by[name] = rule

        for name, (shape, _) in tensors.items():
            module = name.split(".")[-2] if "." in name else name
            if name.startswith("confidence_head.") and not vllm_confidence(config):
                decide(name, "skipped", "dropped: enable_confidence_head is not true (vLLM's default is false)",
                       "confidence_dropped")
            elif name == "t2d":
                decide(name, "skipped", "skipped: vLLM maps draft ids with d2t", "t2d_skipped")
            elif name in params and shape and tuple(shape) != params[name]:
                decide(name, "fatal", f"shape {list(shape)}, the parameter is {list(params[name])}: the load fails",
                       "shape_checked")
                filled.add(name)
            elif name in params:
                stacked = _STACKED.get(module) if not name.startswith("markov_head.") else None
                decide(name, "loaded", f"stacked into {stacked}" if stacked else "loaded as is",
                       "stacked" if stacked else "shape_checked")
                filled.add(name)
            elif name.endswith(".bias"):
                decide(name, "ignored", "no parameter of that name; names ending in .bias are dropped without an "
                       "error", "bias_ignored")
            elif name.startswith("markov_head."):
                renamed = name.replace(".gate_proj.", ".gate_up_proj.")
                decide(name, "fatal", f"vLLM's Markov head is vanilla only: no parameter {renamed}; the load fails",
                       "vanilla_markov")
            else:
                decide(name, "fatal", "no parameter of that name: the load fails (ValueError)", "unknown_raises")
        for param in sorted(set(params) - filled):
            result.unfilled[param] = ("fatal", "no tensor fills it: start-up fails")
            result.decided_by[param] = "unfilled_raises"
        return result

    def serving_parameters(self, config: Mapping[str, Any], *, draft: str = "DRAFT",
                           block_size: int | None = None) -> dict[str, Any]:
        return serving_parameters(config, draft=draft, block_size=block_size)

    def serving_findings(self, config: Mapping[str, Any], block_size: int | None) -> list[Finding]:
        """A warning for a bonus-anchor draft, whose token count is not its block size."""
        facts = serving_facts(config)
        block = config.get("block_size")
        anchored = config.get("sample_from_anchor", speculators.DEFAULTS["sample_from_anchor"])
        if anchored or facts.num_speculative_tokens is None or facts.num_speculative_tokens == block:
            return []
        return [warning("SERVING_TOKEN_COUNT", "runtime:vllm", f"a bonus-anchor draft (sample_from_anchor false) "
                        f"drafts {facts.num_speculative_tokens} tokens per step, not its block_size {block}; vLLM "
                        f"given no count takes block_size and runs {block + 1} query slots on a draft trained with "
                        f"{block} [{RULES['serving_tokens'].source}; executed]",
                        f"pass num_speculative_tokens {facts.num_speculative_tokens} explicitly (the commands do)")]


def serving_facts(config: Mapping[str, Any]) -> ServingFacts:
    """Method, token count and verifier a speculators DSpark config implies for vLLM."""
    declared = speculators.speculative_tokens(config)
    written = speculators.written_speculative_tokens(config)
    notes = []
    if declared is not None and written is not None and declared != written:
        notes.append(f"speculative_tokens {declared} differs from what training writes for this block layout "
                     f"({written})")
    if declared is not None:
        n, source = declared, "speculators_config.proposal_methods[0].speculative_tokens"
    else:
        n, source = written, "block_size (speculative_tokens is not recorded)"
    if not config.get("sample_from_anchor", speculators.DEFAULTS["sample_from_anchor"]):
        notes.append(f"bonus-anchor layout (sample_from_anchor false): {n} drafted tokens per step for block_size "
                     f"{config.get('block_size')}; give the count explicitly, as these commands do")
    return ServingFacts(method="dspark", num_speculative_tokens=n, source=source,
                        verifier=speculators.verifier_name(config), notes=tuple(notes))


def serving_parameters(config: Mapping[str, Any], *, draft: str = "DRAFT", target: str | None = None,
                       block_size: int | None = None) -> dict[str, Any]:
    """Both spellings of the vLLM serving command the config implies, with N given explicitly.

    `vllm serve VERIFIER --speculative-config '{"method": "dspark", "model": DRAFT, "num_speculative_tokens": N}'`
    and the seed card's `vllm serve VERIFIER --spec-method dspark --spec-model DRAFT --spec-tokens N` (the same
    dict in vLLM 0.32.0). VERIFIER is `speculators_config.verifier.name_or_path` unless `target` is given;
    N is `proposal_methods[0].speculative_tokens` unless `block_size` overrides it.
    """
    facts = serving_facts(config)
    n = block_size if block_size is not None else facts.num_speculative_tokens
    verifier = target or facts.verifier or "VERIFIER"
    draft_id = _draft_id(draft)
    spec = json.dumps({"method": facts.method, "model": draft_id, "num_speculative_tokens": n})
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
                         f"{shlex.quote(draft_id)} --spec-tokens {n}"],
        "source": f"{RULES['serving_tokens'].source}; {RULES['spec_flags'].source}; the --spec-* spelling is the "
                  "one on the RedHatAI/Kimi-K3-speculator.dspark card",
        "note": "; ".join(facts.notes) or None,
    }


#: The runtimes with loader rules for a speculators DSpark (only vLLM was found to load the format).
RUNTIMES: dict[str, SpeculatorsLoader] = {"vllm": SpeculatorsLoader()}
