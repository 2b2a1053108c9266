"""What a verify report says about the runtimes: `sections["runtimes"]` and the RUNTIME_* findings.

The verdicts come from the loader specs (`loaders`), or, under `verify --execute`, from running
vLLM's own loader (`execute_vllm`); the findings use the same codes either way.

`sections["runtimes"]` (JSON) maps each runtime's name to a `report.JudgedRuntime` (its verdicts per tensor
and per unfilled parameter, its refusal, counts, rules and serving command; under `--execute` also what the
execution found and how the rules compare) or, for a runtime with no loader rules for the format, a
`report.UnjudgedRuntime` (`supported` false, nothing judged, no command).

`serving` is null for a runtime the verdicts say refuses to start with the draft: no command is
offered that cannot work (`serving_withheld` says why).

`rule` is the id of the rule that decided the row (under `--execute` too: the rule whose verdict was
expected); `evidence` is ``executed`` for a row observed by running the runtime's loader on this
checkpoint, else that rule's own evidence (``executed`` or ``read``; null without a rule id).

Header level only: no tensor data, no torch (`verify --execute` runs vLLM in a child process).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dspark_hub._text import plural
from dspark_hub.errors import ContractError
from dspark_hub.format.checkpoint import CheckpointView
from dspark_hub.report import (
    Finding,
    JudgedRuntime,
    Report,
    RuleAgreement,
    RuntimeEntry,
    Serving,
    UnjudgedRuntime,
    error,
    info,
    warning,
)
from dspark_hub.verify.family import detect, methods_text
from dspark_hub.verify.runtimes import execute_vllm
from dspark_hub.verify.runtimes.loaders import RUNTIMES, loaders_for
from dspark_hub.verify.runtimes.verdicts import RuntimeLoader, RuntimeVerdicts, compare

_CONSEQUENCES = (
    (("context_proj.", "context_norm."), "the context path is dropped"),
    (("context_kv_proj.",), "the context rows of the draft's KV cache are garbage"),
    (("final_norm.",), "the final norm is wrong"),
    (("markov_head.",), "the Markov head is random"),
    (("layers.",), "draft layers run on unset weights"),
    (("confidence_head.",), "the confidence head scores garbage (adaptive verification reads it)"),
)


def consequence(names: list[str]) -> str:
    """What serving loses when these contract parameters are never filled (or these tensors are dropped)."""
    biases = [n for n in names if n.endswith(".bias") and not n.startswith("confidence_head.")]
    weights = [n for n in names if n not in biases]
    parts = [text for prefixes, text in _CONSEQUENCES if any(p.startswith(prefixes) for p in weights)]
    if biases:
        parts.append("trained biases are dropped, so the draft computes something other than what was trained")
    return (", ".join(parts) or "weights are never set") + " and acceptance collapses"


def _listing(names: list[str]) -> str:
    """Every name: a finding never cuts the list (the names are what a publisher has to fix)."""
    return ", ".join(names)


def _state(spec: RuntimeLoader, count: int) -> str:
    state = spec.unfilled_state
    return "at their init values" if state == "at its init value" and count > 1 else state


def findings(result: RuntimeVerdicts) -> list[Finding]:
    """Errors for what this runtime would silently drop or refuse; an info line when it loads cleanly.

    The same codes whether the verdicts come from rules or from running the runtime's loader.
    """
    spec = result.runtime
    where = f"runtime:{spec.name}"
    executed = result.executed is not None
    if result.refusal is not None:
        refusal = result.refusal
        evidence = refusal.get("evidence") or result.evidence(refusal.get("rule"))
        cited = f"[{refusal['source']}" + (f"; {evidence}]" if evidence else "]")
        if refusal["stage"] == "config":
            return [error("RUNTIME_CONFIG_REFUSED", where, f"{spec.title} {'refused' if executed else 'refuses'} "
                          f"the config at parse time, before reading any tensor: {refusal['message']} {cited}",
                          spec.fatal_hint)]
        return [error("RUNTIME_LOAD_FAILS", where, f"{spec.title} {'refused' if executed else 'refuses'} to load "
                      f"the checkpoint: {refusal['message']} {cited}", spec.fatal_hint)]
    ignored = [n for n in result.names("ignored") if n not in result.harmless]
    unfilled = result.unfilled_names("ignored")
    out: list[Finding] = []
    if result.loads and (ignored or unfilled):    # a load that fails drops nothing silently
        verb = "ignored" if executed else "would ignore"      # executed: observed, not predicted
        head = f"{spec.title} {verb} {_listing(ignored)}" if ignored else spec.title
        if unfilled:
            head += (" and" if ignored else "") + f" starts and serves with {_listing(unfilled)} " \
                f"{_state(spec, len(unfilled))}"
        out.append(error("RUNTIME_SILENT_DROP", where, f"{head}: {consequence(unfilled + ignored)}; the server log "
                         "stays healthy", spec.drop_hint))
    if not result.loads:
        raising = result.names("fatal")
        checked = result.unfilled_names("fatal")
        raised = "raised" if executed else "raises"
        parts = ([f"its loader {raised} on {_listing(raising)}"] if raising else []) + \
            ([f"{_listing(checked)} never written, which its start-up check {'refused' if executed else 'refuses'}"]
             if checked else []) + \
            ([f"also never written, which nothing refuses: {_listing(unfilled)}"] if unfilled else [])
        out.append(error("RUNTIME_LOAD_FAILS", where, f"{spec.title} {'refused' if executed else 'refuses'} to "
                         f"start: {'; '.join(parts)}", spec.fatal_hint))
    if not out:
        c = result.counts()
        out.append(info("RUNTIME_LOADS", where, f"{spec.title} loads {plural(c['loaded'], 'tensor')} and skips "
                        f"{c['skipped']} by design"))
    return out


def _serving(spec: RuntimeLoader, result: RuntimeVerdicts, config: Mapping[str, Any], draft: str,
             block_size: int | None) -> Serving:
    """`serving` (the command) for a runtime that starts with the draft; for one the verdicts say refuses
    it, `serving` is null and `serving_withheld` says why (no command is offered that cannot work)."""
    if not result.loads:
        return {"serving": None, "serving_withheld": f"{spec.title} refuses to start with this draft (see its "
                                                     "RUNTIME_* finding); fix that first"}
    return {"serving": spec.serving_parameters(config, draft=draft, block_size=block_size)}


def runtimes_section(tensors: Mapping[str, tuple[tuple[int, ...], str]] | list[str], config: Mapping[str, Any],
                     specs: list[RuntimeLoader], *, draft: str = "DRAFT", block_size: int | None = None,
                     measured: Mapping[str, RuntimeVerdicts] | None = None
                     ) -> tuple[dict[str, RuntimeEntry], list[Finding]]:
    """`sections["runtimes"]` and the findings for the named runtimes' loaders.

    `tensors` maps name -> (shape, dtype) (a list of names is read as names of unknown shape).
    `measured` holds verdicts observed by running a runtime's loader (`execute_vllm.as_verdicts`): those
    runtimes are reported as measured, with the same codes, and compared row by row with the rules
    (`rules_agree`, `disagreements`; a `RUNTIME_RULES_DIFFER` warning when they differ).
    """
    present = tensors if isinstance(tensors, Mapping) else {name: ((), "") for name in tensors}
    section: dict[str, RuntimeEntry] = {}
    out: list[Finding] = []
    for spec in specs:
        result = spec.verdicts(present, config)
        agreement: RuleAgreement = {}
        if measured and spec.name in measured:
            measured[spec.name].adopt_rule_ids(result)
            rows = compare(result, measured[spec.name])
            differ = [row.to_dict() for row in rows if not row.agree]
            agreement = {"rules_agree": not differ, "rows_compared": len(rows), "disagreements": differ}
            if differ:
                measured_by = measured[spec.name].measured_by
                shown = "; ".join(f"{d['name']}: rules {d['rules']}, executed {d['executed']}" for d in differ[:4])
                out.append(warning("RUNTIME_RULES_DIFFER", f"runtime:{spec.name}",
                                   f"{measured_by} did otherwise than dspark-hub's rules on "
                                   f"{plural(len(differ), 'row')}: {shown}" + ("; ..." if len(differ) > 4 else ""),
                                   "the executed verdicts are what this vLLM does; report the difference to "
                                   "dspark-hub"))
            result = measured[spec.name]
        judged: JudgedRuntime = {**result.to_dict(), "supported": True, **agreement,
                                 **_serving(spec, result, config, draft, block_size)}
        section[spec.name] = judged
        out.extend(findings(result))
        out.extend(spec.serving_findings(config, block_size))
    return section, out


def extend_report(report: Report, view: CheckpointView, names: str | list[str], *, block_size: int | None = None,
                  execute: bool = False) -> Report:
    """Add `sections["runtimes"]` (and `sections["family"]`) plus the runtime findings to a verify report.

    The loaders are those of the checkpoint's draft format (`format.registry`); a runtime with no
    loader rules for that format gets a `RUNTIME_NO_RULES` warning instead of verdicts. A folder of
    another draft family, or a config without a roster, gets no runtime verdicts: the family
    finding already says what it is. With `execute`, vLLM's own loader is run on the folder in a
    child process (`execute_vllm.run_isolated`) and its verdicts replace the rules' for vLLM.
    """
    fmt, found = detect(view.config, view.tensors)
    report.sections["family"] = found.to_dict()
    if fmt is None or view.config is None:
        return report
    loaders = loaders_for(fmt)
    wanted = list(RUNTIMES) if names == "all" or names == ["all"] else ([names] if isinstance(names, str) else names)
    present = {n: (tuple(info.shape), info.dtype) for n, (_, info) in view.tensors.items()}
    measured = None
    if execute and "vllm" in loaders and "vllm" in wanted:
        measured = {"vllm": execute_vllm.as_verdicts(execute_vllm.run_isolated(view.location), loaders["vllm"])}
    try:
        section, out = runtimes_section(present, view.config, [loaders[n] for n in loaders if n in wanted],
                                        draft=view.location, block_size=block_size, measured=measured)
    except ContractError:
        return report     # ROSTER_UNDECIDABLE is already reported
    explicit = names not in ("all", ["all"])
    for name in (n for n in wanted if n not in loaders):
        title = RUNTIMES[name].title if name in RUNTIMES else name
        unjudged: UnjudgedRuntime = {"title": title, "supported": False, "verdicts": [], "unfilled": [], "counts": {},
                                     "rules": [], "notes": [f"no {title} loader for {fmt.title} checkpoints is known"],
                                     "serving": None}
        section[name] = unjudged
        if explicit:
            out.append(warning("RUNTIME_NO_RULES", f"runtime:{name}", f"dspark-hub knows no {title} loader for "
                               f"{fmt.title} checkpoints ({methods_text(found.spec)}); nothing was judged",
                               "judge it with a runtime that serves this format"))
    report.sections["runtimes"] = section
    report.findings.extend(out)
    return report
