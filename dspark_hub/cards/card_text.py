"""A rendered card read back: front matter, body lines outside code fences, tables, and the numbers its text
states about the weights (`statements`). `lint` checks what this reads.

It also holds the one encoding of a name (a file, a tensor, a dataset) in a card, both ways: `code_span`
writes it as inline code that stays on its line and in its table cell whatever it holds (a newline, `|`,
backticks, HTML, a leading `#`), `code_text` reads it back, and `line_text` writes it as plain text on one line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

_PARAMETERS = re.compile(r"(?<![\d.,])(\d{1,3}(?:,\d{3})+|\d{4,})\s+(?:\w+\s+)?parameters\b", re.IGNORECASE)
_TENSORS = re.compile(r"(?<![\d.,])(\d[\d,]*)\s+tensors\b", re.IGNORECASE)
_LAYER_IDS = re.compile(r"\blayers?(?:\s+ids?)?\s+`?\[(\d+(?:\s*,\s*\d+)*)\]`?", re.IGNORECASE)
_BLOCK_SIZE = re.compile(r"block[-_ ]size`?\s*[=:]?\s*`?(\d+)", re.IGNORECASE)
_DECODER_LAYERS = re.compile(r"^(\d+) x decoder layers?$", re.IGNORECASE)


@dataclass(frozen=True)
class Table:
    """A markdown table: header cells, and (line number, cells) per body row."""

    line: int
    headers: list[str]
    rows: list[tuple[int, list[str]]]

    def column(self, pattern: str) -> int | None:
        return next((i for i, h in enumerate(self.headers) if re.search(pattern, h, re.IGNORECASE)), None)


@dataclass
class Card:
    """A card split into front matter and body lines (1-based numbers kept)."""

    name: str
    front_matter: list[tuple[int, str]] | None
    body: list[tuple[int, str]]          # prose and table lines outside code fences
    tables: list[Table]

    def where(self, line: int) -> str:
        return f"{self.name}:{line}"


#: What may not appear raw in a name on one line of a card: the backslash (the escape itself), C0 (newline,
#: carriage return, tab, escape, ...), DEL, C1 (NEL), the Unicode line and paragraph separators, bidi overrides.
_NOT_IN_A_LINE = re.compile("[\\\\\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_NAMED_ESCAPES = {"\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}
_ESCAPE = re.compile(r"\\(\\|n|r|t|x[0-9a-f]{2}|u[0-9a-f]{4})")
#: Plain text from a file: what would open a code span, HTML or an autolink, an inline link (`](`) or a table
#: cell is backslash-escaped (emphasis is left alone: it cannot change the card's structure).
_MARKUP = re.compile(r"[`<>|]|(?<=\])\(")


def one_line(text: str) -> str:
    """`text` with every line break and control character written out (`\\n`, `\\x1b`, `\\u2028`; `\\\\` for a
    backslash), so it cannot end its line, open a heading or a table row, or move a terminal's cursor."""
    def escape(match: re.Match[str]) -> str:
        char = match[0]
        return _NAMED_ESCAPES.get(char) or (f"\\x{ord(char):02x}" if ord(char) < 0x100 else f"\\u{ord(char):04x}")

    return _NOT_IN_A_LINE.sub(escape, text)


def undo_one_line(text: str) -> str:
    """The text `one_line` wrote out."""
    named = {v[1:]: k for k, v in _NAMED_ESCAPES.items()}
    return _ESCAPE.sub(lambda m: named.get(m[1]) or chr(int(m[1][1:], 16)), text)


def code_span(name: object, *, cell: bool = False) -> str:
    """`name` as inline code on one line: a fence longer than any run of backticks it holds, a space inside the
    fence where it begins or ends with a backtick or a space, `|` escaped in a table `cell`."""
    body = one_line(str(name))
    if cell:
        body = body.replace("|", "\\|")
    fence = "`" * (max((len(run) for run in re.findall("`+", body)), default=0) + 1)
    pad = " " if body[:1] in ("`", " ") or body[-1:] in ("`", " ") else ""
    return f"{fence}{pad}{body}{pad}{fence}"


def code_text(cell: str) -> str:
    """The name a `code_span` cell holds (a cell `_cells` split, `\\|` already `|`); a cell that is no code
    span is read as `plain` text."""
    m = re.fullmatch(r"(`+)(.*?)\1", cell.strip())
    if not m:
        return plain(cell)
    body = m.group(2)
    if len(body) >= 2 and body[0] == " " and body[-1] == " " and body.strip():
        body = body[1:-1]
    return undo_one_line(body)


def line_text(value: object, *, cell: bool = False) -> str:
    """Text from a file (a dataset name, an engine's name) as plain markdown on one line: `one_line`, and
    a backslash before what would open a code span, HTML or a link (`|` too in a table `cell`)."""
    text = _MARKUP.sub(lambda m: "\\" + m[0], one_line(str(value)))
    return text if cell else text.replace("\\|", "|")


def _cells(line: str) -> list[str]:
    inner = line.strip()
    inner = inner[1:] if inner.startswith("|") else inner
    inner = inner[:-1] if inner.endswith("|") and not inner.endswith("\\|") else inner
    return [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", inner)]


def _is_separator(line: str) -> bool:
    return bool(re.fullmatch(r"\|?(\s*:?-{3,}:?\s*\|)+\s*:?-{0,}:?\s*\|?", line.strip()))


def parse_card(text: str, name: str = "README.md") -> Card:
    """Split a card into front matter, body lines outside code fences, and tables."""
    lines = text.splitlines()
    front: list[tuple[int, str]] | None = None
    start = 0
    if lines and lines[0].strip() == "---":
        end = next((i for i in range(1, len(lines)) if lines[i].strip() == "---"), None)
        if end is not None:
            front = [(i + 1, lines[i]) for i in range(1, end)]
            start = end + 1
    body: list[tuple[int, str]] = []
    fenced = False
    for i in range(start, len(lines)):
        if lines[i].lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            body.append((i + 1, lines[i]))
    return Card(name=name, front_matter=front, body=body, tables=_tables(body))


def _tables(body: list[tuple[int, str]]) -> list[Table]:
    tables: list[Table] = []
    i = 0
    while i + 1 < len(body):
        number, line = body[i]
        if line.lstrip().startswith("|") and _is_separator(body[i + 1][1]):
            rows = []
            j = i + 2
            while j < len(body) and body[j][1].lstrip().startswith("|"):
                rows.append((body[j][0], _cells(body[j][1])))
                j += 1
            tables.append(Table(number, _cells(line), rows))
            i = j
        else:
            i += 1
    return tables


def plain(cell: str) -> str:
    return cell.replace("**", "").replace("`", "").strip()


def cell_int(text: str) -> int | None:
    text = plain(text).replace(",", "")
    return int(text) if text.isdigit() else None


def expand_names(pattern: str) -> list[str]:
    """`layers.{0..2}.w{1,2}` -> the six names it stands for."""
    m = re.search(r"\{([^{}]*)\}", pattern)
    if not m:
        return [pattern]
    body = m.group(1)
    if ".." in body:
        lo, hi = body.split("..", 1)
        choices = [str(i) for i in range(int(lo), int(hi) + 1)] if lo.isdigit() and hi.isdigit() else [body]
    else:
        choices = body.split(",")
    return [n for c in choices for n in expand_names(pattern[:m.start()] + c.strip() + pattern[m.end():])]


@dataclass(frozen=True)
class Statement:
    line: int
    kind: str             # total | trained | frozen | tensors | layer_tensors | layer_ids | block_size
    value: Any
    text: str


def _clause(text: str, start: int) -> str:
    m = re.search(r"[.;:](?:\s|$)", text[start:])
    return text[start:start + m.start()] if m else text[start:]


def statements(card: Card) -> list[Statement]:
    """Every number the card states about the weights, with its line."""
    out: list[Statement] = []
    for line, raw in card.body:
        text = raw.replace("**", "")
        for m in _PARAMETERS.finditer(text):
            clause = _clause(text, m.start()).lower()
            kind = "frozen" if "frozen" in clause else "trained" if "trained" in clause else "total"
            out.append(Statement(line, kind, int(m.group(1).replace(",", "")), m.group(0)))
        for m in _TENSORS.finditer(text):
            before = text[:m.start()].lower()
            kind = "layer_tensors" if re.search(r"\b(each|per)\b[^.]*$", before) else "tensors"
            out.append(Statement(line, kind, int(m.group(1).replace(",", "")), m.group(0)))
        for m in _LAYER_IDS.finditer(text):
            out.append(Statement(line, "layer_ids", [int(x) for x in m.group(1).split(",")], m.group(0)))
        for m in _BLOCK_SIZE.finditer(text):
            out.append(Statement(line, "block_size", int(m.group(1)), m.group(0)))
    for table in card.tables:
        for line, cells in table.rows:
            if len(cells) >= 2 and re.fullmatch(r"target layer ids?", plain(cells[0]), re.IGNORECASE):
                ids = [int(x) for x in re.findall(r"\d+", plain(cells[1]))]
                out.append(Statement(line, "layer_ids", ids, cells[1]))
            if cells and (layers := _DECODER_LAYERS.match(plain(cells[0]))):
                out.append(Statement(line, "layers", int(layers.group(1)), cells[0]))
    return out
