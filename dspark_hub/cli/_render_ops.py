"""Human views of the ops commands' results: diff, convert, init."""

from __future__ import annotations

import json
from typing import Any

from dspark_hub._text import plural, short_json
from dspark_hub.cli._output import TerminalText as Text
from dspark_hub.cli._output import stderr, stdout
from dspark_hub.cli._table import Cell, Column, print_table
from dspark_hub.format.contract import CONFIG_NAME

CHANGES_PER_KIND = 4   # convert's human view; --json lists every change


def _short(value: Any) -> str:
    return short_json(value, limit=60)   # a table cell


def render_diff(result: Any) -> None:
    """Human view of a `DiffReport`."""
    d = result.to_dict()
    cfg, roster = d["config"], d["roster"]
    rows: list[list[Cell]] = []
    rows += [[Text(f"- {key}", style="red"), _short(value), ""] for key, value in cfg["removed"].items()]
    rows += [[Text(f"+ {key}", style="green"), "", _short(value)] for key, value in cfg["added"].items()]
    rows += [[Text(f"~ {key}", style="yellow"), _short(pair["a"]), _short(pair["b"])]
             for key, pair in cfg["changed"].items()]
    if rows:
        print_table(CONFIG_NAME, (Column("key"), Column("A", prose=True), Column("B", prose=True)), rows)
    for name, e in roster["renamed"].items():
        stdout.print(Text.assemble((f"> {name} -> {e['to']}", "cyan"),
                                   f" {e['shape']} {e['dtype']} (renamed; the same bytes)"))
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
        print_table("changed tensors (relative L2 ||b-a||/||a||)",
                    (Column("tensor"), Column("rel L2", justify="right")),
                    [[name, "-" if t["rel_l2"] is None else f"{t['rel_l2']:.3e}"]
                     for name, t in sorted(changed.items(), key=lambda kv: -(kv[1]["rel_l2"] or float("inf")))])
    for p in d["problems"]:
        stdout.print(Text(f"{p['side'].upper()}: {p['where']}: {p['message']}", style="red"))
    if not d["layout"]["same"]:
        sides = [f"{side.upper()}: {', '.join(lay['files'])} {json.dumps(lay['metadata'])}"
                 for side, lay in ((s, d["layout"][s]) for s in ("a", "b"))]
        stdout.print(Text.assemble(("~ layout", "yellow"), f" {'; '.join(sides)}"))
    stdout.print(Text.assemble(*diff_verdict(d), f"  ({d['a']} -> {d['b']})"))


#: How `diff_verdict` names each part of `differs` (the weights are said separately).
_DIFFERS_WORDS = {"config": CONFIG_NAME, "layout": "weight file layout", "metadata": "safetensors metadata"}


def diff_verdict(d: dict[str, Any]) -> tuple[Text, str]:
    """The verdict line of `diff`: what differs, then what the common tensors' bytes say."""
    s, roster = d["summary"], d["roster"]
    tensors = f"{s['identical']} of {plural(s['compared'], 'common tensor')} byte-identical"
    if d["identical"]:
        return Text("identical", style="bold green"), f": {tensors}"
    if d["weights_only"]:
        return Text("only the weights differ", style="yellow"), f": {tensors}, {s['changed']} changed"
    counts = [(len(roster[key]), what) for key, what in (("renamed", "renamed"), ("added", "only in B"),
                                                         ("removed", "only in A"), ("shape", "reshaped"),
                                                         ("dtype", "recast"))]
    words = [f"tensor roster ({', '.join(f'{n} {what}' for n, what in counts if n)})" if part == "roster"
             else _DIFFERS_WORDS[part] for part in d["differs"] if part != "weights"]
    parts = ", ".join(words) or "the files could not be read whole"
    if s["changed"]:
        return Text("different", style="bold red"), f": {parts}; weights: {tensors}, {s['changed']} changed"
    return Text("different", style="bold red"), f": {parts}; the weights are the same ({tensors})"


def render_convert(result: Any) -> None:
    """Human view of a `ConvertReport`."""
    d = result.to_dict()
    rows: list[list[Cell]] = []
    shown: dict[str, int] = {}
    for c in d["changes"]:
        shown[c["kind"]] = shown.get(c["kind"], 0) + 1
        if shown[c["kind"]] <= CHANGES_PER_KIND:
            rows.append([c["kind"], c["target"], c["detail"]])
    for kind, n in shown.items():
        if n > CHANGES_PER_KIND:
            rows.append([kind, f"... and {n - CHANGES_PER_KIND} more", "(all listed with --json)"])
    if rows:
        print_table(f"changes {d['input']} -> {d['path']}",
                    (Column("kind"), Column("target"), Column("detail", prose=True)), rows)
    stdout.print(f"wrote {d['path']}: {plural(d['tensors'], 'tensor')}, {plural(d['weights_bytes'], 'byte')}")
    if d["verify"]["ok"]:
        stdout.print(Text("verify OK", style="bold green"))
    else:
        errors = ", ".join(f"{e['code']} ({e['where']})" for e in d["verify"]["errors"][:5])
        stdout.print(Text.assemble(("verify still fails", "bold red"),
                                   f": {errors}; run: dspark-hub verify {d['path']}"))


def render_init(result: Any) -> None:
    """Human view of an `InitResult`; a random frozen embedding is a warning on stderr."""
    embedding = result.embedding
    source = (f"; embed_tokens from {embedding.teacher}" + (f" ({embedding.cast})" if embedding.cast else "")
              if embedding.kind == "teacher" else "")
    stdout.print(f"wrote {result.path} ({result.profile}, {result.init}, {plural(result.weights_bytes, 'byte')}"
                 f"{source}); check it with: dspark-hub verify {result.path}")
    if embedding.kind != "teacher":
        stderr.print(Text.assemble(("warning", "yellow"), f": the frozen embed_tokens.weight is {embedding.kind}, "
                                   "not the target's embedding; 'dspark-hub verify --target TARGET' fails until it "
                                   f"is copied: write the draft with 'dspark-hub init {result.path} --embed-from "
                                   "TARGET --force'"))

