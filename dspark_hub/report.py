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
from typing import Literal, NotRequired, TypedDict, cast

from dspark_hub import schemas

Severity = Literal["error", "warning", "info"]
SEVERITY_RANK = {"error": 0, "warning": 1, "info": 2}
SCHEMA = schemas.command("verify")
#: Section names a report may carry; each is always present in JSON (null when not run).
SECTIONS = ("roster", "deep", "frozen_embed", "runtimes", "family", "pairing", "against_hub", "probe")


# ----------------------------------------------------------------------------- the sections' shapes
# What crosses from verify to the renderers and `--json`: each producer's `to_dict` returns one of these.

class RosterEntry(TypedDict):
    shape: list[int]
    dtype: str


class FileScanDict(TypedDict):
    """One file of `sections["deep"]` (`verify.file_scan.FileScan`)."""

    name: str
    size: int
    sha256: str
    seconds: float


class TensorStatsDict(TypedDict):
    """One tensor of `sections["deep"]` (`verify.tensor_stats.TensorStats`); mean/std/max_abs over finite values."""

    file: str
    dtype: str
    shape: list[int]
    nan: int
    inf: int
    all_zero: bool
    mean: float | None
    std: float | None
    max_abs: float | None


class DeepSection(TypedDict):
    files: list[FileScanDict]
    tensors: dict[str, TensorStatsDict]


class TensorDigestDict(TypedDict):
    """A tensor's bytes as hashed in place (`format.tensorio.TensorDigest`)."""

    location: str
    dtype: str
    shape: list[int]
    bytes: int
    sha256: str


class EmbeddingVerdict(TypedDict):
    """How two embeddings compare (`verify.embedding.EmbeddingComparison`)."""

    target_cast: TensorDigestDict | None
    compared_as: Literal["bytes", "cast"] | None
    identical: bool | None
    verdict: str | None


class FrozenEmbedSection(EmbeddingVerdict):
    """`sections["frozen_embed"]`: the draft's embedding against the teacher's."""

    teacher: str
    draft: TensorDigestDict | None
    teacher_tensor: TensorDigestDict


class FamilySection(TypedDict):
    """`sections["family"]` (`verify.family.Fingerprint`)."""

    family: str
    title: str
    confidence: str
    evidence: list[str]
    methods: dict[str, str | None]
    config_model_type: object          # the config's model_type as written (any JSON value, or null)
    format: str
    speculators_type: str | None


class PairedConfig(TypedDict):
    """The target config's facts a pairing records (values as the config gives them: any JSON, or null)."""

    hidden_size: object
    num_hidden_layers: object
    vocab_size: object
    sha256: str


class PairingDraftKeys(TypedDict):
    """What the draft config says about its target (`format.registry.PairingKeys.to_dict`)."""

    tap_width: int | None
    vocab_size: int | None
    draft_vocab_size: int | None
    target_layers: int | None
    target_layer_ids: list[int] | None          # our convention: entry l = output of target layer l
    native_layer_ids: list[int] | None          # as the config writes them
    native_layer_ids_key: str
    verifier: str | None


class FileSizeDigest(TypedDict):
    size: int
    sha256: str | None


class PairedEmbedding(EmbeddingVerdict):
    draft: TensorDigestDict | None
    target: TensorDigestDict | None


class TokenDict(TypedDict):
    id: int
    content: str
    special: bool | None
    where: str


class PairingSection(TypedDict):
    """`sections["pairing"]` (`verify.pairing`): what the draft was paired with."""

    target: str
    revision: str | None
    revision_source: str | None
    format: str
    draft: PairingDraftKeys
    config: PairedConfig
    files: dict[str, FileSizeDigest]
    embedding: PairedEmbedding | None
    mask_token: TokenDict | None


# `sections["runtimes"]` (`verify.runtimes`): runtime name -> what its loader does with the draft.

#: A runtime loader's verdict on one tensor, or on one parameter no tensor fills (`verify.runtimes.verdicts`).
Verdict = Literal["loaded", "skipped", "ignored", "fatal"]
#: How a loader rule is known: run against the runtime, or read in its code.
Evidence = Literal["executed", "read"]
#: Where a runtime refuses a draft before judging any tensor.
RefusalStage = Literal["config", "load", "after loading"]


class CitedRule(TypedDict):
    """One loader rule and where it comes from (`verify.runtimes.verdicts.Cited`)."""

    id: str | None
    rule: str
    source: str
    evidence: Evidence | None


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


class ComparedRow(TypedDict):
    """One row of the rules against an executed load (`verify.runtimes.verdicts.Row`)."""

    kind: Literal["tensor", "parameter", "refusal"]
    name: str
    rules: str
    executed: str
    agree: bool


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
    rules: list[CitedRule]
    notes: list[str]
    execution: NotRequired[Execution]   # only when the runtime's loader was run (`verify --execute`)


class RuleAgreement(TypedDict, total=False):
    """How the rules compare with an executed load, row by row: all three keys under `verify --execute`, else none."""

    rules_agree: bool
    rows_compared: int
    disagreements: list[ComparedRow]


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
    rules: list[CitedRule]                  # always empty
    notes: list[str]
    serving: None


RuntimeEntry = JudgedRuntime | UnjudgedRuntime


# `sections["against_hub"]` (`verify.against_hub`).

#: How a file differs from its reference (`format.digests.FileProblem`).
ProblemKind = Literal["mismatch", "missing", "extra"]


class FileProblemDict(TypedDict):
    """A file that differs from its reference (`format.digests.FileProblem`); null for a side with no file."""

    path: str
    kind: ProblemKind
    message: str
    expected: str | None
    actual: str | None


class AgainstHubSection(TypedDict):
    """`sections["against_hub"]` (`verify.against_hub.HubComparison`): local files against a Hub revision."""

    location: str
    commit: str
    files_compared: int
    ok: bool
    problems: list[FileProblemDict]


class Sections(TypedDict, total=False):
    """The optional analyses a report carries (absent: not run)."""

    roster: dict[str, RosterEntry] | None
    deep: DeepSection
    frozen_embed: FrozenEmbedSection
    family: FamilySection
    runtimes: dict[str, RuntimeEntry]
    pairing: PairingSection
    against_hub: AgainstHubSection
    probe: dict[str, object]        # `verify --probe`: the probe's document (`train.evaluation.probe.ProbeResult`)


class FindingDict(TypedDict):
    """One finding as `--json` prints it (`Finding.to_dict`)."""

    code: str
    severity: Severity
    where: str
    message: str
    hint: str | None


@dataclass(frozen=True)
class Finding:
    """One problem (or note) found in a checkpoint."""

    code: str
    severity: Severity
    where: str
    message: str
    hint: str | None = None

    def to_dict(self) -> FindingDict:
        return {"code": self.code, "severity": self.severity, "where": self.where,
                "message": self.message, "hint": self.hint}


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


class SummaryDict(TypedDict):
    """`summary` as `--json` prints it (`Summary.to_dict`)."""

    model_type: str | None
    format: str | None
    layout: str | None
    files: list[SummaryFile]
    tensors: int
    parameters: dict[str, int] | None
    bytes: int
    dtypes: dict[str, int]
    metadata: dict[str, str] | None


class ReportDict(TypedDict):
    """The `verify --json` document (`Report.to_dict`): `sections` has every name of SECTIONS (null: not run)."""

    schema: str
    ok: bool
    path: str
    summary: SummaryDict
    findings: list[FindingDict]
    sections: dict[str, object]     # name -> that section's type in `Sections`, or null


@dataclass
class Summary:
    """What the checkpoint holds, as read from its headers and config."""

    model_type: str | None = None
    format: str | None = None           # the draft format verified ("k3_dspark", "speculators_dspark") or None
    layout: str | None = None           # "single", "sharded" or None (no weights)
    files: list[SummaryFile] = field(default_factory=list)
    tensors: int = 0
    parameters: dict[str, int] | None = None   # {"total", "trained", "frozen", "maps"}
    bytes: int = 0                      # sum of weight-file sizes
    dtypes: dict[str, int] = field(default_factory=dict)   # dtype -> tensor count
    metadata: dict[str, str] | None = None

    def to_dict(self) -> SummaryDict:
        return {"model_type": self.model_type, "format": self.format, "layout": self.layout, "files": self.files,
                "tensors": self.tensors, "parameters": self.parameters, "bytes": self.bytes,
                "dtypes": dict(sorted(self.dtypes.items())), "metadata": self.metadata}


@dataclass
class Report(FindingsMixin):
    """The result of `verify`: findings plus a summary and optional sections."""

    path: str
    summary: Summary = field(default_factory=Summary)
    findings: list[Finding] = field(default_factory=list)
    sections: Sections = field(default_factory=lambda: Sections())

    def sorted_findings(self) -> list[Finding]:
        return sorted(self.findings, key=lambda f: (SEVERITY_RANK[f.severity], f.where, f.code))

    def to_dict(self) -> ReportDict:
        return {
            "schema": SCHEMA,
            "ok": self.ok,
            "path": self.path,
            "summary": self.summary.to_dict(),
            "findings": [f.to_dict() for f in self.sorted_findings()],
            "sections": {name: cast(Mapping[str, object], self.sections).get(name) for name in SECTIONS},
        }
