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
CHANGES_PER_KIND = 4   # convert's human view; --json lists every change


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


def render_deep(report: Report) -> None:
    """Digests and the frozen-embedding verdict of a deep verify."""
    deep = report.sections.get("deep")
    if deep:
        for f in deep["files"]:
            stdout.print(f"sha256  {f['sha256']}  {f['name']} ({f['size']:,} bytes, {f['seconds']:.1f} s)")
        flagged = sum(1 for t in deep["tensors"].values() if t["nan"] or t["inf"])
        stdout.print(f"scanned {len(deep['tensors'])} tensors: {flagged} with NaN/inf")
    frozen = report.sections.get("frozen_embed")
    if frozen:
        verdict = {True: "[green]bit-identical[/]", False: "[bold red]DIFFERENT[/]", None: "not checked"}
        stdout.print(f"frozen embed vs {frozen['teacher_tensor']['location']}: {verdict[frozen['identical']]}")


def _short(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


def render_diff(result: Any) -> None:
    """Human view of a `DiffReport`."""
    d = result.to_dict()
    cfg, roster = d["config"], d["roster"]
    if cfg["added"] or cfg["removed"] or cfg["changed"]:
        table = Table(title="config.json", expand=False)
        for col in ("key", "A", "B"):
            table.add_column(col, overflow="fold")
        for key, value in cfg["removed"].items():
            table.add_row(f"[red]- {key}[/]", _short(value), "")
        for key, value in cfg["added"].items():
            table.add_row(f"[green]+ {key}[/]", "", _short(value))
        for key, pair in cfg["changed"].items():
            table.add_row(f"[yellow]~ {key}[/]", _short(pair["a"]), _short(pair["b"]))
        stdout.print(table)
    for name, e in roster["removed"].items():
        stdout.print(f"[red]- {name}[/] {e['shape']} {e['dtype']} (only in A)")
    for name, e in roster["added"].items():
        stdout.print(f"[green]+ {name}[/] {e['shape']} {e['dtype']} (only in B)")
    for name, e in roster["shape"].items():
        stdout.print(f"[yellow]~ {name}[/] shape {e['a']} -> {e['b']}")
    for name, e in roster["dtype"].items():
        stdout.print(f"[yellow]~ {name}[/] dtype {e['a']} -> {e['b']}")
    changed = {n: t for n, t in d["tensors"].items() if not t["identical"]}
    if changed:
        table = Table(title="changed tensors (relative L2 ||b-a||/||a||)", expand=False)
        table.add_column("tensor")
        table.add_column("rel L2", justify="right")
        for name, t in sorted(changed.items(), key=lambda kv: -(kv[1]["rel_l2"] or float("inf"))):
            table.add_row(name, "-" if t["rel_l2"] is None else f"{t['rel_l2']:.3e}")
        stdout.print(table)
    for p in d["problems"]:
        stdout.print(f"[red]{p['side'].upper()}: {p['where']}: {p['message']}[/]")
    s = d["summary"]
    verdict = ("[bold green]identical[/]" if d["identical"] else
               "[yellow]only the weights differ[/]" if d["weights_only"] else "[bold red]different[/]")
    stdout.print(f"{verdict}: {s['identical']} of {s['compared']} common tensors byte-identical, "
                 f"{s['changed']} changed  ({d['a']} -> {d['b']})")


def render_convert(result: Any) -> None:
    """Human view of a `ConvertReport`."""
    d = result.to_dict()
    table = Table(title=f"changes {d['src']} -> {d['dst']}", expand=False)
    for col in ("kind", "target", "detail"):
        table.add_column(col, overflow="fold")
    shown: dict[str, int] = {}
    for c in d["changes"]:
        shown[c["kind"]] = shown.get(c["kind"], 0) + 1
        if shown[c["kind"]] <= CHANGES_PER_KIND:
            table.add_row(c["kind"], c["target"], c["detail"])
    for kind, n in shown.items():
        if n > CHANGES_PER_KIND:
            table.add_row(kind, f"... and {n - CHANGES_PER_KIND} more", "(all listed with --json)")
    if d["changes"]:
        stdout.print(table)
    stdout.print(f"wrote {d['dst']}: {d['tensors']} tensors, {d['weights_bytes']:,} bytes")
    if d["verify"]["ok"]:
        stdout.print("[bold green]verify OK[/]")
    else:
        errors = ", ".join(f"{e['code']} ({e['where']})" for e in d["verify"]["errors"][:5])
        stdout.print(f"[bold red]verify still fails[/]: {errors}; run: dspark-hub verify {d['dst']}")


@click.group(cls=DsparkGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="dspark-hub")
@click.option("--debug", is_flag=True, help="Show full tracebacks (or set DSPARK_DEBUG=1).")
def cli(debug: bool) -> None:
    """Verify, train, card and publish k3_dspark speculative-decoding drafts."""


@cli.command()
@click.argument("path")
@click.option("--drop-in", "drop_in", metavar="REF",
              help=f"Also demand drop-in identity with a bundled reference ({', '.join(contract.REFERENCES)}) "
                   "or a checkpoint folder.")
@click.option("--deep", is_flag=True, help="Also stream every weight file: SHA-256, NaN/inf counts, all-zero "
                                          "matrices, per-tensor mean/std/max|x| (local folders).")
@click.option("--frozen-embed", "frozen_embed", metavar="TEACHER",
              help="Demand embed_tokens.weight be bit-identical to the embedding in the TEACHER checkpoint "
                   "(folder, sharded or not, or a .safetensors file).")
@quiet_option
@json_option
@click.pass_context
def verify(ctx: click.Context, path: str, drop_in: str | None, deep: bool, frozen_embed: str | None,
           quiet: bool, as_json: bool) -> None:
    """Check a checkpoint folder (or hf://ORG/NAME[@REV]) against its config, the runtime rules and the contract.

    Exit codes: 0 no error finding, 1 error findings, 2 usage or I/O error.
    """
    from . import checks

    if deep or frozen_embed is not None:
        from .deep import planned_bytes

        total = planned_bytes(path, deep=deep, frozen_embed=frozen_embed)
        with progress_bar("verify --deep" if deep else "frozen-embed", total,
                          enabled=not (quiet or as_json)) as advance:
            report = checks.verify(path, drop_in=drop_in, deep=deep, frozen_embed=frozen_embed, progress=advance)
    else:
        report = checks.verify(path, drop_in=drop_in)
    if as_json:
        print_json(report.to_dict())
    else:
        render_report(report)
        render_deep(report)
    ctx.exit(0 if report.ok else 1)


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


@cli.command()
@click.argument("a", type=click.Path(path_type=Path))
@click.argument("b", type=click.Path(path_type=Path))
@quiet_option
@json_option
def diff(a: Path, b: Path, quiet: bool, as_json: bool) -> None:
    """Compare checkpoint folders A and B: config keys, roster, and every common tensor's bytes.

    Per tensor: identical bytes, or the relative L2 change ||b-a||/||a||. Exit code 0 whether or not
    they differ (read "identical" / "weights_only" in the output); 2 on usage or I/O error.
    """
    from .diff import diff as diff_checkpoints, planned_bytes

    with progress_bar("diff", planned_bytes(a, b), enabled=not (quiet or as_json)) as advance:
        result = diff_checkpoints(a, b, progress=advance)
    if as_json:
        print_json(result.to_dict())
    else:
        render_diff(result)


@cli.command()
@click.argument("src", type=click.Path(path_type=Path))
@click.argument("dst", type=click.Path(path_type=Path))
@force_option
@quiet_option
@json_option
def convert(src: Path, dst: Path, force: bool, quiet: bool, as_json: bool) -> None:
    """Rewrite a near-miss export in SRC as a contract checkpoint in DST, reporting every change.

    Renames trainer names, strips model./module. prefixes, drops lm_head, casts F32/F16 to BF16,
    merges shards, repairs the config. SRC is never modified. Exit codes: 0 written, 2 usage or I/O error.
    """
    from .convert import convert as convert_checkpoint, planned_bytes
    from .writer import check_writable

    check_writable(dst, force=force)
    with progress_bar("convert", planned_bytes(src), enabled=not (quiet or as_json)) as advance:
        result = convert_checkpoint(src, dst, force=force, progress=advance)
    if as_json:
        print_json(result.to_dict())
    else:
        render_convert(result)


def main() -> None:
    """Console-script entry point: SIGTERM unwinds like Ctrl-C so writers clean up."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    cli(prog_name="dspark-hub")
