"""Publishing a checkpoint folder to the Hub: plan, one commit, optional tag, then compare what landed.

The upload goes through `huggingface_hub`. Its weights travel by one of two transfers: Xet (the
client uses it whenever `hf_xet` is installed and HF_HUB_DISABLE_XET is not set, and nothing the
server says changes that) or git LFS. `transfer="auto"` asks the endpoint for a Xet write token
first and, where it has none (404: a self-hosted or test Hub), uploads through LFS instead.
`release.publish_checkpoint` puts the preflight gate in front of this.

What is uploaded is what was judged, or nothing (`_operations`, `_refuse_changes`): a file another
process writes, replaces or removes after the gate read it refuses the publish before the commit.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Literal
from urllib.parse import quote

from dspark_hub import __version__
from dspark_hub.documents import Document
from dspark_hub.errors import ChangedMeanwhileError, HubError, UsageError
from dspark_hub.format.contract import CONFIG_NAME
from dspark_hub.format.digests import FileDigest, FileProblem, Manifest, compute_manifest
from dspark_hub.format.folder import FileStamp, changed_files, list_folder, read_regular, stamp_files
from dspark_hub.format.hub_http import network_scope
from dspark_hub.format.remote import (
    HubSource,
    hf_location,
    hub_errors,
    require_huggingface_hub,
    resolve_endpoint,
    validate_repo_id,
)
from dspark_hub.format.urls import redact_url
from dspark_hub.progress import Progress
from dspark_hub.verify.against_hub import compare_files, local_digests

if TYPE_CHECKING:
    from huggingface_hub import CommitInfo, CommitOperationAdd, HfApi

#: Files uploaded last within the commit's listing order (the card and config describe the weights).
_LAST = (CONFIG_NAME, "README.md")

#: How the weights travel: `auto` (Xet where client and endpoint both have it, else LFS), or one forced.
Transfer = Literal["auto", "xet", "lfs"]
TRANSFERS: tuple[Transfer, ...] = ("auto", "xet", "lfs")


@dataclass(frozen=True)
class PublishPlan(Document):
    """What `publish` sends, in upload order (LFS weights first, the card and config last)."""

    KEYS = ("repo_id", "revision", "endpoint=shown_endpoint", "private", "tag", "commit_message", "transfer",
            "files=planned_files", "file_count", "total_bytes", "lfs_bytes")

    repo_id: str
    revision: str
    endpoint: str
    private: bool | None
    tag: str | None
    commit_message: str
    files: list[FileDigest]
    #: repo path -> the local file it is read from
    sources: dict[str, Path] = field(default_factory=dict)
    #: the transfer asked for (`auto`, `xet`, `lfs`); `PublishResult.transfer` says which one ran
    transfer: Transfer = "auto"

    @property
    def total_bytes(self) -> int:
        return sum(f.size or 0 for f in self.files)

    @property
    def lfs_bytes(self) -> int:
        return sum(f.size or 0 for f in self.files if f.lfs)

    @property
    def file_count(self) -> int:
        return len(self.files)

    @property
    def shown_endpoint(self) -> str:
        """The endpoint as the document shows it: its credentials, if any, redacted."""
        return redact_url(self.endpoint)

    @property
    def planned_files(self) -> list[PlannedFile]:
        """Every file in upload order, with the local file it is read from."""
        return [PlannedFile(**{f.name: getattr(file, f.name) for f in fields(FileDigest)},
                            source=str(self.sources[file.path])) for file in self.files]


@dataclass(frozen=True)
class PlannedFile(FileDigest):
    """A file of the plan: its digest and the local file it is read from."""

    KEYS: ClassVar[tuple[str, ...]] = ("path", "size", "sha256", "blob_id", "lfs", "source")

    source: str = ""


PublishStatus = Literal["refused", "dry_run", "published", "unchanged"]


@dataclass(frozen=True)
class PublishResult(Document):
    """The outcome of `publish`.

    `status`: `refused` (the preflight named problems; nothing was sent), `dry_run` (the plan
    only), `published` (a new commit) or `unchanged` (every file was already on the Hub).
    `problems` are the post-upload differences between the local digests and the Hub.
    """

    KEYS = ("status", "ok", "refusals", "repo_url", "commit_oid", "commit_url", "tag", "transfer", "plan", "problems")

    status: PublishStatus
    plan: PublishPlan
    refusals: list[str] = field(default_factory=list)
    repo_url: str | None = None
    commit_oid: str | None = None
    commit_url: str | None = None
    tag: str | None = None
    problems: list[FileProblem] = field(default_factory=list)
    #: the transfer the upload used (`xet` or `lfs`) and why
    transfer: TransferChoice | None = None

    @property
    def ok(self) -> bool:
        return self.status in ("dry_run", "published", "unchanged") and not self.problems


@dataclass(frozen=True)
class TransferChoice(Document):
    """The transfer an upload used (`xet` or `lfs`) and the reason, in words."""

    name: Literal["xet", "lfs"]
    reason: str


def _upload_order(digest: FileDigest) -> tuple[int, str]:
    if digest.lfs:
        return 0, digest.path
    return (2 if digest.path in _LAST else 1), digest.path


def plan_publish(folder: Path | str, repo_id: str, *, revision: str | None = None, private: bool | None = None,
                 tag: str | None = None, commit_message: str | None = None, endpoint: str | None = None,
                 extra_files: Mapping[str, Path | str] | None = None, transfer: Transfer = "auto",
                 progress: Progress | None = None, manifest: Manifest | None = None) -> tuple[PublishPlan, Manifest]:
    """Hash the folder (plus `extra_files`, repo path -> local file) and order the upload.

    `manifest`: the folder's digests from `local_digests`, when already computed (skips hashing).

    Raises:
        UsageError: a bad repo id or `transfer`, or an extra file that collides with a folder file.
        CheckpointNotFoundError: the folder or an extra file does not exist.
    """
    folder = Path(folder)
    validate_repo_id(repo_id)
    if transfer not in TRANSFERS:
        raise UsageError(f"unknown transfer {transfer!r}; choose one of {', '.join(TRANSFERS)}", param="transfer")
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
        digests.append(dataclasses.replace(extra, path=repo_path))
        sources[repo_path] = local
    digests.sort(key=_upload_order)
    message = commit_message or f"Upload {repo_id.split('/')[1]} with dspark-hub {__version__}"
    plan = PublishPlan(repo_id=repo_id, revision=revision or "main", endpoint=resolve_endpoint(endpoint),
                       private=private, tag=tag, commit_message=message,
                       files=digests, sources=sources, transfer=transfer)
    return plan, Manifest(files=tuple(sorted(digests, key=lambda d: d.path)))


def publish(folder: Path | str, repo_id: str, *, private: bool | None = None, revision: str | None = None,
            tag: str | None = None, commit_message: str | None = None, commit_description: str | None = None,
            endpoint: str | None = None, token: str | bool | None = None, dry_run: bool = False,
            transfer: Transfer = "auto", preflight: Callable[[], Sequence[str]] | None = None,
            extra_files: Mapping[str, Path | str] | None = None,
            progress: Progress | None = None, show_hub_progress: bool = False,
            manifest: Manifest | None = None, stamps: Mapping[Path, FileStamp | None] | None = None
            ) -> PublishResult:
    """Publish a checkpoint folder to a Hub repository, then check what landed there.

    Steps: hash every file; run `preflight` (any message refuses the publish before a byte is
    sent); find a token; create the repo (`exist_ok`); create the branch if `revision` is not
    `main`; choose the transfer; one commit with every file (large objects upload first; the
    commit then lands atomically); tag; list the remote files and compare them with the local digests.

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
        transfer: `auto` (Xet when the client has `hf_xet` and the endpoint answers its Xet
            write-token route, else LFS), `xet` or `lfs`.
        preflight: called after hashing; returns the reasons to refuse (empty: go ahead).
        extra_files: more files to upload, repo path -> local path (e.g. a package's sidecars).
        progress: called with bytes hashed.
        show_hub_progress: let huggingface_hub draw its own upload bars (on stderr).
        manifest: the folder's digests from `local_digests`, when the caller already hashed it.
        stamps: `stamp_files` of the folder's files from before anything judged them (the gate);
            default: taken before hashing. A file that differs before the commit refuses the publish.

    Raises:
        HubError: no token, the Hub refused or could not be reached, or Xet was forced on an
            endpoint without it (never containing the token).
        UsageError: a bad repo id or `transfer`; `xet` asked of a client that cannot use it.
        ChangedMeanwhileError: a file changed after it was judged (nothing was committed).
    """
    if stamps is None:
        stamps = stamp_files(Path(folder) / rel for rel in list_folder(folder).files)
    plan, manifest = plan_publish(folder, repo_id, revision=revision, private=private, tag=tag,
                                  commit_message=commit_message, endpoint=endpoint, extra_files=extra_files,
                                  transfer=transfer, progress=progress, manifest=manifest)
    refusals = list(preflight()) if preflight is not None else []
    if refusals:
        return PublishResult(status="refused", plan=plan, refusals=refusals)
    if dry_run:
        return PublishResult(status="dry_run", plan=plan)
    stamps = {**stamp_files(plan.sources.values()), **stamps}   # an extra file: stamped as it was hashed
    require_huggingface_hub()
    from huggingface_hub import HfApi  # 0.4 s to import (TID253): only a publish that sends loads it
    from huggingface_hub import utils as hf_utils

    where = hf_location(repo_id, plan.revision)
    with network_scope(plan.endpoint):   # finding the token may take a request (an OIDC exchange in CI)
        require_token(token, where)
    client_xet = client_has_xet()
    if plan.transfer == "xet" and not client_xet:
        raise UsageError(f"{where}: Xet was asked for, but this huggingface_hub cannot use it ({_NO_CLIENT_XET}); "
                         "install hf-xet and unset HF_HUB_DISABLE_XET, or publish through LFS", param="transfer")
    api = HfApi(endpoint=plan.endpoint, token=token, library_name="dspark-hub", library_version=__version__)
    quiet = hf_utils.disable_progress_bars() if not show_hub_progress else nullcontext()
    with network_scope(plan.endpoint):   # one budget of waiting for the whole publish
        with quiet:
            repo_url, info, status, choice = _commit(api, plan, manifest, private=private, token=token,
                                                     client_xet=client_xet, commit_description=commit_description,
                                                     stamps=stamps)
        commit_oid = str(info.oid)
        source = HubSource(repo_id, commit_oid, endpoint=plan.endpoint, token=token)
        problems = compare_files(Path(folder), manifest.files, source.remote_files(),
                                 location=hf_location(repo_id, commit_oid[:12]))
    return PublishResult(status=status, plan=plan, repo_url=redact_url(repo_url), commit_oid=commit_oid,
                         commit_url=redact_url(str(info.commit_url)), tag=tag, problems=problems, transfer=choice)


def _commit(api: HfApi, plan: PublishPlan, manifest: Manifest, *, private: bool | None, token: str | bool | None,
            client_xet: bool, commit_description: str | None, stamps: Mapping[Path, FileStamp | None]
            ) -> tuple[str, CommitInfo, PublishStatus, TransferChoice]:
    """Create the repository and branch, choose the transfer, upload, check nothing changed, commit, tag.

    Returns the repository URL, the commit, whether anything changed, and the transfer.
    """
    repo_id = plan.repo_id
    where = hf_location(repo_id, plan.revision)

    def errors(action: str) -> AbstractContextManager[None]:
        return hub_errors(where, endpoint=plan.endpoint, token=token, action=action)

    with errors("create the repository"):
        repo_url = str(api.create_repo(repo_id, private=private, exist_ok=True))
    if plan.revision != "main":
        with errors(f"create the branch {plan.revision}"):
            api.create_branch(repo_id, branch=plan.revision, exist_ok=True)
    with errors("read the branch head"):
        head_before = api.model_info(repo_id, revision=plan.revision).sha
    with errors("ask the endpoint for Xet storage"):
        choice = choose_transfer(plan.transfer, client_xet,
                                 lambda: endpoint_offers_xet(plan.endpoint, repo_id, plan.revision, token))
    operations = _operations(plan, manifest, xet=choice.name == "xet")
    _refuse_changes(plan, manifest, operations, stamps)            # before a byte is sent, and again after
    with errors("upload the files"), _xet_errors(where, plan.endpoint), _through(choice), _no_op_quiet():
        try:
            api.preupload_lfs_files(repo_id, additions=operations, revision=plan.revision)
        finally:   # a file that changed under the upload is the reason it failed, if it did
            _refuse_changes(plan, manifest, operations, stamps)
        info = api.create_commit(repo_id, operations=operations,
                                 commit_message=plan.commit_message, commit_description=commit_description,
                                 revision=plan.revision)
    commit_oid = str(info.oid)
    # When every file is already there the client skips the commit and returns the head.
    status: PublishStatus = "unchanged" if commit_oid == head_before else "published"
    if plan.tag:
        _tag(api, repo_id, plan.tag, commit_oid, errors)
    return repo_url, info, status, choice


# --- token -------------------------------------------------------------------------------------------

def require_token(token: str | bool | None, where: str) -> None:
    """Refuse before any request when no token is given and huggingface_hub finds none (a publish needs one)."""
    if isinstance(token, str) and token:
        return
    from huggingface_hub import constants, get_token  # deferred (TID253), as in publish

    if token is None and get_token() is not None:
        return
    raise HubError(f"{where}: no Hub token found, and publishing needs one with write access; huggingface_hub "
                   f"reads HF_TOKEN, then the token file {constants.HF_TOKEN_PATH} that 'hf auth login' writes",
                   hint="run 'hf auth login' or set HF_TOKEN")


# --- Xet or LFS ----------------------------------------------------------------------------------------

_NO_CLIENT_XET = "hf_xet is not installed, or HF_HUB_DISABLE_XET is set"


def client_has_xet() -> bool:
    """huggingface_hub's own rule: `hf_xet` importable and HF_HUB_DISABLE_XET not set (read at its import)."""
    from huggingface_hub import constants  # deferred (TID253), as in publish

    return not constants.HF_HUB_DISABLE_XET and importlib.util.find_spec("hf_xet") is not None


def endpoint_offers_xet(endpoint: str, repo_id: str, revision: str, token: str | bool | None) -> bool:
    """Ask the endpoint for a Xet write token, as the client's Xet upload does first; 404 means it has no Xet.

    Raises huggingface_hub's HTTP errors for any other failure.
    """
    # deferred (TID253), as in publish
    from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

    url = f"{endpoint}/api/models/{repo_id}/xet-write-token/{quote(revision, safe='')}"
    headers = build_hf_headers(token=token, library_name="dspark-hub", library_version=__version__)
    response = get_session().get(url, headers=headers)
    if response.status_code == 404:
        return False
    hf_raise_for_status(response)
    return True


def choose_transfer(requested: Transfer, client_xet: bool, endpoint_xet: Callable[[], bool]) -> TransferChoice:
    """Which transfer the upload takes; `endpoint_xet` is asked only when both are possible."""
    if requested == "lfs":
        return TransferChoice("lfs", "LFS was asked for")
    if requested == "xet":
        return TransferChoice("xet", "Xet was asked for")
    if not client_xet:
        return TransferChoice("lfs", f"this client has no Xet ({_NO_CLIENT_XET})")
    if endpoint_xet():
        return TransferChoice("xet", "the endpoint offers Xet storage")
    return TransferChoice("lfs", "the endpoint has no Xet storage: its Xet write-token route answered 404")


@contextmanager
def _through(choice: TransferChoice) -> Iterator[None]:
    """Make huggingface_hub upload through `choice`: for LFS, its Xet switch is off for the block."""
    from huggingface_hub import constants  # deferred (TID253), as in publish

    before = constants.HF_HUB_DISABLE_XET
    constants.HF_HUB_DISABLE_XET = before or choice.name == "lfs"
    try:
        yield
    finally:
        constants.HF_HUB_DISABLE_XET = before


@contextmanager
def _xet_errors(where: str, endpoint: str) -> Iterator[None]:
    """A Xet upload refused by an endpoint without Xet names Xet and the fix (hf_xet reports a network error)."""
    try:
        yield
    except Exception as exc:
        text = str(exc)
        if "xet-write-token" in text and "404" in text:
            raise HubError(f"{where}: the endpoint {redact_url(endpoint)} has no Xet storage (its Xet write-token "
                           "route answered 404), and the upload went through Xet; publish through LFS instead: "
                           "`transfer` lfs or auto, or set HF_HUB_DISABLE_XET=1") from exc
        raise


@contextmanager
def _no_op_quiet() -> Iterator[None]:
    """Keep huggingface_hub's "No files have been modified" warning off the terminal: the result says `unchanged`."""
    hub_log = logging.getLogger("huggingface_hub.hf_api")

    def keep(record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("No files have been modified since last commit")

    hub_log.addFilter(keep)
    try:
        yield
    finally:
        hub_log.removeFilter(keep)


# --- the bytes judged, or nothing ------------------------------------------------------------------------

def _operations(plan: PublishPlan, manifest: Manifest, *, xet: bool) -> list[CommitOperationAdd]:
    """One operation per planned file: a small (regular) file as its bytes, read once and checked against
    the judged digest; an LFS file by path, with the judged SHA-256 for LFS (the server checks the bytes
    against it; the client need not read the file again), without for Xet (hf_xet computes it from the
    bytes it sends; `_refuse_changes` compares)."""
    from huggingface_hub import CommitOperationAdd  # deferred (TID253), as in publish

    digests = manifest.by_path()
    operations = []
    for planned in plan.files:
        sha256 = digests[planned.path].sha256
        assert sha256 is not None, "a computed manifest knows every SHA-256"
        if not planned.lfs:
            operations.append(CommitOperationAdd(planned.path, _judged_bytes(plan, planned.path, sha256)))
            continue
        op = CommitOperationAdd(path_in_repo=planned.path, path_or_fileobj=str(plan.sources[planned.path]))
        if not xet:
            op.upload_info.sha256 = bytes.fromhex(sha256)
        operations.append(op)
    return operations


def _judged_bytes(plan: PublishPlan, path: str, sha256: str) -> bytes:
    data = read_regular(plan.sources[path])
    if hashlib.sha256(data).hexdigest() != sha256:
        raise _changed(plan, path)
    return data


def _refuse_changes(plan: PublishPlan, manifest: Manifest, operations: Sequence[CommitOperationAdd],
                    stamps: Mapping[Path, FileStamp | None]) -> None:
    """Refuse the commit when a file is not what the gate judged: bytes hf_xet sent under another SHA-256,
    or a file written, replaced or removed since its stamp."""
    digests = manifest.by_path()
    for op in operations:
        if op.upload_info.is_hashed and op.upload_info.sha256.hex() != digests[op.path_in_repo].sha256:
            raise _changed(plan, op.path_in_repo)
    by_source = {source: path for path, source in plan.sources.items()}
    changed = changed_files({source: stamps.get(source) for source in by_source})
    if changed:
        raise _changed(plan, by_source[changed[0]])


def _changed(plan: PublishPlan, path: str) -> ChangedMeanwhileError:
    return ChangedMeanwhileError(f"{hf_location(plan.repo_id, plan.revision)}: {path}: changed after the publish "
                                 "gate judged it (another process wrote, replaced or removed it); nothing was "
                                 "committed; publish again once nothing else writes the folder")


def _tag(api: HfApi, repo_id: str, tag: str, commit_oid: str,
         errors: Callable[[str], AbstractContextManager[None]]) -> None:
    with errors(f"tag the commit as {tag}"):
        existing = {ref.name: ref.target_commit for ref in api.list_repo_refs(repo_id).tags}
        if tag in existing:
            if existing[tag] != commit_oid:
                raise HubError(f"{hf_location(repo_id, tag)}: tag already exists on commit {existing[tag][:12]}; "
                               "choose another `tag` or delete the old one on the Hub")
            return
        api.create_tag(repo_id, tag=tag, revision=commit_oid)
