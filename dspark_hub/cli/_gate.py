"""The output gate: what may reach a terminal. Every token huggingface_hub would send is redacted
(`redaction.redact_tokens`) and every control character is written out as text (`\x1b`, `\r`, `\x9b`), so a
checkpoint's names cannot retitle the terminal, clear the screen or overwrite its own findings."""

from __future__ import annotations

import re

from dspark_hub.redaction import redact_tokens

#: What a terminal may act on: C0 but the newline, DEL, C1, lone surrogates (unprintable), bidi overrides.
CONTROL = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\ud800-\udfff\u202a-\u202e\u2066-\u2069]")
_NAMED = {"\t": "\\t", "\r": "\\r"}


def escape(match: re.Match[str]) -> str:
    char = match[0]
    return _NAMED.get(char) or (f"\\x{ord(char):02x}" if ord(char) < 0x100 else f"\\u{ord(char):04x}")


def terminal_text(text: str) -> str:
    """`text` safe for a terminal: tokens redacted, control characters written out (`\x1b`, `\r`, `\x9b`)."""
    return CONTROL.sub(escape, redact_tokens(text))
