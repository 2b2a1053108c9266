"""dspark-hub: verify, train, card and publish k3_dspark speculative-decoding drafts.

Public names resolve lazily (PEP 562) so `import dspark_hub` stays free of heavy imports.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "CheckpointFormatError": "errors",
    "DsparkError": "errors",
    "Finding": "report",
    "REFERENCE_CONFIG": "contract",
    "Report": "report",
    "init_checkpoint": "writer",
    "parameter_counts": "contract",
    "read_header": "reader",
    "roster": "contract",
    "verify": "checks",
}
__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:
    from .checks import verify
    from .contract import REFERENCE_CONFIG, parameter_counts, roster
    from .errors import CheckpointFormatError, DsparkError
    from .reader import read_header
    from .report import Finding, Report
    from .writer import init_checkpoint


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'dspark_hub' has no attribute {name!r}")
    return getattr(importlib.import_module(f".{module}", __name__), name)
