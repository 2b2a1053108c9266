"""Publishing a checkpoint folder to the Hub: plan, one commit, optional tag, then compare what landed.

The upload goes through `huggingface_hub` (weights through LFS, or xet where the client has it).
`release.publish_checkpoint` puts the preflight gate in front of this.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from dspark_hub import __version__
from dspark_hub.errors import HubError, UsageError
from dspark_hub.format.digests import FileDigest, FileProblem, Manifest, compute_manifest
from dspark_hub.format.remote import (
    HubSource,
    hf_location,
    hub_errors,
    require_huggingface_hub,
    resolve_endpoint,
    validate_repo_id,
)
from dspark_hub.progress import Progress
from dspark_hub.verify.against_hub import compare_files, local_digests

if TYPE_CHECKING:
    from huggingface_hub import CommitOperationAdd, HfApi

#: Files uploaded last within the commit's listing order (the card and config describe the weights).
_LAST = ("config.json", "README.md")

@dataclass(frozen=True)
class PublishPlan:
    """What `publish` sends, in upload order (LFS weights first, the card and config last)."""

    repo_id: str
    revision: str
    endpoint: str
    private: bool | None
    tag: str | None
    commit_message: str
    files: list[FileDigest]
    #: repo path -> the local file it is read from
    sources: dict[str, Path] = field(default_factory=dict)

    @property
    def total_bytes(self) -> int:
        return sum(f.size or 0 for f in self.files)

    @property
    def lfs_bytes(self) -> int:
        return sum(f.size or 0 for f in self.files if f.lfs)

    def to_dict(self) -> dict[str, Any]:
        return {"repo_id": self.repo_id, "revision": self.revision, "endpoint": self.endpoint,
                "private": self.private, "tag": self.tag, "commit_message": self.commit_message,
                "files": [{**f.to_dict(), "source": str(self.sources[f.path])} for f in self.files],
                "file_count": len(self.files), "total_bytes": self.total_bytes, "lfs_bytes": self.lfs_bytes}


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
        return {"status": self.status, "ok": self.ok,
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
        digests.append(dataclasses.replace(extra, path=repo_path))
        sources[repo_path] = local
    digests.sort(key=_upload_order)
    message = commit_message or f"Upload {repo_id.split('/')[1]} with dspark-hub {__version__}"
    plan = PublishPlan(repo_id=repo_id, revision=revision or "main", endpoint=resolve_endpoint(endpoint),
                       private=private, tag=tag, commit_message=message,
                       files=digests, sources=sources)
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
    require_huggingface_hub()
    from huggingface_hub import HfApi
    from huggingface_hub import utils as hf_utils

    where = hf_location(repo_id, plan.revision)
    api = HfApi(endpoint=plan.endpoint, token=token, library_name="dspark-hub", library_version=__version__)

    def errors(action: str) -> AbstractContextManager[None]:
        return hub_errors(where, endpoint=plan.endpoint, token=token, action=action)

    quiet = hf_utils.disable_progress_bars() if not show_hub_progress else _nothing()
    with quiet:
        with errors("create the repository"):
            repo_url = str(api.create_repo(repo_id, private=private, exist_ok=True))
        if plan.revision != "main":
            with errors(f"create the branch {plan.revision}"):
                api.create_branch(repo_id, branch=plan.revision, exist_ok=True)
        with errors("read the branch head"):
            head_before = api.model_info(repo_id, revision=plan.revision).sha
        with errors("upload the files"):
            info = api.create_commit(repo_id, operations=_operations(plan, manifest),
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


def _operations(plan: PublishPlan, manifest: Manifest) -> list[CommitOperationAdd]:
    from huggingface_hub import CommitOperationAdd

    digests = manifest.by_path()
    operations = []
    for planned in plan.files:
        op = CommitOperationAdd(path_in_repo=planned.path, path_or_fileobj=str(plan.sources[planned.path]))
        # Hand over the SHA-256 we already computed: the client would otherwise read every LFS file again.
        sha256 = digests[planned.path].sha256
        assert sha256 is not None, "a computed manifest knows every SHA-256"
        op.upload_info.sha256 = bytes.fromhex(sha256)
        operations.append(op)
    return operations


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
