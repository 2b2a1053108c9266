"""Everything needed to publish and mirror a checkpoint: checksums, `.gitattributes`, a torrent, a magnet.

The torrent is deterministic (no creation date, no `created by`, not private, fixed piece size
rule), so the same checkpoint always gives the same info-hash. Its web seeds are the Hub's
resolve URLs for `repo@revision` (BEP 19, GetRight style). For a multi-file torrent a client
builds each file's URL as `<url-list entry> + <torrent name> + "/" + <path in torrent>`; with
the web seed `{endpoint}/{repo}/resolve/` and the torrent named after the revision, that is
exactly `{endpoint}/{repo}/resolve/{revision}/{path}`, the Hub's download URL. Name the
revision by commit sha when you can: a branch moves, the torrent's pieces do not.

`torf` is imported inside `package` (header-level commands never pay for it).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from dspark_hub import schemas
from dspark_hub.documents import Document
from dspark_hub.errors import CheckpointNotFoundError, MissingDependencyError, UsageError
from dspark_hub.format.digests import (
    GITATTRIBUTES_NAME,
    LFS_ATTRIBUTES,
    MANIFEST_NAME,
    SUMS_NAME,
    Manifest,
    checkpoint_files,
    compute_manifest,
    lfs_patterns,
    matches_gitattributes,
)
from dspark_hub.format.remote import resolve_endpoint, validate_repo_id
from dspark_hub.format.urls import public_url
from dspark_hub.format.writer import Checked, atomic_dir, check_writable, refuse_own_inputs, write_file
from dspark_hub.hub.checksums import manifest_text, sums_text

#: `progress(stage, bytes_done, bytes_total)`; stage is "checksums" then "pieces".
PackageProgress = Callable[[str, int, int], None]


@dataclass(frozen=True)
class PackageResult(Document):
    """What `package` wrote (the package folder `path`, from the checkpoint folder `input`), and the torrent."""

    SCHEMA = schemas.command("package")
    KEYS = ("input", "path", "files", "repo_id", "revision", "infohash", "magnet", "webseeds", "piece_size",
            "file_count", "total_bytes")

    input: Path
    path: Path
    files: dict[str, Path]
    repo_id: str
    revision: str
    infohash: str
    magnet: str
    webseeds: list[str]
    piece_size: int
    manifest: Manifest

    @property
    def file_count(self) -> int:
        return len(self.manifest.files)

    @property
    def total_bytes(self) -> int:
        return self.manifest.total_bytes


def gitattributes_text(manifest: Manifest, patterns: tuple[str, ...]) -> str:
    """`.gitattributes` routing every LFS file of the manifest through LFS.

    The patterns come first (the Hub's defaults plus the folder's own); files that are LFS only
    because of their size or content get an explicit line, so git and the Hub agree with
    `FileDigest.lfs` for every file.
    """
    lines = [f"{pattern} {LFS_ATTRIBUTES}" for pattern in patterns]
    for digest in manifest.files:
        if digest.lfs and not any(matches_gitattributes(digest.path, p) for p in patterns):
            lines.append(f"{_escape_gitattributes_path(digest.path)} {LFS_ATTRIBUTES}")
    return "\n".join(lines) + "\n"


def _escape_gitattributes_path(path: str) -> str:
    escaped = "".join(f"\\{c}" if c in "*?[]\\ " else c for c in path)
    return "/" + escaped  # anchored: this file only


def webseed_urls(repo_id: str, revision: str, endpoint: str, *, single_file: str | None = None) -> list[str]:
    """BEP 19 web seeds resolving to `{endpoint}/{repo}/resolve/{revision}/{path}` (see module doc)."""
    base = f"{endpoint.rstrip('/')}/{repo_id}/resolve/"
    if single_file is not None:  # a single-file torrent's URL is used as is
        return [f"{base}{quote(revision, safe='')}/{quote(single_file)}"]
    return [base]


def _torf() -> Any:
    try:
        import torf
    except ImportError:  # pragma: no cover - a declared dependency
        raise MissingDependencyError("package needs torf; pip install 'torf>=4.2'") from None
    return torf


#: What `git check-ref-format` refuses in one ref component: control characters and space, `~^:?*[\\`,
#: `..` and `@{`; '/' is refused too (the revision names the torrent, a single path component).
_BAD_REF = re.compile(r"[\x00-\x20\x7f~^:?*\[\\/]|\.\.|@\{")


def _check_revision(revision: str) -> str:
    """A revision usable as a git ref component and a torrent name (branch, tag or commit sha)."""
    if (not revision or revision == "@" or _BAD_REF.search(revision) or any(c.isspace() for c in revision)
            or revision.startswith((".", "-")) or revision.endswith((".", ".lock"))):
        raise UsageError(f"{revision!r} is not a git branch, tag or commit sha usable here (no whitespace, '/', "
                         "'..', '~^:?*[\\', '@{', leading '.' or '-'); pass e.g. main or a commit sha",
                         param="revision")
    return revision


def _check_out_dir(folder: Path, out_dir: Path, force: bool) -> Checked:
    refuse_own_inputs(out_dir, [("folder", folder)], param="out_dir", folder=True)
    return check_writable(out_dir, force=force)


def _refuse_aliases(folder: Path, manifest: Manifest) -> None:
    """Refuse two paths that are one file (a symlink beside its target): a torrent lists each file once.

    Raises:
        UsageError: naming both paths.
    """
    seen: dict[str, str] = {}
    for digest in manifest.files:
        real = os.path.realpath(folder / digest.path)
        if real in seen:
            raise UsageError(f"{folder}: {seen[real]} and {digest.path} are one file (a symlink to the other, or "
                             "to the same blob); a torrent lists each file once, so replace the link with a copy")
        seen[real] = digest.path


def build_torrent(folder: Path, manifest: Manifest, *, repo_id: str, revision: str, endpoint: str,
                  progress: PackageProgress | None = None) -> Any:
    """A hashed, deterministic `torf.Torrent` of the manifest's files with Hub web seeds."""
    torf = _torf()
    paths = [folder / f.path for f in manifest.files]
    _refuse_aliases(folder, manifest)
    torrent = torf.Torrent(created_by=None, creation_date=None, private=None, randomize_infohash=False,
                           comment=f"hf://{repo_id}@{revision}")
    torrent.filepaths = paths
    single = torrent.mode == "singlefile"
    listed = sorted(Path(*f["path"]).as_posix() for f in torrent.metainfo["info"].get("files", []))
    if not single and listed != sorted(f.path for f in manifest.files):
        raise UsageError(f"{folder}: files must sit under the checkpoint folder itself (found {listed[:3]}...)")
    torrent.name = manifest.files[0].path if single else revision
    torrent.piece_size = torf.Torrent.calculate_piece_size(manifest.total_bytes)
    torrent.webseeds = webseed_urls(repo_id, revision, endpoint, single_file=manifest.files[0].path if single else None)
    total = manifest.total_bytes

    def report(_torrent: Any, _path: str, done: int, count: int) -> None:
        if progress is not None:
            progress("pieces", min(total, done * torrent.piece_size), total)

    torrent.generate(callback=report if progress is not None else None, interval=0.2)
    if progress is not None:
        progress("pieces", total, total)
    return torrent


def package(folder: Path | str, repo_id: str, *, out_dir: Path | str, revision: str = "main",
            endpoint: str | None = None, force: bool = False, progress: PackageProgress | None = None,
            manifest: Manifest | None = None) -> PackageResult:
    """Write `SHA256SUMS`, `checksums.json`, `.gitattributes`, `<name>.torrent` and `<name>.magnet` to `out_dir`.

    The folder is never modified; `out_dir` appears complete or not at all (built in a hidden
    sibling and renamed).

    Args:
        folder: the checkpoint folder.
        repo_id: `ORG/NAME` the checkpoint is (or will be) published to; names the web seeds.
        out_dir: the package folder (must not overlap `folder`).
        revision: the Hub revision the web seeds point at (a commit sha is best).
        endpoint: the Hub endpoint of the web seeds (default: HF_ENDPOINT / huggingface.co); credentials in its
            URL (`https://user:password@host`) are left out of every file written.
        force: replace an existing `out_dir`.
        progress: `progress(stage, done, total)` while hashing files then torrent pieces.
        manifest: digests already computed for this folder (skips the checksum pass).

    Raises:
        RefusedOverwriteError: `out_dir` exists and `force` is off (checked before hashing).
        UsageError: bad repo id, revision or endpoint, or `out_dir` overlaps `folder`.
        CheckpointNotFoundError: `folder` is not a directory or holds no file.
    """
    folder, out_dir = Path(folder), Path(out_dir)
    validate_repo_id(repo_id)
    _check_revision(revision)
    if not folder.is_dir():
        raise CheckpointNotFoundError(f"{folder}: not a directory", hint="pass a checkpoint folder")
    checked = _check_out_dir(folder, out_dir, force)
    endpoint = public_url(resolve_endpoint(endpoint))   # shared files never carry the endpoint's credentials
    if manifest is None:
        manifest = _hash(folder, progress)
    if not manifest.files or manifest.total_bytes == 0:
        raise CheckpointNotFoundError(f"{folder}: no file with content to package")
    torrent = build_torrent(folder, manifest, repo_id=repo_id, revision=revision, endpoint=endpoint,
                            progress=progress)
    stem = repo_id.split("/")[1]
    magnet = str(torrent.magnet())
    contents = {
        SUMS_NAME: sums_text(manifest),
        MANIFEST_NAME: manifest_text(manifest),
        GITATTRIBUTES_NAME: gitattributes_text(manifest, lfs_patterns(folder)),
        f"{stem}.magnet": magnet + "\n",
    }
    with atomic_dir(out_dir, force=force, checked=checked) as tmp:
        for name, text in contents.items():
            write_file(tmp / name, text)
        torrent.write(tmp / f"{stem}.torrent")
    written = {name: out_dir / name for name in [*contents, f"{stem}.torrent"]}
    return PackageResult(input=folder, path=out_dir, files=written, repo_id=repo_id, revision=revision,
                         infohash=str(torrent.infohash), magnet=magnet, webseeds=list(torrent.webseeds),
                         piece_size=int(torrent.piece_size), manifest=manifest)


def _hash(folder: Path, progress: PackageProgress | None) -> Manifest:
    if progress is None:
        return compute_manifest(folder)
    total = sum((folder / p).stat().st_size for p in checkpoint_files(folder))
    done = 0

    def report(n: int) -> None:
        nonlocal done
        done += n
        progress("checksums", done, total)
    return compute_manifest(folder, progress=report)
