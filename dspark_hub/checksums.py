"""Per-file digests of a checkpoint folder: `SHA256SUMS`, the JSON manifest, and checking them.

Stdlib only. Files are hashed in parallel (hashlib releases the GIL) with a reused 8 MiB
buffer per worker, so memory stays flat whatever the file size.

Manifest schema `dspark-hub/checksums/1` (`checksums.json`); every key is always present::

    {
      "schema": "dspark-hub/checksums/1",
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
Neither sidecar lists itself or the other; tool folders (`.git/`, `.cache/`, ...) are never part of a checkpoint.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import re
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Literal, Mapping

from .checkpoint import SKIP_DIRS
from .errors import CheckpointFormatError, CheckpointNotFoundError, RefusedOverwriteError, UsageError
from .writer import atomic_file

SCHEMA = "dspark-hub/checksums/1"
SUMS_NAME = "SHA256SUMS"
MANIFEST_NAME = "checksums.json"
GITATTRIBUTES_NAME = ".gitattributes"
#: Files describing the checkpoint rather than being part of it.
SIDECAR_NAMES = frozenset({SUMS_NAME, MANIFEST_NAME})
#: Directories that belong to tools, never to the checkpoint (the same set `LocalSource` skips).
IGNORED_DIRS = frozenset(SKIP_DIRS)

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

Progress = Callable[[int], None]
ProblemKind = Literal["mismatch", "missing", "extra"]


@dataclass(frozen=True)
class FileDigest:
    """One file of a checkpoint as the Hub will see it."""

    path: str
    size: int
    sha256: str
    blob_id: str
    lfs: bool

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "size": self.size, "sha256": self.sha256,
                "blob_id": self.blob_id, "lfs": self.lfs}

    @classmethod
    def from_dict(cls, data: Any, *, where: str = "entry") -> FileDigest:
        """Read one `files` entry of a manifest.

        Raises:
            ValueError: `data` is not an object with the five keys of their types (the message
                names `where` and the key).
        """
        if not isinstance(data, Mapping):
            raise ValueError(f"{where} is a JSON {json_type(data)}, expected an object")
        for key, ok, wanted in _ENTRY_KEYS:
            if key not in data:
                raise ValueError(f"{where} has no {key!r}")
            if not ok(data[key]):
                raise ValueError(f"{where}: {key!r} must be {wanted}, got {data[key]!r:.40}")
        return cls(path=data["path"], size=data["size"], sha256=data["sha256"].lower(),
                   blob_id=data["blob_id"], lfs=data["lfs"])


def json_type(value: Any) -> str:
    """The JSON name of a decoded value's type (`object`, `array`, `string`, ...), for error messages."""
    names = {dict: "object", list: "array", str: "string", bool: "boolean", int: "number", float: "number"}
    return "null" if value is None else names.get(type(value), type(value).__name__)


def _is_sha256(value: Any) -> bool:
    return isinstance(value, str) and re.fullmatch(r"[0-9a-fA-F]{64}", value) is not None


#: (key, type test, what it must be) for every entry of a manifest's `files`.
_ENTRY_KEYS: tuple[tuple[str, Callable[[Any], bool], str], ...] = (
    ("path", lambda v: isinstance(v, str) and v != "", "a non-empty string"),
    ("size", lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0, "a non-negative integer"),
    ("sha256", _is_sha256, "64 hex digits"),
    ("blob_id", lambda v: isinstance(v, str), "a string"),
    ("lfs", lambda v: isinstance(v, bool), "true or false"),
)


@dataclass(frozen=True)
class Manifest:
    """Digests of every file of a checkpoint folder, sorted by path."""

    files: tuple[FileDigest, ...]

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    def by_path(self) -> dict[str, FileDigest]:
        return {f.path: f for f in self.files}

    def to_dict(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "algorithm": "sha256", "file_count": len(self.files),
                "total_bytes": self.total_bytes, "files": [f.to_dict() for f in self.files]}

    @classmethod
    def from_dict(cls, data: Any) -> Manifest:
        """Read a `dspark-hub/checksums/1` document.

        Raises:
            ValueError: not an object, no `files` array, or an entry of the wrong form (one line).
        """
        if not isinstance(data, Mapping):
            raise ValueError(f"is a JSON {json_type(data)}, expected an object with 'schema' and 'files'")
        files = data.get("files")
        if not isinstance(files, list):
            raise ValueError("has no 'files' array" if files is None else
                             f"'files' is a JSON {json_type(files)}, expected an array")
        digests = (FileDigest.from_dict(f, where=f"files[{i}]") for i, f in enumerate(files))
        return cls(files=tuple(sorted(digests, key=lambda f: f.path)))


@dataclass(frozen=True)
class FileProblem:
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

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "kind": self.kind, "message": self.message,
                "expected": self.expected, "actual": self.actual}


@dataclass(frozen=True)
class ChecksumFiles:
    """What `write_checksums` wrote."""

    sums_path: Path
    manifest_path: Path
    manifest: Manifest = field(repr=False)

    def to_dict(self) -> dict[str, Any]:
        return {"sums_path": str(self.sums_path), "manifest_path": str(self.manifest_path),
                "manifest": self.manifest.to_dict()}


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
        for line in attributes.read_text(encoding="utf-8", errors="replace").splitlines():
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
    """Relative POSIX paths of the files that make up a checkpoint folder, sorted.

    Skips tool folders (`IGNORED_DIRS`) and the checksum sidecars. Symlinks to files count as files.

    Raises:
        CheckpointNotFoundError: `folder` is not a directory.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise CheckpointNotFoundError(f"{folder}: not a directory; pass a checkpoint folder")
    found: list[str] = []
    for root, dirs, files in os.walk(folder, followlinks=True):
        dirs[:] = sorted(d for d in dirs if d not in IGNORED_DIRS)
        rel_root = Path(root).relative_to(folder)
        for name in files:
            rel = (rel_root / name).as_posix()
            if rel in SIDECAR_NAMES or not (Path(root) / name).is_file():
                continue
            found.append(rel)
    return sorted(found)


_buffers = threading.local()


def _buffer() -> memoryview:
    """This thread's reusable read buffer."""
    if not hasattr(_buffers, "view"):
        _buffers.view = memoryview(bytearray(CHUNK_SIZE))
    return _buffers.view


def _hash_file(path: Path, rel: str, patterns: tuple[str, ...], progress: Progress | None) -> FileDigest:
    size = path.stat().st_size
    sha256 = hashlib.sha256()
    view = _buffer()
    with open(path, "rb", buffering=0) as handle:
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
        progress: called with the number of bytes just hashed (from worker threads, serialized).
        paths: relative paths to hash instead of `checkpoint_files(folder)`.
        workers: hashing threads; defaults to one per CPU, at most one per file.

    Raises:
        CheckpointNotFoundError: the folder (or a listed path) does not exist.
    """
    folder = Path(folder)
    rels = sorted(paths) if paths is not None else checkpoint_files(folder)
    for rel in rels:
        if not (folder / rel).is_file():
            raise CheckpointNotFoundError(f"{folder / rel}: no such file; pass files inside {folder}")
    patterns = lfs_patterns(folder)
    report = _locked(progress)
    n_workers = max(1, min(workers or os.cpu_count() or 1, len(rels) or 1))
    with ThreadPoolExecutor(max_workers=n_workers, thread_name_prefix="dspark-hash") as pool:
        digests = list(pool.map(lambda rel: _hash_file(folder / rel, rel, patterns, report), rels))
    return Manifest(files=tuple(digests))


# --- the sidecar files ---------------------------------------------------------------------------

def _sums_line(digest: FileDigest) -> str:
    name = digest.path
    if "\\" in name or "\n" in name:  # GNU coreutils escaping
        escaped = name.replace("\\", "\\\\").replace("\n", "\\n")
        return f"\\{digest.sha256}  {escaped}\n"
    return f"{digest.sha256}  {name}\n"


def sums_text(manifest: Manifest) -> str:
    """`SHA256SUMS` content for a manifest (GNU coreutils format)."""
    return "".join(_sums_line(f) for f in manifest.files)


def manifest_text(manifest: Manifest) -> str:
    return json.dumps(manifest.to_dict(), indent=2) + "\n"


def write_text_atomic(path: Path, text: str) -> None:
    """Write `path` through a temporary sibling and a rename (replacing any existing file)."""
    with atomic_file(path, force=True, mode="w") as handle:
        handle.write(text)


def write_checksums(folder: Path | str, *, force: bool = False, progress: Progress | None = None,
                    manifest: Manifest | None = None, out_dir: Path | str | None = None) -> ChecksumFiles:
    """Write `SHA256SUMS` and `checksums.json` for a checkpoint folder.

    Args:
        folder: the checkpoint folder.
        force: replace existing sidecars.
        progress: see `compute_manifest`.
        manifest: digests already computed for this folder (skips hashing).
        out_dir: where to write the two files (default: the folder itself).

    Raises:
        RefusedOverwriteError: a sidecar exists and `force` is false (checked before hashing).
    """
    folder = Path(folder)
    target = Path(out_dir) if out_dir is not None else folder
    sums_path, manifest_path = target / SUMS_NAME, target / MANIFEST_NAME
    for path in (sums_path, manifest_path):
        if path.exists() and not force:
            raise RefusedOverwriteError(str(path))
    manifest = manifest if manifest is not None else compute_manifest(folder, progress=progress)
    target.mkdir(parents=True, exist_ok=True)
    write_text_atomic(sums_path, sums_text(manifest))
    write_text_atomic(manifest_path, manifest_text(manifest))
    return ChecksumFiles(sums_path=sums_path, manifest_path=manifest_path, manifest=manifest)


#: How to repair a sidecar `dspark-hub checksums` wrote.
REGENERATE = "regenerate it with 'dspark-hub checksums --force'"
_SUMS_LINE = re.compile(r"([0-9a-fA-F]{64}) [ *](.+)", re.DOTALL)
_SUMS_ESCAPES = {"\\": "\\", "n": "\n", "r": "\r"}


def read_sidecar_text(path: Path, remedy: str) -> str:
    """The UTF-8 text of a checksum file.

    Raises:
        CheckpointFormatError: the bytes are not UTF-8 (the message ends with `remedy`).
    """
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise CheckpointFormatError("NOT_UTF8", f"byte 0x{data[e.start]:02x} at offset {e.start} is not UTF-8 "
                                    f"text; {remedy}", path=str(path)) from None


def parse_sums(text: str, *, path: str, remedy: str = REGENERATE) -> list[tuple[str, str]]:
    """(file, lowercase sha256) for every line of GNU `sha256sum` output, in order, duplicates kept.

    Accepts the text form `sha256sum -c` reads: `<hex>  <name>` or `<hex> *<name>`, leading blanks,
    `#` comment lines, CRLF line ends, and the backslash-escaped form for names holding a newline,
    carriage return or backslash.

    Raises:
        CheckpointFormatError: a line of any other form (the message names `path`, the line and `remedy`).
    """
    pairs: list[tuple[str, str]] = []
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
        pairs.append((name, match.group(1).lower()))
    return pairs


def read_manifest(path: Path) -> Manifest:
    """Read a `checksums.json` this tool wrote.

    Raises:
        CheckpointFormatError: not UTF-8, not JSON, another schema, or entries of the wrong form.
    """
    text = read_sidecar_text(path, REGENERATE)
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as e:
        raise CheckpointFormatError("BAD_MANIFEST", f"not valid JSON ({str(e).splitlines()[0]}); {REGENERATE}",
                                    path=str(path)) from None
    if isinstance(data, dict) and data.get("schema") != SCHEMA:
        raise CheckpointFormatError("BAD_MANIFEST", f"schema is {data.get('schema')!r:.60}, expected {SCHEMA!r}; "
                                    f"{REGENERATE}", path=str(path))
    try:
        return Manifest.from_dict(data)
    except ValueError as e:
        raise CheckpointFormatError("BAD_MANIFEST", f"{e}; {REGENERATE}", path=str(path)) from None


@dataclass(frozen=True)
class Claim:
    """What one sidecar says about one file (`size` is None where the sidecar holds no size)."""

    sha256: str
    size: int | None
    source: str


def load_expected(folder: Path) -> dict[str, list[Claim]]:
    """path -> every claim `checksums.json` and `SHA256SUMS` make about it (both are read when both exist).

    Raises:
        CheckpointNotFoundError: neither file exists.
        CheckpointFormatError: a sidecar is malformed.
    """
    manifest_path, sums_path = folder / MANIFEST_NAME, folder / SUMS_NAME
    if not manifest_path.is_file() and not sums_path.is_file():
        raise CheckpointNotFoundError(f"{sums_path}: not found (nor {MANIFEST_NAME}); "
                                      f"run 'dspark-hub checksums {folder}' first")
    claims: dict[str, list[Claim]] = {}
    if manifest_path.is_file():
        for f in read_manifest(manifest_path).files:
            claims.setdefault(f.path, []).append(Claim(f.sha256, f.size, MANIFEST_NAME))
    if sums_path.is_file():
        for name, sha in parse_sums(read_sidecar_text(sums_path, REGENERATE), path=str(sums_path)):
            claims.setdefault(name, []).append(Claim(sha, None, SUMS_NAME))
    return claims


def _who(claims: Iterable[Claim]) -> str:
    """`SHA256SUMS says` / `checksums.json and SHA256SUMS say`."""
    sources = sorted({c.source for c in claims}, key=[MANIFEST_NAME, SUMS_NAME].index)
    return " and ".join(sources) + (" say" if len(sources) > 1 else " says")


def _listing_problems(rel: str, claims: list[Claim], sources: set[str], actual_size: int) -> list[FileProblem]:
    """Problems found without hashing: a sidecar that omits a present file, sizes that differ."""
    problems = [FileProblem(rel, "extra", f"{rel}: in the folder and {_who(claims).rsplit(' ', 1)[0]} but not in "
                            f"{source}; regenerate the checksums") for source in sorted(sources - {c.source for c in claims})]
    for size in sorted({c.size for c in claims if c.size is not None and c.size != actual_size}):
        said = [c for c in claims if c.size == size]
        problems.append(FileProblem(rel, "mismatch", f"{rel}: {actual_size} bytes, {_who(said)} {size}; "
                                    "the file is truncated or was replaced",
                                    expected=str(size), actual=str(actual_size)))
    return problems


def check_checksums(folder: Path | str, *, progress: Progress | None = None) -> list[FileProblem]:
    """Compare a folder with `checksums.json` and `SHA256SUMS` (each that exists); name every bad, missing and extra file.

    Sizes are compared before hashing, so a truncated file is reported without reading it. A file
    listed twice with different digests (as `sha256sum -c` would) fails on the digest it does not have.

    Raises:
        CheckpointNotFoundError: the folder has no checksum files.
        CheckpointFormatError: a checksum file is malformed.
    """
    folder = Path(folder)
    expected = load_expected(folder)
    sources = {c.source for claims in expected.values() for c in claims}
    present = set(checkpoint_files(folder))
    problems: list[FileProblem] = []
    to_hash: list[str] = []
    for rel, claims in expected.items():
        if rel not in present:
            problems.append(FileProblem(rel, "missing", f"{rel}: {_who(claims).rsplit(' ', 1)[0]} list it but it is "
                                        "not in the folder; restore it or regenerate the checksums",
                                        expected=claims[0].sha256))
            continue
        found = _listing_problems(rel, claims, sources, (folder / rel).stat().st_size)
        problems.extend(found)
        if not any(p.kind == "mismatch" for p in found):
            to_hash.append(rel)
    for rel in sorted(present - expected.keys()):
        problems.append(FileProblem(rel, "extra", f"{rel}: in the folder but not in the checksums; "
                                    "remove it or regenerate the checksums"))
    for digest in compute_manifest(folder, paths=to_hash, progress=progress).files:
        claims = expected[digest.path]
        for sha in sorted({c.sha256 for c in claims} - {digest.sha256}):
            problems.append(FileProblem(digest.path, "mismatch", f"{digest.path}: SHA-256 {digest.sha256[:12]}..., "
                                        f"{_who(c for c in claims if c.sha256 == sha)} {sha[:12]}...; "
                                        "the content changed or that checksum is wrong",
                                        expected=sha, actual=digest.sha256))
    return sorted(problems, key=lambda p: (p.path, p.kind))


# --- single files and known digests (used by cards) ----------------------------------------------

def sha256_file(path: str | os.PathLike[str], *, progress: Progress | None = None) -> str:
    """Hex SHA-256 of one file (same reader as `compute_manifest`)."""
    path = Path(path)
    return _hash_file(path, path.name, (), progress).sha256


@dataclass(frozen=True)
class ManifestEntry:
    """A file's known size and digest from a manifest (either may be unknown)."""

    size: int | None
    sha256: str | None


def load_checksum_manifest(path: str | os.PathLike[str]) -> dict[str, ManifestEntry]:
    """Read known digests: `sha256sum` output, or JSON (`{"files": [{"path", "size", "sha256"}]}`,
    `{"files": {name: {...}}}`, `[{...}]` or `{name: "hex"}`).

    Raises:
        UsageError: the file is missing or in none of these forms.
        CheckpointFormatError: the file is not UTF-8, or a sha256sum line is malformed.
    """
    p = Path(path)
    if not p.exists():
        raise UsageError(f"{p}: no such file; pass a checksum manifest (JSON or sha256sum output)")
    text = read_sidecar_text(p, _MANIFEST_FORMS)
    try:
        doc = json.loads(text)
    except json.JSONDecodeError:
        return _sha256sum_entries(p, text)
    except RecursionError:
        raise UsageError(f"{p}: JSON nested too deeply to read; {_MANIFEST_FORMS}") from None
    files = doc.get("files", doc) if isinstance(doc, dict) else doc
    out: dict[str, ManifestEntry] = {}
    items = files.items() if isinstance(files, dict) else ((None, e) for e in files) if isinstance(files, list) else ()
    for name, entry in items:
        if isinstance(entry, str):
            out[str(name)] = ManifestEntry(None, entry.lower())
        elif isinstance(entry, dict):
            key = name or entry.get("path") or entry.get("name") or entry.get("file")
            sha = entry.get("sha256")
            size = entry.get("size")
            out[str(key)] = ManifestEntry(size if isinstance(size, int) else None,
                                          sha.lower() if isinstance(sha, str) else None)
    if not out:
        raise UsageError(f"{p}: holds no file digests; expected sha256sum lines or {{\"files\": [...]}}")
    return out


_MANIFEST_FORMS = "pass sha256sum output or a JSON manifest"


def _sha256sum_entries(path: Path, text: str) -> dict[str, ManifestEntry]:
    out: dict[str, ManifestEntry] = {}
    for name, sha in parse_sums(text, path=str(path), remedy=_MANIFEST_FORMS):
        if name in out and out[name].sha256 != sha:
            raise UsageError(f"{path}: lists {name!r} twice with different digests; keep the right line")
        out[name] = ManifestEntry(None, sha)
    return out
