"""A strict safetensors header reader in pure Python (stdlib only).

Format: 8-byte little-endian header length N, N bytes of UTF-8 JSON, then the data
area. The JSON maps tensor names to ``{"dtype", "shape", "data_offsets"}`` (offsets
relative to the data area) plus an optional ``"__metadata__"`` string map.

Stricter than the `safetensors` library: duplicate keys are rejected at any depth
(Python's `json` keeps the last one; the library's map parser swallows them), NaN
literals are rejected, unknown fields are rejected, and the tensors must tile the
data area exactly (no gap, no overlap, no trailing or missing bytes).

Every failure raises `CheckpointFormatError` with a stable `code` (see `FORMAT_CODES`).
Reading a header never reads tensor data.
"""

from __future__ import annotations

import json
import math
import os
import re
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dspark_hub.errors import CheckpointFormatError
from dspark_hub.format.folder import open_regular
from dspark_hub.format.jsonio import loads_strict

MAX_HEADER_SIZE = 100_000_000
#: safetensors dtype -> bytes per element.
DTYPE_SIZES: dict[str, int] = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1,
    "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
    "I32": 4, "U32": 4, "F32": 4,
    "I64": 8, "U64": 8, "F64": 8,
}
LFS_POINTER_PREFIX = b"version https://git-lfs"

#: code -> what it means. Append-only: tools match on these.
FORMAT_CODES: dict[str, str] = {
    "FILE_TOO_SMALL": "shorter than the 8-byte header length",
    "LFS_POINTER": "a git-lfs pointer file, not the weights",
    "HEADER_TOO_LARGE": "header length above 100,000,000 bytes",
    "HEADER_OUT_OF_BOUNDS": "header length runs past the end of the file",
    "HEADER_NOT_UTF8": "header is not valid UTF-8",
    "HEADER_NOT_JSON": "header is not valid JSON",
    "DUPLICATE_KEY": "a JSON object repeats a key",
    "HEADER_NOT_OBJECT": "header JSON is not an object",
    "INVALID_METADATA": "__metadata__ is not a map of strings to strings",
    "INVALID_TENSOR_ENTRY": "a tensor entry is not {dtype, shape, data_offsets}",
    "UNKNOWN_DTYPE": "a tensor has a dtype safetensors does not define",
    "INVALID_SHAPE": "a shape is not a list of non-negative integers",
    "INVALID_OFFSETS": "data_offsets is not [begin, end] with 0 <= begin <= end",
    "SIZE_MISMATCH": "byte range differs from prod(shape) x itemsize",
    "OFFSET_OUT_OF_BOUNDS": "a tensor's bytes run past the end of the file",
    "TENSOR_OVERLAP": "two tensors share bytes",
    "TENSOR_GAP": "unclaimed bytes between tensors",
    "TRAILING_BYTES": "bytes after the last tensor",
    "INDEX_INVALID": "model.safetensors.index.json is malformed",
    "INDEX_UNSAFE_PATH": "the index names a file outside the checkpoint folder",
    "INDEX_HEADER_NOT_UTF8": "model.safetensors.index.json is not valid UTF-8",
    "INDEX_HEADER_NOT_JSON": "model.safetensors.index.json is not valid JSON",
    "INDEX_DUPLICATE_KEY": "model.safetensors.index.json repeats a key",
}


@dataclass(frozen=True)
class TensorInfo:
    """One tensor entry; `begin`/`end` are offsets into the data area."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.end - self.begin


@dataclass(frozen=True)
class SafetensorsHeader:
    """A validated header. `tensors` is in data order (ascending offsets)."""

    path: str
    header_length: int
    file_size: int
    metadata: dict[str, str] | None
    tensors: dict[str, TensorInfo] = field(repr=False)

    @property
    def data_start(self) -> int:
        return 8 + self.header_length

    def absolute_range(self, name: str) -> tuple[int, int]:
        """Byte range of a tensor in the file (for streaming reads)."""
        info = self.tensors[name]
        return self.data_start + info.begin, self.data_start + info.end


#: How the shared JSON failures are reported for a safetensors header, and for a shard index.
_HEADER_JSON_CODES = {"NOT_UTF8": "HEADER_NOT_UTF8", "NOT_JSON": "HEADER_NOT_JSON",
                      "NON_FINITE_NUMBER": "HEADER_NOT_JSON"}
_INDEX_JSON_CODES = {"NOT_UTF8": "INDEX_HEADER_NOT_UTF8", "NOT_JSON": "INDEX_HEADER_NOT_JSON",
                     "NON_FINITE_NUMBER": "INDEX_HEADER_NOT_JSON", "DUPLICATE_KEY": "INDEX_DUPLICATE_KEY"}


def header_length(first8: bytes, file_size: int, *, path: str) -> int:
    """Validate the 8-byte length prefix against the file size."""
    if file_size < 8 or len(first8) < 8:
        raise CheckpointFormatError("FILE_TOO_SMALL", f"{file_size} bytes, shorter than the 8-byte header length; "
                                    "the download is truncated, fetch the file again", path=path)
    if first8.startswith(LFS_POINTER_PREFIX[:8]):
        raise CheckpointFormatError("LFS_POINTER", "is a git-lfs pointer, not the weights; run 'git lfs pull' "
                                    "or download with huggingface_hub", path=path)
    n: int
    (n,) = struct.unpack("<Q", first8[:8])
    if n > MAX_HEADER_SIZE:
        raise CheckpointFormatError("HEADER_TOO_LARGE", f"header length {n:,} exceeds {MAX_HEADER_SIZE:,} bytes; "
                                    "the file is not safetensors or is corrupt", path=path)
    if n > file_size - 8:
        raise CheckpointFormatError("HEADER_OUT_OF_BOUNDS", f"header length {n:,} runs past the end of the "
                                    f"{file_size:,}-byte file; the file is truncated or not safetensors", path=path)
    return n


def _shape(name: str, value: Any, path: str) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0
                                              for d in value):
        raise CheckpointFormatError("INVALID_SHAPE", f"tensor {name!r} has shape {json.dumps(value)}; "
                                    "a shape is a list of non-negative integers", path=path, tensor=name)
    return tuple(value)


def _offsets(name: str, value: Any, path: str) -> tuple[int, int]:
    ok = (isinstance(value, list) and len(value) == 2
          and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in value)
          and value[0] <= value[1])
    if not ok:
        raise CheckpointFormatError("INVALID_OFFSETS", f"tensor {name!r} has data_offsets {json.dumps(value)}; "
                                    "expected [begin, end] with 0 <= begin <= end", path=path, tensor=name)
    return value[0], value[1]


def _tensor(name: str, entry: Any, path: str) -> TensorInfo:
    if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
        got = sorted(entry) if isinstance(entry, dict) else type(entry).__name__
        raise CheckpointFormatError("INVALID_TENSOR_ENTRY", f"tensor {name!r} entry has {got}; expected exactly "
                                    "dtype, shape and data_offsets", path=path, tensor=name)
    dtype = entry["dtype"]
    if not isinstance(dtype, str) or dtype not in DTYPE_SIZES:
        raise CheckpointFormatError("UNKNOWN_DTYPE", f"tensor {name!r} has dtype {json.dumps(dtype)}; "
                                    f"known: {', '.join(sorted(DTYPE_SIZES))}", path=path, tensor=name)
    shape = _shape(name, entry["shape"], path)
    begin, end = _offsets(name, entry["data_offsets"], path)
    need = math.prod(shape) * DTYPE_SIZES[dtype]
    if end - begin != need:
        raise CheckpointFormatError("SIZE_MISMATCH", f"tensor {name!r} data_offsets [{begin}, {end}] cover "
                                    f"{end - begin:,} bytes, shape {list(shape)} x {dtype} needs {need:,}",
                                    path=path, tensor=name)
    return TensorInfo(name, dtype, shape, begin, end)


#: A UTF-16 surrogate: JSON's `\\ud800` escape decodes to one when it has no partner; no UTF-8 text holds one.
_SURROGATE = re.compile("[\ud800-\udfff]")


def _metadata(value: Any, path: str) -> dict[str, str]:
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise CheckpointFormatError("INVALID_METADATA", f"__metadata__ is {json.dumps(value)[:80]}; it must map "
                                    "strings to strings (e.g. {\"torchspec_version\": \"0.1.0\"})", path=path)
    for key, text in value.items():
        if _SURROGATE.search(key) or _SURROGATE.search(text):
            raise CheckpointFormatError("INVALID_METADATA", f"__metadata__ entry {json.dumps(key)[:60]}: "
                                        f"{json.dumps(text)[:60]} holds a lone surrogate escape, which is not "
                                        "Unicode text: the safetensors library refuses to open the file; write the "
                                        "metadata again as plain text", path=path)
    return value


def _check_tiling(tensors: list[TensorInfo], data_size: int, path: str) -> None:
    expected = 0
    for info in sorted(tensors, key=lambda t: (t.begin, t.end)):
        if info.end > data_size:
            raise CheckpointFormatError("OFFSET_OUT_OF_BOUNDS", f"tensor {info.name!r} ends at data byte {info.end:,}"
                                        f" but the data area holds {data_size:,}; the file is truncated",
                                        path=path, tensor=info.name)
        if info.begin < expected:
            raise CheckpointFormatError("TENSOR_OVERLAP", f"tensor {info.name!r} starts at {info.begin:,}, inside "
                                        f"the previous tensor (ends {expected:,}); every tensor needs its own bytes",
                                        path=path, tensor=info.name)
        if info.begin > expected:
            raise CheckpointFormatError("TENSOR_GAP", f"{info.begin - expected:,} unclaimed bytes before tensor "
                                        f"{info.name!r}; tensors must be contiguous", path=path, tensor=info.name)
        expected = info.end
    if expected != data_size:
        raise CheckpointFormatError("TRAILING_BYTES", f"{data_size - expected:,} bytes after the last tensor; "
                                    "re-export the file or fetch it again", path=path)


def parse_header(header: bytes, *, header_len: int, file_size: int, path: str) -> SafetensorsHeader:
    """Validate the JSON header bytes (the N bytes after the length prefix).

    Raises:
        CheckpointFormatError: with one of `FORMAT_CODES`.
    """
    doc = loads_strict(header, path=path, codes=_HEADER_JSON_CODES)
    if not isinstance(doc, dict):
        raise CheckpointFormatError("HEADER_NOT_OBJECT", f"header JSON is a {type(doc).__name__}, not an object",
                                    path=path)
    metadata = _metadata(doc["__metadata__"], path) if "__metadata__" in doc else None
    infos = [_tensor(name, entry, path) for name, entry in doc.items() if name != "__metadata__"]
    _check_tiling(infos, file_size - 8 - header_len, path)
    ordered = sorted(infos, key=lambda t: (t.begin, t.end))
    return SafetensorsHeader(path=path, header_length=header_len, file_size=file_size, metadata=metadata,
                             tensors={t.name: t for t in ordered})


ReadBytes = Callable[[int, int], bytes]


def read_header_with(read: ReadBytes, *, file_size: int, path: str) -> SafetensorsHeader:
    """Read and validate a header through `read(start, length)` (local file or HTTP range)."""
    first8 = read(0, 8) if file_size >= 8 else b""
    n = header_length(first8, file_size, path=path)
    raw = read(8, n)
    if len(raw) != n:
        raise CheckpointFormatError("HEADER_OUT_OF_BOUNDS", f"read {len(raw):,} of {n:,} header bytes; the file "
                                    "is truncated", path=path)
    return parse_header(raw, header_len=n, file_size=file_size, path=path)


def read_header(path: str | os.PathLike[str], *, display: str | None = None) -> SafetensorsHeader:
    """Read and validate the header of a local safetensors file (reads 8 + N bytes, never the data).

    Raises:
        CheckpointFormatError: the file is not a valid safetensors file.
        CheckpointFormatError: `SPECIAL_FILE`, a FIFO, socket or device (never opened).
        OSError: the file cannot be opened.
    """
    p = Path(path)
    shown = display or str(p)
    with open_regular(p, display=shown) as f:
        size = os.fstat(f.fileno()).st_size

        def read(start: int, length: int) -> bytes:
            f.seek(start)
            return f.read(length)

        return read_header_with(read, file_size=size, path=shown)


@dataclass(frozen=True)
class ShardIndex:
    """A validated `model.safetensors.index.json`."""

    weight_map: dict[str, str]
    total_size: int | None
    metadata: dict[str, Any]

    @property
    def files(self) -> list[str]:
        return sorted(set(self.weight_map.values()))


def is_safe_relative(name: str) -> bool:
    """True for a plain relative path that stays inside its folder."""
    if not name or name.startswith(("/", "\\")) or "\\" in name or (len(name) > 1 and name[1] == ":"):
        return False
    return all(part not in ("", ".", "..") for part in name.split("/"))


def parse_index(raw: bytes, *, path: str) -> ShardIndex:
    """Validate a shard index: strict JSON, `weight_map` of names to safe relative file names.

    Raises:
        CheckpointFormatError: INDEX_INVALID, INDEX_UNSAFE_PATH, INDEX_DUPLICATE_KEY, INDEX_HEADER_NOT_JSON,
            INDEX_HEADER_NOT_UTF8.
    """
    doc = loads_strict(raw, path=path, codes=_INDEX_JSON_CODES)
    if not isinstance(doc, dict) or not isinstance(doc.get("weight_map"), dict):
        raise CheckpointFormatError("INDEX_INVALID", "has no \"weight_map\" object; regenerate the index",
                                    path=path)
    weight_map: Mapping[str, Any] = doc["weight_map"]
    for tensor, file in weight_map.items():
        if not isinstance(file, str):
            raise CheckpointFormatError("INDEX_INVALID", f"weight_map[{tensor!r}] is {json.dumps(file)}, not a "
                                        "file name", path=path, tensor=tensor)
        if not is_safe_relative(file):
            raise CheckpointFormatError("INDEX_UNSAFE_PATH", f"weight_map[{tensor!r}] names {file!r}, outside the "
                                        "checkpoint folder; use a plain file name", path=path, tensor=tensor)
    metadata = doc.get("metadata") or {}
    if not isinstance(metadata, dict):
        raise CheckpointFormatError("INDEX_INVALID", "\"metadata\" is not an object", path=path)
    total = metadata.get("total_size")
    if total is not None and (isinstance(total, bool) or not isinstance(total, int) or total < 0):
        raise CheckpointFormatError("INDEX_INVALID", f"metadata.total_size is {json.dumps(total)}, not a byte "
                                    "count", path=path)
    return ShardIndex(weight_map=dict(weight_map), total_size=total, metadata=metadata)
