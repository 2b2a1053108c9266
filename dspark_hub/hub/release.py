"""Publishing a draft: the preflight gate (verify + card lint), then `hub.publish`.

The gate runs before anything is sent: a checkpoint that fails `verify` (with `--drop-in`
when given), whose card fails `card lint` against the weights, or whose checksum sidecars
(`SHA256SUMS`, `checksums.json`) no longer match its files, or whose `training_args.json` names
inputs by local path (written before finetune recorded Hub ids and digests), is refused with every reason named,
and the Hub sees no request at all. The folder is hashed once; the card lint, the sidecar check
and the upload share that manifest, and the upload refuses a file that changed after the gate
first read it (its stamp, taken before the gate). Stale sidecars are refused, not rewritten: they are the
user's file, and a card may quote them.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from dspark_hub import __version__, schemas
from dspark_hub._text import plural
from dspark_hub.cards import CardLintReport, lint_card
from dspark_hub.documents import Document
from dspark_hub.errors import CheckpointFormatError, CheckpointNotFoundError
from dspark_hub.format.checkpoint import LocalSource, open_checkpoint
from dspark_hub.format.digests import Manifest, checkpoint_files, sha256_file
from dspark_hub.format.folder import list_folder, stamp_files
from dspark_hub.format.jsonio import load_json_file
from dspark_hub.format.provenance import TRAINING_ARGS_NAME, local_paths
from dspark_hub.format.registry import FORMATS, titles
from dspark_hub.format.remote import validate_repo_id
from dspark_hub.format.remote_code import export_code
from dspark_hub.hub.checksums import check_checksums, has_sidecars
from dspark_hub.hub.publish import PublishResult, PublishStatus, Transfer, publish
from dspark_hub.progress import Progress
from dspark_hub.report import Report
from dspark_hub.verify.against_hub import local_digests
from dspark_hub.verify.checks import verify
from dspark_hub.verify.family import detect

CARD_NAME = "README.md"


@dataclass
class Gate(Document):
    """What the preflight found: the verify report, the card lint, and the reasons to refuse."""

    KEYS = ("ok", "refusals", "verify", "card_lint=lint")
    verify: Report
    lint: CardLintReport | None
    refusals: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.refusals


#: A further check of the gate that adds to the verify report in place (`verify --probe`'s, from the CLI).
ReportCheck = Callable[[Path, Report], object]


def preflight(folder: str | os.PathLike[str], *, drop_in: str | None = None,
              progress: Progress | None = None, check: ReportCheck | None = None) -> tuple[Gate, Manifest | None]:
    """Verify the checkpoint and lint its card against it; collect every reason to refuse.

    `check` adds its findings to the verify report before the refusals are read (`publish --probe`: the
    behaviour probe, which lives above this layer).

    Verify reads headers only and runs first: a failing checkpoint is refused before any byte
    is hashed. Otherwise the folder is hashed once (returned as the manifest `hub.publish`
    reuses) and the card's checksum table is checked against those digests.
    """
    folder = Path(folder)
    report = verify(folder, drop_in=drop_in)
    if check is not None:
        check(folder, report)
    refusals = [f"verify: {f.where}: {f.message}" for f in report.sorted_findings() if f.severity == "error"]
    card = folder / CARD_NAME
    if refusals:
        return Gate(verify=report, lint=None, refusals=refusals), None
    if not card.is_file():
        refusals.append(f"{CARD_NAME}: no model card in the folder; write one with 'dspark-hub card' "
                        "(a draft without a card is not published)")
        return Gate(verify=report, lint=None, refusals=refusals), None
    refusals += training_args_refusals(folder)
    manifest = local_digests(folder, progress=progress)
    digests = {folder / d.path: d.sha256 for d in manifest.files}
    lint = lint_card(card, checkpoint=folder,
                     hasher=lambda path: digests.get(Path(path)) or sha256_file(path))
    refusals += [f"card lint: {f.where}: {f.message}" for f in lint.sorted_findings() if f.severity == "error"]
    refusals += sidecar_refusals(folder, manifest)
    return Gate(verify=report, lint=lint, refusals=refusals), manifest


def training_args_refusals(folder: Path) -> list[str]:
    """A `training_args.json` from an older finetune names its inputs by local path; publishing would show them."""
    path = folder / TRAINING_ARGS_NAME
    if not path.is_file():
        return []
    try:
        doc = load_json_file(path)
    except CheckpointFormatError as e:
        return [f"{TRAINING_ARGS_NAME}: {e.detail}; fix or delete it"]
    found = local_paths(doc) if isinstance(doc, dict) else {}
    return [f"{TRAINING_ARGS_NAME}: {key} is the local path {value!r}, which means nothing on the Hub and shows "
            "the author's folders; replace it with a Hub id or its digests ({\"sha256\": ...}, what finetune "
            "writes now) or delete the key, then render the card again" for key, value in found.items()]


def sidecar_refusals(folder: Path, manifest: Manifest) -> list[str]:
    """Every file the folder's `SHA256SUMS` / `checksums.json` get wrong, checked against `manifest` (no rehash)."""
    if not has_sidecars(folder):
        return []
    problems = check_checksums(folder, manifest=manifest).problems
    if not problems:
        return []
    return [f"checksums: {p.message}" for p in problems] + [
        f"checksums: the sidecars describe other files than the ones to publish; regenerate them with "
        f"'dspark-hub checksums {folder} --force' (or delete them), then publish"]


def commit_text(report: Report, *, name: str, drop_in: str | None) -> tuple[str, str]:
    """A commit title and body that summarise the verify report."""
    s = report.summary
    params = s.parameters or {}
    title = (f"Upload {name}: verify OK ({plural(s.tensors, 'tensor')}, {plural(params.get('total', 0), 'parameter')}"
             + (f", drop-in {drop_in}" if drop_in else "") + ")")
    warnings = sum(1 for f in report.findings if f.severity == "warning")
    body = "\n".join([
        f"Checked with dspark-hub {__version__} before upload.",
        f"layout: {s.layout}; files: {', '.join(f['name'] for f in s.files)}",
        f"parameters: {params.get('total', 0):,} total / {params.get('trained', 0):,} trained / "
        f"{params.get('frozen', 0):,} frozen",
        f"dtypes: {', '.join(f'{k} x{v}' for k, v in sorted(s.dtypes.items()))}",
        f"findings: 0 errors, {plural(warnings, 'warning')}",
    ])
    return title, body


@contextmanager
def staged_with_code(folder: Path) -> Iterator[Path]:
    """A sibling copy of `folder` (hard links where possible) with the modeling code exported into it.

    The input folder is never modified; the stage is removed afterwards.
    """
    stage = Path(tempfile.mkdtemp(prefix=f".{folder.name}.publish-", dir=folder.parent))
    try:
        for rel in checkpoint_files(folder):
            target = stage / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(folder / rel, target)
            except OSError:
                shutil.copy2(folder / rel, target)
        export_code(stage, force=True)
        yield stage
    finally:
        shutil.rmtree(stage, ignore_errors=True)


@dataclass
class Publication(Document):
    """The gate for publishing the folder `input` to `repo_id` and, when it passed, what `hub.publish` did."""

    SCHEMA = schemas.command("publish")
    KEYS = ("ok", "status", "input", "repo_id", "gate", "publish=result")
    input: str
    repo_id: str
    gate: Gate
    result: PublishResult | None = None

    @property
    def ok(self) -> bool:
        return self.gate.ok and (self.result is None or self.result.ok)

    @property
    def status(self) -> PublishStatus:
        """The publish status; `refused` also when the gate refused (no publish ran)."""
        return self.result.status if self.result is not None else "refused"


def publish_checkpoint(folder: str | os.PathLike[str], repo_id: str, *, drop_in: str | None = None,
                       private: bool | None = None, revision: str | None = None, tag: str | None = None,
                       with_remote_code: bool = False, endpoint: str | None = None, token: str | None = None,
                       dry_run: bool = False, transfer: Transfer = "auto", progress: Progress | None = None,
                       check: ReportCheck | None = None) -> Publication:
    """Gate, then publish a checkpoint folder to `repo_id` and compare what landed with the local files.

    Args:
        folder: the checkpoint folder (with its `README.md` card).
        repo_id: `ORG/NAME`.
        drop_in: demand drop-in identity with this reference in the gate (`kimi-k3` or a folder).
        private, revision, tag, endpoint, token, dry_run, transfer, progress: see `hub.publish`.
        with_remote_code: also upload the modeling code and an `auto_map` (the folder is not changed).
        check: a further gate check on the folder it judges (`preflight`).

    Raises:
        UsageError: `repo_id` is not `ORG/NAME` (checked first, dry run or not).
        CheckpointNotFoundError: `folder` is not a directory.
        HubError: the Hub refused or could not be reached.
    """
    validate_repo_id(repo_id)
    folder = Path(folder)
    if not folder.is_dir():
        raise CheckpointNotFoundError(f"{folder}: not a directory", hint="pass the checkpoint folder to publish")
    if with_remote_code and (refusal := _remote_code_refusal(folder)):
        gate, _ = preflight(folder, drop_in=drop_in, progress=progress, check=check)
        gate.refusals.append(refusal)
        return Publication(input=str(folder), repo_id=repo_id, gate=gate)
    with (staged_with_code(folder) if with_remote_code else _as_is(folder)) as source:
        stamps = stamp_files(source / rel for rel in list_folder(source).files)   # before the gate reads a byte
        gate, manifest = preflight(source, drop_in=drop_in, progress=progress, check=check)
        if with_remote_code and gate.lint is not None and any(f.code.startswith("CHECKSUM_") and
                                                              f.severity == "error" for f in gate.lint.findings):
            gate.refusals.append("`with_remote_code` adds auto_map to config.json, so the card's checksums no "
                                 f"longer match; run 'dspark-hub export-code {folder}' and render the card again")
        if not gate.ok:
            return Publication(input=str(folder), repo_id=repo_id, gate=gate)
        title, body = commit_text(gate.verify, name=repo_id.split("/")[-1], drop_in=drop_in)
        result = publish(source, repo_id, private=private, revision=revision, tag=tag, commit_message=title,
                         commit_description=body, endpoint=endpoint, token=token, dry_run=dry_run,
                         transfer=transfer, progress=progress, manifest=manifest, stamps=stamps)
    return Publication(input=str(folder), repo_id=repo_id, gate=gate, result=result)


def _remote_code_refusal(folder: Path) -> str | None:
    """Why the k3_dspark modeling code may not ship with this checkpoint (None when it may)."""
    view = open_checkpoint(LocalSource(folder))
    fmt, found = detect(view.config, view.tensors)
    if view.config is None or (fmt is not None and fmt.remote_code):
        return None
    coded = titles(f for f in FORMATS.values() if f.remote_code)
    return (f"remote code: the exported code is the {coded} modeling, and this is {found.spec.title}; its own "
            "library loads it (its config.json auto_map would be replaced); publish it without the code")


@contextmanager
def _as_is(folder: Path) -> Iterator[Path]:
    yield folder
