"""Where the package keeps its code registries (codes are data, one dict per area), and their union.

`tests/test_docs.py` checks the README against the union and the source against it;
`tests/conftest.py` checks every finding and format error the suite creates against it.
"""

from __future__ import annotations

import importlib

#: module -> its registry (code -> meaning).
REGISTRIES: dict[str, str] = {
    "dspark_hub.format.jsonio": "JSON_CODES",
    "dspark_hub.format.reader": "FORMAT_CODES",
    "dspark_hub.format.checkpoint": "FOLDER_CODES",
    "dspark_hub.format.digests": "DIGEST_CODES",
    "dspark_hub.verify.codes": "FINDING_CODES",
    "dspark_hub.cards.lint": "LINT_CODES",
    "dspark_hub.format.remote_code": "LOAD_CODES",
    "dspark_hub.verify.runtimes.execute_vllm": "ERROR_CODES",
}


def registry(module: str) -> dict[str, str]:
    return getattr(importlib.import_module(module), REGISTRIES[module])


def registered_codes() -> set[str]:
    """Every code some registry lists."""
    return {code for module in REGISTRIES for code in registry(module)}


class CodeChecker:
    """`checker(code)` is True for a registered code (the registries are read once, on first use)."""

    def __init__(self) -> None:
        self._all: set[str] | None = None

    def __call__(self, code: str) -> bool:
        if self._all is None:
            self._all = registered_codes()
        return code in self._all
