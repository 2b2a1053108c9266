"""Human rendering for the CLI: rich tables on stdout, progress bars on stderr.

Everything here turns a library result into text; nothing computes. `--json` output does
not pass through here: the CLI prints the result's own `to_dict()`.
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

from dspark_hub.report import Finding, Report

# Markup and emoji are off: tensor names, keys and paths come from checkpoints and are printed as they
# are ('bad[/x]name' must not crash, ':smile:' must not become a picture). Styles use `Text`.
# soft_wrap keeps commands, URLs and paths on one line for copy and paste.
stdout = Console(highlight=False, soft_wrap=True, markup=False, emoji=False)
stderr = Console(stderr=True, highlight=False, markup=False, emoji=False)


def verdict_line(ok: bool, errors: int, where: str) -> Text:
    """`OK  path` or `FAILED (n errors)  path`, styled."""
    head = Text("OK", style="bold green") if ok else Text.assemble(
        ("FAILED", "bold red"), f" ({errors} error{'s' * (errors != 1)})")
    return Text.assemble(head, f"  {where}")
SEVERITY_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}
CHANGES_PER_KIND = 4   # convert's human view; --json lists every change


class Bar:
    """What `progress_bar` yields: call it with bytes done since the last call, or `stage()` it."""

    def __init__(self, progress: Any, task: Any) -> None:
        self._progress, self._task = progress, task

    def __call__(self, n: int) -> None:
        self._progress.advance(self._task, n)

    def stage(self, description: str, done: int, total: int) -> None:
        """Absolute progress of a named stage (e.g. hashing, then torrent pieces)."""
        self._progress.update(self._task, description=description, completed=done, total=total)


@contextmanager
def progress_bar(description: str, total: int | None, *, enabled: bool = True) -> Iterator[Bar]:
    """A rich progress bar on stderr, shown only on a terminal."""
    from rich.progress import (BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn,
                               TransferSpeedColumn)

    with Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                  TimeRemainingColumn(), console=stderr,
                  disable=not (enabled and stderr.is_terminal)) as bar:
        yield Bar(bar, bar.add_task(description, total=total))


def print_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2))


def render_findings(findings: list[Finding], title: str) -> None:
    """A findings table (severity, where, message, hint) on stdout; nothing when there are none."""
    if findings:
        table = Table(title=title, show_lines=False, expand=False)
        for col in ("severity", "where", "message", "hint"):
            table.add_column(col, overflow="fold")
        for f in findings:
            table.add_row(Text(f.severity, style=SEVERITY_STYLE[f.severity]), f.where, f.message, f.hint or "")
        stdout.print(table)


def render_report(report: Report) -> None:
    """Human view of a verify report: findings table, then summary."""
    render_findings(report.sorted_findings(), f"findings for {report.path}")
    s = report.summary
    params = s.parameters or {}
    stdout.print(f"layout: {s.layout or '-'}   files: {len(s.files)}   tensors: {s.tensors}   "
                 f"bytes: {s.bytes:,}   dtypes: {', '.join(f'{k} x{v}' for k, v in sorted(s.dtypes.items())) or '-'}")
    if params:
        from dspark_hub.verify.formats import FORMATS

        names = ", ".join(n.removesuffix(".weight") for n in FORMATS[s.format or "k3_dspark"].frozen_tensors)
        frozen = f" ({names})" if params["frozen"] else ""
        maps = f"; {params['maps']:,} vocabulary-map elements (not parameters)" if params.get("maps") else ""
        stdout.print(f"parameters: {params['total']:,} total / {params['trained']:,} trained / "
                     f"{params['frozen']:,} frozen{frozen}{maps}")
    stdout.print(verdict_line(report.ok, len(report.errors), report.path))


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
        verdict = {True: Text("bit-identical", style="green"), False: Text("DIFFERENT", style="bold red"),
                   None: Text("not checked")}
        stdout.print(Text.assemble(f"frozen embed vs {frozen['teacher_tensor']['location']}: ",
                                   verdict[frozen["identical"]]))


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
            table.add_row(Text(f"- {key}", style="red"), _short(value), "")
        for key, value in cfg["added"].items():
            table.add_row(Text(f"+ {key}", style="green"), "", _short(value))
        for key, pair in cfg["changed"].items():
            table.add_row(Text(f"~ {key}", style="yellow"), _short(pair["a"]), _short(pair["b"]))
        stdout.print(table)
    for name, e in roster["removed"].items():
        stdout.print(Text.assemble((f"- {name}", "red"), f" {e['shape']} {e['dtype']} (only in A)"))
    for name, e in roster["added"].items():
        stdout.print(Text.assemble((f"+ {name}", "green"), f" {e['shape']} {e['dtype']} (only in B)"))
    for name, e in roster["shape"].items():
        stdout.print(Text.assemble((f"~ {name}", "yellow"), f" shape {e['a']} -> {e['b']}"))
    for name, e in roster["dtype"].items():
        stdout.print(Text.assemble((f"~ {name}", "yellow"), f" dtype {e['a']} -> {e['b']}"))
    changed = {n: t for n, t in d["tensors"].items() if not t["identical"]}
    if changed:
        table = Table(title="changed tensors (relative L2 ||b-a||/||a||)", expand=False)
        table.add_column("tensor")
        table.add_column("rel L2", justify="right")
        for name, t in sorted(changed.items(), key=lambda kv: -(kv[1]["rel_l2"] or float("inf"))):
            table.add_row(name, "-" if t["rel_l2"] is None else f"{t['rel_l2']:.3e}")
        stdout.print(table)
    for p in d["problems"]:
        stdout.print(Text(f"{p['side'].upper()}: {p['where']}: {p['message']}", style="red"))
    if not d["layout"]["same"]:
        la, lb = d["layout"]["a"], d["layout"]["b"]
        stdout.print(Text.assemble(("~ layout", "yellow"), f" A: {', '.join(la['files'])} {la['metadata']}; "
                                   f"B: {', '.join(lb['files'])} {lb['metadata']}"))
    s = d["summary"]
    verdict = (Text("identical", style="bold green") if d["identical"] else
               Text("only the weights differ", style="yellow") if d["weights_only"] else
               Text("different", style="bold red"))
    stdout.print(Text.assemble(verdict, f": {s['identical']} of {s['compared']} common tensors byte-identical, "
                               f"{s['changed']} changed  ({d['a']} -> {d['b']})"))


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
        stdout.print(Text("verify OK", style="bold green"))
    else:
        errors = ", ".join(f"{e['code']} ({e['where']})" for e in d["verify"]["errors"][:5])
        stdout.print(Text.assemble(("verify still fails", "bold red"), f": {errors}; run: dspark-hub verify {d['dst']}"))


VERDICT_STYLE = {"loaded": "green", "skipped": "cyan", "ignored": "bold red", "fatal": "bold red"}


def render_sections(report: Report) -> None:
    """Human view of the optional family, runtimes and pairing sections (nothing when absent)."""
    family = report.sections.get("family")
    if family and family["family"] != "k3_dspark":
        stdout.print(f"family: {family['title']} ({'; '.join(family['evidence'])})")
    for name, data in (report.sections.get("runtimes") or {}).items():
        if not data.get("supported", True):
            stdout.print(f"{data['title']}: {'; '.join(data['notes'])}")
            continue
        table = Table(title=f"{data['title']}: per-tensor verdicts", expand=False)
        for col in ("tensor", "verdict", "detail"):
            table.add_column(col, overflow="fold")
        rows = [(v["tensor"], v["verdict"], v["detail"]) for v in data["verdicts"]]
        rows += [(u["parameter"] + " (unfilled)", u["verdict"], u["detail"]) for u in data["unfilled"]]
        loaded = sum(1 for _, verdict, _ in rows if verdict == "loaded")
        for tensor, verdict, detail in rows:
            if verdict != "loaded":   # the loaded majority is counted below; --json lists every tensor
                table.add_row(tensor, Text(verdict, style=VERDICT_STYLE[verdict]), detail)
        if table.row_count:
            stdout.print(table)
        stdout.print(f"{data['title']}: {loaded} of {len(data['verdicts'])} tensors loaded"
                     + ("" if table.row_count else "; nothing skipped, ignored or fatal"))
        serving = data["serving"]
        stdout.print(f"serve with {data['title']} ({serving['num_speculative_tokens']} draft tokens; "
                     f"{serving['block_size_source']}; target layers {serving['target_layer_ids']} from "
                     "config.json):")
        for command in [serving["command"], *serving.get("alternatives", [])]:
            stdout.print(f"  {command}")
    pairing = report.sections.get("pairing")
    if pairing:
        embedding = pairing["embedding"]
        identical = "not compared (the draft saves none)" if embedding is None else embedding["identical"]
        stdout.print(f"paired with {pairing['target']} (revision {pairing['revision'] or 'unknown'}; "
                     f"config sha256 {pairing['config']['sha256'][:16]}; embedding identical: {identical})")


@contextmanager
def count_bar(description: str, *, enabled: bool = True) -> Iterator[tuple[Callable[[int], None], Callable[[int], None]]]:
    """A rich item-count progress bar on stderr (terminal only); yields `(advance(n), set_total(n))`."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                  console=stderr, disable=not (enabled and stderr.is_terminal)) as bar:
        task = bar.add_task(description, total=None)
        yield (lambda n: bar.advance(task, n)), (lambda n: bar.update(task, total=n))


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
                 f"block size {harness['block_size']}; teacher {harness['teacher']}")
    if data["reference"]:
        stdout.print(f"ratio to reference: {data['reference']['ratio']:.4f}")
    stdout.print(f"definition: {data['definition']}")


def _file_problems_table(title: str, problems: list[Any]) -> None:
    table = Table(title=title)
    for col in ("file", "problem", "message"):
        table.add_column(col, overflow="fold")
    for p in problems:
        table.add_row(p.path, p.kind, p.message)
    stdout.print(table)


def _render_publication(outcome: Any) -> None:
    if not outcome.gate.ok:
        stderr.print(Text.assemble(("refused", "bold red"), f": nothing was sent ({len(outcome.gate.refusals)} problems)"))
        for reason in outcome.gate.refusals:
            stdout.print(f"  {reason}")
        return
    result = outcome.result
    plan = result.plan
    if result.status == "dry_run":
        table = Table(title=f"plan: {plan.repo_id}@{plan.revision} ({plan.endpoint})")
        for col, justify in (("file", "left"), ("bytes", "right"), ("storage", "left")):
            table.add_column(col, justify=justify)   # type: ignore[arg-type]
        for f in plan.files:
            table.add_row(f.path, f"{f.size:,}", "LFS" if f.lfs else "regular")
        stdout.print(table)
        stdout.print(f"{len(plan.files)} files, {plan.total_bytes:,} bytes ({plan.lfs_bytes:,} through LFS); "
                     f"commit: {plan.commit_message}; dry run: nothing sent")
        return
    if result.problems:
        _file_problems_table("the Hub's files differ from the local ones", result.problems)
    stdout.print(f"{result.status}: {result.commit_url}" + (f" (tag {result.tag})" if result.tag else ""))
    if not result.problems:
        stdout.print(f"the Hub's {len(plan.files)} files match the local SHA-256 digests")

