"""The checksum sidecars: write `SHA256SUMS` and `checksums.json`, and check a folder against them.

The digests, the hashing and the reading of both files live in `format.digests`; this module
decides what a folder's sidecars say and what differs.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from dspark_hub import schemas
from dspark_hub.documents import Document
from dspark_hub.errors import CheckpointNotFoundError, RefusedOverwriteError
from dspark_hub.format.digests import (
    MANIFEST_NAME,
    SUMS_NAME,
    FileDigest,
    FileProblem,
    Manifest,
    ManifestListing,
    checkpoint_files,
    compute_manifest,
    read_digest_file,
    read_manifest,
)
from dspark_hub.format.writer import atomic_file
from dspark_hub.progress import Progress


@dataclass(frozen=True)
class ChecksumFiles(Document):
    """What `write_checksums` wrote: the two sidecars for the checkpoint folder `path`."""

    SCHEMA = schemas.command("checksums")
    KEYS = ("path", "sums_path", "manifest_path", "**listing")

    path: Path
    sums_path: Path
    manifest_path: Path
    manifest: Manifest = field(repr=False)

    def listing(self) -> ManifestListing:
        """What the sidecars list (as `checksums.json`)."""
        return self.manifest.listing()


@dataclass(frozen=True)
class ChecksumCheck(Document):
    """What `check_checksums` found: every file that differs from the sidecars (none when `ok`)."""

    SCHEMA = schemas.command("checksums-check")
    KEYS = ("ok", "input=path", "path", "problems")

    path: Path
    problems: list[FileProblem]

    @property
    def ok(self) -> bool:
        return not self.problems


def _checkpoint_folder(folder: Path | str) -> Path:
    folder = Path(folder)
    if not folder.is_dir():
        raise CheckpointNotFoundError(f"{folder}: not a directory", hint="pass a checkpoint folder")
    return folder


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
        CheckpointNotFoundError: `folder` is not a directory.
        RefusedOverwriteError: a sidecar exists and `force` is false (checked before hashing).
    """
    folder = _checkpoint_folder(folder)
    target = Path(out_dir) if out_dir is not None else folder
    sums_path, manifest_path = target / SUMS_NAME, target / MANIFEST_NAME
    for path in (sums_path, manifest_path):
        if path.exists() and not force:
            raise RefusedOverwriteError(str(path))
    manifest = manifest if manifest is not None else compute_manifest(folder, progress=progress)
    target.mkdir(parents=True, exist_ok=True)
    write_text_atomic(sums_path, sums_text(manifest))
    write_text_atomic(manifest_path, manifest_text(manifest))
    return ChecksumFiles(path=folder, sums_path=sums_path, manifest_path=manifest_path, manifest=manifest)


def load_expected(folder: Path) -> dict[str, list[FileDigest]]:
    """path -> every statement `checksums.json` and `SHA256SUMS` make about it (both read when both exist).

    Raises:
        CheckpointNotFoundError: neither file exists.
        CheckpointFormatError: a sidecar is malformed.
    """
    manifest_path, sums_path = folder / MANIFEST_NAME, folder / SUMS_NAME
    if not manifest_path.is_file() and not sums_path.is_file():
        raise CheckpointNotFoundError(f"{sums_path}: not found (nor {MANIFEST_NAME})",
                                      hint=f"write them with 'dspark-hub checksums {folder}' first")
    claims: dict[str, list[FileDigest]] = {}
    statements: list[FileDigest] = []
    if manifest_path.is_file():
        statements += read_manifest(manifest_path).files
    if sums_path.is_file():
        statements += read_digest_file(sums_path)
    for digest in statements:
        claims.setdefault(digest.path, []).append(digest)
    return claims


def _who(claims: Iterable[FileDigest]) -> str:
    """`SHA256SUMS says` / `checksums.json and SHA256SUMS say`."""
    sources = sorted({str(c.origin) for c in claims}, key=[MANIFEST_NAME, SUMS_NAME].index)
    return " and ".join(sources) + (" say" if len(sources) > 1 else " says")


def _listing_problems(rel: str, claims: list[FileDigest], sources: set[str], actual_size: int) -> list[FileProblem]:
    """Problems found without hashing: a sidecar that omits a present file, sizes that differ."""
    listed_by = _who(claims).rsplit(" ", 1)[0]
    problems = [FileProblem(rel, "extra", f"{rel}: in the folder and {listed_by} but not in {source}; "
                            "regenerate the checksums")
                for source in sorted(sources - {str(c.origin) for c in claims})]
    for size in sorted({c.size for c in claims if c.size is not None and c.size != actual_size}):
        said = [c for c in claims if c.size == size]
        change = "is shorter than listed (truncated)" if actual_size < size else "grew since it was listed"
        problems.append(FileProblem(rel, "mismatch", f"{rel}: {actual_size} bytes, {_who(said)} {size}; the file "
                                    f"{change} or was replaced", expected=str(size), actual=str(actual_size)))
    return problems


def has_sidecars(folder: Path | str) -> bool:
    """Whether the folder carries `SHA256SUMS` or `checksums.json`."""
    return any((Path(folder) / name).is_file() for name in (SUMS_NAME, MANIFEST_NAME))


def check_checksums(folder: Path | str, *, progress: Progress | None = None,
                    manifest: Manifest | None = None) -> ChecksumCheck:
    """Compare a folder with `checksums.json` and `SHA256SUMS` (each that exists); name every bad, missing
    and extra file.

    Sizes are compared before hashing, so a truncated file is reported without reading it. A file
    listed twice with different digests (as `sha256sum -c` would) fails on the digest it does not have.
    `manifest`: the folder's digests, when already computed (`publish` hashes once); files it does
    not list are hashed here.

    Returns:
        A `ChecksumCheck` whose `problems` are sorted by path and kind.

    Raises:
        CheckpointNotFoundError: `folder` is not a directory, or has no checksum files.
        CheckpointFormatError: a checksum file is malformed.
    """
    folder = _checkpoint_folder(folder)
    expected = load_expected(folder)
    sources = {str(c.origin) for claims in expected.values() for c in claims}
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
    known = manifest.by_path() if manifest is not None else {}
    computed = compute_manifest(folder, paths=[rel for rel in to_hash if rel not in known], progress=progress)
    for digest in [known[rel] for rel in to_hash if rel in known] + list(computed.files):
        claims = expected[digest.path]
        actual = str(digest.sha256)
        for sha in sorted({str(c.sha256) for c in claims} - {actual}):
            problems.append(FileProblem(digest.path, "mismatch", f"{digest.path}: SHA-256 {actual[:12]}..., "
                                        f"{_who(c for c in claims if c.sha256 == sha)} {sha[:12]}...; "
                                        "the content changed or that checksum is wrong",
                                        expected=sha, actual=actual))
    return ChecksumCheck(path=folder, problems=sorted(problems, key=lambda p: (p.path, p.kind)))
