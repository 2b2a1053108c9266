"""Tensor bytes on disk: stream byte ranges, hash them, decode and cast float dtypes, find tensors by name.

The byte-level counterpart of `reader.py` (which never reads tensor data). Everything
streams through fixed-size reusable buffers, so memory stays bounded however large
the file. numpy is imported lazily: `hash_range` and `locate_tensor` are stdlib only.
"""

from __future__ import annotations

import errno
import hashlib
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

from dspark_hub.documents import Document
from dspark_hub.errors import CheckpointNotFoundError, UsageError
from dspark_hub.format.contract import INDEX_NAME
from dspark_hub.format.folder import list_folder, open_regular, read_regular
from dspark_hub.format.reader import DTYPE_SIZES, SafetensorsHeader, TensorInfo, parse_index, read_header
from dspark_hub.progress import Progress

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    from dspark_hub.format.checkpoint import CheckpointView

CHUNK_BYTES = 16 << 20

#: Raw tensor bytes as the streaming functions pass them around (`iter_range` yields memoryviews).
BytesLike: TypeAlias = bytes | bytearray | memoryview

#: Float dtypes we can decode: dtype -> (unsigned view, |x| bit mask, +inf bit pattern).
FLOAT_BITS: dict[str, tuple[str, int, int]] = {
    "BF16": ("<u2", 0x7FFF, 0x7F80),
    "F16": ("<u2", 0x7FFF, 0x7C00),
    "F32": ("<u4", 0x7FFF_FFFF, 0x7F80_0000),
    "F64": ("<u8", 0x7FFF_FFFF_FFFF_FFFF, 0x7FF0_0000_0000_0000),
}


def iter_range(path: str | os.PathLike[str], start: int, end: int, *, chunk_bytes: int = CHUNK_BYTES,
               buffer: bytearray | None = None) -> Iterator[memoryview]:
    """Yield the bytes `[start, end)` of a file as views of one reused buffer.

    A yielded view is valid only until the next one is requested (the buffer is reused).

    Raises:
        OSError: the file cannot be read or ends before `end`.
    """
    buf = buffer if buffer is not None else bytearray(min(chunk_bytes, max(1, end - start)))
    view = memoryview(buf)
    with open_regular(path) as f:
        f.seek(start)
        left = end - start
        while left > 0:
            n = f.readinto(view[:min(len(buf), left)])
            if not n:
                raise OSError(errno.EIO, f"ends {left:,} bytes before offset {end:,}; the file is truncated",
                              os.fspath(path))
            left -= n
            yield view[:n]


def hash_range(path: str | os.PathLike[str], start: int, end: int, *, progress: Progress | None = None,
               chunk_bytes: int = CHUNK_BYTES) -> str:
    """SHA-256 (hex) of the bytes `[start, end)` of a file, streamed."""
    hasher = hashlib.sha256()
    for piece in iter_range(path, start, end, chunk_bytes=chunk_bytes):
        hasher.update(piece)
        if progress:
            progress(len(piece))
    return hasher.hexdigest()


@dataclass(frozen=True)
class TensorLocation:
    """Where one tensor's bytes live: the file, its validated header and the tensor entry."""

    path: Path
    header: SafetensorsHeader
    info: TensorInfo

    @property
    def name(self) -> str:
        return self.info.name

    @property
    def byte_range(self) -> tuple[int, int]:
        return self.header.absolute_range(self.info.name)

    def describe(self) -> str:
        return f"{self.path}:{self.info.name}"


@dataclass(frozen=True)
class TensorDigest(Document):
    """SHA-256 of a tensor's raw bytes, with the dtype and shape that give them meaning."""

    KEYS = ("location", "dtype", "shape", "bytes=nbytes", "sha256")

    location: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    sha256: str


def view_location(view: CheckpointView, name: str) -> TensorLocation:
    """Where tensor `name` of an opened local checkpoint lives.

    Raises:
        UsageError: the checkpoint is not a local folder (a Hub checkpoint has no path to read).
    """
    file, info = view.tensors[name]
    return TensorLocation(path=view.local_path(file), header=view.headers[file], info=info)


def tensor_digest(location: TensorLocation, *, progress: Progress | None = None) -> TensorDigest:
    """Hash a tensor's bytes in place (streamed from its byte range, never loaded whole)."""
    start, end = location.byte_range
    return TensorDigest(location=location.describe(), dtype=location.info.dtype, shape=location.info.shape,
                        nbytes=end - start, sha256=hash_range(location.path, start, end, progress=progress))


def tensor_files(folder: str | os.PathLike[str]) -> dict[str, Path]:
    """Tensor name -> the safetensors file of a checkpoint folder that holds it (the one resolution).

    A sharded folder's index decides (validated: no path outside the folder); otherwise every
    `*.safetensors` file's header is read. Only headers and the index are read, never tensor data.

    Raises:
        CheckpointFormatError: the index or a header is invalid.
    """
    folder = Path(folder)
    index_path = folder / INDEX_NAME
    if index_path.is_file():
        index = parse_index(read_regular(index_path), path=str(index_path))
        return {name: folder / file for name, file in index.weight_map.items()}
    out: dict[str, Path] = {}
    for file in weight_files(folder):
        out.update(dict.fromkeys(read_header(file).tensors, file))
    return out


def weight_files(folder: Path) -> list[Path]:
    """The top-level `*.safetensors` files of a folder, as the one listing (`format.folder`) sees them."""
    return [folder / f for f in list_folder(folder).files if "/" not in f and f.endswith(".safetensors")]


def _candidate_files(folder: Path, names: Sequence[str]) -> list[Path]:
    """Weight files to search, the index's choice first when the folder is sharded."""
    index_path = folder / INDEX_NAME
    if index_path.is_file():
        index = parse_index(read_regular(index_path), path=str(index_path))
        return [folder / index.weight_map[n] for n in names if n in index.weight_map]
    return weight_files(folder)


def locate_tensor(path: str | os.PathLike[str], names: Sequence[str]) -> TensorLocation:
    """Find the first of `names` in a safetensors file or a checkpoint folder (single file or sharded).

    Only headers are read. In a sharded folder the index says which shard to open.

    Raises:
        CheckpointNotFoundError: `path` does not exist.
        UsageError: none of `names` is stored there.
        CheckpointFormatError: a header or the index is invalid.
    """
    p = Path(path)
    if not p.exists():
        raise CheckpointNotFoundError(f"{path}: no such file or directory",
                                      hint="pass a checkpoint folder or a .safetensors file")
    files = _candidate_files(p, names) if p.is_dir() else [p]
    for file in files:
        header = read_header(file)
        for name in names:
            if name in header.tensors:
                return TensorLocation(path=file, header=header, info=header.tensors[name])
    raise UsageError(f"{path}: holds none of {', '.join(names)}; pass the checkpoint that holds that tensor")


# ---------------------------------------------------------------- decoding

def float_dtype_supported(dtype: str) -> bool:
    return dtype in FLOAT_BITS


def decode_float(raw: BytesLike, dtype: str) -> npt.NDArray[np.floating[Any]]:
    """Little-endian float bytes -> a float32 array (float64 for F64). BF16 is widened bit-exactly."""
    import numpy as np

    if dtype == "BF16":
        bits = np.frombuffer(raw, dtype="<u2")
        return (bits.astype(np.uint32) << 16).view(np.float32)
    if dtype == "F16":
        return np.frombuffer(raw, dtype="<f2").astype(np.float32)
    if dtype == "F32":
        return np.frombuffer(raw, dtype="<f4")
    if dtype == "F64":
        return np.frombuffer(raw, dtype="<f8")
    raise UsageError(f"dtype {dtype}: not a float dtype this tool decodes ({', '.join(FLOAT_BITS)})")


def iter_elements(location: TensorLocation, elements_per_chunk: int) -> Iterator[memoryview]:
    """A tensor's bytes in pieces of whole elements (`elements_per_chunk` each, the last shorter)."""
    start, end = location.byte_range
    return iter_range(location.path, start, end, chunk_bytes=elements_per_chunk * DTYPE_SIZES[location.info.dtype])


# ---------------------------------------------------------------- exact casts

#: Casts that are exact functions of the bytes: F32 or F16 to BF16, rounding to nearest, ties to even
#: (what torch's `.to(torch.bfloat16)` does; F16 widens to F32 exactly first). NaN stays a quiet NaN.
EXACT_CASTS: frozenset[tuple[str, str]] = frozenset({("F32", "BF16"), ("F16", "BF16")})


def f32_bits_to_bf16(bits: npt.NDArray[np.uint32]) -> npt.NDArray[np.uint16]:
    """uint32 F32 bit patterns -> uint16 BF16 bit patterns, round to nearest even; NaN stays (quiet) NaN."""
    import numpy as np

    rounded = ((bits + (0x7FFF + ((bits >> 16) & 1))) >> 16).astype(np.uint16)
    nan = (bits & 0x7FFF_FFFF) > 0x7F80_0000
    if nan.any():
        rounded[nan] = ((bits[nan] >> 16) | 0x0040).astype(np.uint16)
    return rounded


def cast_bytes(raw: BytesLike, src: str, dst: str) -> BytesLike:
    """Little-endian `src` float bytes (whole elements) as `dst` bytes: `raw` itself when the dtypes agree.

    Raises:
        UsageError: the cast is not one of `EXACT_CASTS`.
    """
    import numpy as np

    if src == dst:
        return raw
    if (src, dst) not in EXACT_CASTS:
        raise UsageError(f"dtype {src} -> {dst}: not an exact cast this tool makes "
                         f"({', '.join(f'{a} -> {b}' for a, b in sorted(EXACT_CASTS))})")
    bits = (np.frombuffer(raw, dtype="<u4") if src == "F32"
            else np.frombuffer(raw, dtype="<f2").astype(np.float32).view(np.uint32))
    return f32_bits_to_bf16(bits).astype("<u2", copy=False).data


def cast_text(src: str, dst: str) -> str:
    """How a cast is said in messages: `BF16 rounding (nearest even) of the F32`."""
    return f"{dst} rounding (nearest even) of the {src}"


def cast_chunks(pieces: Iterable[BytesLike], src: str, dst: str) -> Iterator[BytesLike]:
    """Cast a stream of `src` bytes cut anywhere into `dst` bytes, carrying partial elements over."""
    size = DTYPE_SIZES[src]
    carry = b""
    for piece in pieces:
        data = bytes(carry) + bytes(piece) if carry else piece
        whole = len(data) - len(data) % size
        carry = bytes(data[whole:])
        if whole:
            yield cast_bytes(memoryview(data)[:whole], src, dst)
    if carry:
        raise UsageError(f"a {src} stream ended inside an element ({len(carry)} stray bytes)")


@dataclass(frozen=True)
class CastDigest:
    """SHA-256 of a tensor's bytes as stored, and of the same values cast to another dtype (one read)."""

    stored: TensorDigest
    cast: TensorDigest | None      # None when no cast was asked for

    def as_dtype(self, dtype: str) -> TensorDigest | None:
        """The digest of the tensor in `dtype`: the stored one, or the cast one (None when neither is)."""
        if self.stored.dtype == dtype:
            return self.stored
        return self.cast if self.cast is not None and self.cast.dtype == dtype else None


def digest_as(pieces: Iterable[BytesLike], stored: TensorDigest, dst: str | None) -> CastDigest:
    """Hash `pieces` (a tensor's bytes, in order) as stored and, when `dst` is an exact cast away, as `dst`.

    `stored` carries the location, dtype and shape; its `sha256` is filled in here. Memory: one
    piece and its cast.
    """
    raw_hash = hashlib.sha256()
    cast_dst = dst if dst is not None and (stored.dtype, dst) in EXACT_CASTS else None
    cast_hash = hashlib.sha256() if cast_dst is not None else None
    cast_bytes_total = 0

    def tee() -> Iterator[BytesLike]:
        for piece in pieces:
            raw_hash.update(piece)
            yield piece

    if cast_hash is not None and cast_dst is not None:
        for out in cast_chunks(tee(), stored.dtype, cast_dst):
            cast_hash.update(out)
            cast_bytes_total += memoryview(out).nbytes
    else:
        for _ in tee():
            pass
    done = TensorDigest(location=stored.location, dtype=stored.dtype, shape=stored.shape, nbytes=stored.nbytes,
                        sha256=raw_hash.hexdigest())
    cast = None if cast_hash is None or cast_dst is None else TensorDigest(
        location=f"{stored.location} ({cast_text(stored.dtype, cast_dst)})", dtype=cast_dst, shape=stored.shape,
        nbytes=cast_bytes_total, sha256=cast_hash.hexdigest())
    return CastDigest(stored=done, cast=cast)


def location_digest(location: TensorLocation, *, as_dtype: str | None = None,
                    progress: Progress | None = None) -> CastDigest:
    """`digest_as` of a local tensor, streamed from its byte range."""
    start, end = location.byte_range

    def pieces() -> Iterator[memoryview]:
        for piece in iter_range(location.path, start, end):
            if progress:
                progress(len(piece))
            yield piece

    stored = TensorDigest(location=location.describe(), dtype=location.info.dtype, shape=location.info.shape,
                          nbytes=end - start, sha256="")
    return digest_as(pieces(), stored, as_dtype)
