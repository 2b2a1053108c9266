"""Release commands: `checksums`, `package`, `publish`, `export-code`."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from dspark_hub.cli._framework import command, endpoint_option, force_option, json_option, quiet_option
from dspark_hub.cli._output import emit, progress

if TYPE_CHECKING:
    from dspark_hub.hub.publish import Transfer


@command()
@click.argument("folder", type=click.Path(path_type=Path))
@click.option("--check", is_flag=True, help="Verify FOLDER against its SHA256SUMS / checksums.json instead.")
@force_option
@quiet_option
@json_option
def checksums(folder: Path, check: bool, force: bool, quiet: bool, as_json: bool) -> None:
    """Write SHA256SUMS and checksums.json for FOLDER (or --check it against them)."""
    from dspark_hub.hub.checksums import (  # loads when the command runs (--help stays light)
        check_checksums,
        write_checksums,
    )

    with progress("sha256", quiet=quiet or as_json) as bar:
        result = check_checksums(folder, progress=bar) if check else write_checksums(folder, force=force, progress=bar)
    emit(result, as_json=as_json, renderer="render_checksum_check" if check else "render_checksums")


@command()
@click.argument("ckpt", type=click.Path(path_type=Path))
@click.option("--repo", "repo_id", required=True, metavar="ORG/NAME", help="The Hub repo the web seeds point at.")
@click.option("--revision", default="main", show_default=True, help="The revision the web seeds point at "
              "(a commit sha is best).")
@click.option("-o", "--out", "out_dir", required=True, type=click.Path(path_type=Path), help="Package folder.")
@endpoint_option
@force_option
@quiet_option
@json_option
def package(ckpt: Path, repo_id: str, revision: str, out_dir: Path, endpoint: str | None, force: bool,
            quiet: bool, as_json: bool) -> None:
    """Write SHA256SUMS, checksums.json, .gitattributes, a .torrent with Hub web seeds and its magnet link."""
    from dspark_hub.hub.package import package as build  # loads when the command runs (--help stays light)

    with progress("checksums", quiet=quiet or as_json) as bar:
        result = build(ckpt, repo_id, out_dir=out_dir, revision=revision, endpoint=endpoint, force=force,
                       progress=bar.stage)
    emit(result, as_json=as_json, renderer="render_package")


@command()
@click.argument("ckpt", type=click.Path(path_type=Path))
@click.argument("repo_id", metavar="ORG/NAME")
@click.option("--drop-in", "drop_in", metavar="REF", help="The gate also demands drop-in identity with REF.")
@click.option("--private", is_flag=True, default=None, help="Create the repository private.")
@click.option("--revision", metavar="BRANCH", help="Commit to this branch (created from main if missing).")
@click.option("--tag", metavar="TAG", help="Tag the new commit.")
@click.option("--with-remote-code", is_flag=True, help="Also upload the modeling code and an auto_map.")
@click.option("--dry-run", is_flag=True, help="Print the plan (every file, size, LFS or regular); send nothing.")
@click.option("--probe", "probe_target", metavar="TARGET",
              help="Require the behaviour probe against this local target in the gate (dspark-hub probe): a "
                   "convention the weights contradict refuses the upload.")
@click.option("--probe-prompts", "probe_prompts", metavar="JSONL",
              help="The prompts --probe continues [default: dspark-hub probe's 24 built-in chat prompts].")
@click.option("--transfer", type=click.Choice(["auto", "xet", "lfs"]), default="auto", show_default=True,
              help="How large files travel: auto = Xet where hf_xet is installed and the endpoint offers it, "
                   "else LFS.")
@endpoint_option
@quiet_option
@json_option
def publish(ckpt: Path, repo_id: str, drop_in: str | None, private: bool | None, revision: str | None,
            tag: str | None, with_remote_code: bool, dry_run: bool, probe_target: str | None,
            probe_prompts: str | None, transfer: Transfer, endpoint: str | None, quiet: bool, as_json: bool) -> None:
    """Gate (verify + card lint), upload CKPT to ORG/NAME, then compare the Hub's files with the local ones.

    The token comes from huggingface_hub's usual sources (HF_TOKEN, 'hf auth login') and is never printed.
    """
    from dspark_hub.hub.release import (
        publish_checkpoint,  # loads when the command runs (--help stays light)
    )

    if probe_prompts is not None and probe_target is None:
        raise click.UsageError("--probe-prompts goes with --probe TARGET")
    check = None
    if probe_target is not None:
        from dspark_hub.train.evaluation.probe_gate import add_to_report  # torch: only a probing gate pays for it

        def check(folder: Path, report: Any) -> None:
            add_to_report(report, folder, target=probe_target, prompts=probe_prompts)

    with progress("sha256", quiet=quiet or as_json) as bar:
        outcome = publish_checkpoint(ckpt, repo_id, drop_in=drop_in, private=private, revision=revision, tag=tag,
                                     with_remote_code=with_remote_code, endpoint=endpoint, dry_run=dry_run,
                                     transfer=transfer, progress=bar, check=check)
    emit(outcome, as_json=as_json, renderer="render_publication")


@command("export-code")
@click.argument("folder", type=click.Path(path_type=Path))
@force_option
@json_option
def export_code(folder: Path, force: bool, as_json: bool) -> None:
    """Copy the modeling files and an auto_map into FOLDER for trust_remote_code loading."""
    from dspark_hub.format.remote_code import export_code as export  # loads when the command runs (--help stays light)

    emit(export(folder, force=force), as_json=as_json, renderer="render_export")
