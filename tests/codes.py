"""Where the package keeps its code registries (codes are data, one dict per area), and their union.

`tests/test_docs.py` checks the README against the union and the source against it;
`tests/conftest.py` checks every finding and format error the suite creates against it.
"""

from __future__ import annotations

import importlib

#: module -> its registry (code -> meaning). The modeling one imports torch, so it is read last.
REGISTRIES: dict[str, str] = {
    "dspark_hub.format.jsonio": "JSON_CODES",
    "dspark_hub.format.reader": "FORMAT_CODES",
    "dspark_hub.format.checkpoint": "FOLDER_CODES",
    "dspark_hub.format.digests": "DIGEST_CODES",
    "dspark_hub.verify.codes": "FINDING_CODES",
    "dspark_hub.cards.lint": "LINT_CODES",
    "dspark_hub.modeling.checkpoint_io": "LOAD_CODES",
}
_HEAVY = "dspark_hub.modeling.checkpoint_io"


def registry(module: str) -> dict[str, str]:
    return getattr(importlib.import_module(module), REGISTRIES[module])


def registered_codes(*, heavy: bool = True) -> set[str]:
    """Every code some registry lists (`heavy=False` skips the one that needs torch)."""
    return {code for module in REGISTRIES if heavy or module != _HEAVY for code in registry(module)}


class CodeChecker:
    """`checker(code)` is True for a registered code; imports the torch-backed registry only if needed."""

    def __init__(self) -> None:
        self._light: set[str] | None = None
        self._all: set[str] | None = None

    def __call__(self, code: str) -> bool:
        if self._light is None:
            self._light = registered_codes(heavy=False)
        if code in self._light:
            return True
        if self._all is None:
            self._all = registered_codes()
        return code in self._all
