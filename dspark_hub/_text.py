"""Small text helpers shared by library messages and the CLI's human views."""

from __future__ import annotations

import json

#: How long a value quoted in a message may be (a config can hold a 50 MB string).
SHORT_VALUE = 200


def plural(n: int, noun: str, plural_form: str | None = None) -> str:
    """`1 problem`, `2 problems`, `1,234 bytes` (`plural_form` for irregular nouns: `plural(n, "entry", "entries")`)."""
    return f"{n:,} {noun if n == 1 else plural_form or noun + 's'}"


def shortened(text: str, limit: int = SHORT_VALUE) -> str:
    """`text` cut to `limit` characters with `...` at the end when longer."""
    return text if len(text) <= limit else text[:limit - 3] + "..."


def short_json(value: object, limit: int = SHORT_VALUE) -> str:
    """`value` as JSON, `shortened` to `limit` characters."""
    return shortened(json.dumps(value), limit)
