"""Streaming SHA-256 of local files (stdlib only).

Private stop-gap for the card's checksum table until `dspark_hub.checksums.compute_manifest`
lands on main; then `cards` should take its digests from there.
"""

from __future__ import annotations

import hashlib
import os
from typing import Callable

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
