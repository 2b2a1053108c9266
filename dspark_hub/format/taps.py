"""The tap-id rule: which target layers a draft reads, in both conventions, checked once.

`tap_layer_findings` is the rule for `target_layer_ids`; `verify`, `verify --target`,
`rollouts` and `finetune` all call it, so they cannot disagree about a config. The tap
convention (which residual stream an id names) is also here, with its conversions, and the
speculators aux-id rule (`aux_id_findings`). It is a fact of the format, so it sits in the
format core: `ops`, `cards`, `train` and `hub` learn it without importing `verify`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from dspark_hub.errors import UsageError
from dspark_hub.format.jsonio import is_int
from dspark_hub.report import Finding, error, warning

#: What a `target_layer_ids` entry names, for manifests and messages.
TAP_CONVENTION = ("target_layer_ids entry l = output of teacher decoder layer l (0-based), i.e. "
                  "transformers hidden_states[l + 1] and vLLM/speculators aux layer id l + 1; the taps "
                  "are concatenated in ascending id order")


def residual_index(layer_id: int) -> int:
    """The residual-stream index of a tap: how many decoder layers have run when it is read.

    Our ids name a layer's OUTPUT (`l`); transformers' `hidden_states[k]` and vLLM's and
    speculators' aux layer ids name the residual after `k` layers. So `k = l + 1`; the final
    layer's output is `k = num_hidden_layers`, which transformers returns normed in
    `hidden_states[-1]` but vLLM captures before the norm.
    """
    return layer_id + 1


def text_config(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """The language-model part of a (possibly multimodal) target config: its `text_config` when nested."""
    nested = config.get("text_config")
    return nested if isinstance(nested, Mapping) and "hidden_size" in nested else config


def layer_id_from_residual(index: int) -> int:
    """Inverse of `residual_index`: a vLLM/speculators aux layer id as our `target_layer_ids` entry."""
    return index - 1



def tap_layer_findings(config: Mapping[str, Any], *, target_layers: int | None = None,
                       code: str = "CONFIG_RULE") -> list[Finding]:
    """Every problem with a config's `target_layer_ids`, as findings.

    The ids must be a non-empty list of integers, strictly ascending and distinct, as many as
    `num_target_layers`, each in `[0, L)` where `L` is the config's `target_num_hidden_layers`.
    With `target_layers` (a target model's real layer count, for pairing) only the range is
    checked against it: the shape of the list is the config rule's to report, once. Tapping the final
    layer is a warning: its output is read before the final norm by vLLM and by forward hooks,
    but after it by transformers' `hidden_states[-1]`, so the capture path must be checked.

    Args:
        config: the draft config.
        target_layers: the paired target's `num_hidden_layers`, when known.
        code: the finding code (`CONFIG_RULE` for verify, `PAIRING_LAYER_ID` against a target).
    """
    ids, n = config.get("target_layer_ids"), config.get("num_target_layers")
    total = target_layers if target_layers is not None else config.get("target_num_hidden_layers")
    where = "config.json:target_layer_ids"
    well_formed = isinstance(ids, list) and bool(ids) and all(is_int(i) for i in ids)
    if target_layers is not None and (not well_formed or target_layers == config.get("target_num_hidden_layers")):
        return []   # the config rule already said it; against a target only another layer count is new
    if not well_formed:
        return [error(code, where, f"target_layer_ids is {json.dumps(ids)[:60]}; it must be a non-empty list of "
                      "integers (runtimes that default it guess other layers and acceptance collapses)",
                      "list the target layers the draft was trained on, ascending")]
    assert isinstance(ids, list)
    out: list[Finding] = []
    if target_layers is None and ids != sorted(set(ids)):
        out.append(error(code, where, f"target_layer_ids {ids} are not strictly ascending and distinct",
                         "list the target layers the draft was trained on, ascending"))
    if target_layers is None and len(ids) != n:
        out.append(error(code, where, f"{len(ids)} target_layer_ids but num_target_layers is {json.dumps(n)}",
                         "make num_target_layers equal the number of ids"))
    if is_int(total):
        whose = "the target's" if target_layers is not None else "target_num_hidden_layers="
        bad = [i for i in ids if not 0 <= i < total]
        if bad:
            out.append(error(code, where, f"ids {bad} are outside [0, {whose}{total})",
                             "use 0-based ids of the target's decoder layers"))
        elif total - 1 in ids:
            out.append(warning(code, where, f"id {total - 1} is the target's final layer: its output is the "
                               "residual before the final norm (vLLM aux id "
                               f"{residual_index(total - 1)}, a forward hook), not transformers' normed "
                               "hidden_states[-1]", "check that training and serving capture it the same way"))
    return out


#: What a speculators / vLLM aux layer id names, for messages.
AUX_ID_CONVENTION = ("aux_hidden_state_layer_ids entry k = the residual stream after k target decoder layers "
                     "(transformers hidden_states[k]; 0 = the embedding output, L = the last layer's output before "
                     "the final norm) = our target_layer_ids entry k - 1")
#: Where the speculators aux-id rule was read and run.
AUX_ID_SOURCE = ("[speculators 0.9.0 models/utils.py:99-140 resolve_target_layer_ids (distinct, within "
                 "[0, num_layers] inclusive, order not checked); vLLM 0.32.0 algos.py:192-195 (target_layer_ids = "
                 "ids - 1); executed]")


def aux_id_findings(ids: Any, *, target_layers: int | None = None, code: str = "CONFIG_RULE",
                    where: str = "config.json:aux_hidden_state_layer_ids") -> list[Finding]:
    """Every problem with a speculators config's `aux_hidden_state_layer_ids`, as findings.

    The ids must be a non-empty list of distinct integers >= 0 (speculators refuses anything else
    when it sets up training); ascending order is what both the library and vLLM capture, so
    another order is a warning. With `target_layers` (the paired target's layer count) only the
    range `[0, target_layers]` (inclusive: the last layer's output is id `target_layers`) is checked:
    the shape of the list is the config rule's to report, once.
    """
    well_formed = isinstance(ids, list) and bool(ids) and all(is_int(i) for i in ids)
    if target_layers is not None:
        if not well_formed:
            return []
        bad = [i for i in ids if not 0 <= i <= target_layers]
        return [error(code, where, f"aux ids {bad} are outside [0, {target_layers}] for a target with "
                      f"{target_layers} layers (aux id k is the residual after k layers)",
                      "list residual indices the target has")] if bad else []
    if not well_formed:
        return [error(code, where, f"aux_hidden_state_layer_ids is {json.dumps(ids)[:60]}; it must be a non-empty "
                      f"list of integers (speculators and vLLM size fc and pick the target's hidden states from it) "
                      f"{AUX_ID_SOURCE}", "list the target residual indices the draft was trained on")]
    out: list[Finding] = []
    if len(set(ids)) != len(ids) or any(i < 0 for i in ids):
        out.append(error(code, where, f"aux ids {ids} must be distinct and >= 0 {AUX_ID_SOURCE}",
                         "list each residual index once"))
    elif ids != sorted(ids):
        out.append(warning(code, where, f"aux ids {ids} are not ascending; the target's hidden states are captured "
                           "in layer order whatever the list order, so fc's column blocks follow ascending ids "
                           f"{AUX_ID_SOURCE}",
                           "write the ids ascending"))
    return out


def taps_from_aux_ids(ids: list[int]) -> list[int]:
    """A speculators config's aux ids in our `target_layer_ids` convention (`k - 1`)."""
    return [layer_id_from_residual(k) for k in ids]


def require_tap_layers(config: Mapping[str, Any], *, target_layers: int | None = None) -> list[int]:
    """The draft's `target_layer_ids`, or a `UsageError` naming the first rule they break.

    Raises:
        UsageError: `tap_layer_findings` reports an error (the message is its message).
    """
    errors = [f for f in tap_layer_findings(config) if f.severity == "error"]
    if target_layers is not None and not errors:
        errors = [f for f in tap_layer_findings(config, target_layers=target_layers) if f.severity == "error"]
    if errors:
        raise UsageError(f"{errors[0].where}: {errors[0].message}; {errors[0].hint}")
    return list(config["target_layer_ids"])
