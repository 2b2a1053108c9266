"""Streaming SHA-256 of local files, and reading manifests of known digests (stdlib only).

Private stop-gap for the card's checksum table until `dspark_hub.checksums.compute_manifest`
lands on main; then `cards` should take its digests (and manifest format) from there.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .errors import UsageError

_CHUNK = 8 << 20


def sha256_file(path: str | os.PathLike[str], *, progress: Callable[[int], None] | None = None) -> str:
    """Hex SHA-256 of a file, read in 8 MiB pieces; `progress(nbytes)` after each piece."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
            if progress:
                progress(len(chunk))
    return digest.hexdigest()


@dataclass(frozen=True)
class ManifestEntry:
    """A file's known size and digest from a manifest (either may be unknown)."""

    size: int | None
    sha256: str | None


def load_checksum_manifest(path: str | os.PathLike[str]) -> dict[str, ManifestEntry]:
    """Read known digests: `sha256sum` output, or JSON (`{"files": [{"path", "size", "sha256"}]}`,
    `{"files": {name: {...}}}`, `[{...}]` or `{name: "hex"}`).

    Raises:
        UsageError: the file is missing or in none of these forms.
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UsageError(f"{p}: no such file; pass a checksum manifest (JSON or sha256sum output)") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError:
        return _sha256sum_lines(p, text)
    files = doc.get("files", doc) if isinstance(doc, dict) else doc
    out: dict[str, ManifestEntry] = {}
    items = files.items() if isinstance(files, dict) else ((None, e) for e in files) if isinstance(files, list) else ()
    for name, entry in items:
        if isinstance(entry, str):
            out[str(name)] = ManifestEntry(None, entry.lower())
        elif isinstance(entry, dict):
            key = name or entry.get("path") or entry.get("name") or entry.get("file")
            sha = entry.get("sha256")
            size = entry.get("size")
            out[str(key)] = ManifestEntry(size if isinstance(size, int) else None,
                                          sha.lower() if isinstance(sha, str) else None)
    if not out:
        raise UsageError(f"{p}: holds no file digests; expected sha256sum lines or {{\"files\": [...]}}")
    return out


def _sha256sum_lines(path: Path, text: str) -> dict[str, ManifestEntry]:
    out = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        m = re.fullmatch(r"([0-9a-fA-F]{64}) [ *](.+)", line.strip())
        if not m:
            raise UsageError(f"{path}:{number}: not '<sha256>  <file>'; pass sha256sum output or a JSON manifest")
        out[m.group(2)] = ManifestEntry(None, m.group(1).lower())
    return out
