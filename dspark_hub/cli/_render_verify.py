"""Human views of verify's results: findings, the verdict line, the summary and the optional sections."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from dspark_hub._text import plural
from dspark_hub.cli._errors import in_cli_terms
from dspark_hub.cli._table import Column, print_table
from dspark_hub.cli._terminal import TerminalText as Text
from dspark_hub.cli._terminal import stdout
from dspark_hub.format.registry import DEFAULT_FORMAT, FORMATS
from dspark_hub.report import EmbeddingVerdict, Finding, Report

SEVERITY_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}
VERDICT_STYLE = {"loaded": "green", "skipped": "cyan", "ignored": "bold red", "fatal": "bold red"}

FINDING_COLUMNS = (Column("severity"), Column("code"), Column("where"), Column("message", prose=True),
                   Column("hint", prose=True))


def verdict_line(ok: bool, errors: int, where: str) -> Text:
    """`OK  path` or `FAILED (n errors)  path`, styled."""
    head = (Text("OK", style="bold green") if ok
            else Text.assemble(("FAILED", "bold red"), f" ({plural(errors, 'error')})"))
    return Text.assemble(head, f"  {where}")


#: Human output lists at most this many rows of one finding code (or runtime verdict); `--json` lists all.
ROWS_PER_KIND = 200


def grouped(items: Iterable[tuple[tuple[str, ...], str]]) -> tuple[list[tuple[tuple[str, ...], str]], dict[str, int]]:
    """Rows of (key, name) items, in order; a kind (`key[0]`: a code, a verdict) of more than `ROWS_PER_KIND`
    items is grouped and capped so human output stays small however many there are.

    In such a kind, items whose keys are equal (120,000 tensors the roster does not name: one code, message and
    hint) are one row, named by the first and how many more, and at most `ROWS_PER_KIND` rows are shown. Returns
    the rows (key, name text) and, per kind, how many items no row shows.
    """
    items = list(items)
    sizes: dict[str, int] = {}
    for key, _ in items:
        sizes[key[0]] = sizes.get(key[0], 0) + 1
    groups: dict[tuple[str, ...], list[str]] = {}
    rows: list[tuple[tuple[str, ...], str]] = []
    for key, name in items:
        if sizes[key[0]] <= ROWS_PER_KIND:
            rows.append((key, name))          # a kind this small is listed whole
        else:
            groups.setdefault(key, []).append(name)
    shown: dict[str, int] = {}
    hidden: dict[str, int] = {}
    for key, names in groups.items():
        if shown.get(key[0], 0) >= ROWS_PER_KIND:
            hidden[key[0]] = hidden.get(key[0], 0) + len(names)
            continue
        shown[key[0]] = shown.get(key[0], 0) + 1
        rows.append((key, names[0] if len(names) == 1 else f"{names[0]} and {len(names) - 1:,} more like it"))
    return rows, hidden


#: Human output quotes at most this many characters of one finding's message (a runtime finding names every
#: tensor it drops: 120,000 names); `--json` has the whole message.
MESSAGE_CHARS = 2_000


def _clipped(message: str) -> str:
    if len(message) <= MESSAGE_CHARS:
        return message
    return f"{message[:MESSAGE_CHARS]}... ({len(message) - MESSAGE_CHARS:,} more characters; --json has them all)"


def finding_rows(findings: list[Finding]) -> list[list[str | Text]]:
    """Table rows of findings, grouped and capped (`grouped`), long messages clipped; `--json` keeps every
    finding whole."""
    rows, hidden = grouped(((f.code, f.severity, f.message, f.hint or ""), f.where) for f in findings)
    out: list[list[str | Text]] = [[Text(severity, style=SEVERITY_STYLE[severity]), code, where, _clipped(message),
                                    hint] for (code, severity, message, hint), where in rows]
    severity = {f.code: f.severity for f in findings}
    out += [[Text(severity[code], style=SEVERITY_STYLE[severity[code]]), code, f"{count:,} more",
             f"{plural(count, 'more finding')} of this code not shown", "--json lists every finding"]
            for code, count in hidden.items()]
    return out


def render_findings(findings: list[Finding], title: str) -> None:
    """Findings (severity, code, where, message, hint) on stdout, grouped and capped (`finding_rows`); nothing
    when there are none."""
    if findings:
        print_table(title, FINDING_COLUMNS, finding_rows(findings))


def render_verify(report: Report) -> None:
    """Human view of a verify report: findings, summary, verdict, then the optional sections."""
    render_findings(report.sorted_findings(), f"findings for {report.path}")
    s = report.summary
    params = s.parameters or {}
    stdout.print(f"layout: {s.layout or '-'}   files: {len(s.files)}   tensors: {s.tensors}   "
                 f"bytes: {s.bytes:,}   dtypes: {', '.join(f'{k} x{v}' for k, v in sorted(s.dtypes.items())) or '-'}")
    if params:
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


def _embedding_verdict(section: EmbeddingVerdict | dict[str, Any]) -> Text:
    """`bit-identical`, `identical after BF16 rounding (nearest even) of the F32 target`, `DIFFERENT`, ..."""
    verdict = section["verdict"]
    if section["identical"] is None or verdict is None:   # the verdict is null exactly when nothing was compared
        return Text("not checked")
    return Text(verdict, style="green") if section["identical"] else Text("DIFFERENT", style="bold red")


def _render_sections(report: Report) -> None:
    hub = report.sections.get("against_hub")
    if hub:
        outcome = ("every one matches (size, and SHA-256 or git blob id)" if hub["ok"]
                   else f"{plural(len(hub['problems']), 'difference')} (see the findings)")
        stdout.print(f"against {hub['location']} (commit {hub['commit'][:12]}): "
                     f"{plural(hub['files_compared'], 'file')} compared; {outcome}")

    family = report.sections.get("family")
    if family and family["family"] != DEFAULT_FORMAT.name:     # the default format goes without saying
        evidence = f" ({'; '.join(family['evidence'])})" if family["evidence"] else ""
        stdout.print(f"family: {family['title']}{evidence}")
    for data in (report.sections.get("runtimes") or {}).values():
        if data["supported"] is False:
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
            groups, hidden = grouped(((verdict, detail), tensor) for tensor, verdict, detail in rows
                                     if verdict != "loaded")        # --json: every tensor
            shown: list[list[str | Text]] = [[tensor, Text(verdict, style=VERDICT_STYLE[verdict]), detail]
                                             for (verdict, detail), tensor in groups]
            shown += [[f"{count:,} more", Text(verdict, style=VERDICT_STYLE[verdict]),
                       f"{plural(count, 'more tensor')} with this verdict not shown; --json lists every tensor"]
                      for verdict, count in hidden.items()]
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
        if serving is None:
            stdout.print(f"no serving command: {data.get('serving_withheld') or data['title'] + ' refuses this draft'}")
            continue
        tokens = serving["num_speculative_tokens"]     # None: neither the config nor --block-size gives it
        count = "draft tokens unknown" if tokens is None else plural(tokens, "draft token")
        stdout.print(f"serve with {data['title']} ({count}; "
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


