"""The project's documentation as tests read it: the README, `docs/*.md` and `cards/README.md`.

Tests read the docs for what the code must agree with (tables, commands, samples, quoted
numbers), never for wording. Helpers here find a file's section by its heading and its fenced
blocks.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


def doc_files() -> list[Path]:
    """Every Markdown file of the documentation."""
    return [ROOT / "README.md", *sorted(DOCS.glob("*.md")), ROOT / "cards" / "README.md"]


def read(relative: str) -> str:
    return (ROOT / relative).read_text()


def _headings(text: str) -> list[tuple[int, int, str]]:
    """(offset, level, title) of every Markdown heading outside fenced blocks."""
    found, fence, offset = [], False, 0
    for line in text.splitlines(keepends=True):
        if line.startswith("```"):
            fence = not fence
        elif not fence and (m := re.match(r"(#+) (.*)", line)):
            found.append((offset, len(m.group(1)), m.group(2).strip()))
        offset += len(line)
    return found


def section(text: str, title_start: str) -> str:
    """The section whose heading starts with `title_start`, up to the next heading of its level or above."""
    headings = _headings(text)
    for i, (offset, level, title) in enumerate(headings):
        if title.startswith(title_start):
            end = next((o for o, lv, _ in headings[i + 1:] if lv <= level), len(text))
            return text[offset:end]
    raise AssertionError(f"no section {title_start!r}")


def fenced_blocks(text: str, *languages: str) -> list[tuple[str, str]]:
    """(language, body) of every fenced block whose language is one of `languages` (all when none given)."""
    blocks = re.findall(r"^```(\w*)\n(.*?)^```", text, flags=re.M | re.S)
    return [(lang, body) for lang, body in blocks if not languages or lang in languages]


def without_generated(text: str) -> str:
    """`text` without its generated blocks (what a person wrote)."""
    return re.sub(r"<!-- generated: [\w-]+ -->\n.*?<!-- end generated -->", "", text, flags=re.S)
