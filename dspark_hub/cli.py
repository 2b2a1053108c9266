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


@cli.command()
@click.argument("path")
@click.option("--drop-in", "drop_in", metavar="REF",
              help=f"Also demand drop-in identity with a bundled reference ({', '.join(contract.REFERENCES)}) "
                   "or a checkpoint folder.")
@json_option
@click.pass_context
def verify(ctx: click.Context, path: str, drop_in: str | None, as_json: bool) -> None:
    """Check a checkpoint folder (or hf://ORG/NAME[@REV]) against its config, the runtime rules and the contract."""
    from . import checks

    report = checks.verify(path, drop_in=drop_in)
    if as_json:
        print_json(report.to_dict())
    else:
        render_report(report)
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


@contextmanager
def count_bar(description: str, *, enabled: bool = True) -> Iterator[tuple[Callable[[int], None], Callable[[int], None]]]:
    """A rich item-count progress bar on stderr (terminal only); yields `(advance(n), set_total(n))`."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                  console=stderr, disable=not (enabled and stderr.is_terminal)) as bar:
        task = bar.add_task(description, total=None)
        yield (lambda n: bar.advance(task, n)), (lambda n: bar.update(task, total=n))


@cli.command()
@click.option("--teacher", required=True, metavar="DIR", help="Local transformers causal LM folder.")
@click.option("--prompts", required=True, metavar="JSONL", help="Lines with messages, text or input_ids (+ dataset).")
@click.option("--draft-config", "draft_config", required=True, metavar="CONFIG",
              help="The draft's config.json (taps and pairing keys).")
@click.option("--out", required=True, metavar="DIR", help="Rollouts folder (resumed when it exists).")
@click.option("--max-new-tokens", "max_new_tokens", type=int, default=256, show_default=True)
@click.option("--batch-size", "batch_size", type=int, default=8, show_default=True,
              help="Equal-length prompts generated together.")
@click.option("--shard-size", "shard_size", type=int, default=256, show_default=True, help="Sequences per shard.")
@click.option("--ignore-eos", "ignore_eos", is_flag=True, help="Always generate --max-new-tokens tokens.")
@force_option
@quiet_option
@json_option
def rollouts(teacher: str, prompts: str, draft_config: str, out: str, max_new_tokens: int, batch_size: int,
             shard_size: int, ignore_eos: bool, force: bool, quiet: bool, as_json: bool) -> None:
    """Write teacher greedy continuations with the draft's tap states (resumable safetensors shards)."""
    from .rollouts import make_rollouts

    with count_bar("rollouts", enabled=not (quiet or as_json)) as (advance, set_total):
        summary = make_rollouts(teacher, prompts, draft_config, out, max_new_tokens=max_new_tokens,
                                batch_size=batch_size, shard_size=shard_size, ignore_eos=ignore_eos, force=force,
                                progress=advance, total=set_total)
    if as_json:
        print_json(summary.to_dict())
        return
    agreement = "-" if summary.greedy_agreement is None else f"{summary.greedy_agreement:.4f}"
    stdout.print(f"wrote {summary.written} sequences ({summary.skipped} already there) to {summary.out}: "
                 f"{summary.sequences} sequences, {summary.continuation_tokens:,} continuation tokens, "
                 f"{summary.shards} shards, greedy agreement {agreement}")


@cli.command()
@click.option("--base", required=True, metavar="CKPT", help="The k3_dspark checkpoint to start from.")
@click.option("--data", metavar="DIR", help="Rollouts folder ('dspark-hub rollouts').")
@click.option("--out", required=True, metavar="DIR", help="Output checkpoint folder (written atomically).")
@click.option("--steps", type=int, help="Optimizer steps.")
@click.option("--epochs", type=float, help="Passes over --data (instead of --steps).")
@click.option("--lr", type=float, default=3e-4, show_default=True, help="Peak learning rate.")
@click.option("--min-lr-ratio", "min_lr_ratio", type=float, default=0.1, show_default=True,
              help="Cosine floor as a fraction of --lr.")
@click.option("--warmup", type=int, default=0, show_default=True, help="Linear warmup steps.")
@click.option("--batch-size", "batch_size", type=int, default=8, show_default=True, help="Global sequences per step.")
@click.option("--block-size", "block_size", type=int, default=7, show_default=True, help="K drafts per block.")
@click.option("--anchors", "max_anchors", type=int, default=512, show_default=True, help="Max anchors per sequence.")
@click.option("--loss", default='{"ce":0.1,"tv":0.9}', show_default=True, help="JSON weights of ce, kl, tv.")
@click.option("--gamma", type=float, default=4.0, show_default=True, help="Slot weight exp(-k/gamma).")
@click.option("--alpha", type=float, default=1.0, show_default=True, help="Confidence-head BCE weight.")
@click.option("--clip", type=float, default=1.0, show_default=True, help="Gradient-norm clip (0 = off).")
@click.option("--weight-decay", "weight_decay", type=float, default=0.0, show_default=True)
@click.option("--dtype", type=click.Choice(["fp32", "bf16"]), default="fp32", show_default=True,
              help="bf16 = bf16 autocast over fp32 master weights.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--save-every", "save_every", type=int, default=0, show_default=True, help="Steps between states.")
@click.option("--resume", is_flag=True, help="Continue from the latest state in --state-dir.")
@click.option("--state-dir", "state_dir", metavar="DIR", help="Training states and log (default OUT.state).")
@click.option("--teacher", metavar="DIR", help="Teacher folder (lm_head; rollouts with --on-policy).")
@click.option("--on-policy", "on_policy", is_flag=True, help="Alternate teacher rollouts and draft updates.")
@click.option("--rounds", type=int, default=1, show_default=True, help="On-policy rounds.")
@click.option("--prompts", metavar="JSONL", help="Prompts for --on-policy.")
@click.option("--max-new-tokens", "max_new_tokens", type=int, default=256, show_default=True)
@click.option("--eval-data", "eval_data", metavar="DIR", help="Held-out rollouts for acceptance in the log.")
@click.option("--eval-every", "eval_every", type=int, default=0, show_default=True)
@click.option("--fsdp", is_flag=True, help="Shard with FSDP2 fully_shard under torchrun instead of DDP.")
@force_option
@quiet_option
@json_option
def finetune(quiet: bool, as_json: bool, **options: Any) -> None:
    """Fine-tune drop-in k3_dspark weights on teacher rollouts (one process or torchrun)."""
    from .objective import parse_loss
    from .train import TrainConfig, finetune as run

    config = TrainConfig(**{**options, "loss": parse_loss(options["loss"])})
    with count_bar("finetune", enabled=not (quiet or as_json)) as (advance, set_total):
        if config.steps:
            set_total(config.steps)
        result = run(config, progress=advance)
    if int(os.environ.get("RANK", "0")) != 0:
        return
    if as_json:
        print_json(result.to_dict())
        return
    loss = "-" if result.final_loss is None else f"{result.final_loss:.4f}"
    stdout.print(f"wrote {result.out}: {result.steps} steps, {result.tokens:,} tokens, "
                 f"{result.tokens_per_second:,.0f} tokens/s, final loss {loss} (log: {result.state_dir})")
    if result.eval:
        stdout.print(f"held-out acceptance length {result.eval['acceptance_length']:.4f} "
                     f"(prompt lookup {result.eval['baseline']['acceptance_length']:.4f})")


def render_eval(data: dict[str, Any]) -> None:
    """Acceptance table: draft, reference and prompt lookup, overall and per dataset."""
    block = len(data["per_position"])
    table = Table(title="simulated acceptance (greedy, teacher-forced)")
    for col in ["data", "drafter", "AL", *[f"a{k}" for k in range(1, block + 1)]]:
        table.add_column(col, justify="left" if col in ("data", "drafter") else "right")

    def row(scope: str, name: str, stats: dict[str, Any]) -> None:
        table.add_row(scope, name, f"{stats['acceptance_length']:.4f}", *[f"{a:.3f}" for a in stats["per_position"]])

    scopes = [("all", data)] + list(data["by_dataset"].items())
    for scope, stats in scopes:
        row(scope, "draft", stats)
        if stats.get("reference") or (scope == "all" and data["reference"]):
            row(scope, "reference", stats.get("reference") or data["reference"])
        row(scope, "prompt lookup", stats["baseline"])
    stdout.print(table)
    harness = data["harness"]
    stdout.print(f"{data['prompts']} prompts, {data['tokens']:,} continuation tokens, {data['steps']:,} steps; "
                 f"block size {harness['block_size']}; teacher {harness['teacher']['label']}")
    if data["reference"]:
        stdout.print(f"ratio to reference: {data['reference']['ratio']:.4f}")
    stdout.print(f"definition: {data['definition']}")


@cli.command(name="eval")
@click.option("--draft", required=True, metavar="CKPT", help="The k3_dspark checkpoint to measure.")
@click.option("--teacher", metavar="DIR", help="Teacher folder (rollouts and lm_head).")
@click.option("--prompts", metavar="JSONL", help="Held-out prompts, continued greedily by the teacher.")
@click.option("--data", metavar="DIR", help="A rollouts folder instead of --prompts.")
@click.option("--reference", metavar="CKPT", help="Also measure this draft on the same data; report the ratio.")
@click.option("--block-size", "block_size", type=int, default=7, show_default=True)
@click.option("--max-new-tokens", "max_new_tokens", type=int, default=256, show_default=True)
@click.option("--batch-size", "batch_size", type=int, default=8, show_default=True)
@click.option("--plot", type=click.Path(path_type=Path), help="Write a PNG of acceptance by position (matplotlib).")
@quiet_option
@json_option
def eval_command(draft: str, teacher: str | None, prompts: str | None, data: str | None, reference: str | None,
                 block_size: int, max_new_tokens: int, batch_size: int, plot: Path | None, quiet: bool,
                 as_json: bool) -> None:
    """Simulated acceptance of a draft on held-out prompts, next to a prompt-lookup drafter."""
    from .evaluate import evaluate, plot_acceptance, require_matplotlib

    if plot is not None:
        require_matplotlib()   # fail before the long run, not after it
    with count_bar("eval", enabled=not (quiet or as_json)) as (advance, _):
        result = evaluate(draft, teacher=teacher, prompts=prompts, data=data, reference=reference,
                          block_size=block_size, max_new_tokens=max_new_tokens, batch_size=batch_size,
                          progress=advance)
    if plot is not None:
        plot_acceptance(result, plot)
    if as_json:
        print_json(result.to_dict())
    else:
        render_eval(result.to_dict())


def main() -> None:
    """Console-script entry point: SIGTERM unwinds like Ctrl-C so writers clean up."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    cli(prog_name="dspark-hub")
