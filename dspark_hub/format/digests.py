"""File digests: the one digest type, the one hashing path and the one reader of digest files.

Stdlib only. Files are hashed in parallel (hashlib releases the GIL) with a reused 8 MiB buffer
per worker, so memory stays flat whatever the file size.

Manifest schema `dspark-hub/checksums-manifest/1` (`checksums.json`; files written before 0.2 say
`dspark-hub/checksums/1`, still read); every key is always present::

    {
      "schema": "dspark-hub/checksums-manifest/1",
      "algorithm": "sha256",
      "file_count": 3,
      "total_bytes": 7124635170,
      "files": [                       # sorted by path
        {"path": "config.json",        # POSIX path relative to the folder
         "size": 1251,                 # bytes
         "sha256": "5a3c...",          # SHA-256 of the content (the Hub's LFS oid for LFS files)
         "blob_id": "1f0e...",         # git blob SHA-1 the Hub shows as the file's `oid`: of the
                                       # content for regular files, of the LFS pointer for LFS files
         "lfs": false}                 # stored through LFS (same rule as the `.gitattributes` we write)
      ]
    }

`SHA256SUMS` is the GNU coreutils format (`<hex>  <path>`), accepted by `sha256sum -c`.
Neither sidecar lists itself or the other; tool folders (`.git/`, `.cache/`, ...) are never part
of a checkpoint.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import re
import threading
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, ClassVar, TypedDict

from dspark_hub.documents import JSON, Document, Of
from dspark_hub.errors import CheckpointFormatError, CheckpointNotFoundError
from dspark_hub.format.folder import folder_files, open_regular, read_regular
from dspark_hub.format.jsonio import json_type, loads_strict
from dspark_hub.progress import Progress, announce_total
from dspark_hub.report import ProblemKind
from dspark_hub.schemas import CHECKSUMS, current

SUMS_NAME = "SHA256SUMS"
MANIFEST_NAME = "checksums.json"
GITATTRIBUTES_NAME = ".gitattributes"
#: Files describing the checkpoint rather than being part of it.
SIDECAR_NAMES = frozenset({SUMS_NAME, MANIFEST_NAME})

CHUNK_SIZE = 8 * 1024 * 1024
#: The Hub refuses regular (non-LFS) files above 10 MiB.
LFS_SIZE_THRESHOLD = 10 * 1024 * 1024
#: Bytes the Hub looks at to decide whether a file is binary (the preupload `sample`).
SAMPLE_SIZE = 512
LFS_ATTRIBUTES = "filter=lfs diff=lfs merge=lfs -text"
#: The patterns of the `.gitattributes` the Hub puts in every new model repository.
HUB_LFS_PATTERNS: tuple[str, ...] = (
    "*.7z", "*.arrow", "*.bin", "*.bz2", "*.ckpt", "*.ftz", "*.gguf", "*.gz", "*.h5", "*.joblib",
    "*.lfs.*", "*.mlmodel", "*.model", "*.msgpack", "*.npy", "*.npz", "*.onnx", "*.ot",
    "*.parquet", "*.pb", "*.pickle", "*.pkl", "*.pt", "*.pth", "*.rar", "*.safetensors",
    "saved_model/**/*", "*.tar.*", "*.tar", "*.tflite", "*.tgz", "*.wasm", "*.xz", "*.zip",
    "*.zst", "*tfevents*",
)
#: `CheckpointFormatError.code`s of reading digest files and hashing. Append-only: tools match on them.
DIGEST_CODES: dict[str, str] = {
    "NOT_UTF8": "a digest file is not UTF-8 text",
    "BAD_SUMS_LINE": "a SHA256SUMS line is not '<sha256>  <path>'",
    "BAD_MANIFEST": "checksums.json is malformed or an entry lacks a field",
    "NO_DIGESTS": "the file holds no recognisable file digests",
    "FILE_CHANGED": "a file's size changed while it was hashed",
}
#: How to repair a sidecar `dspark-hub checksums` wrote.
REGENERATE = "regenerate it with 'dspark-hub checksums --force'"

class ManifestListing(TypedDict):
    """What a manifest lists (`Manifest.listing`): `checksums.json` without its schema."""

    algorithm: str
    file_count: int
    total_bytes: int
    files: list[Annotated[JSON, Of("dspark_hub.format.digests.FileDigest")]]


@dataclass(frozen=True)
class FileDigest(Document):
    """What a source states about one file.

    A manifest we compute knows every field; a `SHA256SUMS` line only the SHA-256; the Hub's
    listing the size, the git blob id and, for LFS files, the SHA-256. Unknown fields are None.
    `origin` names where the statement comes from (`checksums.json`, `SHA256SUMS`, a Hub location)
    for messages.
    """

    KEYS: ClassVar[tuple[str, ...]] = ("path", "size", "sha256", "blob_id", "lfs")

    path: str
    size: int | None = None
    sha256: str | None = None
    blob_id: str | None = None
    lfs: bool | None = None
    origin: str | None = field(default=None, compare=False)


@dataclass(frozen=True)
class Manifest(Document):
    """Digests of every file of a checkpoint folder, sorted by path (every field known)."""

    SCHEMA = CHECKSUMS
    KEYS = ("**listing",)

    files: tuple[FileDigest, ...]

    @property
    def total_bytes(self) -> int:
        return sum(f.size or 0 for f in self.files)

    def by_path(self) -> dict[str, FileDigest]:
        return {f.path: f for f in self.files}

    def listing(self) -> ManifestListing:
        """What a manifest lists (`checksums.json` without its schema)."""
        return {"algorithm": "sha256", "file_count": len(self.files), "total_bytes": self.total_bytes,
                "files": [f.to_dict() for f in self.files]}


@dataclass(frozen=True)
class FileProblem(Document):
    """A file that differs from its reference (a manifest, or the Hub).

    `kind`: `mismatch` (present on both sides, size or digest differs), `missing` (in the
    reference, not here) or `extra` (here, not in the reference). `expected`/`actual` hold the
    compared values (`None` for the side that has no file).
    """

    path: str
    kind: ProblemKind
    message: str
    expected: str | None = None
    actual: str | None = None


# --- git / LFS identities --------------------------------------------------------------------------

def git_blob_sha1(content: bytes) -> str:
    """The git blob SHA-1 of `content` (what `git hash-object` prints)."""
    return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()


def lfs_pointer(sha256: str, size: int) -> bytes:
    """The git-lfs pointer file git stores in place of an LFS file."""
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n".encode()


def lfs_patterns(folder: Path) -> tuple[str, ...]:
    """The Hub's default LFS patterns plus the `filter=lfs` patterns of the folder's own `.gitattributes`."""
    extra: list[str] = []
    attributes = folder / GITATTRIBUTES_NAME
    if attributes.is_file():
        for line in read_regular(attributes).decode("utf-8", errors="replace").splitlines():
            parts = line.split()
            if len(parts) >= 2 and not parts[0].startswith("#") and "filter=lfs" in parts[1:]:
                extra.append(parts[0])
    return HUB_LFS_PATTERNS + tuple(p for p in extra if p not in HUB_LFS_PATTERNS)


def matches_gitattributes(path: str, pattern: str) -> bool:
    """Whether a `.gitattributes` pattern applies to a repository path (the subset the Hub writes)."""
    pattern = pattern.lstrip("/") if pattern.startswith("/") else pattern
    if "/" not in pattern:  # a bare pattern matches the basename at any depth
        return fnmatch.fnmatchcase(path.rsplit("/", 1)[-1], pattern)
    return fnmatch.fnmatchcase(path, pattern)


def looks_binary(sample: bytes) -> bool:
    """The Hub's heuristic on the first bytes: a NUL byte or invalid UTF-8 means binary."""
    if b"\0" in sample:
        return True
    for cut in range(4):  # the sample may end inside a multi-byte character
        try:
            sample[: len(sample) - cut].decode("utf-8")
            return False
        except UnicodeDecodeError:
            continue
    return True


def is_lfs(path: str, size: int, sample: bytes, patterns: Iterable[str] = HUB_LFS_PATTERNS) -> bool:
    """Whether the Hub stores this file through LFS: a pattern matches, it is large, or it is binary."""
    if size == 0:  # the client always sends empty files as regular files
        return False
    return (any(matches_gitattributes(path, p) for p in patterns)
            or size > LFS_SIZE_THRESHOLD or looks_binary(sample))


# --- listing and hashing -------------------------------------------------------------------------

def checkpoint_files(folder: Path) -> list[str]:
    """Relative POSIX paths of the files that make up a checkpoint folder, sorted: `folder.folder_files`
    (the one listing every command uses) without the checksum sidecars.

    Raises:
        CheckpointNotFoundError: `folder` is not a directory.
        CheckpointFormatError: the folder holds an entry the listing leaves out (a FIFO, a link out of it, ...).
    """
    return [rel for rel in folder_files(folder) if rel not in SIDECAR_NAMES]


_buffers = threading.local()


def _buffer() -> memoryview:
    """This thread's reusable read buffer."""
    if not hasattr(_buffers, "view"):
        _buffers.view = memoryview(bytearray(CHUNK_SIZE))
    view: memoryview = _buffers.view
    return view


def hash_file(path: Path, rel: str, patterns: tuple[str, ...] = HUB_LFS_PATTERNS,
              progress: Progress | None = None) -> FileDigest:
    """Every digest of one file in one read: SHA-256, the git blob id, and the LFS decision.

    Raises:
        CheckpointFormatError: `FILE_CHANGED` when the size changed while reading.
    """
    sha256 = hashlib.sha256()
    view = _buffer()
    with open_regular(path) as handle:
        size = os.fstat(handle.fileno()).st_size
        first = handle.readinto(view) or 0
        sample = bytes(view[: min(first, SAMPLE_SIZE)])
        lfs = is_lfs(rel, size, sample, patterns)
        # git's blob id of the content is only shown (and only cheap) for regular files.
        content_sha1 = None if lfs else hashlib.sha1(b"blob %d\0" % size)
        n, done = first, 0
        while n:
            sha256.update(view[:n])
            if content_sha1 is not None:
                content_sha1.update(view[:n])
            done += n
            if progress is not None:
                progress(n)
            n = handle.readinto(view) or 0
    if done != size:
        raise CheckpointFormatError("FILE_CHANGED", f"size changed while hashing ({size} -> {done} bytes); "
                                    "hash again once writers are done", path=str(path))
    digest = sha256.hexdigest()
    blob = content_sha1.hexdigest() if content_sha1 is not None else git_blob_sha1(lfs_pointer(digest, size))
    return FileDigest(path=rel, size=size, sha256=digest, blob_id=blob, lfs=lfs)


def sha256_file(path: str | os.PathLike[str], *, progress: Progress | None = None) -> str:
    """Hex SHA-256 of one file (the same reader as `compute_manifest`)."""
    p = Path(path)
    sha = hash_file(p, p.name, (), progress).sha256
    assert sha is not None
    return sha


def _locked(progress: Progress | None) -> Progress | None:
    if progress is None:
        return None
    lock = threading.Lock()

    def report(n: int) -> None:
        with lock:
            progress(n)
    return report


def compute_manifest(folder: Path | str, *, progress: Progress | None = None,
                     paths: Iterable[str] | None = None, workers: int | None = None) -> Manifest:
    """Hash every file of a checkpoint folder (SHA-256, git blob SHA-1, LFS decision).

    Args:
        folder: the checkpoint folder.
        progress: called with the number of bytes just hashed (from worker threads, serialized); told the
            total first (`dspark_hub.progress`).
        paths: relative paths to hash instead of `checkpoint_files(folder)`.
        workers: hashing threads; defaults to one per CPU, at most one per file.

    Raises:
        CheckpointNotFoundError: the folder (or a listed path) does not exist.
    """
    folder = Path(folder)
    rels = sorted(paths) if paths is not None else checkpoint_files(folder)
    for rel in rels:
        if not (folder / rel).exists():   # a FIFO or a directory: `hash_file` names what it is
            raise CheckpointNotFoundError(f"{folder / rel}: no such file", hint=f"pass files inside {folder}")
    announce_total(progress, sum((folder / rel).stat().st_size for rel in rels))
    patterns = lfs_patterns(folder)
    report = _locked(progress)
    n_workers = max(1, min(workers or os.cpu_count() or 1, len(rels) or 1))
    with ThreadPoolExecutor(max_workers=n_workers, thread_name_prefix="dspark-hash") as pool:
        digests = list(pool.map(lambda rel: hash_file(folder / rel, rel, patterns, report), rels))
    return Manifest(files=tuple(digests))


# --- reading digest files --------------------------------------------------------------------------

_SUMS_LINE = re.compile(r"([0-9a-fA-F]{64}) [ *](.+)", re.DOTALL)
_SUMS_ESCAPES = {"\\": "\\", "n": "\n", "r": "\r"}


def _is_sha256(value: Any) -> bool:
    return isinstance(value, str) and re.fullmatch(r"[0-9a-fA-F]{64}", value) is not None


def _is_size(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


#: (key, type test, what it must be) for every entry of a `checksums.json` manifest.
_ENTRY_KEYS: tuple[tuple[str, Callable[[Any], bool], str], ...] = (
    ("path", lambda v: isinstance(v, str) and v != "", "a non-empty string"),
    ("size", _is_size, "a non-negative integer"),
    ("sha256", _is_sha256, "64 hex digits"),
    ("blob_id", lambda v: isinstance(v, str), "a string"),
    ("lfs", lambda v: isinstance(v, bool), "true or false"),
)


def parse_sums(text: str, *, path: str, remedy: str = REGENERATE) -> list[FileDigest]:
    """Every line of GNU `sha256sum` output as a digest, in order, duplicates kept.

    Accepts the text form `sha256sum -c` reads: `<hex>  <name>` or `<hex> *<name>`, leading blanks,
    `#` comment lines, CRLF line ends, and the backslash-escaped form for names holding a newline,
    carriage return or backslash.

    Raises:
        CheckpointFormatError: `BAD_SUMS_LINE`, a line of any other form (naming `path`, the line and `remedy`).
    """
    out: list[FileDigest] = []
    origin = Path(path).name
    for number, raw in enumerate(text.split("\n"), 1):
        line = raw.removesuffix("\r").lstrip(" \t")
        if not line or line.startswith("#"):
            continue
        escaped = line.startswith("\\")
        match = _SUMS_LINE.fullmatch(line[1:] if escaped else line)
        if match is None:
            raise CheckpointFormatError("BAD_SUMS_LINE", f"line {number} is not '<sha256>  <path>'; {remedy}",
                                        path=path)
        name = match.group(2)
        if escaped:
            name = re.sub(r"\\([\\nr])", lambda m: _SUMS_ESCAPES[m.group(1)], name)
        out.append(FileDigest(path=name, sha256=match.group(1).lower(), origin=origin))
    return out


def _manifest_entry(data: Any, where: str, origin: str) -> FileDigest:
    if not isinstance(data, Mapping):
        raise ValueError(f"{where} is a JSON {json_type(data)}, expected an object")
    for key, ok, wanted in _ENTRY_KEYS:
        if key not in data:
            raise ValueError(f"{where} has no {key!r}")
        if not ok(data[key]):
            raise ValueError(f"{where}: {key!r} must be {wanted}, got {data[key]!r:.40}")
    return FileDigest(path=data["path"], size=data["size"], sha256=data["sha256"].lower(),
                      blob_id=data["blob_id"], lfs=data["lfs"], origin=origin)


def _schema_entries(doc: Mapping[str, Any], origin: str) -> list[FileDigest]:
    """The entries of a `checksums.json` manifest document (every field checked)."""
    if current(doc.get("schema")) != CHECKSUMS:
        raise ValueError(f"schema is {doc.get('schema')!r:.60}, expected {CHECKSUMS!r}")
    files = doc.get("files")
    if not isinstance(files, list):
        raise ValueError("has no 'files' array" if files is None else
                         f"'files' is a JSON {json_type(files)}, expected an array")
    return [_manifest_entry(f, f"files[{i}]", origin) for i, f in enumerate(files)]


def _loose_entry(name: Any, entry: Any, origin: str) -> FileDigest | None:
    if isinstance(entry, str) and name is not None:
        return FileDigest(path=str(name), sha256=entry.lower(), origin=origin)
    if not isinstance(entry, Mapping):
        return None
    key = name or entry.get("path") or entry.get("name") or entry.get("file")
    if key is None:
        return None
    sha, size = entry.get("sha256"), entry.get("size")
    return FileDigest(path=str(key), size=size if _is_size(size) else None,
                      sha256=sha.lower() if isinstance(sha, str) else None, origin=origin)


def _loose_entries(doc: Any, origin: str) -> list[FileDigest]:
    """Other JSON manifests: `{"files": [...]}`, `{"files": {name: {...}}}`, `[{...}]` or `{name: "hex"}`."""
    files = doc.get("files", doc) if isinstance(doc, dict) else doc
    if isinstance(files, dict):
        items: Iterable[tuple[Any, Any]] = files.items()
    elif isinstance(files, list):
        items = ((None, e) for e in files)
    else:
        items = ()
    return [d for name, entry in items if (d := _loose_entry(name, entry, origin)) is not None]


def read_digest_file(path: str | os.PathLike[str], *, remedy: str = REGENERATE,
                     manifest: bool = False) -> list[FileDigest]:
    """Read a file of digests: `sha256sum` output, a `checksums.json` manifest, or another
    JSON manifest (`{"files": [{"path", "size", "sha256"}]}`, `{"files": {name: {...}}}`,
    `[{...}]` or `{name: "hex"}`).

    A document that names a `schema` must be ours and is checked field by field; other forms
    give whatever fields they carry. `manifest=True` accepts only our `checksums.json` form.

    Raises:
        CheckpointNotFoundError: no such file.
        CheckpointFormatError: `NOT_UTF8`, `BAD_SUMS_LINE`, `BAD_MANIFEST` (malformed JSON
            manifest) or `NO_DIGESTS` (nothing recognisable); the message ends with `remedy`.
    """
    p = Path(path)
    origin = p.name
    try:
        data = read_regular(p)
    except FileNotFoundError:
        raise CheckpointNotFoundError(f"{p}: no such file") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise CheckpointFormatError("NOT_UTF8", f"byte 0x{data[e.start]:02x} at offset {e.start} is not UTF-8 "
                                    f"text; {remedy}", path=str(p)) from None
    if not manifest and not text.lstrip().startswith(("{", "[")):
        entries = parse_sums(text, path=str(p), remedy=remedy)
    else:
        try:
            doc = loads_strict(text, path=str(p))
        except CheckpointFormatError as e:
            raise CheckpointFormatError("BAD_MANIFEST", f"{e.detail}; {remedy}", path=str(p)) from None
        try:
            if manifest and not isinstance(doc, dict):
                raise ValueError(f"is a JSON {json_type(doc)}, expected an object with 'schema' and 'files'")
            entries = (_schema_entries(doc, origin) if isinstance(doc, dict) and ("schema" in doc or manifest)
                       else _loose_entries(doc, origin))
        except ValueError as e:
            raise CheckpointFormatError("BAD_MANIFEST", f"{e}; {remedy}", path=str(p)) from None
    if not entries and text.strip():
        raise CheckpointFormatError("NO_DIGESTS", f"holds no file digests; {remedy}", path=str(p))
    return entries


def read_manifest(path: str | os.PathLike[str]) -> Manifest:
    """Read a complete manifest (`checksums.json` as this tool writes it).

    Raises:
        CheckpointFormatError: see `read_digest_file`, or `BAD_MANIFEST` when an entry lacks a field.
    """
    entries = read_digest_file(path, manifest=True)
    incomplete = [d.path for d in entries if None in (d.size, d.sha256, d.blob_id, d.lfs)]
    if incomplete:
        raise CheckpointFormatError("BAD_MANIFEST", f"{incomplete[0]!r} lacks size, sha256, blob_id or lfs; "
                                    f"{REGENERATE}", path=str(path))
    return Manifest(files=tuple(sorted(entries, key=lambda d: d.path)))
