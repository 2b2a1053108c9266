"""What a card states about the weights: `card_facts(ckpt)` reads a checkpoint's headers and config (never
tensor data, except to hash files for the checksum table); `facts_from_metadata` takes them from the card
source when there is no checkpoint.
"""

from __future__ import annotations

import os
import re
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from dspark_hub.documents import Document
from dspark_hub.errors import CheckpointFormatError, DsparkError, UsageError
from dspark_hub.format import contract
from dspark_hub.format.checkpoint import CheckpointView, LocalSource, open_checkpoint
from dspark_hub.format.digests import FileDigest, read_digest_file, sha256_file
from dspark_hub.format.jsonio import load_json_object, loads_strict, object_or_raise
from dspark_hub.format.reader import read_header
from dspark_hub.format.registry import K3, DraftFormat
from dspark_hub.schemas import GOLDEN_FIXTURE, current
from dspark_hub.verify.family import detect

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
class Component(Document):
    """A row of the component table: one tensor, or tensors that differ only by an index."""

    KEYS = ("name", "shape=listed_shape", "count", "kind")

    name: str                              # `layers.{0..4}.mlp.up_proj.weight`, `markov_head.markov_w{1,2}.weight`
    shape: tuple[int, ...] | None          # None for the decoder-layer summary row
    count: int = 1                         # tensors the row stands for
    kind: Literal["tensor", "layers"] = "tensor"

    @property
    def listed_shape(self) -> tuple[int, ...] | None:
        """The shape, None for the summary row (and a shape with no dimension)."""
        return self.shape or None


@dataclass(frozen=True)
class FileChecksum(Document):
    """One row of the checksum table; `sha256` is None when it was not computed."""

    file: str
    size: int
    sha256: str | None
    origin: Literal["computed", "manifest", "metadata", "none"]


@dataclass
class CardFacts(Document):
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


def int_or_none(value: Any) -> int | None:
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
        target_num_hidden_layers=int_or_none(keys.target_layers),
        block_size=fmt.block_size(config), markov_rank=int_or_none(config.get("markov_rank")),
        has_lm_head=any(n.startswith("lm_head.") for n in shapes),
        has_embed_tokens=any(n.startswith("embed_tokens.") for n in shapes), frozen_note=fmt.frozen_note,
        tap_note=fmt.tap_note, tap_convention=fmt.tap_convention, config=dict(config))


def _layer0(name: str) -> str:
    m = _LAYER.match(name)
    return f"layers.0.{m.group(2)}" if m else name


# ------------------------------------------------------------------ checksums

def known_digests(path: str | os.PathLike[str]) -> dict[str, FileDigest]:
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
                    "cases": {case: spec.get("context_start") if isinstance(spec, dict) else None
                              for case, spec in cases.items()}})
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
    facts.block_size = int_or_none(architecture.get("block_size")) or facts.block_size
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
