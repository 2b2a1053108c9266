"""`card lint`: check a model card (README.md) for wrong or self-contradicting numbers.

Checks, each finding naming the line (`where` = "README.md:LINE"):

- front matter: present, valid YAML, accepted by `huggingface_hub.ModelCardData`, license /
  pipeline tag / base-model relation among the Hub's ids (`cards.front_matter.front_matter_problems`);
- acceptance tables (columns `Pos N` plus `Acceptance length`): every acceptance length equals
  1 + the sum of its per-position rates to the table's rounding; rates lie in [0, 100%] and do
  not increase along a row;
- no table repeats a row key (acceptance tables: the cells before `Pos 0`; others: the first cell);
- all statements of the block size agree;
- no line outside code fences prints a Python repr (a dataclass, a dict, a list of strings or
  objects, `<... object at 0x...>`): facts print as text (`cards.templating.reader_text`);
- every acceptance table (two or more `Pos N` columns, or a column `Acceptance length`) says which
  number it shows: the first non-blank line after it is `Acceptance numbers: measured (vLLM x.y,
  k=K, dtype, prompts F)` or `Acceptance numbers: simulated (definition, k=K, ...)`
  (`cards.labels.AcceptanceLabel`); a measured label states its engine (a vLLM one with its
  version) and k, a simulated one its definition ("not stated" counts as stating); its k equals
  the table's `Pos` columns, and with `eval_json` the label agrees with that file (measured or
  simulated, vLLM version, k, dtype, prompts fingerprint), whether or not the table has `Pos` columns;
  a table of several k (`eval --k`: a `k` column) is labelled `k=LOW-HIGH`, and every row's k lies in it;
- with a checkpoint: parameter counts (total, trained, frozen), tensor counts, decoder-layer
  count, tensor shapes in any table with a `Shape` column (brace patterns such as
  `layers.{0..4}.x` and `w{1,2}` are expanded), target layer ids, block size (when the weights'
  metadata records it), and the checksum table (file, size, SHA-256, hashing only the files
  whose digest the card states).

Exit codes as verify: 0 no error finding, 1 error findings, 2 the lint could not run.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from dspark_hub import schemas
from dspark_hub.cards.card_text import (
    Card,
    Statement,
    Table,
    cell_int,
    code_text,
    expand_names,
    parse_card,
    plain,
    statements,
)
from dspark_hub.cards.facts import card_facts
from dspark_hub.cards.front_matter import FRONT_MATTER_CODES, front_matter_problems
from dspark_hub.cards.labels import AcceptanceLabel, acceptance_label, parse_label
from dspark_hub.cards.source import load_yaml
from dspark_hub.documents import Document
from dspark_hub.errors import CheckpointFormatError, CheckpointNotFoundError, UsageError
from dspark_hub.format.checkpoint import CheckpointView, LocalSource, open_checkpoint
from dspark_hub.format.digests import sha256_file
from dspark_hub.format.folder import read_regular
from dspark_hub.format.jsonio import load_json_object
from dspark_hub.report import SEVERITY_RANK, Finding, FindingsMixin, error, info, warning

SCHEMA = schemas.command("card-lint")
#: Every finding code of `lint_card`. Append-only: tools match on them.
LINT_CODES: dict[str, str] = {
    "FRONT_MATTER_MISSING": "no YAML front matter between --- lines",
    "FRONT_MATTER_INVALID_YAML": "the front matter does not parse",
    **FRONT_MATTER_CODES,
    "ACCEPTANCE_UNREADABLE": "a rate or an acceptance length in an acceptance table is not a number",
    "RATE_OUT_OF_RANGE": "a per-position rate is outside [0, 100%]",
    "ACCEPTANCE_LENGTH_MISMATCH": "acceptance length differs from 1 + the sum of the row's rates",
    "RATES_INCREASE": "a per-position rate is higher than the one before it",
    "DUPLICATE_ROW": "a table repeats a row key",
    "BLOCK_SIZE_CONFLICT": "two statements of the block size disagree",
    "PARAMETERS_INCONSISTENT": "trained + frozen differs from total",
    "PARAMETERS_MISMATCH": "a parameter count differs from the checkpoint's",
    "TENSOR_COUNT_MISMATCH": "a tensor count differs from the checkpoint's",
    "LAYER_COUNT_MISMATCH": "the 'N x decoder layer' row differs from the checkpoint",
    "TARGET_LAYERS_MISMATCH": "target layer ids differ from config.json",
    "BLOCK_SIZE_MISMATCH": "block size differs from the weights' __metadata__ block_size",
    "TENSOR_NOT_IN_CHECKPOINT": "a shape table names a tensor the checkpoint lacks",
    "SHAPE_MISMATCH": "a shape in a table differs from the checkpoint's",
    "CHECKSUM_MALFORMED": "a SHA-256 cell is not a 64-character hex digest",
    "CHECKSUM_FILE_MISSING": "the checksum table names a file the checkpoint lacks",
    "CHECKSUM_SIZE_MISMATCH": "a size in the checksum table differs from the file's",
    "CHECKSUM_MISMATCH": "a stated SHA-256 differs from the file's",
    "WEIGHTS_NOT_CHECKED": "no checkpoint given: weight facts were not compared",
    "ACCEPTANCE_UNLABELLED": "an acceptance table does not say whether it shows measured or simulated numbers",
    "ACCEPTANCE_LABEL_MISMATCH": "an acceptance table's label contradicts its eval file or its own columns",
    "ACCEPTANCE_LABEL_INCOMPLETE": "an acceptance label leaves out the engine (and vLLM version) or k of a "
                                   "measurement, or the definition of a simulation",
    "PYTHON_REPR": "the card prints a Python object's repr (a dataclass, dict, list or <object at 0x...>)",
}
_POSITION = re.compile(r"^pos(?:ition)?\s*(\d+)$", re.IGNORECASE)
_NUMBER = re.compile(r"^[+-]?\d+(?:\.(\d+))?$")
_SHAPE = re.compile(r"^\d+(?: x \d+)*$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
#: How Python prints objects, never how a card should state a fact (outside code fences).
_REPRS = (
    ("an object's default repr", re.compile(r"<[\w.]+(?: [\w.]+)* object at 0x[0-9a-fA-F]+>")),
    ("a dataclass repr", re.compile(r"\b[A-Z]\w*\(\w+=(?:-?\d|'|None\b|True\b|False\b|\[|\{|[A-Z]\w*\()")),
    ("a dict repr", re.compile(r"\{'[^'\n]*': ")),
    ("a list repr", re.compile(r"\[(?:'[^'\n]*'(?:, |\])|[A-Z]\w*\(\w+=)")),
)


@dataclass
class CardLintReport(Document, FindingsMixin):
    """Findings about one card; `ok` when none is an error."""

    SCHEMA = SCHEMA
    KEYS = ("ok", "input=path", "path", "checkpoint", "findings=sorted_findings")

    path: str
    checkpoint: str | None = None
    findings: list[Finding] = field(default_factory=list)

    def sorted_findings(self) -> list[Finding]:
        def line(f: Finding) -> int:
            tail = f.where.rsplit(":", 1)[-1]
            return int(tail) if tail.isdigit() else 0
        return sorted(self.findings, key=lambda f: (SEVERITY_RANK[f.severity], line(f), f.code))


# ------------------------------------------------------------------ front matter

def _front_matter_findings(card: Card) -> list[Finding]:
    if card.front_matter is None:
        return [error("FRONT_MATTER_MISSING", card.where(1), "the card has no YAML front matter between '---' lines",
                      "start the card with license, base_model, tags and pipeline_tag between '---' lines")]
    try:
        data = load_yaml("\n".join(text for _, text in card.front_matter)) or {}
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = card.front_matter[0][0] + (mark.line if mark else 0)
        return [error("FRONT_MATTER_INVALID_YAML", card.where(line), f"front matter is not valid YAML "
                      f"({getattr(e, 'problem', None) or e})", "fix the YAML syntax")]

    def key_line(key: str) -> int:
        return next((n for n, text in card.front_matter or [] if re.match(rf"^{re.escape(key)}\s*:", text)),
                    card.front_matter[0][0] - 1 if card.front_matter else 1)

    out = []
    for p in front_matter_problems(data):
        make = error if p.severity == "error" else warning
        out.append(make(p.code, card.where(key_line(p.key)), p.message, "see https://huggingface.co/docs/hub/model-cards"))
    return out


# ------------------------------------------------------------------ tables

def _rate(cell: str) -> tuple[float, float] | None:
    """A rate cell as (fraction, half a unit of its last printed digit, as a fraction)."""
    text = plain(cell)
    percent = text.endswith("%")
    m = _NUMBER.match(text.rstrip("%").strip())
    if not m:
        return None
    scale = 100.0 if percent else 1.0
    half = 0.5 * 10 ** -len(m.group(1) or "") / scale
    return float(m.group(0)) / scale, half


def _acceptance_findings(card: Card, table: Table) -> list[Finding]:
    positions = [i for i, h in enumerate(table.headers) if _POSITION.match(plain(h))]
    length_col = table.column(r"acceptance\s+length")
    if len(positions) < 2 and not (positions and length_col is not None):
        return []
    out = []
    for line, cells in table.rows:
        where = card.where(line)
        rates = [_rate(cells[i]) for i in positions if i < len(cells) and plain(cells[i]) not in ("", "—", "-")]
        length = None if length_col is None else _rate(cells[length_col]) if length_col < len(cells) else None
        if any(r is None for r in rates) or (length_col is not None and length is None):
            out.append(error("ACCEPTANCE_UNREADABLE", where, "a rate or the acceptance length is not a number",
                             "write rates as 81.3% or 0.813 and lengths as 4.96"))
            continue
        read = [r for r in rates if r is not None]     # every one, checked above
        values = [r[0] for r in read]
        out += [error("RATE_OUT_OF_RANGE", where, f"rate {v:.2%} at position {k} is outside [0, 100%]",
                      "rates are fractions of verification steps") for k, v in enumerate(values) if not 0 <= v <= 1]
        total = 1.0 + sum(values)
        tolerance = (length[1] if length else 0.0) + sum(r[1] for r in read) + 1e-9
        if length is not None and length_col is not None and abs(length[0] - total) > tolerance:
            out.append(error("ACCEPTANCE_LENGTH_MISMATCH", where,
                             f"acceptance length {plain(cells[length_col])} but 1 + the sum of the per-position "
                             f"rates is {total:.4f} (tolerance {tolerance:.4f} at the table's rounding)",
                             "recompute the row: acceptance length = 1 + sum of per-position rates"))
        rises = [k for k in range(1, len(values)) if values[k] > values[k - 1]]
        if rises:
            k = rises[0]
            out.append(error("RATES_INCREASE", where, f"rate at position {k} ({plain(cells[positions[k]])}) exceeds "
                             f"position {k - 1} ({plain(cells[positions[k - 1]])}); a position is accepted only "
                             "after every earlier one, so rates cannot rise along a row",
                             "check the row for swapped or conditional (per-position) rates"))
    return out


def _row_key(table: Table, cells: list[str]) -> tuple[str, ...]:
    first_position = next((i for i, h in enumerate(table.headers) if _POSITION.match(plain(h))), None)
    width = first_position if first_position else 1
    return tuple(plain(c) for c in cells[:width])


def _duplicate_findings(card: Card, table: Table) -> list[Finding]:
    seen: dict[tuple[str, ...], tuple[int, list[str]]] = {}
    out = []
    for line, cells in table.rows:
        key = _row_key(table, cells)
        if not any(key):
            continue
        if key in seen:
            first_line, first_cells = seen[key]
            same = [plain(c) for c in first_cells] == [plain(c) for c in cells]
            detail = "with the same values" if same else "with different values"
            out.append(error("DUPLICATE_ROW", card.where(line), f"row {' | '.join(key)!r} repeats line {first_line} "
                             f"{detail}", "keep one row per key (and say which measurement is right)"))
        else:
            seen[key] = (line, cells)
    return out


def _label_after(card: Card, table: Table) -> tuple[int, str] | None:
    """The first non-blank body line after the table (None at the end of the card)."""
    last = table.rows[-1][0] if table.rows else table.line + 1
    return next(((line, text) for line, text in card.body if line > last and text.strip()), None)


def _position_columns(table: Table) -> int:
    return sum(1 for h in table.headers if _POSITION.match(plain(h)))


def _is_acceptance_table(table: Table) -> bool:
    """A table of acceptance numbers: two or more `Pos N` columns, or an `Acceptance length` column."""
    return _position_columns(table) >= 2 or table.column(r"acceptance\s+length") is not None


def _label_findings(card: Card, table: Table, expected: AcceptanceLabel | None) -> list[Finding]:
    if not _is_acceptance_table(table):
        return []
    after = _label_after(card, table)
    label = parse_label(after[1]) if after else None
    if label is None or after is None:
        return [error("ACCEPTANCE_UNLABELLED", card.where(table.line), "the acceptance table does not say which "
                      "numbers it shows (no 'Acceptance numbers: measured (...)' or 'simulated (...)' line after it)",
                      "add the label line under the table ('dspark-hub card' writes it from the eval file)")]
    where = card.where(after[0])
    out = _incomplete_label_findings(label, where)
    out += _k_range_findings(card, table, label, where)
    positions = _position_columns(table)
    if positions and label.k is not None and label.k != positions:
        out.append(error("ACCEPTANCE_LABEL_MISMATCH", where, f"the label says k={label.k} but the table has "
                         f"{positions} position columns", "state the k the numbers were measured with"))
    if expected is not None:
        out += [error("ACCEPTANCE_LABEL_MISMATCH", where, f"the label says {d}",
                      f"label the table '{expected.text}' or lint it against its own eval file")
                for d in _label_differences(label, expected)]
    return out


def _k_range_findings(card: Card, table: Table, label: AcceptanceLabel, where: str) -> list[Finding]:
    """A table of several k (`k=1-7` in its label): every row's `k` lies in that range."""
    column = table.column(r"^k$")
    if label.k_range is None or column is None:
        return []
    low, high = label.k_range
    return [error("ACCEPTANCE_LABEL_MISMATCH", card.where(line), f"the row's k {plain(cells[column])} is outside the "
                  f"label's k={low}-{high} ({where})", "label the table with the k it was measured at")
            for line, cells in table.rows if column < len(cells)
            and not (plain(cells[column]).isdigit() and low <= int(plain(cells[column])) <= high)]


def _incomplete_label_findings(label: AcceptanceLabel, where: str) -> list[Finding]:
    if not label.missing:
        return []
    shape = "vLLM x.y, k=K, dtype, prompts F" if label.kind == "measured" else "definition, k=K, dtype, prompts F"
    return [error("ACCEPTANCE_LABEL_INCOMPLETE", where, f"the {label.kind} label does not state "
                  f"{' or '.join(label.missing)}",
                  f"write '{label.kind} ({shape})', with 'not stated' for a part that is unknown")]


def _named(label: AcceptanceLabel) -> str | None:
    """A label's engine (without its version) or simulation, to compare; None when it is not stated."""
    what = (label.what or "").split(",")[0].strip()
    if label.kind == "measured" and label.version:
        what = what.replace(label.version, "").strip()
    return None if not what or "not stated" in what else what.lower()


def _short(text: str | None, limit: int = 80) -> str:
    text = text or ""
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _label_differences(label: AcceptanceLabel, expected: AcceptanceLabel) -> list[str]:
    """Where a card's label contradicts the label its eval file implies, one phrase each."""
    differences = [f"{label.kind}, the eval file {expected.kind}"] if label.kind != expected.kind else []
    if label.kind == expected.kind and _named(label) and _named(expected) and _named(label) != _named(expected):
        what = "engine" if label.kind == "measured" else "simulation"
        differences.append(f"the {what} is {_short(label.what)!r}, the eval file {_short(expected.what)!r}")
    for name in ("version", "k", "dtype"):
        mine, theirs = getattr(label, name), getattr(expected, name)
        if mine is not None and theirs is not None and str(mine) != str(theirs):
            differences.append(f"{name} {mine}, the eval file {theirs}")
    if label.prompts and expected.prompts and not (label.prompts.startswith(expected.prompts)
                                                   or expected.prompts.startswith(label.prompts)):
        differences.append(f"prompts {label.prompts}, the eval file {expected.prompts}")
    return differences + _decoding_differences(label.sampling, expected.sampling)


def _decoding_differences(mine: dict[str, Any], theirs: dict[str, Any]) -> list[str]:
    """A sampled number presented as greedy or the reverse, or sampled otherwise than its eval file says."""
    def said(sampling: dict[str, Any]) -> str:
        return "greedy" if not sampling["temperature"] else f"sampled at temperature {sampling['temperature']:g}"

    if mine["temperature"] != theirs["temperature"]:
        return [f"{said(mine)} numbers, the eval file {said(theirs)}"]
    unset = {"drafting": "not stated"}
    return [f"{name} {mine.get(name, unset.get(name, 'off'))}, the eval file {theirs.get(name, unset.get(name, 'off'))}"
            for name in ("top-p", "top-k", "min-p", "drafting") if mine.get(name) != theirs.get(name)]


def _consistency_findings(card: Card, said: list[Statement]) -> list[Finding]:
    out = []
    blocks = [s for s in said if s.kind == "block_size"]
    for s in blocks[1:]:
        if s.value != blocks[0].value:
            out.append(error("BLOCK_SIZE_CONFLICT", card.where(s.line), f"'{s.text}' but line {blocks[0].line} says "
                             f"'{blocks[0].text}'", "state the one block size the draft was trained with"))
    firsts = {kind: next((s for s in said if s.kind == kind), None) for kind in ("total", "trained", "frozen")}
    total, trained, frozen = firsts["total"], firsts["trained"], firsts["frozen"]
    if total and trained and frozen and trained.value + frozen.value != total.value:
        out.append(error("PARAMETERS_INCONSISTENT", card.where(frozen.line),
                         f"{trained.value:,} trained + {frozen.value:,} frozen != {total.value:,} total "
                         f"(line {total.line})", "recompute the counts from the weights with 'dspark-hub card'"))
    return out


# ------------------------------------------------------------------ against the checkpoint

def _weight_findings(card: Card, said: list[Statement], view: CheckpointView,
                     hasher: Callable[[Path], str] = sha256_file) -> list[Finding]:
    facts = card_facts(view, hash_files=False)
    per_layer = sum(1 for n in view.tensors if n.startswith("layers.0."))
    truth: dict[str, Any] = {
        "total": facts.parameters.total if facts.parameters else None,
        "trained": facts.parameters.trained if facts.parameters else None,
        "frozen": facts.parameters.frozen if facts.parameters else None,
        "tensors": facts.tensor_count, "layer_tensors": per_layer, "layers": facts.num_layers,
        "layer_ids": facts.target_layer_ids, "block_size": facts.block_size,
    }
    codes = {"total": "PARAMETERS_MISMATCH", "trained": "PARAMETERS_MISMATCH", "frozen": "PARAMETERS_MISMATCH",
             "tensors": "TENSOR_COUNT_MISMATCH", "layer_tensors": "TENSOR_COUNT_MISMATCH",
             "layers": "LAYER_COUNT_MISMATCH", "layer_ids": "TARGET_LAYERS_MISMATCH",
             "block_size": "BLOCK_SIZE_MISMATCH"}
    out = []
    for s in said:
        actual = truth.get(s.kind)
        if actual is None or s.value == actual:
            continue
        shown = f"{actual:,}" if isinstance(actual, int) else str(actual)
        out.append(error(codes[s.kind], card.where(s.line), f"the card says '{s.text}' ({s.kind.replace('_', ' ')}) "
                         f"but the checkpoint has {shown}", "regenerate the card with 'dspark-hub card CKPT'"))
    shapes = {name: info.shape for name, (_, info) in view.tensors.items()}
    for table in card.tables:
        out += _shape_findings(card, table, shapes)
        out += _checksum_findings(card, table, view, hasher)
    return out


def _shape_findings(card: Card, table: Table, shapes: Mapping[str, tuple[int, ...]]) -> list[Finding]:
    shape_col = table.column(r"^shape$")
    if shape_col is None:
        return []
    out = []
    for line, cells in table.rows:
        named = code_text(cells[0]) if cells and cells[0].strip().startswith("`") else None
        shape_text = plain(cells[shape_col]) if shape_col < len(cells) else ""
        if not named or not _SHAPE.match(shape_text):
            continue
        stated = tuple(int(x) for x in shape_text.split(" x "))
        for name in expand_names(named):
            actual = shapes.get(name)
            if actual is None:
                out.append(error("TENSOR_NOT_IN_CHECKPOINT", card.where(line), f"the card lists {name} but the "
                                 "checkpoint has no such tensor", "regenerate the card from these weights"))
            elif actual != stated:
                out.append(error("SHAPE_MISMATCH", card.where(line), f"{name}: the card says {shape_text}, the "
                                 f"checkpoint has {' x '.join(map(str, actual))}",
                                 "regenerate the card from these weights"))
    return out


def _checksum_findings(card: Card, table: Table, view: CheckpointView | None,
                       hasher: Callable[[Path], str] = sha256_file) -> list[Finding]:
    sha_col, file_col = table.column(r"sha-?256"), table.column(r"^file$")
    if sha_col is None or file_col is None:
        return []
    size_col = table.column(r"^size")
    out = []
    for line, cells in table.rows:
        name = code_text(cells[file_col]) if file_col < len(cells) else ""
        digest = plain(cells[sha_col]).lower() if sha_col < len(cells) else ""
        where = card.where(line)
        if digest not in ("", "—", "-") and not _SHA256.match(digest):
            out.append(error("CHECKSUM_MALFORMED", where, f"{name}: {digest!r} is not a SHA-256 hex digest",
                             "write the 64-character lowercase hex digest"))
            continue
        if view is None:
            continue
        if name not in view.files:
            out.append(error("CHECKSUM_FILE_MISSING", where, f"the card lists {name} but the checkpoint has no such "
                             "file", "regenerate the checksum table from these files"))
            continue
        size = cell_int(cells[size_col]) if size_col is not None and size_col < len(cells) else None
        if size is not None and size != view.files[name]:
            out.append(error("CHECKSUM_SIZE_MISMATCH", where, f"{name}: the card says {size:,} bytes, the file has "
                             f"{view.files[name]:,}", "regenerate the checksum table from these files"))
        elif _SHA256.match(digest) and hasher(view.local_path(name)) != digest:
            out.append(error("CHECKSUM_MISMATCH", where, f"{name}: SHA-256 differs from the card's {digest[:12]}...",
                             "regenerate the checksum table from these files"))
    return out


def _repr_findings(card: Card) -> list[Finding]:
    """A line that prints a Python object (`{{ facts.parameters }}` rendered by an older dspark-hub, a template
    printing an object) instead of the text a reader expects."""
    out = []
    for line, text in card.body:
        for kind, pattern in _REPRS:
            m = pattern.search(text)
            if m:
                shown = text[m.start():m.start() + 60]
                out.append(error("PYTHON_REPR", card.where(line), f"{kind} in the card: {shown!r}",
                                 "print the fact's documented text (e.g. '{{ facts.parameters.total | thousands }}'), "
                                 "then render the card again"))
                break
    return out


# ------------------------------------------------------------------ entry point

def lint_card(readme_path: str | Path, checkpoint: str | Path | None = None, *,
              hasher: Callable[[Path], str] = sha256_file, eval_json: str | Path | None = None) -> CardLintReport:
    """Lint a model card; with `checkpoint`, also check every weight fact it states.

    `hasher(path) -> sha256` checks the card's checksum table; pass digests already computed
    (as `publish` does) so large weights are not read twice. With `eval_json` (the `eval --json`
    file the card's per-position tables come from), each table's label must agree with it.

    Raises:
        UsageError: the card or the eval file cannot be read.
        CheckpointNotFoundError: the checkpoint folder does not exist.
    """
    path = Path(readme_path)
    try:
        text = read_regular(path).decode("utf-8")
    except FileNotFoundError:
        raise UsageError(f"{path}: no such file; pass the card (README.md) to lint") from None
    except UnicodeDecodeError:
        raise UsageError(f"{path}: not UTF-8 text; a model card is a UTF-8 markdown file") from None
    card = parse_card(text, path.name)
    expected = _expected_label(eval_json) if eval_json is not None else None
    report = CardLintReport(path=str(path), checkpoint=str(checkpoint) if checkpoint is not None else None)
    report.findings += _front_matter_findings(card)
    for table in card.tables:
        report.findings += _acceptance_findings(card, table)
        report.findings += _label_findings(card, table, expected)
        report.findings += _duplicate_findings(card, table)
    report.findings += _repr_findings(card)
    said = statements(card)
    report.findings += _consistency_findings(card, said)
    if checkpoint is None:
        for table in card.tables:
            report.findings += _checksum_findings(card, table, None)
        report.findings.append(info("WEIGHTS_NOT_CHECKED", card.where(1), "no checkpoint given: parameter counts, "
                                    "shapes, target layers and checksums were not compared with weights",
                                    f"lint it with the weights: 'dspark-hub card lint {path} --checkpoint CKPT'"))
    else:
        report.findings += _weight_findings(card, said, open_checkpoint(LocalSource(checkpoint)), hasher)
    return report


def _expected_label(eval_json: str | Path) -> AcceptanceLabel:
    path = Path(eval_json)
    try:
        doc = load_json_object(path)
    except (CheckpointFormatError, CheckpointNotFoundError) as e:
        raise UsageError(f"{e}; pass the eval file ('dspark-hub eval --json' output)", param="eval_json") from None
    label = acceptance_label(doc)
    if label is None:
        raise UsageError(f"{path}: says neither measured_by nor a simulated mode; it cannot confirm a label",
                         param="eval_json")
    return label
