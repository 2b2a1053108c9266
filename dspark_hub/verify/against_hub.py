"""`verify --against-hub`: local files against a Hub revision's sizes, LFS SHA-256 and git blob ids."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from dspark_hub.documents import Document
from dspark_hub.format.digests import FileDigest, FileProblem, Manifest, compute_manifest, git_blob_sha1
from dspark_hub.format.folder import folder_files, read_regular
from dspark_hub.format.hub_http import network_scope
from dspark_hub.format.remote import HOUSEKEEPING_FILES, HubSource, hf_location
from dspark_hub.progress import Progress


@dataclass(frozen=True)
class HubComparison(Document):
    """Local files against a Hub revision. The Hub is the reference: `missing` = not in the folder,
    `extra` = in the folder but not on the Hub, `mismatch` = size or digest differs."""

    KEYS = ("location", "commit", "files_compared", "ok", "problems")

    location: str
    commit: str
    files_compared: int
    problems: list[FileProblem]

    @property
    def ok(self) -> bool:
        return not self.problems


def compare_files(folder: Path, local: Iterable[FileDigest], remote: Mapping[str, FileDigest], *,
                  location: str, ignore_remote: Iterable[str] = HOUSEKEEPING_FILES) -> list[FileProblem]:
    """Name every file that differs between local digests and a remote listing (Hub = reference).

    LFS files compare SHA-256 with the LFS oid; regular files compare the git blob SHA-1 of the
    content with the Hub's blob id (re-hashed here if we predicted LFS for a file the Hub keeps
    as a regular file). Remote-only files in `ignore_remote` are not reported.
    """
    problems: list[FileProblem] = []
    local_by_path = {d.path: d for d in local}
    for path, digest in sorted(local_by_path.items()):
        theirs = remote.get(path)
        if theirs is None:
            problems.append(FileProblem(path, "extra", f"{path}: in the folder but not on {location}; "
                                        "upload it, or remove it from the folder", actual=digest.sha256))
            continue
        if theirs.size != digest.size:
            problems.append(FileProblem(path, "mismatch", f"{path}: {digest.size} bytes here, {theirs.size} on "
                                        f"{location}; {_size_difference(digest.size, theirs.size)}",
                                        expected=str(theirs.size), actual=str(digest.size)))
        elif theirs.sha256 is not None and theirs.sha256 != digest.sha256:
            problems.append(FileProblem(path, "mismatch", f"{path}: SHA-256 {(digest.sha256 or '')[:12]}... here, "
                                        f"{theirs.sha256[:12]}... on {location}; the content differs",
                                        expected=theirs.sha256, actual=digest.sha256))
        elif theirs.sha256 is None:
            ours = digest.blob_id if not digest.lfs else git_blob_sha1(read_regular(folder / path))
            if ours != theirs.blob_id:
                problems.append(FileProblem(path, "mismatch", f"{path}: git blob {(ours or '')[:12]}... here, "
                                            f"{(theirs.blob_id or '')[:12]}... on {location}; the content differs",
                                            expected=theirs.blob_id, actual=ours))
    skipped = set(ignore_remote)
    for path in sorted(remote.keys() - local_by_path.keys()):
        if path not in skipped:
            problems.append(FileProblem(path, "missing", f"{path}: on {location} but not in the folder; "
                                        "download it, or delete it from the repository",
                                        expected=remote[path].sha256 or remote[path].blob_id))
    return problems


def _size_difference(here: int | None, there: int | None) -> str:
    """What a size difference suggests, by its direction."""
    if here is not None and there is not None and here > there:
        return "the local file is larger: a different version, or the upload was cut short"
    return "the local file is smaller: truncated, or a different version"


def local_digests(folder: Path, *, progress: Progress | None = None) -> Manifest:
    """Digests of every file of a folder, its checksum sidecars included (both get published).

    Raises:
        CheckpointFormatError: the folder holds an entry the listing leaves out (`format.folder`).
    """
    return compute_manifest(folder, paths=folder_files(folder), progress=progress)


def compare_with_hub(folder: Path | str, repo_id: str, revision: str | None = None, *,
                     endpoint: str | None = None, token: str | bool | None = None,
                     manifest: Manifest | None = None, progress: Progress | None = None) -> HubComparison:
    """Compare a local folder with a Hub revision: every mismatching, missing and extra file.

    Args:
        folder: the local checkpoint folder.
        repo_id: `ORG/NAME`.
        revision: branch, tag or commit (default `main`).
        endpoint: the Hub endpoint (default: HF_ENDPOINT / huggingface.co).
        token: a token (default: huggingface_hub's usual sources).
        manifest: local digests already computed (skips hashing).
        progress: called with bytes hashed.

    Raises:
        HubError: the repository or revision cannot be read.
        CheckpointNotFoundError: `folder` is not a directory.
    """
    folder = Path(folder)
    local = manifest if manifest is not None else local_digests(folder, progress=progress)
    source = HubSource(repo_id, revision, endpoint=endpoint, token=token)
    with network_scope(source.endpoint):   # one budget of waiting for the revision and its listing
        remote = source.remote_files()
    location = hf_location(repo_id, revision or "main")
    problems = compare_files(folder, local.files, remote, location=location)
    return HubComparison(location=location, commit=source.commit, files_compared=len(local.files),
                         problems=problems)
