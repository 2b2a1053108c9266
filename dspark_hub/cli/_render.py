"""Human views of library results: one renderer per result type, on stdout.

Everything here turns a library result into text; nothing computes. `--json` output does not
pass through here: `emit` prints the result's own `to_dict()`.

Names, numbers and codes are never cut, in a pipe or a narrow terminal: `print_table` wraps
only prose columns, and when even that does not fit it prints one block per row (the key cells
on one line, each prose cell indented below). Plain lines are printed with soft wrap, so the
terminal may fold them on screen but the text stream keeps every name whole.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from rich.cells import cell_len
from rich.table import Table
from rich.text import Text

from dspark_hub._text import plural
from dspark_hub.cli._errors import in_cli_terms
from dspark_hub.cli._output import size_text, stderr, stdout
from dspark_hub.report import Finding, Report

SEVERITY_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}
VERDICT_STYLE = {"loaded": "green", "skipped": "cyan", "ignored": "bold red", "fatal": "bold red"}
CHANGES_PER_KIND = 4   # convert's human view; --json lists every change
#: A prose column narrower than this wraps into a column of single words: use blocks instead.
MIN_PROSE_WIDTH = 16

Cell = str | Text


# ----------------------------------------------------------------------------- tables that never cut

@dataclass(frozen=True)
class Column:
    """A table column. `prose` columns wrap at word boundaries; the others are never wrapped or cut.

    `label`: in the block layout, show the cell as `name value` (for numbers that mean nothing bare).
    """

    name: str
    prose: bool = False
    label: bool = False
    justify: Literal["left", "right"] = "left"


def _width(cell: Cell) -> int:
    return cell.cell_len if isinstance(cell, Text) else cell_len(cell)


def _longest_word(cell: Cell) -> int:
    return max((cell_len(word) for word in str(cell).split()), default=0)


def _column_widths(columns: Sequence[Column], rows: Sequence[Sequence[Cell]], width: int) -> list[int] | None:
    """Widths that keep every non-prose cell and every word whole within `width`; None if there are none."""
    natural = [max([_width(Text(c.name))] + [_width(row[i]) for row in rows]) for i, c in enumerate(columns)]
    prose = [i for i, c in enumerate(columns) if c.prose]
    available = width - (3 * len(columns) + 1) - sum(w for i, w in enumerate(natural) if i not in prose)
    least = {i: max([min(natural[i], MIN_PROSE_WIDTH), *(_longest_word(row[i]) for row in rows)]) for i in prose}
    if sum(least.values()) > available:
        return None
    if sum(natural[i] for i in prose) <= available:
        return natural
    spare = available - sum(least.values())
    growth = {i: natural[i] - least[i] for i in prose}
    total_growth = sum(growth.values()) or 1
    widths = list(natural)
    for i in prose:
        widths[i] = least[i] + spare * growth[i] // total_growth
    return widths


def print_table(title: str | None, columns: Sequence[Column], rows: Sequence[Sequence[Cell]]) -> None:
    """Print rows as a table that fits the console, or as blocks when no table can keep every name whole."""
    widths = _column_widths(columns, rows, stdout.width)
    if widths is not None:
        table = Table(title=title, expand=False)
        for column, w in zip(columns, widths, strict=True):
            table.add_column(column.name, justify=column.justify, width=w, no_wrap=not column.prose,
                             overflow="fold" if column.prose else "ignore")
        for row in rows:
            table.add_row(*row)
        stdout.print(table)
        return
    if title:
        stdout.print(title)
    for row in rows:
        key = [Text.assemble(f"{c.name} ", cell) if c.label else cell
               for c, cell in zip(columns, row, strict=True) if not c.prose and str(cell)]
        stdout.print(Text("  ").join(Text(k) if isinstance(k, str) else k for k in key))
        named = False
        for column, cell in zip(columns, row, strict=True):
            if column.prose and str(cell):
                stdout.print(Text.assemble("    ", f"{column.name}: " if named else "", cell))
            named = named or column.prose


# ----------------------------------------------------------------------------- findings and verify

FINDING_COLUMNS = (Column("severity"), Column("code"), Column("where"), Column("message", prose=True),
                   Column("hint", prose=True))


def verdict_line(ok: bool, errors: int, where: str) -> Text:
    """`OK  path` or `FAILED (n errors)  path`, styled."""
    head = (Text("OK", style="bold green") if ok
            else Text.assemble(("FAILED", "bold red"), f" ({plural(errors, 'error')})"))
    return Text.assemble(head, f"  {where}")


def render_findings(findings: list[Finding], title: str) -> None:
    """Findings (severity, code, where, message, hint) on stdout; nothing when there are none."""
    if findings:
        print_table(title, FINDING_COLUMNS, [[Text(f.severity, style=SEVERITY_STYLE[f.severity]), f.code, f.where,
                                             f.message, f.hint or ""] for f in findings])


def render_verify(report: Report) -> None:
    """Human view of a verify report: findings, summary, verdict, then the optional sections."""
    render_findings(report.sorted_findings(), f"findings for {report.path}")
    s = report.summary
    params = s.parameters or {}
    stdout.print(f"layout: {s.layout or '-'}   files: {len(s.files)}   tensors: {s.tensors}   "
                 f"bytes: {s.bytes:,}   dtypes: {', '.join(f'{k} x{v}' for k, v in sorted(s.dtypes.items())) or '-'}")
    if params:
        from dspark_hub.format.registry import DEFAULT_FORMAT, FORMATS

        fmt = FORMATS[s.format] if s.format else DEFAULT_FORMAT
        names = ", ".join(n.removesuffix(".weight") for n in fmt.frozen_tensors)
        frozen = f" ({names})" if params["frozen"] else ""
        maps = f"; {params['maps']:,} vocabulary-map elements (not parameters)" if params.get("maps") else ""
        stdout.print(f"parameters: {params['total']:,} total / {params['trained']:,} trained / "
                     f"{params['frozen']:,} frozen{frozen}{maps}")
    stdout.print(verdict_line(report.ok, len(report.errors), report.path))
    _render_deep(report)
    _render_sections(report)


def _render_deep(report: Report) -> None:
    deep = report.sections.get("deep")
    if deep:
        for f in deep["files"]:
            stdout.print(f"sha256  {f['sha256']}  {f['name']} ({plural(f['size'], 'byte')}, {f['seconds']:.1f} s)")
        flagged = sum(1 for t in deep["tensors"].values() if t["nan"] or t["inf"])
        stdout.print(f"scanned {plural(len(deep['tensors']), 'tensor')}: {flagged} with NaN/inf")
    frozen = report.sections.get("frozen_embed")
    if frozen:
        stdout.print(Text.assemble(f"frozen embed vs {frozen['teacher_tensor']['location']}: ",
                                   _embedding_verdict(frozen)))


def _embedding_verdict(section: dict[str, Any]) -> Text:
    """`bit-identical`, `identical after BF16 rounding (nearest even) of the F32 target`, `DIFFERENT`, ..."""
    if section["identical"] is None:
        return Text("not checked")
    return Text(section["verdict"], style="green") if section["identical"] else Text("DIFFERENT", style="bold red")


def _render_sections(report: Report) -> None:
    from dspark_hub.format.registry import DEFAULT_FORMAT

    family = report.sections.get("family")
    if family and family["family"] != DEFAULT_FORMAT.name:     # the default format goes without saying
        evidence = f" ({'; '.join(family['evidence'])})" if family["evidence"] else ""
        stdout.print(f"family: {family['title']}{evidence}")
    for data in (report.sections.get("runtimes") or {}).values():
        if not data.get("supported", True):
            stdout.print(f"{data['title']}: {'; '.join(data['notes'])}")
            continue
        execution = data.get("execution")
        how = f" (executed: {data['measured_by']})" if execution else ""
        refusal = data.get("refusal")
        if refusal:
            stdout.print(f"{data['title']}{how}: refuses to start ({refusal['stage']}): {refusal['message']}")
        else:
            rows = [(v["tensor"], v["verdict"], v["detail"]) for v in data["verdicts"]]
            rows += [(u["parameter"] + " (unfilled)", u["verdict"], u["detail"]) for u in data["unfilled"]]
            loaded = sum(1 for _, verdict, _ in rows if verdict == "loaded")
            shown = [[tensor, Text(verdict, style=VERDICT_STYLE[verdict]), detail]   # --json lists every tensor
                     for tensor, verdict, detail in rows if verdict != "loaded"]
            if shown:
                print_table(f"{data['title']}: per-tensor verdicts{how}",
                            (Column("tensor"), Column("verdict"), Column("detail", prose=True)), shown)
            stdout.print(f"{data['title']}: {loaded} of {plural(len(data['verdicts']), 'tensor')} loaded"
                         + ("" if shown else "; nothing skipped, ignored or fatal"))
        if execution:
            agree = "agree" if data.get("rules_agree") else f"DIFFER on {len(data.get('disagreements', []))}"
            stdout.print(f"{data['title']}: executed vLLM {execution['vllm_version']} ({execution['model_class']}, "
                         f"{plural(execution['rounds'], 'load')}; stubs {', '.join(execution['stubs'])}; shims "
                         f"{', '.join(execution['shims']) or 'none'}); dspark-hub's rules {agree} "
                         f"({plural(data.get('rows_compared', 0), 'row')} compared)"
                         + "".join(f"; {w}" for w in execution.get("warnings", [])))
        serving = data["serving"]
        stdout.print(f"serve with {data['title']} ({plural(serving['num_speculative_tokens'], 'draft token')}; "
                     f"{in_cli_terms(serving['block_size_source'])}; target layers {serving['target_layer_ids']} "
                     "from config.json):")
        for command in [serving["command"], *serving.get("alternatives", [])]:
            stdout.print(f"  {command}")
    pairing = report.sections.get("pairing")
    if pairing:
        embedding = pairing["embedding"]
        same = Text("not compared (the draft saves none)") if embedding is None else _embedding_verdict(embedding)
        stdout.print(Text.assemble(f"paired with {pairing['target']} (revision {pairing['revision'] or 'unknown'}; "
                                   f"config sha256 {pairing['config']['sha256'][:16]}; embedding: ", same, ")"))


# ----------------------------------------------------------------------------- diff, convert, init

def _short(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


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
        print_table("config.json", (Column("key"), Column("A", prose=True), Column("B", prose=True)), rows)
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
_DIFFERS_WORDS = {"config": "config.json", "layout": "weight file layout", "metadata": "safetensors metadata"}


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


# ----------------------------------------------------------------------------- training

def render_rollouts(summary: Any) -> None:
    """Human view of a `RolloutSummary`."""
    agreement = "-" if summary.greedy_agreement is None else f"{summary.greedy_agreement:.4f}"
    stdout.print(f"wrote {plural(summary.written, 'sequence')} ({summary.skipped} already there) to {summary.path}: "
                 f"{plural(summary.sequences, 'sequence')}, "
                 f"{plural(summary.continuation_tokens, 'supervised token')}, "
                 f"{plural(summary.shards, 'shard')}, greedy agreement {agreement} "
                 f"({summary.engine} engine, {summary.mode})")


def render_init_target(result: Any) -> None:
    """Human view of a `TargetInitResult`."""
    vocab = (f", draft vocabulary {result.draft_vocab_size:,} ({result.vocab_coverage:.1%} of the data's tokens)"
             if result.vocab_coverage is not None else "")
    stdout.print(f"wrote {result.path} ({result.format} for {result.target}: {plural(result.layers, 'layer')}, taps "
                 f"{result.taps}, mask token {result.mask.id} {result.mask.content!r}{vocab}; "
                 f"{plural(result.weights_bytes, 'byte')}); check it with: dspark-hub verify {result.path} "
                 f"--target {result.target}")


def render_threads(choice: Any) -> None:
    """The CPU threads a training command uses, and why (stderr, before the work starts)."""
    stderr.print(f"threads: {choice.threads} ({choice.reason}; --threads N to choose)")


def render_init_teacher(result: Any) -> None:
    """Human view of a `TeacherInitResult`."""
    source = f"shapes and embedding of {result.draft}" if result.draft else f"profile {result.profile}"
    stdout.print(f"wrote {result.path}: a random Llama teacher ({source}; hidden {result.hidden_size}, "
                 f"{plural(result.num_hidden_layers, 'layer')}, vocabulary {result.vocab_size:,}, "
                 f"{plural(result.parameters, 'parameter')}) with an offline byte-level tokenizer")


def binary_size(n: float) -> str:
    """`8.1 GiB`, `512.0 KiB`, `96 bytes` (memory reads in binary units)."""
    return size_text(n, binary=True)


def _flops(n: float) -> str:
    for unit, scale in (("PFLOP", 1e15), ("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n:,.0f} FLOP"


#: How `plan.memory_bytes` parts read.
MEMORY_PARTS = {"attention": "attention", "activations": "activations", "loss": "loss chunks",
                "states": "weights+grads+AdamW", "teacher_lm_head": "teacher lm_head"}


def plan_lines(plan: dict[str, Any]) -> list[str]:
    """A `TrainPlan.to_dict()` as the lines `finetune` prints before step 1 (flags named, estimates marked)."""
    ranks = f" per rank ({plan['world_size']} ranks)" if plan["world_size"] > 1 else ""
    flops, total = plan["flops"], plan["total_flops"] or 1.0
    memory = plan["memory_bytes"]
    split = ", ".join(f"{part} {100 * flops[part] / total:.0f}%" for part in sorted(flops, key=flops.get, reverse=True))
    parts = ", ".join(f"{MEMORY_PARTS.get(part, part)} {binary_size(memory[part])}"
                      for part in sorted(memory, key=memory.get, reverse=True))
    lines = [
        f"finetune plan{ranks}, from step 1's batch: {plural(plan['sequences'], 'sequence')} x "
        f"{plan['positions']:,} positions ({plan['supervised_tokens']:,} supervised tokens) a step",
        f"  {plan['sequences']} x {plan['anchors']:,} anchors x block {plan['block_size']} = "
        f"{plan['block_rows']:,} block rows, each attending over {plan['keys_per_row']:,} keys "
        f"({plan['positions']:,} positions + {plan['anchors'] * plan['block_size']:,} block rows); "
        f"{plan['vocabulary_rows']:,} rows x {plan['vocabulary']:,} vocabulary for the loss",
        f"  compute ~{_flops(total)} a step: {split}",
        f"  memory ~{binary_size(plan['memory_total_bytes'])} (estimate, besides the runtime): {parts}",
    ]
    if plan["dominant"] == "attention":
        lines.append("  attention grows with (--anchors x --block-size)^2 per sequence: halving --anchors cuts it "
                     "about 4x")
    return lines


def render_plan(plan: Any) -> None:
    """`finetune`'s plan on stderr, before step 1 (above the progress bar on a terminal)."""
    for line in plan_lines(plan.to_dict()):
        stderr.print(line, soft_wrap=True)


def render_training(result: Any) -> None:
    """Human view of a `TrainResult`."""
    loss = "-" if result.final_loss is None else f"{result.final_loss:.4f}"
    log = f"{result.path}/training_log.jsonl"
    stdout.print(f"wrote {result.path}: {plural(result.steps, 'step')}, {plural(result.tokens, 'token')}, "
                 f"{result.tokens_per_second:,.0f} tokens/s on {result.device}, final loss {loss} (log: {log})")
    if result.plan is not None:
        measured = "CUDA allocated" if result.device.startswith("cuda") else "process RSS"
        stdout.print(f"memory: estimated ~{binary_size(result.plan.memory_bytes)} for training plus the runtime, "
                     f"measured peak "
                     f"{binary_size(result.peak_memory_bytes)} ({measured})")
    if result.states:
        stdout.print(f"states in {result.state_dir}: {', '.join(result.states)}")
    for action in result.engine_releases:
        stdout.print(f"between rounds: {action}")
    for warning in getattr(result, "warnings", ()):
        stderr.print(Text.assemble(("warning", "yellow"), f": {warning}"))
    if result.eval:
        stdout.print(f"held-out acceptance length {result.eval['acceptance_length']:.4f} "
                     f"(prompt lookup {result.eval['baseline']['acceptance_length']:.4f})")


def render_eval(result: Any) -> None:
    """Acceptance table (draft, reference, prompt lookup; overall and per dataset), then the counts."""
    data = result.to_dict()
    block = len(data["per_position"])
    columns = [Column("data"), Column("drafter"), Column("AL", label=True, justify="right"),
               *[Column(f"a{k}", label=True, justify="right") for k in range(1, block + 1)],
               Column("drafts", label=True, justify="right")]
    rows: list[list[Cell]] = []

    def row(scope: str, name: str, stats: dict[str, Any]) -> None:
        rows.append([scope, name, f"{stats['acceptance_length']:.4f}", *[f"{a:.3f}" for a in stats["per_position"]],
                     f"{stats['drafts']:,}"])

    for scope, stats in [("all", data), *data["by_dataset"].items()]:
        row(scope, "draft", stats)
        if stats.get("reference") or (scope == "all" and data["reference"]):
            row(scope, "reference", stats.get("reference") or data["reference"])
        if stats.get("baseline"):
            row(scope, "prompt lookup", stats["baseline"])
    harness, measured = data["harness"], data["measured_by"]
    title = (f"measured by vLLM {measured['vllm_version']} (greedy)" if measured
             else "simulated acceptance (vLLM's verify loop, greedy)")
    print_table(title, columns, rows)
    stdout.print(f"accepted per position {data['accepted_per_position']} of {plural(data['drafts'], 'draft')} "
                 f"(k {data['k']}); {plural(data['prompts'], 'prompt')}, {plural(data['tokens'], 'output token')}; "
                 f"teacher {harness['teacher']}")
    if measured:
        spec = measured["speculative_config"]
        stdout.print(f"vLLM {measured['vllm_version']}, {measured['model_runner']} runner"
                     f"{', Triton interpreter' if measured['triton_interpret'] else ''}, {measured['dtype']}; "
                     f"speculative config {spec}")
        stdout.print("lossless: the outputs equal plain greedy decoding's" if data["lossless"] else
                     "NOT lossless: the outputs differ from plain greedy decoding's")
    if data["reference"]:
        stdout.print(f"ratio to reference: {data['reference']['ratio']:.4f}")
    if data["plot"]:
        stdout.print(f"wrote {data['plot']}")
    stdout.print(f"definition: {data['definition']}")


# ----------------------------------------------------------------------------- release

def _file_problems(title: str, problems: list[Any]) -> None:
    print_table(title, (Column("file"), Column("problem"), Column("message", prose=True)),
                [[p.path, p.kind, p.message] for p in problems])


def render_checksums(written: Any) -> None:
    """Human view of `ChecksumFiles`."""
    stdout.print(f"wrote {written.sums_path} and {written.manifest_path} "
                 f"({plural(len(written.manifest.files), 'file')}, {plural(written.manifest.total_bytes, 'byte')}); "
                 f"check with: sha256sum -c SHA256SUMS (in {written.path})")


def render_checksum_check(check: Any) -> None:
    """Human view of a `ChecksumCheck`."""
    if check.problems:
        _file_problems(f"checksum problems in {check.path}", check.problems)
    else:
        stdout.print(f"OK  {check.path}: every file matches its checksum")


def render_package(result: Any) -> None:
    """Human view of a `PackageResult`."""
    stdout.print(f"wrote {result.path}: {', '.join(sorted(result.files))}")
    stdout.print(f"infohash {result.infohash}")
    stdout.print(f"magnet   {result.magnet}")


def render_export(result: Any) -> None:
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
                     f"({plan.lfs_bytes:,} through LFS); commit: {plan.commit_message}; dry run: nothing sent")
        return
    if result.problems:
        _file_problems("the Hub's files differ from the local ones", result.problems)
    stdout.print(f"{result.status}: {result.commit_url}" + (f" (tag {result.tag})" if result.tag else ""))
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


def render_golden_write(result: Any) -> None:
    """Human view of a `GoldenWrite`."""
    cases = ", ".join(f"{c} from position {p}" for c, p in result.cases.items())
    stdout.print(f"wrote {result.path} ({plural(result.bytes, 'byte')}; cases {cases}); "
                 f"check it with: dspark-hub golden check {result.input} {result.path}")


def render_golden_check(result: Any) -> None:
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
