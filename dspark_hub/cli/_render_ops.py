"""Human views of the ops commands' results: diff, convert, init."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from dspark_hub._text import plural, short_json
from dspark_hub.cli._table import Cell, Column, print_table
from dspark_hub.cli._terminal import TerminalText as Text
from dspark_hub.cli._terminal import stderr, stdout
from dspark_hub.format.contract import CONFIG_NAME

if TYPE_CHECKING:
    from dspark_hub.ops.convert import ConvertReport
    from dspark_hub.ops.diff import DiffReport, TensorDelta
    from dspark_hub.ops.init import InitResult

CHANGES_PER_KIND = 4   # convert's human view; --json lists every change
LINES_PER_KIND = 20    # diff's human view: lines of one kind (only in B, reshaped, ...); --json lists all


def _print_capped(lines: list[Text], kind: str) -> None:
    """At most `LINES_PER_KIND` of `lines`, then one line counting the rest (a header naming 120,000 extra
    tensors prints 21 lines, not 120,000)."""
    for line in lines[:LINES_PER_KIND]:
        stdout.print(line)
    if len(lines) > LINES_PER_KIND:
        stdout.print(Text(f"... and {len(lines) - LINES_PER_KIND:,} more {kind} (--json lists every one)",
                          style="dim"))


def _short(value: Any) -> str:
    return short_json(value, limit=60)   # a table cell


def render_diff(result: DiffReport) -> None:
    """Human view of a `DiffReport`."""
    rows: list[list[Cell]] = []
    rows += [[Text(f"- {key}", style="red"), _short(value), ""] for key, value in result.config_removed.items()]
    rows += [[Text(f"+ {key}", style="green"), "", _short(value)] for key, value in result.config_added.items()]
    rows += [[Text(f"~ {key}", style="yellow"), _short(a), _short(b)] for key, (a, b) in result.config_changed.items()]
    if rows:
        more = len(rows) - LINES_PER_KIND
        print_table(CONFIG_NAME + (f" (the first {LINES_PER_KIND} of {len(rows):,} keys that differ; --json lists "
                                   "every one)" if more > 0 else ""),
                    (Column("key"), Column("A", prose=True), Column("B", prose=True)), rows[:LINES_PER_KIND])
    _print_capped([Text.assemble((f"> {name} -> {to}", "cyan"), f" {list(shape)} {dtype} (renamed; the same bytes)")
                   for name, (to, shape, dtype, _) in result.renamed.items()], "renamed")
    _print_capped([Text.assemble((f"- {name}", "red"), f" {list(shape)} {dtype} (only in A)")
                   for name, (shape, dtype) in result.tensors_removed.items()], "only in A")
    _print_capped([Text.assemble((f"+ {name}", "green"), f" {list(shape)} {dtype} (only in B)")
                   for name, (shape, dtype) in result.tensors_added.items()], "only in B")
    _print_capped([Text.assemble((f"~ {name}", "yellow"), f" shape {list(shape_a)} -> {list(shape_b)}")
                   for name, (shape_a, shape_b) in result.shape_changed.items()], "reshaped")
    _print_capped([Text.assemble((f"~ {name}", "yellow"), f" dtype {dtype_a} -> {dtype_b}")
                   for name, (dtype_a, dtype_b) in result.dtype_changed.items()], "with another dtype")
    if result.changed:
        changed = sorted(result.changed.items(), key=lambda kv: -(kv[1].rel_l2 or float("inf")))
        more = len(changed) - LINES_PER_KIND
        print_table("changed tensors (relative L2 ||b-a||/||a||" + (
            f"; the {LINES_PER_KIND} that moved most of {len(changed):,}, --json lists every one)" if more > 0
            else ")"), (Column("tensor"), Column("rel L2", justify="right")),
            [[name, _relative_change(t)] for name, t in changed[:LINES_PER_KIND]])
    _print_capped([Text(f"{side.upper()}: {problem.where}: {problem.message}", style="red")
                   for side, problem in result.problems], "problems")
    if not result.same_layout:
        sides = [f"{side.upper()}: {', '.join(layout['files'])} {json.dumps(layout['metadata'])}"
                 for side, layout in (("a", result.layout_a), ("b", result.layout_b))]
        stdout.print(Text.assemble(("~ layout", "yellow"), f" {'; '.join(sides)}"))
    stdout.print(Text.assemble(*diff_verdict(result), f"  ({result.a} -> {result.b})"))


def _relative_change(delta: TensorDelta) -> str:
    """`1.234e-02`; for a tensor that is zero in A, how far it moved (`from zero: ||b-a|| 3.1e-01`)."""
    if delta.rel_l2 is not None:
        return f"{delta.rel_l2:.3e}"
    if delta.abs_l2 is not None:
        return f"from zero: ||b-a|| {delta.abs_l2:.3e}"
    return "changed (not a float tensor)"


#: How `diff_verdict` names each part of `differs` (the weights are said separately).
_DIFFERS_WORDS = {"config": CONFIG_NAME, "layout": "weight file layout", "metadata": "safetensors metadata"}


def diff_verdict(result: DiffReport) -> tuple[Text, str]:
    """The verdict line of `diff`: what differs, then what the common tensors' bytes say."""
    compared, changed = len(result.tensors), len(result.changed)
    tensors = f"{compared - changed} of {plural(compared, 'common tensor')} byte-identical"
    if result.identical:
        return Text("identical", style="bold green"), f": {tensors}"
    if result.weights_only:
        return Text("only the weights differ", style="yellow"), f": {tensors}, {changed} changed"
    counts = [(len(result.renamed), "renamed"), (len(result.tensors_added), "only in B"),
              (len(result.tensors_removed), "only in A"), (len(result.shape_changed), "reshaped"),
              (len(result.dtype_changed), "recast")]
    words = [f"tensor roster ({', '.join(f'{n} {what}' for n, what in counts if n)})" if part == "roster"
             else _DIFFERS_WORDS[part] for part in result.differs if part != "weights"]
    parts = ", ".join(words) or "the files could not be read whole"
    if changed:
        return Text("different", style="bold red"), f": {parts}; weights: {tensors}, {changed} changed"
    return Text("different", style="bold red"), f": {parts}; the weights are the same ({tensors})"


def render_convert(result: ConvertReport) -> None:
    """Human view of a `ConvertReport`."""
    rows: list[list[Cell]] = []
    shown: dict[str, int] = {}
    for change in result.changes:
        shown[change.kind] = shown.get(change.kind, 0) + 1
        if shown[change.kind] <= CHANGES_PER_KIND:
            rows.append([change.kind, change.target, change.detail])
    for kind, n in shown.items():
        if n > CHANGES_PER_KIND:
            rows.append([kind, f"... and {n - CHANGES_PER_KIND} more", "(all listed with --json)"])
    if rows:
        print_table(f"changes {result.src} -> {result.dst}",
                    (Column("kind"), Column("target"), Column("detail", prose=True)), rows)
    stdout.print(f"wrote {result.dst}: {plural(result.tensors, 'tensor')}, {plural(result.weights_bytes, 'byte')}")
    if result.verify_ok:
        stdout.print(Text("verify OK", style="bold green"))
    else:
        errors = ", ".join(f"{code} ({where})" for code, where in result.verify_errors[:5])
        stdout.print(Text.assemble(("verify still fails", "bold red"),
                                   f": {errors}; run: dspark-hub verify {result.dst}"))


def render_init(result: InitResult) -> None:
    """Human view of an `InitResult`; a random frozen embedding is a warning on stderr."""
    embedding = result.embedding
    source = (f"; embed_tokens from {embedding.target}" + (f" ({embedding.cast})" if embedding.cast else "")
              if embedding.kind == "teacher" else "")
    stdout.print(f"wrote {result.path} ({result.profile}, {result.init}, {plural(result.weights_bytes, 'byte')}"
                 f"{source}); check it with: dspark-hub verify {result.path}")
    if embedding.kind != "teacher":
        stderr.print(Text.assemble(("warning", "yellow"), f": the frozen embed_tokens.weight is {embedding.kind}, "
                                   "not the target's embedding; 'dspark-hub verify --target TARGET' fails until it "
                                   f"is copied: write the draft with 'dspark-hub init {result.path} --embed-from "
                                   "TARGET --force'"))



def render_init_target(result: Any) -> None:
    """Human view of a `TargetInitResult` (`init --target`)."""
    vocab = (f", draft vocabulary {result.draft_vocab_size:,} ({result.vocab_coverage:.1%} of the data's tokens)"
             if result.vocab_coverage is not None else "")
    stdout.print(f"wrote {result.path} ({result.format} for {result.target}: {plural(result.layers, 'layer')}, taps "
                 f"{result.taps}, mask token {result.mask.id} {result.mask.content!r}{vocab}; "
                 f"{plural(result.weights_bytes, 'byte')}); check it with: dspark-hub verify {result.path} "
                 f"--target {result.target}")
