"""`diff A B`: what differs between two checkpoint folders, down to the tensor bytes.

Config keys added, removed and changed; roster differences (tensors added, removed,
renamed, reshaped, recast); and, per tensor present in both with the same shape, whether the
bytes are identical and otherwise the relative L2 change ``||b - a|| / ||a||``. Both
files are read in lockstep in fixed-size chunks, so memory stays bounded; comparing the
chunks directly answers "identical bytes?" exactly as comparing two SHA-256 digests would,
without hashing either side. This is how a
user proves "only the weights differ" and "embed_tokens stayed frozen". A tensor only in A and
one only in B with the same shape, dtype and SHA-256 are one tensor renamed, not a removal and an
addition (only such candidates are hashed).

JSON (schema `dspark-hub/diff/1`; keys are never omitted)::

    {
      "schema": "dspark-hub/diff/1",
      "ok": bool,                  # both sides were read whole (no error in "problems"); exit 1 otherwise
      "a": str, "b": str,
      "identical": bool,           # same config, same roster, every tensor byte-identical
      "weights_only": bool,        # same config, roster and file layout (a drop-in); tensors may differ
      "differs": [str],            # what differs, in this order: "config", "roster", "layout", "metadata",
                                   # "weights" (a common tensor's bytes); [] when identical
      "config": {"added": {key: value}, "removed": {key: value},
                 "changed": {key: {"a": value, "b": value}}},
      "roster": {"added": {name: {"shape", "dtype"}}, "removed": {name: {"shape", "dtype"}},
                 "renamed": {name_in_a: {"to": name_in_b, "shape", "dtype", "sha256"}},
                 "shape": {name: {"a": [int], "b": [int]}}, "dtype": {name: {"a": str, "b": str}}},
      "layout": {"same": bool, "a": {"files": [str], "metadata": {str: str}|null},
                 "b": {"files": [str], "metadata": {str: str}|null}},   # weight files and __metadata__
      "tensors": {name: {"identical": bool, "rel_l2": float|null, "abs_l2": float|null}},   # common, same shape
      "summary": {"compared": int, "identical": int, "changed": int, "renamed": int},
      "problems": [{"side": "a"|"b", "code", "severity", "where", "message", "hint"}]
                                   # errors met while opening A or B (tensors they hide are not compared)
    }

`rel_l2` is null for non-float dtypes and when ``||a|| = 0`` while b differs; `abs_l2` (``||b - a||``)
then still says how much a float tensor changed (a zero-initialised tensor that was trained).
"""

from __future__ import annotations

import math
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from dspark_hub import schemas
from dspark_hub.documents import Document
from dspark_hub.format.checkpoint import CheckpointView, LocalSource, open_checkpoint
from dspark_hub.format.tensorio import (
    TensorLocation,
    decode_float,
    float_dtype_supported,
    iter_elements,
    tensor_digest,
    view_location,
)
from dspark_hub.progress import Progress, announce_total
from dspark_hub.report import Finding

SCHEMA = schemas.command("diff")
#: Elements per lockstep chunk (widened to float64: 8 MiB per side).
CHUNK_ELEMENTS = 1 << 20


@dataclass(frozen=True)
class TensorDelta(Document):
    """How one tensor changed from A to B."""

    identical: bool
    rel_l2: float | None
    #: ||b - a||, the change itself: what says how much a tensor that is zero in A (rel_l2 null) changed
    abs_l2: float | None = None


@dataclass
class DiffReport:
    """The differences between checkpoints `a` and `b` (B relative to A)."""

    a: str
    b: str
    config_added: dict[str, Any] = field(default_factory=dict)
    config_removed: dict[str, Any] = field(default_factory=dict)
    config_changed: dict[str, tuple[Any, Any]] = field(default_factory=dict)
    tensors_added: dict[str, tuple[tuple[int, ...], str]] = field(default_factory=dict)
    tensors_removed: dict[str, tuple[tuple[int, ...], str]] = field(default_factory=dict)
    #: name in A -> (name in B, shape, dtype, sha256): the same bytes under another name
    renamed: dict[str, tuple[str, tuple[int, ...], str, str]] = field(default_factory=dict)
    shape_changed: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = field(default_factory=dict)
    dtype_changed: dict[str, tuple[str, str]] = field(default_factory=dict)
    tensors: dict[str, TensorDelta] = field(default_factory=dict)
    problems: list[tuple[str, Finding]] = field(default_factory=list)   # ("a" | "b", finding)
    layout_a: dict[str, Any] = field(default_factory=dict)
    layout_b: dict[str, Any] = field(default_factory=dict)

    @property
    def same_layout(self) -> bool:
        return self.layout_a == self.layout_b

    @property
    def weights_only(self) -> bool:
        return self.same_layout and not (self.config_differs or self.roster_differs or self.problems)

    @property
    def config_differs(self) -> bool:
        return bool(self.config_added or self.config_removed or self.config_changed)

    @property
    def roster_differs(self) -> bool:
        return bool(self.tensors_added or self.tensors_removed or self.renamed or self.shape_changed
                    or self.dtype_changed)

    @property
    def differs(self) -> list[str]:
        """What differs, coarse to fine: config, roster, layout (weight files), metadata, weights."""
        out = ["config"] if self.config_differs else []
        out += ["roster"] if self.roster_differs else []
        out += ["layout"] if self.layout_a.get("files") != self.layout_b.get("files") else []
        out += ["metadata"] if self.layout_a.get("metadata") != self.layout_b.get("metadata") else []
        return out + (["weights"] if self.changed else [])

    @property
    def changed(self) -> dict[str, TensorDelta]:
        return {name: d for name, d in self.tensors.items() if not d.identical}

    @property
    def identical(self) -> bool:
        return self.weights_only and not self.changed

    @property
    def ok(self) -> bool:
        """Both sides were read whole (no error opening A or B); differing is not a failure."""
        return not any(f.severity == "error" for _, f in self.problems)

    def to_dict(self) -> dict[str, Any]:
        def entry(shape_dtype: tuple[tuple[int, ...], str]) -> dict[str, Any]:
            return {"shape": list(shape_dtype[0]), "dtype": shape_dtype[1]}

        return {
            "schema": SCHEMA, "ok": self.ok, "a": self.a, "b": self.b,
            "identical": self.identical, "weights_only": self.weights_only, "differs": self.differs,
            "config": {"added": self.config_added, "removed": self.config_removed,
                       "changed": {k: {"a": va, "b": vb} for k, (va, vb) in self.config_changed.items()}},
            "roster": {"added": {n: entry(v) for n, v in self.tensors_added.items()},
                       "removed": {n: entry(v) for n, v in self.tensors_removed.items()},
                       "renamed": {n: {"to": to, **entry((shape, dtype)), "sha256": sha}
                                   for n, (to, shape, dtype, sha) in self.renamed.items()},
                       "shape": {n: {"a": list(sa), "b": list(sb)} for n, (sa, sb) in self.shape_changed.items()},
                       "dtype": {n: {"a": da, "b": db} for n, (da, db) in self.dtype_changed.items()}},
            "layout": {"same": self.same_layout, "a": self.layout_a, "b": self.layout_b},
            "tensors": {n: d.to_dict() for n, d in self.tensors.items()},
            "summary": {"compared": len(self.tensors), "identical": len(self.tensors) - len(self.changed),
                        "changed": len(self.changed), "renamed": len(self.renamed)},
            "problems": [{"side": side, **f.to_dict()} for side, f in self.problems],
        }


def diff_configs(a: dict[str, Any],
                 b: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], dict[str, tuple[Any, Any]]]:
    """(added, removed, changed) keys from config `a` to config `b`."""
    added = {k: b[k] for k in b if k not in a}
    removed = {k: a[k] for k in a if k not in b}
    changed = {k: (a[k], b[k]) for k in a if k in b and a[k] != b[k]}
    return added, removed, changed


def compare_tensor(a: TensorLocation, b: TensorLocation, *, progress: Progress | None = None,
                   chunk_elements: int = CHUNK_ELEMENTS) -> TensorDelta:
    """Byte identity and relative L2 change of two same-shape tensors, read in lockstep chunks."""
    import numpy as np

    same_dtype = a.info.dtype == b.info.dtype
    floats = float_dtype_supported(a.info.dtype) and float_dtype_supported(b.info.dtype)
    identical = same_dtype
    norm_a = delta = 0.0
    for piece_a, piece_b in zip(iter_elements(a, chunk_elements), iter_elements(b, chunk_elements), strict=True):
        equal = same_dtype and np.array_equal(np.frombuffer(piece_a, np.uint8), np.frombuffer(piece_b, np.uint8))
        identical = identical and equal
        if progress:
            progress(len(piece_a) + len(piece_b))
        if not floats:
            if not identical:
                break
            continue
        xa = decode_float(piece_a, a.info.dtype).astype(np.float64)
        norm_a += float(np.dot(xa, xa))
        if not equal:
            d = decode_float(piece_b, b.info.dtype).astype(np.float64) - xa
            delta += float(np.dot(d, d))
    if not floats:
        return TensorDelta(identical=identical, rel_l2=None)
    if delta == 0.0:
        return TensorDelta(identical=identical, rel_l2=0.0, abs_l2=0.0)
    change = math.sqrt(delta)
    rel = change / math.sqrt(norm_a) if norm_a > 0 else None
    return TensorDelta(identical=identical, rel_l2=rel if rel is None or math.isfinite(rel) else None,
                       abs_l2=change if math.isfinite(change) else None)


def _layout(view: CheckpointView) -> dict[str, Any]:
    """Weight file names and their safetensors metadata: what a drop-in must keep identical."""
    metas = [h.metadata for h in view.headers.values()]
    return {"files": sorted(view.headers), "metadata": metas[0] if len(set(map(str, metas))) == 1 else None}


def _roster(report: DiffReport, va: CheckpointView, vb: CheckpointView) -> list[str]:
    """Fill the roster differences; return the names whose bytes can be compared."""
    ta = {n: (info.shape, info.dtype) for n, (_, info) in va.tensors.items()}
    tb = {n: (info.shape, info.dtype) for n, (_, info) in vb.tensors.items()}
    report.tensors_added = {n: tb[n] for n in sorted(set(tb) - set(ta))}
    report.tensors_removed = {n: ta[n] for n in sorted(set(ta) - set(tb))}
    comparable = []
    for name in sorted(set(ta) & set(tb)):
        (sa, da), (sb, db) = ta[name], tb[name]
        if sa != sb:
            report.shape_changed[name] = (sa, sb)
            continue
        if da != db:
            report.dtype_changed[name] = (da, db)
        comparable.append(name)
    return comparable


def _find_renames(report: DiffReport, va: CheckpointView, vb: CheckpointView,
                  progress: Progress | None = None) -> None:
    """Pair tensors only in A with tensors only in B of the same shape, dtype and bytes: renames.

    Only tensors whose shape and dtype have a counterpart on the other side are hashed.
    """
    kinds = set(report.tensors_removed.values()) & set(report.tensors_added.values())

    def by_digest(names: dict[str, tuple[tuple[int, ...], str]],
                  view: CheckpointView) -> dict[tuple[tuple[int, ...], str, str], list[str]]:
        out: dict[tuple[tuple[int, ...], str, str], list[str]] = {}
        for name in sorted(n for n, kind in names.items() if kind in kinds):
            digest = tensor_digest(view_location(view, name), progress=progress)
            out.setdefault((*names[name], digest.sha256), []).append(name)
        return out

    if not kinds:
        return
    removed, added = by_digest(report.tensors_removed, va), by_digest(report.tensors_added, vb)
    for key, olds in removed.items():
        for old, new in zip(olds, added.get(key, []), strict=False):
            shape, dtype, sha = key
            report.renamed[old] = (new, shape, dtype, sha)
            del report.tensors_removed[old], report.tensors_added[new]


def rename_candidate_bytes(report: DiffReport, va: CheckpointView, vb: CheckpointView) -> int:
    """Bytes `_find_renames` will hash (a progress total)."""
    kinds = set(report.tensors_removed.values()) & set(report.tensors_added.values())
    return (sum(va.tensors[n][1].nbytes for n, kind in report.tensors_removed.items() if kind in kinds)
            + sum(vb.tensors[n][1].nbytes for n, kind in report.tensors_added.items() if kind in kinds))


def diff(a: str | os.PathLike[str], b: str | os.PathLike[str], progress: Progress | None = None,
         *, workers: int = 2) -> DiffReport:
    """Compare two local checkpoint folders: config, roster, and every common tensor's bytes.

    Args:
        a: the baseline folder.
        b: the folder compared with it.
        progress: called with the number of tensor bytes read (both sides); told the total first.
        workers: tensors compared in parallel.

    Returns:
        A `DiffReport` (B relative to A).

    Raises:
        CheckpointNotFoundError: a folder does not exist.
    """
    va, vb = open_checkpoint(LocalSource(a)), open_checkpoint(LocalSource(b))
    report = DiffReport(a=os.fspath(a), b=os.fspath(b), layout_a=_layout(va), layout_b=_layout(vb))
    report.problems = [(side, f) for side, view in (("a", va), ("b", vb)) for f in view.findings
                       if f.severity == "error"]
    added, removed, changed = diff_configs(va.config or {}, vb.config or {})
    report.config_added, report.config_removed, report.config_changed = added, removed, changed
    names = _roster(report, va, vb)
    announce_total(progress, sum(va.tensors[n][1].nbytes + vb.tensors[n][1].nbytes for n in names)
                   + rename_candidate_bytes(report, va, vb))
    _find_renames(report, va, vb, progress)
    with ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="diff") as pool:
        deltas = pool.map(lambda n: compare_tensor(view_location(va, n), view_location(vb, n), progress=progress),
                          names)
        report.tensors = dict(zip(names, deltas, strict=True))
    return report
