"""`verify --deep` and `--frozen-embed`: the byte-level half of verification.

One streaming pass per weight file computes the file's SHA-256 and, per tensor, the count of NaN and
inf values, whether it is all zeros, and its mean, std and max |x|. The file is read in windows into
a ring of reused buffers. A hash thread feeds each window to `hashlib` (which releases the GIL) and
hands it to a stats thread, which scans it with numpy while the next window is read and hashed,
reading bytes the hash has just pulled into the shared cache. The windows are read, not mapped: a
mapped file that shrinks under the scan kills the process with SIGBUS, while a short read is a
`FILE_CHANGED` error naming the file. Per L2-sized slice the scan makes two integer reductions
(largest positive and negative magnitude: NaN, inf and all-zero follow from them), widens BF16 to
F32 in place, and takes the sum and the sum of squares with BLAS. Non-finite values, which the
reductions reveal, take a slower path that counts them. Several files run in parallel. Memory is
bounded by `RING_DEPTH x WINDOW_BYTES` of buffers per file plus small scratch arrays.

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
      "teacher": str,                    # the TEACHER argument as given
      "draft": {"location", "dtype", "shape", "bytes", "sha256"}|null,
      "teacher_tensor": {"location", "dtype", "shape", "bytes", "sha256"},   # as stored
      "target_cast": {...}|null,         # the teacher's values cast to the draft's dtype (when they differ)
      "compared_as": "bytes"|"cast"|null,  # bytes: same dtype; cast: exact round-to-nearest-even of the teacher
      "identical": bool|null,            # null when the draft has no embed_tokens.weight
      "verdict": str|null                # "bit-identical", "identical after BF16 rounding (nearest even) of
    }                                    # the F32 teacher", or "different"

Findings: `TENSOR_NAN`, `TENSOR_INF`, `TENSOR_ALL_ZERO` (a weight matrix, ndim >= 2; a zero bias
or norm is not an error) and `FROZEN_EMBED_MISMATCH`, all errors naming the tensor.
"""

from __future__ import annotations

import hashlib
import io
import math
import os
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from dspark_hub.errors import CheckpointFormatError, UsageError, about
from dspark_hub.format import contract
from dspark_hub.format.checkpoint import CheckpointView, LocalSource
from dspark_hub.format.folder import open_regular
from dspark_hub.format.reader import DTYPE_SIZES, SafetensorsHeader, TensorInfo
from dspark_hub.format.tensorio import (
    FLOAT_BITS,
    CastDigest,
    TensorDigest,
    TensorLocation,
    decode_float,
    locate_tensor,
    location_digest,
    tensor_digest,
    view_location,
)
from dspark_hub.progress import Progress, announce_total
from dspark_hub.report import Finding, Report, error
from dspark_hub.verify.embedding import EmbeddingComparison, compare_embeddings

RING_DEPTH = 4
#: Bytes read at a time: the window the hash has just read is still in the shared cache when the
#: stats thread scans it (two windows fit in L3 with room to spare).
WINDOW_BYTES = 8 << 20
#: Elements per numpy call in the stats thread: small enough that the slice and its temporaries stay in L2.
SLICE_ELEMENTS = 1 << 17
#: Row length of the matrix-vector product that sums a slice.
ROW = 512


# ---------------------------------------------------------------- per-tensor statistics

class _Scratch:
    """Reusable arrays for one stats thread (one per file scan): at most `n` elements per call."""

    def __init__(self, n: int) -> None:
        self.pairs = np.empty(n, dtype=np.uint32)    # BF16 element pairs widened to F32, odd ones then even
        self.wide = np.empty(n, dtype=np.uint32)
        self.f32 = np.empty(n, dtype=np.float32)
        self.ones = np.ones(n, dtype=np.float32)
        self.ones64 = np.ones(n, dtype=np.float64)
        self.abs = {code: np.empty(n, dtype=code) for code in ("<u2", "<u4", "<u8")}

    def floats(self, bits: np.ndarray, dtype: str) -> np.ndarray:
        """The values of `bits` as one float32 array (float64 for F64), element order not kept."""
        m = bits.size
        if dtype == "BF16" and m % 2 == 0:
            # BF16 is the high half of an F32. Read element pairs as uint32: masking keeps the odd element
            # as an F32, shifting left makes the even one; 1.5x faster than a uint16 -> uint32 cast.
            pairs, half = bits.view("<u4"), m // 2
            out = self.pairs[:m].reshape(2, half)
            np.bitwise_and(pairs, 0xFFFF_0000, out=out[0])
            np.left_shift(pairs, 16, out=out[1])
            return self.pairs[:m].view(np.float32)
        if dtype == "BF16":
            np.left_shift(bits, 16, out=self.wide[:m], dtype=np.uint32)
            return self.wide[:m].view(np.float32)
        if dtype == "F16":
            np.copyto(self.f32[:m], bits.view("<f2"), casting="unsafe")
            return self.f32[:m]
        return bits.view("<f4" if dtype == "F32" else "<f8")

    def ones_like(self, values: np.ndarray) -> np.ndarray:
        return self.ones[:values.size] if values.dtype == np.float32 else self.ones64[:values.size]


def max_magnitude(bits: np.ndarray) -> int:
    """The largest |x| bit pattern of sign-magnitude values (floats as unsigned ints), in two reductions.

    Read as signed integers, the largest non-negative value is the largest positive magnitude; read
    as unsigned, the largest value at or above the sign bit is the largest negative one. No pass
    writes a masked copy.
    """
    sign = 1 << (8 * bits.itemsize - 1)
    positive = int(bits.view(bits.dtype.str.replace("u", "i")).max())
    negative = int(bits.max())
    return max(positive if positive >= 0 else 0, negative - sign if negative >= sign else 0)


def _json_float(x: float) -> float | None:
    return x if math.isfinite(x) else None


@dataclass
class TensorStats:
    """Streaming statistics of one tensor."""

    name: str
    file: str
    dtype: str
    shape: tuple[int, ...]
    nan: int = 0
    inf: int = 0
    finite: int = 0
    max_bits: int = 0            # |x| bit pattern of the largest finite magnitude
    any_nonzero: bool = False    # for dtypes without float stats
    total: float = 0.0
    total_sq: float = 0.0

    @property
    def is_float(self) -> bool:
        return self.dtype in FLOAT_BITS

    @property
    def all_zero(self) -> bool:
        if self.is_float:
            return self.nan == 0 and self.inf == 0 and self.max_bits == 0
        return not self.any_nonzero

    def mean_std(self) -> tuple[float | None, float | None]:
        """Mean and population std of the finite values (None where float32 partial sums overflowed)."""
        if not self.is_float or self.finite == 0:
            return None, None
        mean = self.total / self.finite
        var = self.total_sq / self.finite - mean * mean
        return _json_float(mean), _json_float(math.sqrt(max(0.0, var)) if math.isfinite(var) else var)

    def max_abs(self) -> float | None:
        if not self.is_float or self.finite == 0:
            return None
        bits_dtype = FLOAT_BITS[self.dtype][0]
        return float(decode_float(np.array([self.max_bits], dtype=bits_dtype).tobytes(), self.dtype)[0])

    def to_dict(self) -> dict[str, Any]:
        mean, std = self.mean_std()
        return {"file": self.file, "dtype": self.dtype, "shape": list(self.shape), "nan": self.nan,
                "inf": self.inf, "all_zero": self.all_zero, "mean": mean, "std": std, "max_abs": self.max_abs()}


class _Accumulator:
    """Feeds one tensor's bytes (arbitrary split points) into its `TensorStats`."""

    def __init__(self, stats: TensorStats, scratch: _Scratch) -> None:
        self.stats = stats
        self.scratch = scratch
        self.itemsize = DTYPE_SIZES[stats.dtype]
        self.carry = b""

    def feed(self, data: memoryview) -> None:
        if self.carry:
            need = self.itemsize - len(self.carry)
            head, data = bytes(self.carry) + bytes(data[:need]), data[need:]
            if len(head) < self.itemsize:
                self.carry = head
                return
            self.carry = b""
            self._feed_aligned(memoryview(head))
        whole = len(data) - len(data) % self.itemsize
        if whole < len(data):
            self.carry = bytes(data[whole:])
        if whole:
            self._feed_aligned(data[:whole])

    def _feed_aligned(self, data: memoryview) -> None:
        s = self.stats
        if not s.is_float:
            s.any_nonzero = s.any_nonzero or bool(np.frombuffer(data, dtype=np.uint8).any())
            return
        code, _, inf_bits = FLOAT_BITS[s.dtype]
        bits = np.frombuffer(data, dtype=code)
        for i in range(0, bits.size, SLICE_ELEMENTS):   # every pass over a slice reads it from L2
            piece = bits[i:i + SLICE_ELEMENTS]
            top = max_magnitude(piece)
            if top >= inf_bits:   # rare: count the non-finite values, keep the finite ones
                self._non_finite_slice(piece)
                continue
            s.max_bits = max(s.max_bits, top)
            s.finite += piece.size
            if top:               # a slice of zeros adds nothing
                self._add(self.scratch.floats(piece, s.dtype))

    def _add(self, values: np.ndarray) -> None:
        # BLAS is several times faster than ufunc reductions here. The sum is a matrix-vector product
        # with a short vector of ones, so it reads the values alone (a dot with ones reads twice the bytes).
        rows = values.size // ROW
        ones = self.scratch.ones_like(values)
        total = float((values[:rows * ROW].reshape(rows, ROW) @ ones[:ROW]).sum()) if rows else 0.0
        self.stats.total += total + float(np.dot(values[rows * ROW:], ones[:values.size - rows * ROW]))
        self.stats.total_sq += float(np.dot(values, values))

    def _non_finite_slice(self, bits: np.ndarray) -> None:
        s, scratch = self.stats, self.scratch
        code, mask, inf_bits = FLOAT_BITS[s.dtype]
        magnitude = np.bitwise_and(bits, mask, out=scratch.abs[code][:bits.size])
        s.nan += int(np.count_nonzero(magnitude > inf_bits))
        s.inf += int(np.count_nonzero(magnitude == inf_bits))
        finite = magnitude < inf_bits
        if not finite.any():
            return
        kept = bits[finite]
        s.max_bits = max(s.max_bits, int(magnitude[finite].max()))
        s.finite += kept.size
        self._add(scratch.floats(kept, s.dtype))


class _FileScanner:
    """Routes sequential file chunks to the accumulators of the tensors they overlap."""

    def __init__(self, header: SafetensorsHeader, file: str) -> None:
        scratch = _Scratch(SLICE_ELEMENTS)
        self.spans: list[tuple[int, int, _Accumulator]] = []
        self.stats: list[TensorStats] = []
        for name, info in header.tensors.items():   # data order
            stats = TensorStats(name=name, file=file, dtype=info.dtype, shape=info.shape)
            start, end = header.absolute_range(name)
            self.spans.append((start, end, _Accumulator(stats, scratch)))
            self.stats.append(stats)
        self.next = 0

    def feed(self, offset: int, data: memoryview) -> None:
        with np.errstate(over="ignore", invalid="ignore"):   # overflowing sums are reported as null
            self._feed(offset, data)

    def _feed(self, offset: int, data: memoryview) -> None:
        end = offset + len(data)
        while self.next < len(self.spans):
            start, stop, acc = self.spans[self.next]
            if start >= end:
                return
            lo, hi = max(start, offset), min(stop, end)
            if hi > lo:
                acc.feed(data[lo - offset:hi - offset])
            if stop > end:
                return
            self.next += 1


# ---------------------------------------------------------------- the pipeline

@dataclass
class FileScan:
    """One scanned weight file: its digest and the statistics of its tensors."""

    name: str
    size: int
    sha256: str
    seconds: float
    tensors: list[TensorStats] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "size": self.size, "sha256": self.sha256, "seconds": round(self.seconds, 3)}


class _Job:
    __slots__ = ("buffer", "length", "offset")

    def __init__(self, buffer: bytearray, offset: int, length: int) -> None:
        self.buffer, self.offset, self.length = buffer, offset, length


def _consume(jobs: queue.Queue[_Job | None], work: Callable[[_Job], None], done: Callable[[_Job | None], None],
             failures: list[BaseException]) -> None:
    """Run `work` on each job until the `None` sentinel; `done` gets every job, then the sentinel."""
    while (job := jobs.get()) is not None:
        try:
            if not failures:
                work(job)
        except BaseException as e:   # re-raised by the reader thread
            failures.append(e)
        finally:
            done(job)
    done(None)


def _hash_window(hasher: hashlib._Hash, job: _Job) -> None:
    with memoryview(job.buffer) as view:
        hasher.update(view[:job.length])


def _scan_window(scanner: _FileScanner, job: _Job) -> None:
    with memoryview(job.buffer) as view:
        scanner.feed(job.offset, view[:job.length])


def _changed(shown: str, size: int, now: int) -> CheckpointFormatError:
    return CheckpointFormatError("FILE_CHANGED", f"size changed while it was scanned ({size:,} -> {now:,} bytes); "
                                 "verify again once writers are done", path=shown)


def _read_window(f: io.FileIO, view: memoryview) -> int:
    """Fill `view` from the file's current position; fewer bytes only at end of file."""
    got = 0
    while got < len(view):
        n = f.readinto(view[got:])
        if not n:
            break
        got += n
    return got


def scan_file(path: str | os.PathLike[str], header: SafetensorsHeader, *, name: str | None = None,
              progress: Progress | None = None, chunk_bytes: int = WINDOW_BYTES,
              depth: int = RING_DEPTH) -> FileScan:
    """SHA-256 of a whole file and statistics of every tensor in it, in one overlapped pass.

    The file is read in windows of `chunk_bytes` into `depth` reused buffers (which bounds
    memory). The hash thread hashes each window and hands it to the stats thread, which scans
    it while the next one is read and hashed: the scan reads bytes the hash has just pulled into
    the shared cache, and both run GIL-free most of the time (hashlib and numpy release it).

    Args:
        path: the safetensors file.
        header: its validated header (`reader.read_header`).
        name: how to name the file in the result and in errors (default: the path).
        progress: called with the number of bytes read.
        chunk_bytes: window size.
        depth: windows in flight.

    Raises:
        CheckpointFormatError: `FILE_CHANGED`, the file is not the size its header was read at (it shrank
            or grew since, or while it was scanned); `SPECIAL_FILE`, it is not a regular file.
    """
    shown = name or str(path)
    scanner = _FileScanner(header, shown)
    hasher = hashlib.sha256()
    free: queue.Queue[bytearray] = queue.Queue()
    failures: list[BaseException] = []
    to_hash: queue.Queue[_Job | None] = queue.Queue()
    to_scan: queue.Queue[_Job | None] = queue.Queue()
    size = header.file_size

    def scanned(job: _Job | None) -> None:
        if job is not None:
            free.put(job.buffer)

    workers = [
        threading.Thread(target=_consume, daemon=True, name="deep-hash",
                         args=(to_hash, lambda job: _hash_window(hasher, job), to_scan.put, failures)),
        threading.Thread(target=_consume, daemon=True, name="deep-stats",
                         args=(to_scan, lambda job: _scan_window(scanner, job), scanned, failures)),
    ]
    for w in workers:
        w.start()
    began = time.perf_counter()
    try:
        with open_regular(path, display=shown) as f:
            if (now := os.fstat(f.fileno()).st_size) != size:
                raise _changed(shown, size, now)
            window = max(1, min(chunk_bytes, size))
            for _ in range(max(1, depth)):
                free.put(bytearray(window))
            for offset in range(0, size, window):
                buffer = free.get()
                if failures:
                    break
                length = min(window, size - offset)
                got = _read_window(f, memoryview(buffer)[:length])
                if got < length:
                    raise _changed(shown, size, offset + got)
                to_hash.put(_Job(buffer, offset, length))
                if progress:
                    progress(length)
            if not failures and ((now := os.fstat(f.fileno()).st_size) != size or f.read(1)):
                raise _changed(shown, size, max(now, size + 1))
    finally:
        to_hash.put(None)    # the hash thread passes it on to the stats thread
        for w in workers:
            w.join()
    if failures:
        raise failures[0]
    return FileScan(name=shown, size=size, sha256=hasher.hexdigest(), seconds=time.perf_counter() - began,
                    tensors=scanner.stats)


def scan_files(files: list[tuple[str, Path, SafetensorsHeader]], *, progress: Progress | None = None,
               workers: int | None = None) -> list[FileScan]:
    """`scan_file` over (name, path, header) triples, several files in parallel; results in input order."""
    if len(files) <= 1:
        return [scan_file(path, header, name=name, progress=progress) for name, path, header in files]
    n = workers or min(len(files), max(2, (os.cpu_count() or 2) // 2))
    with ThreadPoolExecutor(max_workers=n, thread_name_prefix="deep-file") as pool:
        futures = [pool.submit(scan_file, path, header, name=name, progress=progress)
                   for name, path, header in files]
        return [f.result() for f in futures]


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


def deep_section(scans: list[FileScan]) -> dict[str, Any]:
    tensors = {s.name: s.to_dict() for scan in scans for s in scan.tensors}
    return {"files": [scan.to_dict() for scan in scans], "tensors": dict(sorted(tensors.items()))}


# ---------------------------------------------------------------- frozen embedding

@dataclass
class FrozenEmbedResult:
    """The draft's `embed_tokens.weight` against the teacher's embedding, compared in the draft's dtype."""

    teacher: str
    draft: TensorDigest | None
    teacher_tensor: CastDigest

    @property
    def comparison(self) -> EmbeddingComparison:
        return compare_embeddings(self.draft, self.teacher_tensor, who="teacher")

    @property
    def identical(self) -> bool | None:
        return self.comparison.identical

    def to_dict(self) -> dict[str, Any]:
        return {"teacher": self.teacher, "draft": self.draft.to_dict() if self.draft else None,
                "teacher_tensor": self.teacher_tensor.stored.to_dict(), **self.comparison.to_dict()}

    def findings(self) -> list[Finding]:
        comparison = self.comparison
        if comparison.identical is not False:
            return []
        assert self.draft is not None
        return [error("FROZEN_EMBED_MISMATCH", contract.FROZEN_TENSORS[0],
                      f"{self.draft.location} is not {comparison.sameness} the teacher's "
                      f"{self.teacher_tensor.stored.location} ({comparison.evidence})",
                      "copy the teacher's embedding unchanged (a new draft: 'dspark-hub init DIR --embed-from "
                      "TEACHER'); the draft must share it frozen")]


def draft_location(view: CheckpointView, name: str) -> TensorLocation | None:
    """Where a tensor of an opened local checkpoint lives, or None if it is absent."""
    _local(view)
    return view_location(view, name) if name in view.tensors else None


def check_frozen_embed(view: CheckpointView, teacher: str | os.PathLike[str], *,
                       progress: Progress | None = None) -> FrozenEmbedResult:
    """Hash the draft's and the teacher's embedding in place (in parallel) and compare them in the draft's dtype.

    A teacher stored in F32 or F16 is also hashed as its exact BF16 rounding, in the same read
    (`verify.embedding`).

    Raises:
        CheckpointNotFoundError: the teacher path does not exist.
        UsageError: the teacher holds none of `contract.TEACHER_EMBED_NAMES`.
    """
    teacher_loc = locate_tensor(teacher, contract.TEACHER_EMBED_NAMES)
    draft_loc = draft_location(view, contract.FROZEN_TENSORS[0])
    as_dtype = draft_loc.info.dtype if draft_loc else None
    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="deep-embed") as pool:
        teacher_job = pool.submit(location_digest, teacher_loc, as_dtype=as_dtype, progress=progress)
        draft_job = pool.submit(tensor_digest, draft_loc, progress=progress) if draft_loc else None
        return FrozenEmbedResult(teacher=os.fspath(teacher), teacher_tensor=teacher_job.result(),
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
            teacher: TensorInfo = locate_tensor(frozen_embed, contract.TEACHER_EMBED_NAMES).info
            total += teacher.nbytes + (draft.info.nbytes if draft else 0)
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
