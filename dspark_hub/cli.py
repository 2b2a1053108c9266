"""The `dspark-hub` command line: parse arguments, call one library function, render the result.

Exit codes: 0 no error finding, 1 error findings, 2 usage or I/O error, 130 interrupted.
Data goes to stdout (one JSON document with --json); progress, warnings and errors to stderr.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

import click
from rich.console import Console
from rich.table import Table

from . import __version__, contract
from .errors import DsparkError
from .report import Report

stdout = Console(highlight=False, soft_wrap=False)
stderr = Console(stderr=True, highlight=False)
SEVERITY_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}


class DsparkGroup(click.Group):
    """The one error boundary: a `DsparkError` becomes one line on stderr and its exit code."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except DsparkError as e:
            if _debug(ctx):
                raise
            raise _cli_error(e.message, e.hint, e.exit_code) from None
        except OSError as e:
            if _debug(ctx):
                raise
            where = e.filename or "I/O"
            raise _cli_error(f"{where}: {e.strerror or e}", None, 2) from None
        except KeyboardInterrupt:
            stderr.print("interrupted")
            ctx.exit(130)


def _debug(ctx: click.Context) -> bool:
    return bool(ctx.params.get("debug")) or os.environ.get("DSPARK_DEBUG", "") not in ("", "0")


def _cli_error(message: str, hint: str | None, code: int) -> click.ClickException:
    err = click.ClickException(message + (f"\n  hint: {hint}" if hint else ""))
    err.exit_code = code
    return err


def json_option(f: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("--json", "as_json", is_flag=True, help="Print one JSON document (stable schema).")(f)


def force_option(f: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("--force", is_flag=True, help="Replace an existing output.")(f)


def quiet_option(f: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("-q", "--quiet", is_flag=True, help="No progress bar.")(f)


@contextmanager
def progress_bar(description: str, total: int | None, *, enabled: bool = True) -> Iterator[Callable[[int], None]]:
    """A rich progress bar on stderr, shown only on a terminal; yields `advance(nbytes)`."""
    from rich.progress import (BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn,
                               TransferSpeedColumn)

    with Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                  TimeRemainingColumn(), console=stderr,
                  disable=not (enabled and stderr.is_terminal)) as bar:
        task = bar.add_task(description, total=total)
        yield lambda n: bar.advance(task, n)


def print_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2))


def render_report(report: Report) -> None:
    """Human view of a verify report: findings table, then summary."""
    findings = report.sorted_findings()
    if findings:
        table = Table(title=f"findings for {report.path}", show_lines=False, expand=False)
        for col in ("severity", "where", "message", "hint"):
            table.add_column(col, overflow="fold")
        for f in findings:
            table.add_row(f"[{SEVERITY_STYLE[f.severity]}]{f.severity}[/]", f.where, f.message, f.hint or "")
        stdout.print(table)
    s = report.summary
    params = s.parameters or {}
    stdout.print(f"layout: {s.layout or '-'}   files: {len(s.files)}   tensors: {s.tensors}   "
                 f"bytes: {s.bytes:,}   dtypes: {', '.join(f'{k} x{v}' for k, v in sorted(s.dtypes.items())) or '-'}")
    if params:
        stdout.print(f"parameters: {params['total']:,} total / {params['trained']:,} trained / "
                     f"{params['frozen']:,} frozen (embed_tokens)")
    errors = len(report.errors)
    verdict = "[bold green]OK[/]" if report.ok else f"[bold red]FAILED[/] ({errors} error{'s' * (errors != 1)})"
    stdout.print(f"{verdict}  {report.path}")


@click.group(cls=DsparkGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="dspark-hub")
@click.option("--debug", is_flag=True, help="Show full tracebacks (or set DSPARK_DEBUG=1).")
def cli(debug: bool) -> None:
    """Verify, train, card and publish k3_dspark speculative-decoding drafts."""


def runtime_choices() -> list[str]:
    """`--runtime` choices, derived from the runtimes registry (never typed twice)."""
    from .runtimes import RUNTIMES

    return [*RUNTIMES, "all"]


@cli.command()
@click.argument("path")
@click.option("--drop-in", "drop_in", metavar="REF",
              help=f"Also demand drop-in identity with a bundled reference ({', '.join(contract.REFERENCES)}) "
                   "or a checkpoint folder.")
@click.option("--runtime", "runtime", multiple=True, type=click.Choice(runtime_choices()),
              help="Judge every tensor through this runtime's loader (repeatable, or 'all') and print its "
                   "serving command.")
@click.option("--target", "target", metavar="TARGET",
              help="Check the pairing with this target model (folder or hf://ORG/NAME[@REV]).")
@click.option("--block-size", "block_size", type=click.IntRange(min=1), default=None,
              help="Draft tokens per block for the serving commands (not a config key; default 7, the "
                   "reference draft's).")
@json_option
@click.pass_context
def verify(ctx: click.Context, path: str, drop_in: str | None, runtime: tuple[str, ...], target: str | None,
           block_size: int | None, as_json: bool) -> None:
    """Check a checkpoint folder (or hf://ORG/NAME[@REV]) against its config, the runtime rules and the contract."""
    from . import checks

    report = checks.verify(path, drop_in=drop_in, runtime=list(runtime) or None, target=target,
                           block_size=block_size)
    if as_json:
        print_json(report.to_dict())
    else:
        render_sections(report)
        render_report(report)
    ctx.exit(0 if report.ok else 1)


VERDICT_STYLE = {"loaded": "green", "skipped": "cyan", "ignored": "bold red", "fatal": "bold red"}


def render_sections(report: Report) -> None:
    """Human view of the optional family, runtimes and pairing sections (nothing when absent)."""
    family = report.sections.get("family")
    if family and family["family"] != "k3_dspark":
        stdout.print(f"family: {family['title']} ({'; '.join(family['evidence'])})")
    for name, data in (report.sections.get("runtimes") or {}).items():
        table = Table(title=f"{data['title']}: per-tensor verdicts", expand=False)
        for col in ("tensor", "verdict", "detail"):
            table.add_column(col, overflow="fold")
        rows = [(v["tensor"], v["verdict"], v["detail"]) for v in data["verdicts"]]
        rows += [(u["parameter"] + " (unfilled)", u["verdict"], u["detail"]) for u in data["unfilled"]]
        for tensor, verdict, detail in rows:
            table.add_row(tensor, f"[{VERDICT_STYLE[verdict]}]{verdict}[/]", detail)
        stdout.print(table)
        serving = data["serving"]
        stdout.print(f"serve with {data['title']} ({serving['num_speculative_tokens']} draft tokens; "
                     f"{serving['block_size_source']}; target layers {serving['target_layer_ids']} from "
                     "config.json):")
        stdout.print(f"  {serving['command']}", markup=False)
    pairing = report.sections.get("pairing")
    if pairing:
        embedding = pairing["embedding"]
        stdout.print(f"paired with {pairing['target']} (revision {pairing['revision'] or 'unknown'}; "
                     f"config sha256 {pairing['config']['sha256'][:16]}; embedding identical: "
                     f"{embedding['identical']})")


@cli.command()
@click.argument("dst", type=click.Path(path_type=Path))
@click.option("--profile", type=click.Choice(sorted(contract.PROFILES)), default="tiny", show_default=True,
              help="kimi-k3 writes the full reference shape (7.12 GB).")
@click.option("--init", "init_kind", type=click.Choice(["random", "zeros"]), default="random", show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@force_option
@quiet_option
@json_option
def init(dst: Path, profile: str, init_kind: str, seed: int, force: bool, quiet: bool, as_json: bool) -> None:
    """Write a conforming k3_dspark checkpoint (config.json + model.safetensors) to DST."""
    from .writer import check_writable, init_checkpoint

    check_writable(dst, force=force)
    cfg = contract.profile_config(profile)
    total = sum(s.nbytes for s in contract.roster(cfg).values())
    with progress_bar(f"init {profile}", total, enabled=not (quiet or as_json)) as advance:
        out = init_checkpoint(dst, profile=profile, init=init_kind, seed=seed, force=force, progress=advance)
    size = (out / contract.WEIGHTS_NAME).stat().st_size
    if as_json:
        print_json({"schema": "dspark-hub/init/1", "path": str(out), "profile": profile, "init": init_kind,
                    "seed": seed, "weights_bytes": size})
    else:
        stdout.print(f"wrote {out} ({profile}, {init_kind}, {size:,} bytes); check it with: dspark-hub verify {out}")


class DefaultCommandGroup(click.Group):
    """A group whose first argument may be a subcommand or the default command's argument.

    `dspark-hub golden CKPT -o F` runs the hidden `write` command; `dspark-hub golden check ...`
    runs `check`.
    """

    default_command = "write"

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in ctx.help_option_names:
            args = [self.default_command, *args]
        return super().parse_args(ctx, args)


@cli.group(cls=DefaultCommandGroup)
def golden() -> None:
    """Golden vectors: `golden CKPT -o FILE` writes a fixture of the reference forward; `golden check` recomputes it.

    \b
    dspark-hub golden CKPT -o golden.safetensors [--lm-head FILE] [--seed N] [--block-size K]
    dspark-hub golden check CKPT golden.safetensors [--lm-head FILE] [--atol X --rtol Y]
    """


@golden.command("write", hidden=True)
@click.argument("ckpt", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("-o", "--output", "output", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="The golden .safetensors file to write.")
@click.option("--lm-head", "lm_head", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="A safetensors file with the target's lm_head weight (default: a seeded stand-in).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seeds the inputs and the stand-in lm_head.")
@click.option("--block-size", "block_size", type=click.IntRange(min=1), default=7, show_default=True)
@force_option
@json_option
def golden_write(ckpt: Path, output: Path, lm_head: Path | None, seed: int, block_size: int, force: bool,
                 as_json: bool) -> None:
    """Write the golden fixture of CKPT."""
    from .golden import write_golden

    result = write_golden(ckpt, output, lm_head=lm_head, seed=seed, block_size=block_size, force=force)
    if as_json:
        print_json(result)
    else:
        stdout.print(f"wrote {result['path']} ({result['bytes']:,} bytes; cases "
                     f"{', '.join(f'{c} from position {p}' for c, p in result['cases'].items())}); "
                     f"check it with: dspark-hub golden check {ckpt} {output}")


@golden.command("check")
@click.argument("ckpt", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.argument("fixture", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--lm-head", "lm_head", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="The lm_head file the fixture was written with (if any).")
@click.option("--atol", type=float, default=None, help="Override the stored absolute tolerance.")
@click.option("--rtol", type=float, default=None, help="Override the stored relative tolerance.")
@json_option
@click.pass_context
def golden_check(ctx: click.Context, ckpt: Path, fixture: Path, lm_head: Path | None, atol: float | None,
                 rtol: float | None, as_json: bool) -> None:
    """Recompute FIXTURE on CKPT and compare within the stored tolerances (exit 0 when all match, else 1)."""
    from .golden import check_golden

    result = check_golden(ckpt, fixture, lm_head=lm_head, atol=atol, rtol=rtol)
    if as_json:
        print_json(result.to_dict())
    else:
        table = Table(title=f"golden check {fixture}", expand=False)
        for col in ("tensor", "ok", "max |diff|", "tolerance"):
            table.add_column(col)
        for c in result.comparisons:
            tol = f"atol {c['atol']:g} rtol {c['rtol']:g}" if "atol" in c else "exact"
            diff = "-" if c.get("max_abs") is None else f"{c['max_abs']:.3g}"
            table.add_row(c["tensor"], "[green]yes[/]" if c["ok"] else "[bold red]NO[/]", diff, tol)
        stdout.print(table)
        for problem in result.problems:
            stdout.print(f"[bold red]problem[/]: {problem}")
        stdout.print("[bold green]OK[/]" if result.ok else "[bold red]FAILED[/]")
    ctx.exit(0 if result.ok else 1)


def main() -> None:
    """Console-script entry point: SIGTERM unwinds like Ctrl-C so writers clean up."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    cli(prog_name="dspark-hub")
