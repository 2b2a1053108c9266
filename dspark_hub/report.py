"""Findings and the verify report: the data every check returns and `--json` prints.

Schema `dspark-hub/verify/1` (stable; keys are never omitted, absent sections are null):

    {
      "schema": "dspark-hub/verify/1",
      "ok": bool,                       # no finding of severity "error"
      "path": str,                      # folder or hf://org/name@rev as given
      "summary": {...},                 # see Summary.to_dict
      "findings": [{"code", "severity", "where", "message", "hint"}],
      "sections": {name: object|null}   # optional analyses (roster, deep, runtimes, pairing, ...)
    }

`sections.roster` is the roster the config implies, `{name: {"shape": [int], "dtype": str}}`
(null when the config cannot give one, or the folder is another model family).

Findings are sorted errors first, then by where and code, so output diffs stay stable.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated, Literal, NotRequired, TypedDict, cast

from dspark_hub import schemas
from dspark_hub.documents import JSON, Document, Of

Severity = Literal["error", "warning", "info"]
SEVERITY_RANK = {"error": 0, "warning": 1, "info": 2}
SCHEMA = schemas.command("verify")
#: Section names a report may carry; each is always present in JSON (null when not run).
SECTIONS = ("roster", "deep", "frozen_embed", "runtimes", "family", "pairing", "against_hub", "probe")


# The documents of results declared in the areas above (`documents.Of`: by path, so nothing is imported).
FileScanDocument = Annotated[JSON, Of("dspark_hub.verify.file_scan.FileScan")]
TensorStatsDocument = Annotated[JSON, Of("dspark_hub.verify.tensor_stats.TensorStats")]
TensorDigestDocument = Annotated[JSON, Of("dspark_hub.format.tensorio.TensorDigest")]
FingerprintDocument = Annotated[JSON, Of("dspark_hub.verify.family.Fingerprint")]
PairingKeysDocument = Annotated[JSON, Of("dspark_hub.format.registry.PairingKeys")]
TokenInfoDocument = Annotated[JSON, Of("dspark_hub.verify.pairing.TokenInfo")]
CitedDocument = Annotated[JSON, Of("dspark_hub.verify.runtimes.verdicts.Cited")]
RowDocument = Annotated[JSON, Of("dspark_hub.verify.runtimes.verdicts.Row")]
FileProblemDocument = Annotated[JSON, Of("dspark_hub.format.digests.FileProblem")]
HubComparisonDocument = Annotated[JSON, Of("dspark_hub.verify.against_hub.HubComparison")]
ProbeDocument = Annotated[JSON, Of("dspark_hub.train.evaluation.probe.ProbeResult")]


# ----------------------------------------------------------------------------- the sections' shapes
# What crosses from verify to the renderers and `--json`: each producer's `to_dict` returns one of these.

class RosterEntry(TypedDict):
    shape: list[int]
    dtype: str


class DeepSection(TypedDict):
    files: list[FileScanDocument]
    tensors: dict[str, TensorStatsDocument]


class EmbeddingVerdict(TypedDict):
    """How two embeddings compare (`verify.embedding.EmbeddingComparison`)."""

    target_cast: TensorDigestDocument | None
    compared_as: Literal["bytes", "cast"] | None
    identical: bool | None
    verdict: str | None


class FrozenEmbedSection(EmbeddingVerdict):
    """`sections["frozen_embed"]`: the draft's embedding against the teacher's."""

    teacher: str
    draft: TensorDigestDocument | None
    teacher_tensor: TensorDigestDocument


class PairedConfig(TypedDict):
    """The target config's facts a pairing records (values as the config gives them: any JSON, or null)."""

    hidden_size: object
    num_hidden_layers: object
    vocab_size: object
    sha256: str


class FileSizeDigest(TypedDict):
    size: int
    sha256: str | None


class PairedEmbedding(EmbeddingVerdict):
    draft: TensorDigestDocument | None
    target: TensorDigestDocument | None


class PairingSection(TypedDict):
    """`sections["pairing"]` (`verify.pairing`): what the draft was paired with."""

    target: str
    revision: str | None
    revision_source: str | None
    format: str
    draft: PairingKeysDocument
    config: PairedConfig
    files: dict[str, FileSizeDigest]
    embedding: PairedEmbedding | None
    mask_token: TokenInfoDocument | None


# `sections["runtimes"]` (`verify.runtimes`): runtime name -> what its loader does with the draft.

#: A runtime loader's verdict on one tensor, or on one parameter no tensor fills (`verify.runtimes.verdicts`).
Verdict = Literal["loaded", "skipped", "ignored", "fatal"]
#: How a loader rule is known: run against the runtime, or read in its code.
Evidence = Literal["executed", "read"]
#: Where a runtime refuses a draft before judging any tensor.
RefusalStage = Literal["config", "load", "after loading"]


class VerdictFields(TypedDict):
    """A row's verdict, why, the id of the rule that decided it and how that is known."""

    verdict: Verdict
    detail: str
    rule: str | None
    evidence: Evidence | None


class TensorVerdictRow(VerdictFields):
    """What the loader does with one tensor of the checkpoint."""

    tensor: str


class ParameterVerdictRow(VerdictFields):
    """A parameter the runtime builds that no tensor fills (`fatal` or `ignored`)."""

    parameter: str


class RefusalDict(TypedDict):
    """A start-up failure that names no tensor (`verify.runtimes.verdicts.Refusal` as reported)."""

    rule: str | None
    stage: RefusalStage
    message: str
    source: str
    evidence: Evidence | None


class Execution(TypedDict):
    """What running vLLM's own loader adds (`verify.runtimes.execute_vllm.as_verdicts`)."""

    vllm_version: str
    model_class: str
    outcome: str
    rounds: int
    replaced_after_load: dict[str, str]
    stubs: dict[str, str]
    shims: dict[str, str]
    worker_setup: list[str]
    warnings: list[str]
    seconds: dict[str, float]


class ServingCommand(TypedDict):
    """How to start the runtime with the draft (`verdicts.recipe_parameters`, `speculators_rules`)."""

    method: str
    num_speculative_tokens: int | None
    block_size_source: str
    target_layer_ids: object           # the config's value as written (not validated here: any JSON)
    target_layer_ids_source: str
    verifier: NotRequired[str]         # speculators DSpark only: the target model the command serves
    command: str
    alternatives: list[str]
    source: str
    note: str | None


class RuntimeVerdictsDict(TypedDict):
    """Every verdict of one runtime (`verify.runtimes.verdicts.RuntimeVerdicts.to_dict`)."""

    title: str
    verdicts: list[TensorVerdictRow]
    unfilled: list[ParameterVerdictRow]
    refusal: RefusalDict | None
    counts: dict[Verdict, int]
    executed: bool
    measured_by: str
    rules: list[CitedDocument]
    notes: list[str]
    execution: NotRequired[Execution]   # only when the runtime's loader was run (`verify --execute`)


class RuleAgreement(TypedDict, total=False):
    """How the rules compare with an executed load, row by row: all three keys under `verify --execute`, else none."""

    rules_agree: bool
    rows_compared: int
    disagreements: list[RowDocument]


class Serving(TypedDict):
    """`serving` is null for a runtime the verdicts say refuses the draft; `serving_withheld` then says why."""

    serving: ServingCommand | None
    serving_withheld: NotRequired[str]


class JudgedRuntime(RuntimeVerdictsDict, RuleAgreement, Serving):
    """A runtime with loader rules for the checkpoint's format (`verify.runtimes.report.runtimes_section`)."""

    supported: Literal[True]


class UnjudgedRuntime(TypedDict):
    """A runtime with no loader rules for the checkpoint's format: nothing judged, no command (`extend_report`)."""

    title: str
    supported: Literal[False]
    verdicts: list[TensorVerdictRow]        # always empty
    unfilled: list[ParameterVerdictRow]     # always empty
    counts: dict[Verdict, int]              # always empty
    rules: list[CitedDocument]                  # always empty
    notes: list[str]
    serving: None


RuntimeEntry = JudgedRuntime | UnjudgedRuntime


# `sections["against_hub"]` (`verify.against_hub`).

#: How a file differs from its reference (`format.digests.FileProblem`).
ProblemKind = Literal["mismatch", "missing", "extra"]


class Sections(TypedDict, total=False):
    """The optional analyses a report carries (absent: not run)."""

    roster: dict[str, RosterEntry] | None
    deep: DeepSection
    frozen_embed: FrozenEmbedSection
    family: FingerprintDocument
    runtimes: dict[str, RuntimeEntry]
    pairing: PairingSection
    against_hub: HubComparisonDocument
    probe: ProbeDocument


@dataclass(frozen=True)
class Finding(Document):
    """One problem (or note) found in a checkpoint; its document is one entry of `findings`."""

    code: str
    severity: Severity
    where: str
    message: str
    hint: str | None = None


def error(code: str, where: str, message: str, hint: str | None = None) -> Finding:
    return Finding(code, "error", where, message, hint)


def warning(code: str, where: str, message: str, hint: str | None = None) -> Finding:
    return Finding(code, "warning", where, message, hint)


def info(code: str, where: str, message: str, hint: str | None = None) -> Finding:
    return Finding(code, "info", where, message, hint)


class FindingsMixin:
    """`ok`, `errors` and `codes()` for any result that carries `findings`."""

    findings: list[Finding]

    @property
    def ok(self) -> bool:
        return not any(f.severity == "error" for f in self.findings)

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "error"]

    def codes(self) -> set[str]:
        return {f.code for f in self.findings}


class SummaryFile(TypedDict):
    name: str
    size: int


@dataclass
class Summary(Document):
    """What the checkpoint holds, as read from its headers and config (`summary` in `--json`)."""

    KEYS = ("model_type", "format", "layout", "files", "tensors", "parameters", "bytes", "dtypes=sorted_dtypes",
            "metadata")

    model_type: str | None = None
    format: str | None = None           # the draft format verified ("k3_dspark", "speculators_dspark") or None
    layout: str | None = None           # "single", "sharded" or None (no weights)
    files: list[SummaryFile] = field(default_factory=list)
    tensors: int = 0
    parameters: dict[str, int] | None = None   # {"total", "trained", "frozen", "maps"}
    bytes: int = 0                      # sum of weight-file sizes
    dtypes: dict[str, int] = field(default_factory=dict)   # dtype -> tensor count
    metadata: dict[str, str] | None = None

    @property
    def sorted_dtypes(self) -> dict[str, int]:
        return dict(sorted(self.dtypes.items()))


@dataclass
class Report(Document, FindingsMixin):
    """The result of `verify`: findings plus a summary and optional sections; its document is `verify --json`,
    whose `sections` has every name of SECTIONS (null: not run)."""

    SCHEMA = SCHEMA
    KEYS = ("ok", "path", "summary", "findings=sorted_findings", "sections=all_sections")

    path: str
    summary: Summary = field(default_factory=Summary)
    findings: list[Finding] = field(default_factory=list)
    sections: Sections = field(default_factory=lambda: Sections())

    def sorted_findings(self) -> list[Finding]:
        return sorted(self.findings, key=lambda f: (SEVERITY_RANK[f.severity], f.where, f.code))

    @property
    def all_sections(self) -> dict[str, object]:
        """Every section name of SECTIONS, in order: its value, or null when it was not run."""
        return {name: cast(Mapping[str, object], self.sections).get(name) for name in SECTIONS}
