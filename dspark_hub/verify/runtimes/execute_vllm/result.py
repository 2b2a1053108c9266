"""What one execution found (`ExecutedLoad`), and the same as the verdicts `verify --runtime` reports."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, TypedDict, cast

from dspark_hub.documents import Document
from dspark_hub.report import Verdict
from dspark_hub.verify.runtimes.execute_vllm.stubs import WORKER_SETUP
from dspark_hub.verify.runtimes.verdicts import RuntimeLoader, RuntimeVerdicts
from dspark_hub.vllm.pin import PINNED_VERSION

#: What vLLM's loader was seen doing with a tensor.
ExecutedStatus = Literal["consumed", "dropped by design", "silently dropped", "raised"]
#: Executed status -> the verdict `verify --runtime` reports (tensors).
TENSOR_VERDICTS: dict[ExecutedStatus, Verdict] = {"consumed": "loaded", "dropped by design": "skipped",
                                                  "silently dropped": "ignored", "raised": "fatal"}


class ExecutedTensor(TypedDict):
    status: ExecutedStatus
    verdict: Verdict
    detail: str


class WrittenParameter(TypedDict):
    status: Literal["written"]
    verdict: None
    vllm: str                       # vLLM's parameter (and rows, for one shard of a stacked one)


class UnwrittenParameter(TypedDict):
    status: Literal["never written"]
    verdict: Literal["fatal", "ignored"]     # fatal: the strict check raises for it
    vllm: str
    detail: str


ExecutedParameter = WrittenParameter | UnwrittenParameter


class StrictCheck(TypedDict, total=False):
    """What vLLM's strict check did: whether it ran and what it raised for (empty when no load reached it)."""

    ran: bool
    raised_for: list[str]
    error: str
    site: str


class ExecutedRefusal(TypedDict):
    """A refusal vLLM raised before loading any tensor (`load_round`): at config parse, or in `load_weights`."""

    stage: Literal["config", "load"]
    type: str
    message: str
    site: str


@dataclass
class ExecutedLoad(Document):
    """What vLLM's loader did with one draft folder.

    `tensors`: checkpoint name -> an `ExecutedTensor` (status in `TENSOR_VERDICTS`).
    `parameters`: checkpoint-level parameter name -> a `WrittenParameter` or an `UnwrittenParameter` (verdict
    ``fatal`` or ``ignored``; `vllm`: vLLM's parameter and rows); a stacked vLLM parameter appears once
    per shard under the checkpoint name that fills it (`context_kv_proj.weight[shard i]` for the K3
    cross-layer copy of `layers.i.self_attn.kv_a_proj_with_mqa.weight`).
    `outcome`: ``starts``, ``refused at config parse``, ``refused at load`` (a check in the model's
    ``load_weights`` that names no tensor), ``fails at the strict check``, ``fails after loading``.
    """

    KEYS = ("draft", "format", "executed", "vllm_version", "pinned_version", "model_class", "outcome", "refusal",
            "rounds", "tensors", "parameters", "replaced_after_load=replaced", "strict_check", "stubs", "shims",
            "worker_setup", "seconds", "warnings")

    draft: str
    format: str
    vllm_version: str
    model_class: str
    outcome: str
    refusal: ExecutedRefusal | None = None
    tensors: dict[str, ExecutedTensor] = field(default_factory=dict)
    parameters: dict[str, ExecutedParameter] = field(default_factory=dict)
    replaced: dict[str, str] = field(default_factory=dict)
    rounds: int = 0
    strict_check: StrictCheck = field(default_factory=lambda: StrictCheck())
    stubs: dict[str, str] = field(default_factory=dict)
    shims: dict[str, str] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    #: The document says the loader was run, the pin it was built against and how the worker was set up.
    executed: ClassVar[bool] = True
    pinned_version: ClassVar[str] = PINNED_VERSION
    worker_setup: ClassVar[tuple[str, ...]] = tuple(WORKER_SETUP)

    @property
    def starts(self) -> bool:
        return self.outcome == "starts"

    def unfilled(self) -> dict[str, str]:
        """Never-written parameter -> ``fatal`` (the strict check raised for it) or ``ignored``."""
        return {name: p["verdict"] for name, p in self.parameters.items() if p["status"] == "never written"}


    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ExecutedLoad:
        return cls(draft=d["draft"], format=d["format"], vllm_version=d["vllm_version"],
                   model_class=d["model_class"], outcome=d["outcome"], refusal=d.get("refusal"),
                   tensors=dict(d["tensors"]), parameters=dict(d["parameters"]),
                   replaced=dict(d.get("replaced_after_load") or {}), rounds=d.get("rounds", 0),
                   strict_check=cast(StrictCheck, dict(d.get("strict_check") or {})), stubs=dict(d.get("stubs") or {}),
                   shims=dict(d.get("shims") or {}), seconds=dict(d.get("seconds") or {}),
                   warnings=list(d.get("warnings") or []))


def as_verdicts(executed: ExecutedLoad, runtime: RuntimeLoader) -> RuntimeVerdicts:
    """An executed load as the verdicts `verify --runtime` reports (same words, same finding codes).

    `runtime` is the rules' loader spec for the same format (`vllm_rules.VLLM`,
    `speculators_rules.RUNTIMES["vllm"]`): its title, hints and rules go with the result. Every row's
    evidence is ``executed``; the rule ids come from the rules' verdicts for the same checkpoint
    (`RuntimeVerdicts.adopt_rule_ids`, which `report.runtimes_section` applies).
    """
    result = RuntimeVerdicts(runtime=runtime)
    for name, t in executed.tensors.items():
        result.tensors[name] = (t["verdict"], f"{t['status']}: {t['detail']}")
    for name, p in executed.parameters.items():
        if p["status"] == "never written":
            result.unfilled[name] = (p["verdict"], f"never written ({p['vllm']}): {p['detail']}")
    where = f"vLLM {executed.vllm_version}"
    if executed.refusal is not None:
        site = executed.refusal.get("site") or ""
        result.refusal = {"stage": executed.refusal["stage"], "message": executed.refusal["message"],
                          "source": f"{where} {site}".strip(), "evidence": "executed"}
    elif executed.outcome == "fails after loading":
        result.refusal = {"stage": "after loading", "message": executed.strict_check.get("error", ""),
                          "source": f"{where} {executed.strict_check.get('site', '')}".strip(),
                          "evidence": "executed"}
    result.measured_by = f"vLLM {executed.vllm_version}'s own loader, executed on CPU"
    result.executed = {"vllm_version": executed.vllm_version, "model_class": executed.model_class,
                       "outcome": executed.outcome, "rounds": executed.rounds,
                       "replaced_after_load": executed.replaced, "stubs": executed.stubs, "shims": executed.shims,
                       "worker_setup": list(WORKER_SETUP), "warnings": executed.warnings,
                       "seconds": executed.seconds}
    return result
