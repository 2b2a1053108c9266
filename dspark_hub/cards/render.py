"""Model cards rendered from computed facts: weights (header level), evaluation JSON, training log.

`card_facts(ckpt)` reads a checkpoint's headers and config (never tensor data, except to hash
files for the checksum table) and returns `CardFacts`. `render_card(meta, ckpt, eval_json,
train_log)` renders `templates/model_card.md.j2`; same inputs, same bytes.

Card source (`cards/<name>/card.yaml`; relative paths resolve against its folder): the keys are
`dspark_hub.cards.source.CARD_KEYS`, listed in the README (Card source) and checked key by key when
the file is read. Every string outside `front_matter` is itself a jinja template rendered with
`facts` (CardFacts.to_dict()), `config` (the draft config) and `results`, so numbers in prose are
computed, not typed.

Evaluation JSON (`--eval`), as `dspark-hub eval --json` prints it; extra keys are ignored::

    {"acceptance_length": 1.9, "per_position": [0.5, 0.3, ...],      # overall ("all prompts" row)
     "definition": "acceptance length = 1 + sum of per-position rates",
     "by_dataset": {"HumanEval": {"acceptance_length": 4.96, "per_position": [...]}, ...}
                   | [{"dataset": "HumanEval", ...}, ...],
     "long_context": {"benchmark": "LongBench",
                      "rows": [{"subdomain": "Academic", "context_length": 2000,
                                "per_position": [...], "acceptance_length": 3.09}, ...]},
     "prompts": 32, "tokens": 31744, "baseline": {"per_position": [...], "acceptance_length": ...},
     # harness metadata, top level or under "harness":
     "mode": "teacher-forced" | "served" (or "teacher_forced": bool),
     "decoding": "greedy" (or "greedy": bool, "temperature": 0.0), "block_size": 7,
     "teacher": "org/name@rev" | {"repo", "revision"}, "prompts_sha256": "...",
     "chat_template_sha256": "...", "engine": "...", "hardware": "...",
     # what the numbers are (the label under each acceptance table; `cards.results.acceptance_label`):
     "measured_by": {"engine": "vllm", "vllm_version": "0.32.0", "dtype": "float32",
                     "prompts_sha256": "...", "speculative_config": {...}},   # a measurement, or
     "mode": "simulated", "simulation": "what was simulated", "k": 4}          # a simulation

Rates are fractions (percentages above 1 are accepted); a missing `acceptance_length` is
computed as 1 + the sum of the rates.

Training log (`--train-log`): JSON lines, as `finetune` writes them. Plain step lines (`step`,
`loss`, the loss terms, `lr`, `accuracy`, `tokens`) become a paragraph in the training section,
with a setup table from the `training_args.json` beside the log (inputs by Hub id or digest;
a local path an older `finetune` recorded is left out). Lines carrying evaluation results become the
"acceptance length by step" table: `{"step": 5400, "loss": ..., "lr": ..., "eval":
{"acceptance_length": 1.887, "loss": 2.379, ...harness keys...}}` (or top-level
`eval_acceptance_length` / `eval_loss`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from dspark_hub.cards import hub_vocab
from dspark_hub.cards.results import Results, load_eval, load_train_log, load_training_run
from dspark_hub.cards.source import SECTION_DEFAULTS, load_card_source  # noqa: F401  (re-exported)
from dspark_hub.errors import CheckpointFormatError, DsparkError, UsageError
from dspark_hub.format import contract
from dspark_hub.format.checkpoint import CheckpointView, LocalSource, open_checkpoint
from dspark_hub.format.digests import FileDigest, read_digest_file, sha256_file
from dspark_hub.format.jsonio import load_json_object, loads_strict, object_or_raise
from dspark_hub.format.reader import read_header
from dspark_hub.format.registry import K3, DraftFormat
from dspark_hub.format.writer import atomic_file, check_writable
from dspark_hub.schemas import GOLDEN_FIXTURE, command, current
from dspark_hub.verify.family import detect

TEMPLATE = "model_card.md.j2"
#: Files of a checkpoint folder that are not part of the published weights' checksum table.
NOT_CHECKSUMMED = ("README.md",)
#: Order components appear in (data flow), by name prefix.
FLOW_ORDER = ("embed_tokens", "context_proj", "fc", "context_norm", "hidden_norm", "layers", "final_norm", "norm",
              "lm_head", "d2t", "t2d", "markov_head", "confidence_head")
LAYERS_ROW = "decoder layers"
_LAYER = re.compile(r"^layers\.(\d+)\.(.+)$")
_LAST_DIGITS = re.compile(r"^(.*?)(\d+)(\D*)$")
_DTYPE_NAMES = {v: k for k, v in contract.TORCH_DTYPE_NAMES.items()}

FactsSource = Literal["checkpoint", "config", "metadata"]


@dataclass(frozen=True)
class Component:
    """A row of the component table: one tensor, or tensors that differ only by an index."""

    name: str                              # `layers.{0..4}.mlp.up_proj.weight`, `markov_head.markov_w{1,2}.weight`
    shape: tuple[int, ...] | None          # None for the decoder-layer summary row
    count: int = 1                         # tensors the row stands for
    kind: Literal["tensor", "layers"] = "tensor"

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "shape": list(self.shape) if self.shape else None, "count": self.count,
                "kind": self.kind}


@dataclass(frozen=True)
class FileChecksum:
    """One row of the checksum table; `sha256` is None when it was not computed."""

    file: str
    size: int
    sha256: str | None
    origin: Literal["computed", "manifest", "metadata", "none"]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class CardFacts:
    """What a card states about the weights, computed (or, without weights, taken from metadata)."""

    source: FactsSource
    location: str | None = None
    model_type: str | None = None
    format: str | None = None                 # the draft format (`format.registry`), e.g. "speculators_dspark"
    parameters: contract.ParameterCounts | None = None
    tensor_count: int | None = None
    dtype: str | None = None
    components: list[Component] = field(default_factory=list)
    layer_components: list[Component] = field(default_factory=list)
    num_layers: int | None = None
    target_layer_ids: list[int] | None = None
    target_num_hidden_layers: int | None = None
    block_size: int | None = None
    markov_rank: int | None = None
    has_lm_head: bool | None = None
    has_embed_tokens: bool | None = None
    frozen_note: str | None = None            # what the frozen parameters are (the format's words)
    tap_note: str | None = None               # how to read target_layer_ids where they are not layer outputs
    tap_convention: str | None = None         # what a target_layer_ids entry names in this format
    config: dict[str, Any] = field(default_factory=dict)
    checksums: list[FileChecksum] = field(default_factory=list)
    golden: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source, "location": self.location, "model_type": self.model_type, "format": self.format,
            "parameters": self.parameters.to_dict() if self.parameters else None,
            "tensor_count": self.tensor_count, "dtype": self.dtype,
            "components": [c.to_dict() for c in self.components],
            "layer_components": [c.to_dict() for c in self.layer_components],
            "num_layers": self.num_layers, "target_layer_ids": self.target_layer_ids,
            "target_num_hidden_layers": self.target_num_hidden_layers, "block_size": self.block_size,
            "markov_rank": self.markov_rank, "has_lm_head": self.has_lm_head,
            "has_embed_tokens": self.has_embed_tokens, "frozen_note": self.frozen_note, "tap_note": self.tap_note,
            "tap_convention": self.tap_convention, "config": self.config,
            "checksums": [c.to_dict() for c in self.checksums], "golden": self.golden,
        }


# ------------------------------------------------------------------ components

def _index_set(indices: list[int]) -> str:
    """`{0..4}` for a contiguous run, `{0,2,3}` otherwise; a lone index stays bare."""
    if len(indices) == 1:
        return str(indices[0])
    if indices == list(range(indices[0], indices[-1] + 1)):
        return f"{{{indices[0]}..{indices[-1]}}}"
    return "{" + ",".join(map(str, indices)) + "}"


def _flow_rank(name: str) -> tuple[int, str]:
    head = name.split(".", 1)[0]
    return (FLOW_ORDER.index(head) if head in FLOW_ORDER else len(FLOW_ORDER), name)


def group_components(shapes: Mapping[str, tuple[int, ...]]) -> tuple[list[Component], list[Component], int]:
    """Group tensor names into table rows: (top-level rows incl. a decoder-layer row, per-layer rows, layers).

    Per-layer tensors with the same name and shape in every layer become one row
    `layers.{0..4}.<name>`, in the order they first appear in `shapes`; top-level tensors that differ
    only in their last index and share a shape become one row (`markov_head.markov_w{1,2}.weight`).
    """
    per_layer: dict[tuple[str, tuple[int, ...]], list[int]] = defaultdict(list)
    top: dict[tuple[str, str, tuple[int, ...]], list[str]] = defaultdict(list)
    for name, shape in shapes.items():
        layer = _LAYER.match(name)
        if layer:
            per_layer[(layer.group(2), tuple(shape))].append(int(layer.group(1)))
            continue
        parts = _LAST_DIGITS.match(name)
        key = (parts.group(1), parts.group(3), tuple(shape)) if parts else (name, "", tuple(shape))
        top[key].append(parts.group(2) if parts else "")
    rows = []
    for (prefix, suffix, shape), indices in top.items():
        label = prefix + (indices[0] if len(indices) == 1 else "{" + ",".join(sorted(indices, key=int)) + "}") + suffix
        rows.append(Component(label, shape, len(indices)))
    layer_rows = [Component(f"layers.{_index_set(sorted(ix))}.{rest}", shape, len(ix))
                  for (rest, shape), ix in per_layer.items()]
    layers = len({i for ix in per_layer.values() for i in ix})
    if layers:
        rows.append(Component(LAYERS_ROW, None, sum(c.count for c in layer_rows), kind="layers"))
    rows.sort(key=lambda c: _flow_rank("layers" if c.kind == "layers" else c.name.replace(".bias", ".~bias")))
    return rows, layer_rows, layers


def _roster_order(config: Mapping[str, Any], fmt: DraftFormat = K3) -> list[str]:
    try:
        return fmt.layer_order(config)
    except DsparkError:
        return []


def _dtype_text(dtypes: Counter[str]) -> str | None:
    if not dtypes:
        return None
    if len(dtypes) == 1:
        only = next(iter(dtypes))
        return _DTYPE_NAMES.get(only, only)
    return "mixed (" + ", ".join(f"{d} x{n}" for d, n in sorted(dtypes.items())) + ")"


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _facts_from_shapes(source: FactsSource, shapes: Mapping[str, tuple[int, ...]], config: Mapping[str, Any],
                       dtypes: Counter[str]) -> CardFacts:
    """Facts of a roster in whatever draft format the config and names say (`format.registry`; k3_dspark
    when neither says)."""
    fmt = detect(config, shapes)[0] or K3
    # Per-layer rows follow the format's module order, not the alphabetical file order.
    module_order = {f"layers.0.{n.split('.', 2)[2]}": i for i, n in enumerate(_roster_order(config, fmt))}
    ordered = dict(sorted(shapes.items(), key=lambda kv: (module_order.get(_layer0(kv[0]), 1 << 30), kv[0])))
    components, layer_components, layers = group_components(ordered)
    keys = fmt.pairing_keys(config)
    return CardFacts(
        source=source, model_type=config.get("model_type"), format=fmt.name, parameters=fmt.counts(shapes),
        tensor_count=len(shapes), dtype=_dtype_text(dtypes), components=components,
        layer_components=layer_components, num_layers=layers or None,
        target_layer_ids=list(keys.native_taps) if keys.native_taps is not None else None,
        target_num_hidden_layers=_int_or_none(keys.target_layers),
        block_size=fmt.block_size(config), markov_rank=_int_or_none(config.get("markov_rank")),
        has_lm_head=any(n.startswith("lm_head.") for n in shapes),
        has_embed_tokens=any(n.startswith("embed_tokens.") for n in shapes), frozen_note=fmt.frozen_note,
        tap_note=fmt.tap_note, tap_convention=fmt.tap_convention, config=dict(config))


def _layer0(name: str) -> str:
    m = _LAYER.match(name)
    return f"layers.0.{m.group(2)}" if m else name


# ------------------------------------------------------------------ checksums

def _known_digests(path: str | os.PathLike[str]) -> dict[str, FileDigest]:
    """path -> digest from a `--checksums-from` file; a file listed twice must agree with itself."""
    known: dict[str, FileDigest] = {}
    for digest in read_digest_file(path, remedy="pass sha256sum output or a JSON manifest"):
        seen = known.get(digest.path)
        if seen is not None and seen.sha256 != digest.sha256:
            raise UsageError(f"{path}: lists {digest.path!r} twice with different digests; keep the right line")
        known[digest.path] = digest
    return known


def _checksums(view: CheckpointView, manifest: Mapping[str, FileDigest], hash_files: bool,
               progress: Callable[[int], None] | None) -> list[FileChecksum]:
    rows = []
    for name, size in view.files.items():
        if name in NOT_CHECKSUMMED or any(part.startswith(".") for part in name.split("/")):
            continue
        known = manifest.get(name)
        if known is not None and known.size is not None and known.size != size:
            raise UsageError(f"{name}: the checksum manifest says {known.size:,} bytes but the file has {size:,}; "
                             "the manifest describes other files, regenerate it")
        if known is not None and known.sha256:
            rows.append(FileChecksum(name, size, known.sha256, "manifest"))
        elif hash_files:
            rows.append(FileChecksum(name, size, sha256_file(view.local_path(name), progress=progress), "computed"))
        else:
            rows.append(FileChecksum(name, size, None, "none"))
    return rows


# ------------------------------------------------------------------ facts

def card_facts(ckpt: str | os.PathLike[str] | CheckpointView, *, block_size: int | None = None,
               manifest: Mapping[str, FileDigest] | None = None, hash_files: bool = True,
               progress: Callable[[int], None] | None = None) -> CardFacts:
    """Facts a card states about the weights, from a checkpoint folder's headers and config.

    Args:
        ckpt: checkpoint folder (or an opened view).
        block_size: the trained block size from the card metadata; a `block_size` entry in the
            safetensors `__metadata__` takes precedence (block size is not a config key).
        manifest: known digests by path (see `format.digests.read_digest_file`); used instead of hashing.
        hash_files: hash files the manifest does not cover (streamed SHA-256); otherwise leave them blank.
        progress: called with bytes hashed.

    Raises:
        UsageError: the folder has no readable config or weights, or block sizes disagree.
    """
    view = ckpt if isinstance(ckpt, CheckpointView) else open_checkpoint(LocalSource(ckpt))
    if view.config is None or not view.tensors:
        problem = next((f"{f.where}: {f.message}" for f in view.findings if f.severity == "error"),
                       f"{view.location}: no tensors")
        raise UsageError(f"{problem}; run 'dspark-hub verify {view.location}' and fix it before writing a card")
    shapes = {name: info.shape for name, (_, info) in view.tensors.items()}
    floats = set(contract.TORCH_DTYPE_NAMES.values())
    # the dtype of the parameters: integer/boolean vocabulary maps (d2t, t2d) are not parameters
    dtypes = Counter(info.dtype for _, info in view.tensors.values() if info.dtype in floats) or \
        Counter(info.dtype for _, info in view.tensors.values())
    facts = _facts_from_shapes("checkpoint", shapes, view.config, dtypes)
    facts.location = view.location
    facts.block_size = _block_size(view, block_size, facts.block_size)
    facts.checksums = _checksums(view, manifest or {}, hash_files, progress)
    facts.golden = _golden_fixtures(view)
    return facts


def _golden_fixtures(view: CheckpointView) -> list[dict[str, Any]]:
    """Golden-vector fixtures shipped under `golden/` (header metadata only)."""
    out = []
    for name, size in view.files.items():
        if not (name.startswith(contract.GOLDEN_DIR + "/") and name.endswith(".safetensors")):
            continue
        try:
            meta = read_header(view.local_path(name)).metadata or {}
        except CheckpointFormatError:
            continue
        if current(meta.get("schema")) != GOLDEN_FIXTURE:
            continue
        try:
            cases = object_or_raise(loads_strict(meta.get("cases", "{}"), path=name), path=name)
        except CheckpointFormatError:
            continue
        out.append({"file": name, "size": size, "block_size": meta.get("block_size"),
                    "cases": {case: spec.get("context_start") for case, spec in cases.items()}})
    return out


def _block_size(view: CheckpointView, declared: int | None, configured: int | None = None) -> int | None:
    """The trained block size: the weights' `__metadata__` `block_size`, else the config's (a speculators
    config has one; k3_dspark's has not), else the card's; the card may not contradict either."""
    stored = {h.metadata["block_size"] for h in view.headers.values() if h.metadata and "block_size" in h.metadata}
    if not stored:
        if declared is not None and configured is not None and declared != configured:
            raise UsageError(f"card.yaml: architecture.block_size {declared} disagrees with config.json block_size "
                             f"{configured}; fix the card metadata")
        return configured if configured is not None else declared
    value = int(sorted(stored)[0]) if all(str(s).isdigit() for s in stored) else None
    if len(stored) > 1 or value is None:
        raise UsageError(f"{view.location}: safetensors metadata block_size is {sorted(stored)}; store one integer")
    if declared is not None and declared != value:
        raise UsageError(f"card.yaml: architecture.block_size {declared} disagrees with the weights' metadata "
                         f"block_size {value}; fix the card metadata")
    return value


def facts_from_metadata(meta: Mapping[str, Any], base: Path) -> CardFacts:
    """Facts for a card whose weights are not at hand: from `architecture.config` (roster derived
    from the config) or from the explicit `architecture.facts` mapping; checksums from `checksums.files`."""
    architecture = meta.get("architecture") or {}
    config_ref = architecture.get("config")
    explicit = dict(architecture.get("facts") or {})
    if config_ref is not None:
        config = _load_config(config_ref, base)
        specs = (detect(config)[0] or K3).roster(config)
        facts = _facts_from_shapes("config", {n: s.shape for n, s in specs.items()}, config,
                                   Counter(s.dtype for s in specs.values()))
    else:
        facts = CardFacts(source="metadata")
    _apply_explicit(facts, explicit)
    facts.block_size = _int_or_none(architecture.get("block_size")) or facts.block_size
    checksums = (meta.get("checksums") or {}).get("files") or []
    facts.checksums = [FileChecksum(c["file"], int(c["size"]), c.get("sha256"), "metadata") for c in checksums]
    return facts


def _apply_explicit(facts: CardFacts, explicit: dict[str, Any]) -> None:
    params = explicit.pop("parameters", None)
    if isinstance(params, int):
        facts.parameters = contract.ParameterCounts(total=params, frozen=0, trained=params)
    elif isinstance(params, Mapping):
        facts.parameters = contract.ParameterCounts(total=params["total"], frozen=params.get("frozen", 0),
                                                    trained=params.get("trained", params["total"]))
    renames = {"tensors": "tensor_count", "num_hidden_layers": "num_layers"}
    for key, value in explicit.items():
        attr = renames.get(key, key)
        if attr in ("config", "components", "layer_components", "checksums") or not hasattr(facts, attr):
            facts.config[key] = value
        else:
            setattr(facts, attr, value)


def _load_config(ref: Any, base: Path) -> dict[str, Any]:
    if isinstance(ref, Mapping):
        return dict(ref)
    if ref in contract.PROFILES:
        return contract.profile_config(ref)
    path = base / str(ref)
    try:
        return load_json_object(path)
    except CheckpointFormatError as e:
        reason = e.detail
    except OSError as e:      # CheckpointNotFoundError is one
        reason = "no such file" if isinstance(e, FileNotFoundError) else e.strerror or str(e)
    raise UsageError(f"{path}: cannot read the config named by architecture.config ({reason}); "
                     "point it at a config.json or a profile name")


# ------------------------------------------------------------------ card source and front matter

#: Codes of `front_matter_problems`. Append-only: tools match on them.
FRONT_MATTER_CODES: dict[str, str] = {
    "FRONT_MATTER_NOT_MAPPING": "the front matter is not a mapping",
    "METADATA_REJECTED": "huggingface_hub.ModelCardData rejects it",
    "LICENSE_MISSING": "no license",
    "LICENSE_UNKNOWN": "license is not one of the Hub's license ids",
    "LICENSE_UNNAMED": "license: other without license_name",
    "PIPELINE_TAG_UNKNOWN": "pipeline_tag is not a Hub task id",
    "BASE_MODEL_RELATION_UNKNOWN": "base_model_relation is not adapter, merge, quantized or finetune",
    "BASE_MODEL_MISSING": "base_model_relation without base_model",
    "BASE_MODEL_INVALID": "base_model is not a valid repo id",
    "NULL_ITEM": "a list has an empty (null) item",
    "NOT_STRINGS": "tags / datasets / metrics is not a string or a list of strings",
}


@dataclass(frozen=True)
class FrontMatterProblem:
    """A problem in card metadata: the key it concerns, a stable code, severity and message."""

    key: str
    code: str
    severity: Literal["error", "warning"]
    message: str


def front_matter_problems(data: Any) -> list[FrontMatterProblem]:
    """Check card metadata the way the Hub does, offline.

    Uses `huggingface_hub.ModelCardData` (parses `model-index`, eval results) and its repo-id
    validator, plus the Hub's closed vocabularies in `hub_vocab` for license, pipeline tag and
    base-model relation, which `ModelCardData` accepts as any string.
    """
    from huggingface_hub import ModelCardData
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    P = FrontMatterProblem
    if not isinstance(data, dict):
        return [P("front_matter", "FRONT_MATTER_NOT_MAPPING", "error",
                  f"front matter is a YAML {type(data).__name__}, not a mapping")]
    problems: list[FrontMatterProblem] = []
    try:
        ModelCardData(**{k: v for k, v in data.items() if k != "ignore_metadata_errors"})
    except (ValueError, TypeError) as e:
        problems.append(P("model-index", "METADATA_REJECTED", "error", f"huggingface_hub rejects the metadata: {e}"))
    license_id = data.get("license")
    if license_id is None:
        problems.append(P("license", "LICENSE_MISSING", "warning", "no license; the Hub shows the model as unlicensed"))
    elif license_id not in hub_vocab.KNOWN_LICENSES:
        problems.append(P("license", "LICENSE_UNKNOWN", "error", f"license {license_id!r} is not a Hub license id; "
                          "use an id from the Hub's license list (e.g. apache-2.0, mit) or 'other' with license_name"))
    elif license_id == "other" and not data.get("license_name"):
        problems.append(P("license", "LICENSE_UNNAMED", "warning", "license 'other' without license_name; the Hub "
                          "asks for a name (and a LICENSE file or license_link)"))
    tag = data.get("pipeline_tag")
    if tag is not None and tag not in hub_vocab.PIPELINE_TAGS:
        problems.append(P("pipeline_tag", "PIPELINE_TAG_UNKNOWN", "error",
                          f"pipeline_tag {tag!r} is not a Hub task id (e.g. text-generation)"))
    relation = data.get("base_model_relation")
    if relation is not None and relation not in hub_vocab.BASE_MODEL_RELATIONS:
        problems.append(P("base_model_relation", "BASE_MODEL_RELATION_UNKNOWN", "error", f"base_model_relation "
                          f"{relation!r} is not one of {', '.join(sorted(hub_vocab.BASE_MODEL_RELATIONS))}"))
    if relation is not None and not data.get("base_model"):
        problems.append(P("base_model_relation", "BASE_MODEL_MISSING", "error",
                          "base_model_relation without base_model"))
    bases = data.get("base_model")
    for base in ([bases] if isinstance(bases, str) else bases if isinstance(bases, list) else []):
        try:
            validate_repo_id(base)
        except (HFValidationError, TypeError) as e:
            problems.append(P("base_model", "BASE_MODEL_INVALID", "error", f"base_model {base!r} is not a Hub repo id "
                              f"({e})"))
    for key, value in data.items():
        if isinstance(value, list) and any(v is None for v in value):
            problems.append(P(key, "NULL_ITEM", "error", f"{key} lists an empty (null) item; the Hub rejects it"))
        elif key in ("tags", "datasets", "metrics") and value is not None and not (
                isinstance(value, str) or (isinstance(value, list) and all(isinstance(v, str) for v in value))):
            problems.append(P(key, "NOT_STRINGS", "error", f"{key} must be a string or a list of strings"))
    return problems


def front_matter_yaml(data: Mapping[str, Any]) -> str:
    """The front matter body (no `---` lines): Hub keys in a fixed order, lists indented."""
    import yaml

    class _Dumper(yaml.SafeDumper):
        def increase_indent(self, flow: bool = False, indentless: bool = False) -> Any:
            return super().increase_indent(flow, False)

    order = {k: i for i, k in enumerate(hub_vocab.FRONT_MATTER_ORDER)}
    ordered = dict(sorted(data.items(), key=lambda kv: (order.get(kv[0], len(order)), kv[0])))
    return yaml.dump(ordered, Dumper=_Dumper, sort_keys=False, allow_unicode=True, default_flow_style=False,
                     width=1000)


# ------------------------------------------------------------------ rendering

def templates_dir() -> Path:
    """The templates folder: `templates/` of a source checkout, else the installed `dspark_hub.templates`."""
    checkout = Path(__file__).resolve().parents[2] / "templates"
    if (checkout / TEMPLATE).is_file():
        return checkout
    from importlib.resources import files

    return Path(str(files("dspark_hub.templates")))


def _num(value: Any) -> str:
    if value is None:
        return "—"
    return repr(float(value)) if isinstance(value, float) else str(value)


def _cell(value: Any) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


class NotReaderText(ValueError):
    """`{{ expression }}` named an object that has no text a reader expects (it would print as Python)."""

    def __init__(self, value: Any) -> None:
        self.value = value
        super().__init__(f"it prints a {type(value).__name__} as Python text ({_clip(repr(value))}); "
                         f"print {_what_to_print(value)} instead")


def _clip(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _what_to_print(value: Any) -> str:
    if isinstance(value, Mapping):
        return "one of its keys (" + ", ".join(f"`.{k}`" for k in list(value)[:6]) + ")"
    if dataclasses.is_dataclass(value):
        return "one of its fields (" + ", ".join(f"`.{f.name}`" for f in dataclasses.fields(value)) + ")"
    return "one of its fields"


def reader_text(value: Any) -> Any:
    """What `{{ value }}` prints in a card: scalars as they are; `facts.parameters` as the total with
    separators (`136,753`; its fields `.total`, `.trained`, `.frozen`, `.maps` are numbers); a component
    by its name, a checksum row by its file; a list of numbers as `[2, 23, 47]`, any other list as its
    items' texts joined by ", ". Anything else (a mapping, another object) raises `NotReaderText`."""
    import jinja2

    if isinstance(value, jinja2.Undefined):
        return value                            # strict: printing it raises, naming what is undefined
    if isinstance(value, contract.ParameterCounts):
        return f"{value.total:,}"
    if isinstance(value, Component):
        return value.name
    if isinstance(value, FileChecksum):
        return value.file
    if value is None or isinstance(value, (str, int, float)):
        return value
    if isinstance(value, (list, tuple)):
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
            return value
        return ", ".join(str(reader_text(v)) for v in value)
    raise NotReaderText(value)


def environment() -> Any:
    """The jinja2 environment cards render with (strict undefined, trailing newline kept; every
    `{{ }}` goes through `reader_text`, so no Python repr reaches a card)."""
    import jinja2

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(templates_dir())), undefined=jinja2.StrictUndefined,
                             keep_trailing_newline=True, trim_blocks=True, lstrip_blocks=True, autoescape=False,
                             finalize=reader_text)
    env.filters.update(
        thousands=lambda n: f"{n:,}",
        shape=lambda s: " x ".join(map(str, s)) if s else "—",
        num=_num,
        pct=lambda x, d=1: f"{100 * x:.{d}f}%",
        fixed=lambda x, d=2: f"{x:.{d}f}",
        cell=_cell,
        harness=lambda pairs: " · ".join(f"{label}: {value}" for label, value in pairs),
    )
    return env


#: The largest string or list a card source may build with `*`, and the largest exponent of `**`.
MAX_SOURCE_PRODUCT = 100_000
MAX_SOURCE_EXPONENT = 64


def source_environment() -> Any:
    """The sandbox card.yaml strings render in: `environment()`'s settings and filters, but no loader, no
    globals, no `_` attribute, no mutation, and bounded `*` and `**`.

    A card source is someone else's text that runs where the token is; it sees only the context it is
    given (`facts`, `config`, `results`) and the card filters.
    """
    from jinja2.sandbox import ImmutableSandboxedEnvironment, SecurityError

    class CardSourceSandbox(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset(["*", "**"])

        def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
            if operator == "**" and isinstance(right, int) and abs(right) > MAX_SOURCE_EXPONENT:
                raise SecurityError(f"an exponent above {MAX_SOURCE_EXPONENT} is not allowed")
            if operator == "*":
                size = next((len(x) * y for x, y in ((left, right), (right, left))
                             if isinstance(x, (str, list, tuple)) and isinstance(y, int)), 0)
                if size > MAX_SOURCE_PRODUCT:
                    raise SecurityError(f"a product longer than {MAX_SOURCE_PRODUCT:,} is not allowed")
            return super().call_binop(context, operator, left, right)

    ours = environment()
    env = CardSourceSandbox(undefined=ours.undefined, finalize=ours.finalize, autoescape=False,
                            keep_trailing_newline=ours.keep_trailing_newline, trim_blocks=ours.trim_blocks,
                            lstrip_blocks=ours.lstrip_blocks)
    env.filters.update(ours.filters)
    env.globals.clear()        # range, lipsum, cycler, joiner, namespace, dict: a card source needs none
    return env


def _render_strings(value: Any, env: Any, context: Mapping[str, Any], where: str) -> Any:
    """Render every string of the card source as a sandboxed template (facts in prose are computed)."""
    import jinja2
    from jinja2.sandbox import SecurityError

    if isinstance(value, str):
        if "{{" not in value and "{%" not in value:
            return value
        try:
            return env.from_string(value).render(**context)
        except (TypeError, ArithmeticError, AttributeError, LookupError) as e:    # Python under the expression
            raise UsageError(f"card.yaml:{where}: the expression fails ({type(e).__name__}: {e}); "
                             "fix the expression") from None
        except SecurityError as e:
            reason = str(e).rstrip(".")
            raise UsageError(f"card.yaml:{where}: refused by the card-source sandbox ({reason}); a card source may "
                             "use only the documented facts, config and results") from None
        except jinja2.TemplateError as e:
            raise UsageError(f"card.yaml:{where}: {e}; the fact is not known for this card (no checkpoint?) "
                             "or the expression is wrong") from None
        except NotReaderText as e:
            raise UsageError(f"card.yaml:{where}: {e}") from None
    if isinstance(value, dict):
        return {k: _render_strings(v, env, context, f"{where}.{k}" if where else str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [_render_strings(v, env, context, f"{where}[{i}]") for i, v in enumerate(value)]
    return value


def _resolve(base: Path, given: str | os.PathLike[str] | None, declared: Any) -> Path | None:
    if given is not None:
        return Path(given)
    return base / str(declared) if declared else None


def collect_results(meta: Mapping[str, Any], base: Path, eval_json: str | os.PathLike[str] | None,
                    train_log: str | os.PathLike[str] | None) -> Results:
    """Results tables from the eval JSON and training log (arguments win over the card source's paths)."""
    section = meta["results"]
    defaults = section.get("harness") or {}
    eval_path = _resolve(base, eval_json, section.get("eval"))
    results = load_eval(eval_path, defaults=defaults) if eval_path else Results()
    log_path = _resolve(base, train_log, section.get("train_log"))
    if log_path:
        results.by_step, results.by_step_harness, results.by_step_label = load_train_log(log_path, defaults=defaults)
        results.training = load_training_run(log_path)
    return results


def render_card(meta_yaml_path: str | os.PathLike[str], ckpt: str | os.PathLike[str] | CheckpointView | None = None,
                eval_json: str | os.PathLike[str] | None = None, train_log: str | os.PathLike[str] | None = None, *,
                checksums_from: str | os.PathLike[str] | None = None, hash_files: bool = True,
                progress: Callable[[int], None] | None = None) -> str:
    """Render a model card (README.md text). Deterministic: same inputs, same bytes.

    Args:
        meta_yaml_path: the card source (`cards/<name>/card.yaml`).
        ckpt: the checkpoint folder; without it the card metadata carries the architecture facts.
        eval_json: evaluation JSON (default: `results.eval` of the card source).
        train_log: JSON-lines training log (default: `results.train_log`).
        checksums_from: a manifest of known digests, used instead of hashing those files.
        hash_files: hash checkpoint files the manifest does not cover.
        progress: called with bytes hashed.

    Raises:
        UsageError: an input is missing or malformed, or the front matter is invalid.
    """
    meta_path = Path(meta_yaml_path)
    meta = load_card_source(meta_path)
    base = meta_path.parent
    errors = [f"front_matter.{p.key}: {p.message}" for p in front_matter_problems(meta["front_matter"])
              if p.severity == "error"]
    if errors:
        raise UsageError(f"{meta_path}: {errors[0]}; fix the card metadata")
    architecture = meta["architecture"]
    if ckpt is not None:
        manifest = _known_digests(checksums_from) if checksums_from else None
        facts = card_facts(ckpt, block_size=_int_or_none(architecture.get("block_size")), manifest=manifest,
                           hash_files=hash_files, progress=progress)
    else:
        facts = facts_from_metadata(meta, base)
    results = collect_results(meta, base, eval_json, train_log)
    context = {"facts": facts, "config": facts.config, "results": results}
    front_matter = meta["front_matter"]
    card = _render_strings({k: v for k, v in meta.items() if k != "front_matter"}, source_environment(), context, "")
    text = environment().get_template(TEMPLATE).render(card=card, front_matter=front_matter,
                                             front_matter_yaml=front_matter_yaml(front_matter), **context)
    return tidy_markdown(text)


def tidy_markdown(text: str) -> str:
    """One blank line between blocks (outside code fences), no trailing spaces, one final newline.

    Templates compose optional blocks freely; this keeps the output's spacing independent of
    which blocks were present.
    """
    out: list[str] = []
    fenced = False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        if not fenced:
            line = line.rstrip()
            if not line and (not out or not out[-1]):
                continue
        out.append(line)
    while out and not out[-1]:
        out.pop()
    return "\n".join(out) + "\n"


@dataclass(frozen=True)
class CardResult:
    """What `write_card` wrote: the card at `path`, rendered from the checkpoint `checkpoint` (or its metadata)."""

    path: Path
    checkpoint: Path | None
    bytes: int
    lines: int
    sha256: str

    def to_dict(self) -> dict[str, Any]:
        return {"schema": command("card"), "path": str(self.path),
                "input": str(self.checkpoint) if self.checkpoint is not None else None,
                "bytes": self.bytes, "lines": self.lines, "sha256": self.sha256}


def write_card(meta: str | os.PathLike[str], ckpt: str | os.PathLike[str] | None, output: str | os.PathLike[str], *,
               eval_json: str | os.PathLike[str] | None = None, train_log: str | os.PathLike[str] | None = None,
               checksums_from: str | os.PathLike[str] | None = None, hash_files: bool = True, force: bool = False,
               progress: Callable[[int], None] | None = None) -> CardResult:
    """Render a model card (see `render_card`) and write it to `output` atomically.

    Raises:
        RefusedOverwriteError: `output` exists and `force` is False (checked before rendering).
        UsageError: an input is missing or malformed, or the front matter is invalid.
    """
    out = Path(output)
    check_writable(out, force=force)
    text = render_card(meta, ckpt, eval_json, train_log, checksums_from=checksums_from, hash_files=hash_files,
                       progress=progress)
    data = text.encode("utf-8")
    with atomic_file(out, force=force) as handle:
        handle.write(data)
    return CardResult(path=out, checkpoint=Path(ckpt) if ckpt is not None else None, bytes=len(data),
                      lines=text.count("\n"), sha256=hashlib.sha256(data).hexdigest())
