"""The Hugging Face Hub side: read a repo with range requests, compare it with local files, publish.

- `HubSource`: a `checkpoint.Source` over `hf://ORG/NAME[@REV]`; every read is an HTTP range
  request pinned to the commit the revision resolved to, so `verify hf://...` never downloads weights.
- `compare_with_hub`: local SHA-256 / git blob SHA-1 / sizes against the Hub's listing.
- `publish`: create the repo, upload (weights through LFS, or xet where the client has it), tag,
  then re-list the remote files and compare them with the local digests.

`huggingface_hub` is imported inside the functions (header-level commands never pay for it).
The token comes from `token=` or huggingface_hub's usual sources (HF_TOKEN, the login file) and is
never put in a message: every Hub failure becomes a one-line `HubError`.
"""

from __future__ import annotations

import os
import re
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Literal, Mapping, Sequence

from . import __version__
from .checksums import (
    SIDECAR_NAMES, FileDigest, FileProblem, Manifest, Progress, checkpoint_files, compute_manifest, git_blob_sha1,
)
from .errors import DsparkError, HubError, MissingDependencyError, UsageError

HF_SCHEME = "hf://"
_NAME = r"[A-Za-z0-9][A-Za-z0-9._-]*"
_REPO_ID = re.compile(rf"^{_NAME}/{_NAME}$")
#: Remote files that the Hub or our packaging adds on its own; not reported as extra when absent locally.
HOUSEKEEPING_FILES = (".gitattributes",)
#: Files uploaded last within the commit's listing order (the card and config describe the weights).
_LAST = ("config.json", "README.md")
#: Range reads are small; a GET that ignores `Range` is cut off after this many bytes.
_READ_TIMEOUT = 30.0


def _huggingface_hub() -> Any:
    try:
        import huggingface_hub
    except ImportError:  # pragma: no cover - a declared dependency
        raise MissingDependencyError("Hub access needs huggingface_hub; pip install 'huggingface_hub>=1.0'") from None
    return huggingface_hub


# --- names -----------------------------------------------------------------------------------------

def is_hf_url(value: str) -> bool:
    return str(value).startswith(HF_SCHEME)


def validate_repo_id(repo_id: str) -> str:
    """Return `repo_id` if it is `ORG/NAME`; raise `UsageError` otherwise."""
    if not _REPO_ID.match(repo_id or "") or ".." in repo_id:
        raise UsageError(f"{repo_id!r}: not a Hub repository id; write it as ORG/NAME")
    return repo_id


def parse_hf_url(url: str) -> tuple[str, str | None]:
    """Split `hf://ORG/NAME[@REV]` into `(repo_id, revision or None)`.

    The revision is everything after the first `@` (so `refs/pr/1` works); a leading
    `models/` is accepted and dropped.

    Raises:
        UsageError: not an `hf://` URL of a model repository.
    """
    if not is_hf_url(url):
        raise UsageError(f"{url!r}: not a Hub URL; write it as hf://ORG/NAME[@REVISION]")
    repo_part, sep, revision = url[len(HF_SCHEME):].partition("@")
    repo_part = repo_part.strip("/").removeprefix("models/")
    if sep and not revision:
        raise UsageError(f"{url!r}: empty revision after '@'; name a branch, tag or commit")
    try:
        return validate_repo_id(repo_part), (revision or None)
    except UsageError:
        raise UsageError(f"{url!r}: not a Hub URL; write it as hf://ORG/NAME[@REVISION]") from None


def hf_location(repo_id: str, revision: str | None = None) -> str:
    return f"{HF_SCHEME}{repo_id}" + (f"@{revision}" if revision else "")


def resolve_endpoint(endpoint: str | None) -> str:
    """The Hub endpoint to use: the argument, else huggingface_hub's (HF_ENDPOINT at its import)."""
    if endpoint:
        return endpoint.rstrip("/")
    _huggingface_hub()
    from huggingface_hub import constants   # a submodule: not an attribute until imported

    return str(constants.ENDPOINT).rstrip("/")


# --- errors ----------------------------------------------------------------------------------------

def _scrub(text: str, token: str | bool | None) -> str:
    """Remove any token (the one given, or the environment's) from a message; keep it on one line."""
    for secret in (token, os.environ.get("HF_TOKEN"), os.environ.get("HUGGING_FACE_HUB_TOKEN")):
        if isinstance(secret, str) and len(secret) >= 4:
            text = text.replace(secret, "<token>")
    return " ".join(text.split())


def _status(exc: BaseException) -> int | None:
    response = getattr(exc, "response", None)
    return getattr(response, "status_code", None)


def _is_transport_error(exc: BaseException) -> bool:
    if isinstance(exc, (ConnectionError, TimeoutError)):
        return True
    names = {cls.__name__ for cls in type(exc).__mro__}
    return bool(names & {"TransportError", "TimeoutException", "NetworkError", "ConnectError"})


def _describe(exc: BaseException, where: str, endpoint: str, action: str) -> str | None:
    """One line `<where>: <what is wrong>; <what to do>` for a huggingface_hub failure, or None."""
    errors = _huggingface_hub().errors
    if isinstance(exc, errors.OfflineModeIsEnabled):
        return f"{where}: HF_HUB_OFFLINE is set, so the Hub cannot be reached; unset it to {action}"
    if isinstance(exc, errors.RevisionNotFoundError):
        return f"{where}: revision not found; name an existing branch, tag or commit"
    if isinstance(exc, errors.GatedRepoError):
        return f"{where}: the repository is gated; accept its conditions on the Hub with this account"
    if isinstance(exc, errors.RepositoryNotFoundError):
        return (f"{where}: repository not found or not readable with this token; check the name, "
                "or log in with 'hf auth login' (private repositories need a token)")
    if isinstance(exc, errors.EntryNotFoundError) and not isinstance(exc, errors.LocalEntryNotFoundError):
        return f"{where}: file not found in the repository at this revision; check the path and revision"
    status = _status(exc)
    if status == 401:
        return (f"{where}: the Hub rejected the token (401 Unauthorized); log in again with "
                "'hf auth login' or set HF_TOKEN to a valid token")
    if status == 403:
        return (f"{where}: permission denied (403 Forbidden) to {action}; use a token with write access "
                "to this namespace")
    if status == 412:
        return f"{where}: the branch moved while committing (412); run the command again"
    if isinstance(exc, errors.HfHubHTTPError):
        server = getattr(exc, "server_message", "") or ""
        detail = f" ({server})" if server else ""
        return f"{where}: the Hub answered HTTP {status} while trying to {action}{detail}; run it again later"
    if isinstance(exc, errors.LocalEntryNotFoundError) or _is_transport_error(exc):
        return (f"{where}: cannot reach the Hub at {endpoint} ({type(exc).__name__}); "
                "check the network, or the endpoint (--endpoint / HF_ENDPOINT)")
    return None


@contextmanager
def hub_errors(where: str, *, endpoint: str, token: str | bool | None, action: str) -> Iterator[None]:
    """Turn huggingface_hub and network failures raised inside the block into `HubError`."""
    try:
        yield
    except DsparkError:
        raise
    except Exception as exc:
        cause: BaseException | None = exc
        while cause is not None:  # the LFS uploader wraps the real failure in a RuntimeError
            message = _describe(cause, where, endpoint, action)
            if message is not None:
                if cause is not exc and isinstance(exc, RuntimeError):
                    message = f"{message} [{_scrub(str(exc), token)}]"
                raise HubError(_scrub(message, token)) from exc
            cause = cause.__cause__
        if isinstance(exc, RuntimeError):
            raise HubError(_scrub(f"{where}: {action} failed: {exc}; run it again (finished uploads are "
                                  "not sent twice)", token)) from exc
        raise


# --- reading a repository ------------------------------------------------------------------------

@dataclass(frozen=True)
class RemoteFile:
    """A file of a Hub repository as the tree listing shows it."""

    path: str
    size: int
    blob_id: str
    lfs_sha256: str | None

    @property
    def lfs(self) -> bool:
        return self.lfs_sha256 is not None

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "size": self.size, "blob_id": self.blob_id,
                "lfs": self.lfs, "lfs_sha256": self.lfs_sha256}


class HubSource:
    """A checkpoint on the Hub, read file by file with HTTP range requests.

    The revision is resolved to a commit once (on first use); every later call reads that
    commit, so a branch moving mid-verify cannot mix two versions. `token`: a token, `False`
    for anonymous access, `None` for huggingface_hub's usual sources (HF_TOKEN, login file).

    Example:
        >>> src = HubSource.from_url("hf://Inferact/Kimi-K3-DSpark@main")
        >>> src.read_bytes("model.safetensors", 0, 8)   # the header length, one range request
    """

    def __init__(self, repo_id: str, revision: str | None = None, *, endpoint: str | None = None,
                 token: str | bool | None = None) -> None:
        self.repo_id = validate_repo_id(repo_id)
        self.revision = revision
        self.endpoint = resolve_endpoint(endpoint)
        self._token = token
        self._commit: str | None = None
        self._files: dict[str, RemoteFile] | None = None
        #: Body bytes received by `read_bytes` so far.
        self.bytes_read = 0
        self.requests = 0

    @classmethod
    def from_url(cls, url: str, *, endpoint: str | None = None, token: str | bool | None = None) -> HubSource:
        repo_id, revision = parse_hf_url(url)
        return cls(repo_id, revision, endpoint=endpoint, token=token)

    @property
    def location(self) -> str:
        return hf_location(self.repo_id, self.revision)

    def __repr__(self) -> str:  # never show the token
        return f"HubSource({self.location!r}, endpoint={self.endpoint!r})"

    def _errors(self, action: str, where: str | None = None) -> Any:
        return hub_errors(where or self.location, endpoint=self.endpoint, token=self._token, action=action)

    def _api(self) -> Any:
        return _huggingface_hub().HfApi(endpoint=self.endpoint, token=self._token,
                                        library_name="dspark-hub", library_version=__version__)

    @property
    def commit(self) -> str:
        """The 40-hex commit the revision resolved to."""
        if self._commit is None:
            with self._errors("read the repository"):
                info = self._api().model_info(self.repo_id, revision=self.revision)
            self._commit = str(info.sha)
        return self._commit

    def remote_files(self) -> dict[str, RemoteFile]:
        """Every file at the resolved commit, with size, git blob id and LFS SHA-256."""
        if self._files is None:
            commit = self.commit
            with self._errors("list the repository files"):
                entries = list(self._api().list_repo_tree(self.repo_id, revision=commit, recursive=True))
            files = {}
            for entry in entries:
                if not hasattr(entry, "blob_id"):  # a folder
                    continue
                lfs = getattr(entry, "lfs", None)
                files[entry.path] = RemoteFile(path=entry.path, size=int(entry.size), blob_id=str(entry.blob_id),
                                               lfs_sha256=str(lfs.sha256) if lfs is not None else None)
            self._files = dict(sorted(files.items()))
        return self._files

    def list_files(self) -> dict[str, int]:
        """Relative path -> size, for every file of the repository at the resolved commit."""
        return {path: f.size for path, f in self.remote_files().items()}

    def url(self, name: str) -> str:
        """The resolve URL of a file at the resolved commit."""
        return _huggingface_hub().hf_hub_url(self.repo_id, name, revision=self.commit, endpoint=self.endpoint)

    def read_bytes(self, name: str, start: int, length: int) -> bytes:
        """`length` bytes of `name` from `start` (fewer at end of file), with one HTTP range request.

        A server that ignores `Range` is read only up to the bytes needed, then the connection
        is dropped: never the whole weight file.
        """
        if length <= 0:
            return b""
        hf = _huggingface_hub()
        url = self.url(name)
        headers = hf.utils.build_hf_headers(token=self._token, library_name="dspark-hub",
                                            library_version=__version__)
        headers["Range"] = f"bytes={start}-{start + length - 1}"
        where = f"{self.location}/{name}"
        with self._errors(f"read {name}", where):
            with hf.utils.get_session().stream("GET", url, headers=headers, timeout=_READ_TIMEOUT) as response:
                self.requests += 1
                if response.status_code == 416:  # the range starts at or after the end of the file
                    return b""
                hf.utils.hf_raise_for_status(response)
                skip = start if response.status_code == 200 else 0
                data = bytearray()
                for chunk in response.iter_bytes():
                    self.bytes_read += len(chunk)
                    data += chunk
                    if len(data) >= skip + length:
                        break
        return bytes(data[skip:skip + length])


# --- comparing -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class HubComparison:
    """Local files against a Hub revision. The Hub is the reference: `missing` = not in the folder,
    `extra` = in the folder but not on the Hub, `mismatch` = size or digest differs."""

    location: str
    commit: str
    files_compared: int
    problems: list[FileProblem]

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        return {"schema": "dspark-hub/hub-compare/1", "location": self.location, "commit": self.commit,
                "files_compared": self.files_compared, "ok": self.ok,
                "problems": [p.to_dict() for p in self.problems]}


def compare_files(folder: Path, local: Iterable[FileDigest], remote: Mapping[str, RemoteFile], *,
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
                                        f"{location}; the local file is truncated or a different version",
                                        expected=str(theirs.size), actual=str(digest.size)))
        elif theirs.lfs_sha256 is not None and theirs.lfs_sha256 != digest.sha256:
            problems.append(FileProblem(path, "mismatch", f"{path}: SHA-256 {digest.sha256[:12]}... here, "
                                        f"{theirs.lfs_sha256[:12]}... on {location}; the content differs",
                                        expected=theirs.lfs_sha256, actual=digest.sha256))
        elif theirs.lfs_sha256 is None:
            ours = digest.blob_id if not digest.lfs else git_blob_sha1((folder / path).read_bytes())
            if ours != theirs.blob_id:
                problems.append(FileProblem(path, "mismatch", f"{path}: git blob {ours[:12]}... here, "
                                            f"{theirs.blob_id[:12]}... on {location}; the content differs",
                                            expected=theirs.blob_id, actual=ours))
    skipped = set(ignore_remote)
    for path in sorted(remote.keys() - local_by_path.keys()):
        if path not in skipped:
            problems.append(FileProblem(path, "missing", f"{path}: on {location} but not in the folder; "
                                        "download it, or delete it from the repository",
                                        expected=remote[path].lfs_sha256 or remote[path].blob_id))
    return problems


def local_digests(folder: Path, *, progress: Progress | None = None) -> Manifest:
    """Digests of a folder's checkpoint files plus its checksum sidecars (both get published)."""
    folder = Path(folder)
    sidecars = [name for name in sorted(SIDECAR_NAMES) if (folder / name).is_file()]
    return compute_manifest(folder, paths=checkpoint_files(folder) + sidecars, progress=progress)


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
    remote = source.remote_files()
    location = hf_location(repo_id, revision or "main")
    problems = compare_files(folder, local.files, remote, location=location)
    return HubComparison(location=location, commit=source.commit, files_compared=len(local.files),
                         problems=problems)


# --- publishing ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class PlannedFile:
    """One file a publish sends."""

    path: str
    size: int
    lfs: bool
    sha256: str
    source: str

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "size": self.size, "lfs": self.lfs, "sha256": self.sha256,
                "source": self.source}


@dataclass(frozen=True)
class PublishPlan:
    """What `publish` sends, in upload order (LFS weights first, the card and config last)."""

    repo_id: str
    revision: str
    endpoint: str
    private: bool | None
    tag: str | None
    commit_message: str
    files: list[PlannedFile]

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def lfs_bytes(self) -> int:
        return sum(f.size for f in self.files if f.lfs)

    def to_dict(self) -> dict[str, Any]:
        return {"repo_id": self.repo_id, "revision": self.revision, "endpoint": self.endpoint,
                "private": self.private, "tag": self.tag, "commit_message": self.commit_message,
                "files": [f.to_dict() for f in self.files], "file_count": len(self.files),
                "total_bytes": self.total_bytes, "lfs_bytes": self.lfs_bytes}


PublishStatus = Literal["refused", "dry_run", "published", "unchanged"]


@dataclass(frozen=True)
class PublishResult:
    """The outcome of `publish`.

    `status`: `refused` (the preflight named problems; nothing was sent), `dry_run` (the plan
    only), `published` (a new commit) or `unchanged` (every file was already on the Hub).
    `problems` are the post-upload differences between the local digests and the Hub.
    """

    status: PublishStatus
    plan: PublishPlan
    refusals: list[str] = field(default_factory=list)
    repo_url: str | None = None
    commit_oid: str | None = None
    commit_url: str | None = None
    tag: str | None = None
    problems: list[FileProblem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.status in ("dry_run", "published", "unchanged") and not self.problems

    def to_dict(self) -> dict[str, Any]:
        return {"schema": "dspark-hub/publish/1", "status": self.status, "ok": self.ok,
                "refusals": list(self.refusals), "repo_url": self.repo_url, "commit_oid": self.commit_oid,
                "commit_url": self.commit_url, "tag": self.tag, "plan": self.plan.to_dict(),
                "problems": [p.to_dict() for p in self.problems]}


def _upload_order(digest: FileDigest) -> tuple[int, str]:
    if digest.lfs:
        return 0, digest.path
    return (2 if digest.path in _LAST else 1), digest.path


def plan_publish(folder: Path | str, repo_id: str, *, revision: str | None = None, private: bool | None = None,
                 tag: str | None = None, commit_message: str | None = None, endpoint: str | None = None,
                 extra_files: Mapping[str, Path | str] | None = None,
                 progress: Progress | None = None, manifest: Manifest | None = None) -> tuple[PublishPlan, Manifest]:
    """Hash the folder (plus `extra_files`, repo path -> local file) and order the upload.

    `manifest`: the folder's digests from `local_digests`, when already computed (skips hashing).

    Raises:
        UsageError: a bad repo id, or an extra file that collides with a folder file.
        CheckpointNotFoundError: the folder or an extra file does not exist.
    """
    folder = Path(folder)
    validate_repo_id(repo_id)
    manifest = manifest if manifest is not None else local_digests(folder, progress=progress)
    sources = {d.path: folder / d.path for d in manifest.files}
    digests = list(manifest.files)
    for repo_path, local in sorted((extra_files or {}).items()):
        local = Path(local)
        if repo_path in sources and sources[repo_path].resolve() != local.resolve():
            raise UsageError(f"{repo_path}: both in the folder and given as an extra file; keep one")
        if repo_path in sources:
            continue
        extra = compute_manifest(local.parent, paths=[local.name], progress=progress).files[0]
        digests.append(FileDigest(path=repo_path, size=extra.size, sha256=extra.sha256, blob_id=extra.blob_id,
                                  lfs=extra.lfs))
        sources[repo_path] = local
    digests.sort(key=_upload_order)
    message = commit_message or f"Upload {repo_id.split('/')[1]} with dspark-hub {__version__}"
    plan = PublishPlan(repo_id=repo_id, revision=revision or "main", endpoint=resolve_endpoint(endpoint),
                       private=private, tag=tag, commit_message=message,
                       files=[PlannedFile(d.path, d.size, d.lfs, d.sha256, str(sources[d.path])) for d in digests])
    return plan, Manifest(files=tuple(sorted(digests, key=lambda d: d.path)))


def publish(folder: Path | str, repo_id: str, *, private: bool | None = None, revision: str | None = None,
            tag: str | None = None, commit_message: str | None = None, commit_description: str | None = None,
            endpoint: str | None = None, token: str | bool | None = None, dry_run: bool = False,
            preflight: Callable[[], Sequence[str]] | None = None,
            extra_files: Mapping[str, Path | str] | None = None,
            progress: Progress | None = None, show_hub_progress: bool = False,
            manifest: Manifest | None = None) -> PublishResult:
    """Publish a checkpoint folder to a Hub repository, then check what landed there.

    Steps: hash every file; run `preflight` (any message refuses the publish before a byte is
    sent); create the repo (`exist_ok`); create the branch if `revision` is not `main`; one
    commit with every file (LFS objects upload first; the commit then lands atomically); tag;
    list the remote files and compare them with the local digests.

    A re-run after an interruption re-sends nothing the Hub already holds: committed files are
    no-ops (the preupload `oid` matches) and uploaded-but-uncommitted LFS objects are skipped
    (the LFS batch answer has no upload action for them).

    Args:
        folder: the checkpoint folder (every file but tool folders; sidecars included).
        repo_id: `ORG/NAME`.
        private: create the repository private (`None`: the Hub's default). Existing repos keep theirs.
        revision: the branch to commit to (created from `main` when missing).
        tag: a tag to put on the new commit (refused if it exists on another commit).
        commit_message, commit_description: the commit's title and body.
        endpoint: the Hub endpoint (default: HF_ENDPOINT / huggingface.co).
        token: a token with write access (default: huggingface_hub's usual sources).
        dry_run: return the plan; contact nobody.
        preflight: called after hashing; returns the reasons to refuse (empty: go ahead).
        extra_files: more files to upload, repo path -> local path (e.g. a package's sidecars).
        progress: called with bytes hashed.
        show_hub_progress: let huggingface_hub draw its own upload bars (on stderr).
        manifest: the folder's digests from `local_digests`, when the caller already hashed it.

    Raises:
        HubError: the Hub refused or could not be reached (never containing the token).
        UsageError: a bad repo id.
    """
    plan, manifest = plan_publish(folder, repo_id, revision=revision, private=private, tag=tag,
                                  commit_message=commit_message, endpoint=endpoint, extra_files=extra_files,
                                  progress=progress, manifest=manifest)
    refusals = list(preflight()) if preflight is not None else []
    if refusals:
        return PublishResult(status="refused", plan=plan, refusals=refusals)
    if dry_run:
        return PublishResult(status="dry_run", plan=plan)
    hf = _huggingface_hub()
    where = hf_location(repo_id, plan.revision)
    api = hf.HfApi(endpoint=plan.endpoint, token=token, library_name="dspark-hub", library_version=__version__)

    def errors(action: str) -> Any:
        return hub_errors(where, endpoint=plan.endpoint, token=token, action=action)

    quiet = hf.utils.disable_progress_bars() if not show_hub_progress else _nothing()
    with quiet:
        with errors("create the repository"):
            repo_url = str(api.create_repo(repo_id, private=private, exist_ok=True))
        if plan.revision != "main":
            with errors(f"create the branch {plan.revision}"):
                api.create_branch(repo_id, branch=plan.revision, exist_ok=True)
        with errors("read the branch head"):
            head_before = api.model_info(repo_id, revision=plan.revision).sha
        with errors("upload the files"):
            info = api.create_commit(repo_id, operations=_operations(hf, plan, manifest),
                                     commit_message=plan.commit_message, commit_description=commit_description,
                                     revision=plan.revision)
        commit_oid = str(info.oid)
        # When every file is already there the client skips the commit and returns the head.
        status: PublishStatus = "unchanged" if commit_oid == head_before else "published"
        if tag:
            _tag(api, repo_id, tag, commit_oid, errors)
    source = HubSource(repo_id, commit_oid, endpoint=plan.endpoint, token=token)
    problems = compare_files(Path(folder), manifest.files, source.remote_files(),
                             location=hf_location(repo_id, commit_oid[:12]))
    return PublishResult(status=status, plan=plan, repo_url=repo_url, commit_oid=commit_oid,
                         commit_url=str(info.commit_url), tag=tag, problems=problems)


@contextmanager
def _nothing() -> Iterator[None]:
    yield


def _operations(hf: Any, plan: PublishPlan, manifest: Manifest) -> list[Any]:
    digests = manifest.by_path()
    operations = []
    for planned in plan.files:
        op = hf.CommitOperationAdd(path_in_repo=planned.path, path_or_fileobj=planned.source)
        # Hand over the SHA-256 we already computed: the client would otherwise read every LFS file again.
        op.upload_info.sha256 = bytes.fromhex(digests[planned.path].sha256)
        operations.append(op)
    return operations


def _tag(api: Any, repo_id: str, tag: str, commit_oid: str, errors: Callable[[str], Any]) -> None:
    with errors(f"tag the commit as {tag}"):
        existing = {ref.name: ref.target_commit for ref in api.list_repo_refs(repo_id).tags}
        if tag in existing:
            if existing[tag] != commit_oid:
                raise HubError(f"{hf_location(repo_id, tag)}: tag already exists on commit {existing[tag][:12]}; "
                               "choose another --tag or delete the old one on the Hub")
            return
        api.create_tag(repo_id, tag=tag, revision=commit_oid)
