"""Small text helpers shared by library messages and the CLI's human views."""

from __future__ import annotations


def plural(n: int, noun: str, plural_form: str | None = None) -> str:
    """`1 problem`, `2 problems`, `1,234 bytes` (`plural_form` for irregular nouns: `plural(n, "entry", "entries")`)."""
    return f"{n:,} {noun if n == 1 else plural_form or noun + 's'}"
