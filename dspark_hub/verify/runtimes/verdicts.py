"""The vocabulary every runtime loader spec shares: cited rules, serving recipes, per-tensor verdicts.

A runtime's loader, walked over a checkpoint, gives every tensor one verdict and every parameter it
builds that no tensor fills an "unfilled" verdict. The words are the same whether the verdict comes
from rules (`loaders`, `vllm_rules`, `speculators_rules`) or from running vLLM's loader
(`execute_vllm`), which observes the four outcomes on the left:

=====================  ===========  ==================================================================
executed (per tensor)  verdict      meaning
=====================  ===========  ==================================================================
consumed               ``loaded``   it reached a parameter's weight loader (possibly one shard of a
                                    stacked parameter)
dropped by design      ``skipped``  a name rule of the runtime drops it (the target's embedding and
                                    ``lm_head`` are shared; a training-only head; rotary buffers)
silently dropped       ``ignored``  nothing is written and nothing raised
raised                 ``fatal``    the load raises on it: the server does not start
=====================  ===========  ==================================================================

Per parameter the runtime builds: ``written``, or ``never written``, listed in ``unfilled`` as
``fatal`` (a check raises for it: start-up fails) or ``ignored`` (the server starts with it
uninitialised or at its init value). A ``refusal`` is a start-up failure that names no tensor: the
runtime refuses the config at parse time, or its ``load_weights`` refuses the set of names.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, NotRequired, Protocol, TypedDict

from dspark_hub.documents import Document
from dspark_hub.format import contract
from dspark_hub.report import (
    Evidence,
    Execution,
    Finding,
    ParameterVerdictRow,
    RefusalDict,
    RefusalStage,
    RuntimeVerdictsDict,
    ServingCommand,
    TensorVerdictRow,
    Verdict,
)

Policy = Literal["raise", "ignore"]
VERDICTS: tuple[Verdict, ...] = ("loaded", "skipped", "ignored", "fatal")


@dataclass(frozen=True)
class Cited(Document):
    """One loader rule and where it comes from.

    `id` names the rule so a verdict can say which rule decided it; `evidence` says whether the
    behaviour was run against that runtime (`executed`) or only read in its code (`read`); None
    for rules read from public sources without a pinned version.
    """

    KEYS = ("id", "rule", "source", "evidence")

    rule: str
    source: str
    evidence: Evidence | None = None
    id: str | None = None


@dataclass(frozen=True)
class ServingRecipe:
    """How to start the runtime with the draft: a command template and where its flags come from."""

    method: str
    template: str          # {target} {draft} {n} placeholders
    source: str
    note: str = ""


def by_id(rules: Iterable[Cited]) -> dict[str, Cited]:
    """A loader's rules keyed by id (every rule of a loader spec has one)."""
    return {r.id: r for r in rules if r.id is not None}


class RuntimeLoader(Protocol):
    """A runtime's loader as `report.runtimes_section` walks it (`loaders.RuntimeSpec`, `vllm_rules.VllmK3Loader`,
    `speculators_rules.SpeculatorsLoader`)."""

    @property
    def name(self) -> str: ...
    @property
    def title(self) -> str: ...
    @property
    def rules(self) -> tuple[Cited, ...]: ...
    @property
    def notes(self) -> tuple[str, ...]: ...
    @property
    def drop_hint(self) -> str: ...
    @property
    def fatal_hint(self) -> str: ...
    @property
    def unfilled_state(self) -> str:
        """How a never-written parameter is left: "uninitialised", "at its init value"."""

    def verdicts(self, tensors: Mapping[str, tuple[tuple[int, ...], str]],
                 config: Mapping[str, Any]) -> RuntimeVerdicts:
        """What the loader does with every tensor (name -> (shape, dtype)) of a checkpoint."""

    def serving_parameters(self, config: Mapping[str, Any], *, draft: str = "DRAFT",
                           block_size: int | None = None) -> ServingCommand:
        """The serving command the config implies (`sections["runtimes"][name]["serving"]`)."""

    def serving_findings(self, config: Mapping[str, Any], block_size: int | None) -> list[Finding]:
        """Findings about how the draft must be served."""


class Refusal(TypedDict):
    """A start-up failure that names no tensor: where it happens, what the runtime says, and why we know.

    `rule` is the id of the rule that predicts it (absent for an executed refusal no rule predicts);
    `evidence` is set when the refusal was observed (``executed``), else the rule's evidence applies.
    """

    stage: RefusalStage
    message: str
    source: str
    rule: NotRequired[str]
    evidence: NotRequired[Evidence]


@dataclass
class RuntimeVerdicts:
    """What one runtime does with every tensor of a checkpoint.

    `runtime` is the loader spec (a `RuntimeLoader`); `decided_by` / `unfilled_by` name the rule id
    behind a tensor's / a parameter's verdict, where the loader's rules have ids.
    `refusal` (a `Refusal`) is a start-up failure that names no tensor; with one, no tensor is judged.
    `executed` holds what an executed run adds (`execute_vllm.as_verdicts`: version, stubs, rounds) and
    `measured_by` what measured it; None and ``rules`` for verdicts from rules.

    Every row's `evidence` (`to_dict`) says how its verdict is known: ``executed`` when it was observed by
    running the runtime's loader on this checkpoint (`executed` set), else the evidence of the rule that
    decided it (``executed``: the rule was run against that runtime; ``read``: read in its code; None when
    no rule id decided it). An executed row keeps the rule id the rules gave it (`adopt_rule_ids`).
    """

    runtime: RuntimeLoader
    tensors: dict[str, tuple[Verdict, str]] = field(default_factory=dict)     # name -> (verdict, detail)
    unfilled: dict[str, tuple[Verdict, str]] = field(default_factory=dict)    # parameter -> (verdict, detail)
    harmless: set[str] = field(default_factory=set)    # ignored names whose bare form is skipped by design
    decided_by: dict[str, str] = field(default_factory=dict)   # tensor -> rule id
    unfilled_by: dict[str, str] = field(default_factory=dict)  # unfilled parameter -> rule id
    refusal: Refusal | None = None
    executed: Execution | None = None
    measured_by: str = "rules"

    def names(self, verdict: Verdict) -> list[str]:
        return [n for n, (v, _) in self.tensors.items() if v == verdict]

    def unfilled_names(self, verdict: Verdict) -> list[str]:
        return [n for n, (v, _) in self.unfilled.items() if v == verdict]

    @property
    def loads(self) -> bool:
        return self.refusal is None and not self.names("fatal") and not self.unfilled_names("fatal")

    def counts(self) -> dict[Verdict, int]:
        out: dict[Verdict, int] = {v: 0 for v in VERDICTS}
        for v, _ in self.tensors.values():
            out[v] += 1
        return out

    def evidence(self, rule_id: str | None) -> Evidence | None:
        """How a row decided by `rule_id` is known (see the class docstring)."""
        if self.executed is not None:
            return "executed"
        rule = by_id(self.runtime.rules).get(rule_id) if rule_id is not None else None
        return rule.evidence if rule is not None else None

    def adopt_rule_ids(self, rules: RuntimeVerdicts) -> None:
        """Name, on each executed row, the rule that decided the same row in `rules` (the rule whose verdict
        was expected, where the two differ); a row the rules do not have keeps None."""
        self.decided_by = {n: rules.decided_by[n] for n in self.tensors if n in rules.decided_by}
        self.unfilled_by = {n: rules.unfilled_by[n] for n in self.unfilled if n in rules.unfilled_by}
        if self.refusal is not None:
            refusal = self.refusal.copy()
            refusal.pop("rule", None)
            rule = rules.refusal.get("rule") if rules.refusal is not None else None
            if rule:
                refusal["rule"] = rule
            self.refusal = refusal

    def _tensor_row(self, name: str, verdict: Verdict, detail: str) -> TensorVerdictRow:
        rule = self.decided_by.get(name)
        return {"tensor": name, "verdict": verdict, "detail": detail, "rule": rule, "evidence": self.evidence(rule)}

    def _parameter_row(self, name: str, verdict: Verdict, detail: str) -> ParameterVerdictRow:
        rule = self.unfilled_by.get(name)
        return {"parameter": name, "verdict": verdict, "detail": detail, "rule": rule,
                "evidence": self.evidence(rule)}

    def _refusal_dict(self) -> RefusalDict | None:
        if self.refusal is None:
            return None
        rule = self.refusal.get("rule")
        return {"rule": rule, "stage": self.refusal["stage"], "message": self.refusal["message"],
                "source": self.refusal["source"], "evidence": self.refusal.get("evidence") or self.evidence(rule)}

    def to_dict(self) -> RuntimeVerdictsDict:
        doc: RuntimeVerdictsDict = {
            "title": self.runtime.title,
            "verdicts": [self._tensor_row(n, v, d) for n, (v, d) in self.tensors.items()],
            "unfilled": [self._parameter_row(n, v, d) for n, (v, d) in self.unfilled.items()],
            "refusal": self._refusal_dict(),
            "counts": self.counts(),
            "executed": self.executed is not None,
            "measured_by": self.measured_by,
            "rules": [r.to_dict() for r in self.runtime.rules],
            "notes": list(self.runtime.notes)}
        if self.executed is not None:
            doc["execution"] = self.executed.copy()
        return doc


def draft_id(draft: str) -> str:
    """What a runtime accepts for the draft: a Hub repo id (runtimes do not know our hf:// URLs) or a path."""
    if draft.startswith("hf://"):
        return draft[len("hf://"):].split("@", 1)[0]
    return draft


def recipe_parameters(config: Mapping[str, Any], recipe: ServingRecipe, *, draft: str = "DRAFT",
                      target: str = "TARGET", block_size: int | None = None) -> ServingCommand:
    """The serving parameters a k3_dspark config implies under `recipe`, as a ready-to-paste command fragment.

    Args:
        config: the draft's config.
        recipe: the runtime's serving recipe.
        draft: the draft's path or repo id to put in the command.
        target: the target's path or repo id.
        block_size: draft tokens per block; not a config key (default: the reference's 7).
    """
    n = block_size if block_size is not None else contract.REFERENCE_BLOCK_SIZE
    model_id = draft_id(draft)
    vllm_spec = shlex.quote(json.dumps({"method": recipe.method, "model": model_id, "num_speculative_tokens": n}))
    return {
        "method": recipe.method,
        "num_speculative_tokens": n,
        "block_size_source": "`block_size` as given" if block_size is not None else
        f"default: the reference draft's {contract.REFERENCE_BLOCK_SIZE} (block_size is not a config key)",
        "target_layer_ids": config.get("target_layer_ids"),
        "target_layer_ids_source": "read from config.json target_layer_ids by every runtime (0-based, output of "
                                   "each target layer); no command-line flag",
        "command": recipe.template.format(target=target, draft=shlex.quote(model_id), n=n, n1=n + 1,
                                          vllm_spec=vllm_spec),
        "alternatives": [],
        "source": recipe.source,
        "note": recipe.note or None,
    }


@dataclass(frozen=True)
class Row(Document):
    """One compared row: a tensor's verdict, a parameter's fate (`written` or its unfilled verdict), or a refusal."""

    KEYS = ("kind", "name", "rules", "executed", "agree")

    kind: Literal["tensor", "parameter", "refusal"]
    name: str
    rules: str
    executed: str

    @property
    def agree(self) -> bool:
        return self.rules == self.executed


def _refusal_text(refusal: Refusal | None) -> str:
    return "none" if refusal is None else f"refused at {refusal['stage']}: {refusal['message']}"


def compare(rules: RuntimeVerdicts, executed: RuntimeVerdicts) -> list[Row]:
    """Every row of two verdict sets for the same checkpoint: the refusal, each tensor, each parameter.

    A parameter neither side lists as unfilled is `written` on both and is not a row. With a refusal on
    either side only the refusal row is compared (no tensor was judged).
    """
    rows = [Row("refusal", "start-up", _refusal_text(rules.refusal), _refusal_text(executed.refusal))]
    if rules.refusal is not None or executed.refusal is not None:
        return rows
    for name in sorted(set(rules.tensors) | set(executed.tensors)):
        rows.append(Row("tensor", name, rules.tensors.get(name, ("absent", ""))[0],
                        executed.tensors.get(name, ("absent", ""))[0]))
    for name in sorted(set(rules.unfilled) | set(executed.unfilled)):
        rows.append(Row("parameter", name, rules.unfilled.get(name, ("written", ""))[0],
                        executed.unfilled.get(name, ("written", ""))[0]))
    return rows
