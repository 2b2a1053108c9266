"""Human views of the release commands' results (checksums, package, export, publish), cards and golden vectors."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dspark_hub._text import plural
from dspark_hub.cli._errors import in_cli_terms
from dspark_hub.cli._render_verify import render_findings, verdict_line
from dspark_hub.cli._table import Cell, Column, print_table
from dspark_hub.cli._terminal import TerminalText as Text
from dspark_hub.cli._terminal import stdout

if TYPE_CHECKING:
    from dspark_hub.format.remote_code import ExportResult
    from dspark_hub.hub.checksums import ChecksumCheck, ChecksumFiles
    from dspark_hub.hub.package import PackageResult
    from dspark_hub.verify.golden import GoldenCheck, GoldenWrite


def _file_problems(title: str, problems: list[Any]) -> None:
    print_table(title, (Column("file"), Column("problem"), Column("message", prose=True)),
                [[p.path, p.kind, p.message] for p in problems])


def render_checksums(written: ChecksumFiles) -> None:
    """Human view of `ChecksumFiles`."""
    stdout.print(f"wrote {written.sums_path} and {written.manifest_path} "
                 f"({plural(len(written.manifest.files), 'file')}, {plural(written.manifest.total_bytes, 'byte')}); "
                 f"check with: sha256sum -c SHA256SUMS (in {written.path})")


def render_checksum_check(check: ChecksumCheck) -> None:
    """Human view of a `ChecksumCheck`."""
    if check.problems:
        _file_problems(f"checksum problems in {check.path}", check.problems)
    else:
        stdout.print(f"OK  {check.path}: every file matches its checksum")


def render_package(result: PackageResult) -> None:
    """Human view of a `PackageResult`."""
    stdout.print(f"wrote {result.path}: {', '.join(sorted(result.files))}")
    stdout.print(f"infohash {result.infohash}")
    stdout.print(f"magnet   {result.magnet}")


def render_export(result: ExportResult) -> None:
    """Human view of an `ExportResult`."""
    stdout.print(f"{result.path}: wrote {', '.join(result.written) or 'nothing'}"
                 + (f" (unchanged: {', '.join(result.unchanged)})" if result.unchanged else "")
                 + "; load with AutoModel.from_pretrained(folder, trust_remote_code=True)")


def render_publication(outcome: Any) -> None:
    """Human view of a `Publication`: the refusals, the dry-run plan, or what landed on the Hub."""
    if not outcome.gate.ok:
        stdout.print(Text.assemble(("refused", "bold red"),
                                   f": nothing was sent ({plural(len(outcome.gate.refusals), 'problem')})"))
        for reason in outcome.gate.refusals:
            stdout.print(f"  {in_cli_terms(reason)}")
        return
    result = outcome.result
    plan = result.plan
    if result.status == "dry_run":
        print_table(f"plan: {plan.repo_id}@{plan.revision} ({plan.endpoint})",
                    (Column("file"), Column("bytes", justify="right"), Column("storage")),
                    [[f.path, f"{f.size:,}", "LFS" if f.lfs else "regular"] for f in plan.files])
        stdout.print(f"{plural(len(plan.files), 'file')}, {plural(plan.total_bytes, 'byte')} "
                     f"({plan.lfs_bytes:,} in LFS storage); commit: {plan.commit_message}; dry run: nothing sent")
        stdout.print(f"transfer: {plan.transfer}"
                     + (" (Xet where hf_xet is installed and the endpoint offers it, else LFS)"
                        if plan.transfer == "auto" else ""))
        return
    if result.problems:
        _file_problems("the Hub's files differ from the local ones", result.problems)
    stdout.print(f"{result.status}: {result.commit_url}" + (f" (tag {result.tag})" if result.tag else ""))
    if result.transfer is not None and result.status == "published":
        name = {"lfs": "LFS", "xet": "Xet"}[result.transfer.name]
        stdout.print(f"uploaded through {name} ({result.transfer.reason}); choose with --transfer auto|xet|lfs")
    if not result.problems:
        stdout.print(f"the Hub's {plural(len(plan.files), 'file')} match the local SHA-256 digests")


# ----------------------------------------------------------------------------- cards and golden vectors

def render_written_card(result: Any) -> None:
    """Human view of a `CardResult`."""
    stdout.print(f"wrote {result.path} ({plural(result.bytes, 'byte')}); check it with: dspark-hub card lint "
                 f"{result.path}" + (f" --checkpoint {result.checkpoint}" if result.checkpoint else ""))


def render_card_lint(report: Any) -> None:
    """Human view of a card `LintReport`."""
    render_findings(report.sorted_findings(), f"findings for {report.path}")
    stdout.print(verdict_line(report.ok, len(report.errors), report.path))


def render_golden_write(result: GoldenWrite) -> None:
    """Human view of a `GoldenWrite`."""
    cases = ", ".join(f"{c} from position {p}" for c, p in result.cases.items())
    stdout.print(f"wrote {result.path} ({plural(result.bytes, 'byte')}; cases {cases}); "
                 f"check it with: dspark-hub golden check {result.input} {result.path}")


def render_golden_check(result: GoldenCheck) -> None:
    """Human view of a `GoldenCheck`: every compared tensor, the problems, the verdict."""
    rows: list[list[Cell]] = []
    for c in result.comparisons:
        tol = f"atol {c['atol']:g} rtol {c['rtol']:g}" if "atol" in c else "exact"
        diff = "-" if c.get("max_abs") is None else f"{c['max_abs']:.3g}"
        rows.append([c["tensor"], Text("yes", style="green") if c["ok"] else Text("NO", style="bold red"), diff, tol])
    print_table(f"golden check {result.fixture}", (Column("tensor"), Column("ok"), Column("max |diff|", label=True),
                                                  Column("tolerance", label=True)), rows)
    for problem in result.problems:
        stdout.print(Text.assemble(("problem", "bold red"), f": {problem}"))
    stdout.print(Text("OK", style="bold green") if result.ok else Text("FAILED", style="bold red"))
