"""`verify --deep` and `--frozen-embed`: the byte-level half of verification.

One streaming pass per weight file (`verify.file_scan`) computes the file's SHA-256 and, per tensor
(`verify.tensor_stats`), the count of NaN and inf values, whether it is all zeros, and its mean, std
and max |x|. This module turns the scans into findings and report sections, and compares the draft's
frozen embedding with the target's.

On two idle cores the scan runs beside the hash and `--deep` takes about as long as hashing
alone; when other processes keep every core busy, the wall time tends to the CPU-time ratio
(the scan costs about a third of the hash). `bench/bench_deep.py` measures both.

`sections["deep"]` (JSON)::

    {
      "files": [{"name": str, "size": int, "sha256": str, "seconds": float}],
      "tensors": {                       # every tensor of every scanned file, sorted by name
        name: {"file": str, "dtype": str, "shape": [int], "nan": int, "inf": int,
               "all_zero": bool,
               "mean": float|null, "std": float|null, "max_abs": float|null}
      }                                  # mean/std/max_abs: over finite values, float dtypes only
    }

`sections["frozen_embed"]` (JSON)::

    {
      "target": str,                    # the TARGET argument as given
      "draft": {"location", "dtype", "shape", "bytes", "sha256"}|null,
      "target_tensor": {"location", "dtype", "shape", "bytes", "sha256"},   # as stored
      "target_cast": {...}|null,         # the target's values cast to the draft's dtype (when they differ)
      "compared_as": "bytes"|"cast"|null,  # bytes: same dtype; cast: exact round-to-nearest-even of the target
      "identical": bool|null,            # null when the draft has no embed_tokens.weight
      "verdict": str|null                # "bit-identical", "identical after BF16 rounding (nearest even) of
    }                                    # the F32 target", or "different"

Findings: `TENSOR_NAN`, `TENSOR_INF`, `TENSOR_ALL_ZERO` (a weight matrix, ndim >= 2; a zero bias
or norm is not an error) and `FROZEN_EMBED_MISMATCH`, all errors naming the tensor.
"""


import math
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from dspark_hub._compat import renamed_keywords
from dspark_hub.errors import UsageError, about
from dspark_hub.format import contract
from dspark_hub.format.checkpoint import CheckpointView, LocalSource
from dspark_hub.format.reader import TensorInfo
from dspark_hub.format.tensorio import (
    CastDigest,
    TensorDigest,
    TensorLocation,
    locate_tensor,
    location_digest,
    tensor_digest,
    view_location,
)
from dspark_hub.progress import Progress, announce_total
from dspark_hub.report import DeepSection, Finding, FrozenEmbedSection, Report, error
from dspark_hub.verify.embedding import EmbeddingComparison, compare_embeddings
from dspark_hub.verify.file_scan import FileScan, scan_files


def tensor_findings(scans: list[FileScan]) -> list[Finding]:
    """Errors for non-finite values and all-zero weight matrices."""
    out: list[Finding] = []
    for scan in scans:
        for s in scan.tensors:
            if s.nan:
                out.append(error("TENSOR_NAN", s.name, f"holds {s.nan:,} NaN value(s) ({scan.name}); every output "
                                 "that touches it becomes NaN", "re-export from a healthy training step"))
            if s.inf:
                out.append(error("TENSOR_INF", s.name, f"holds {s.inf:,} infinite value(s) ({scan.name})",
                                 "re-export from a healthy training step"))
            if len(s.shape) >= 2 and math.prod(s.shape) > 0 and s.all_zero:
                out.append(error("TENSOR_ALL_ZERO", s.name, f"weight matrix {list(s.shape)} is all zeros "
                                 f"({scan.name}); the export wrote no trained values",
                                 "export the trained weights (an all-zero matrix is never a trained state)"))
    return out


def deep_section(scans: list[FileScan]) -> DeepSection:
    tensors = {s.name: s.to_dict() for scan in scans for s in scan.tensors}
    return {"files": [scan.to_dict() for scan in scans], "tensors": dict(sorted(tensors.items()))}


# ---------------------------------------------------------------- frozen embedding

@dataclass
class FrozenEmbedResult:
    """The draft's `embed_tokens.weight` against the target's embedding, compared in the draft's dtype."""

    target: str
    draft: TensorDigest | None
    target_tensor: CastDigest

    @property
    def comparison(self) -> EmbeddingComparison:
        return compare_embeddings(self.draft, self.target_tensor, who="target")

    @property
    def identical(self) -> bool | None:
        return self.comparison.identical

    def to_dict(self) -> FrozenEmbedSection:
        return {"teacher": self.target, "draft": self.draft.to_dict() if self.draft else None,
                "teacher_tensor": self.target_tensor.stored.to_dict(), **self.comparison.to_dict()}

    def findings(self) -> list[Finding]:
        comparison = self.comparison
        if comparison.identical is not False:
            return []
        assert self.draft is not None
        return [error("FROZEN_EMBED_MISMATCH", contract.FROZEN_TENSORS[0],
                      f"{self.draft.location} is not {comparison.sameness} the target's "
                      f"{self.target_tensor.stored.location} ({comparison.evidence})",
                      "copy the target's embedding unchanged (a new draft: 'dspark-hub init DIR --embed-from "
                      "TARGET'); the draft must share it frozen")]


def draft_location(view: CheckpointView, name: str) -> TensorLocation | None:
    """Where a tensor of an opened local checkpoint lives, or None if it is absent."""
    _local(view)
    return view_location(view, name) if name in view.tensors else None


@renamed_keywords(teacher="target")
def check_frozen_embed(view: CheckpointView, target: str | os.PathLike[str], *,
                       progress: Progress | None = None) -> FrozenEmbedResult:
    """Hash the draft's and the target's embedding in place (in parallel) and compare them in the draft's dtype.

    A target stored in F32 or F16 is also hashed as its exact BF16 rounding, in the same read
    (`verify.embedding`).

    Raises:
        CheckpointNotFoundError: the target path does not exist.
        UsageError: the target holds none of `contract.TARGET_EMBED_NAMES`.
    """
    target_loc = locate_tensor(target, contract.TARGET_EMBED_NAMES)
    draft_loc = draft_location(view, contract.FROZEN_TENSORS[0])
    as_dtype = draft_loc.info.dtype if draft_loc else None
    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="deep-embed") as pool:
        target_job = pool.submit(location_digest, target_loc, as_dtype=as_dtype, progress=progress)
        draft_job = pool.submit(tensor_digest, draft_loc, progress=progress) if draft_loc else None
        return FrozenEmbedResult(target=os.fspath(target), target_tensor=target_job.result(),
                                 draft=draft_job.result() if draft_job else None)


# ---------------------------------------------------------------- verify integration

def _local(view: CheckpointView) -> LocalSource:
    if not isinstance(view.source, LocalSource):
        raise UsageError(f"{view.location}: `deep` and `frozen_embed` read tensor bytes and need a local folder; "
                         "download it first (hf download ...)")
    return view.source


def scan_view(view: CheckpointView, *, progress: Progress | None = None) -> list[FileScan]:
    """Scan every weight file whose header is valid."""
    source = _local(view)
    return scan_files([(name, source.path(name), header) for name, header in view.headers.items()],
                      progress=progress)


def planned_bytes(view: CheckpointView, *, deep: bool = False,
                  frozen_embed: str | os.PathLike[str] | None = None) -> int | None:
    """Bytes a deep / frozen-embed pass over `view` will read (a progress total); None if unknown."""
    try:
        total = sum(view.files[name] for name in view.headers) if deep else 0
        if frozen_embed is not None:
            draft = draft_location(view, contract.FROZEN_TENSORS[0])
            target: TensorInfo = locate_tensor(frozen_embed, contract.TARGET_EMBED_NAMES).info
            total += target.nbytes + (draft.info.nbytes if draft else 0)
        return total
    except Exception:   # the real run reports the problem; a progress total is best effort
        return None


def extend_report(report: Report, view: CheckpointView, *, deep: bool = False,
                  frozen_embed: str | os.PathLike[str] | None = None, progress: Progress | None = None) -> Report:
    """Add the `deep` and/or `frozen_embed` sections and their findings to a verify report."""
    _local(view)
    announce_total(progress, planned_bytes(view, deep=deep, frozen_embed=frozen_embed))
    if deep:
        scans = scan_view(view, progress=progress)
        report.sections["deep"] = deep_section(scans)
        report.findings.extend(tensor_findings(scans))
    if frozen_embed is not None:
        with about("frozen_embed"):
            result = check_frozen_embed(view, frozen_embed, progress=progress)
        report.sections["frozen_embed"] = result.to_dict()
        report.findings.extend(result.findings())
    return report
