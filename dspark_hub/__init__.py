"""dspark-hub: verify, train, card and publish k3_dspark speculative-decoding drafts.

The areas are packages (see the README's "Architecture"): `format` (the strict core),
`verify`, `ops`, `modeling`, `train`, `cards`, `hub` and `cli`. Public names here resolve
lazily (PEP 562), so `import dspark_hub` stays free of heavy imports.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dspark_hub import _compat
from dspark_hub._lazy import lazy_exports
from dspark_hub._version import __version__ as __version__

__getattr__, __dir__ = lazy_exports(__name__, {
    "CheckpointFormatError": "errors",
    "DsparkError": "errors",
    "Finding": "report",
    "REFERENCE_CONFIG": "format.contract",
    "Report": "report",
    "init_checkpoint": "ops.init",
    "parameter_counts": "format.contract",
    "read_header": "format.reader",
    "roster": "format.contract",
})
__all__ = ["REFERENCE_CONFIG", "CheckpointFormatError", "DsparkError", "Finding", "Report", "init_checkpoint",
           "parameter_counts", "read_header", "roster"]

_compat.install()

if TYPE_CHECKING:
    from dspark_hub.errors import CheckpointFormatError, DsparkError
    from dspark_hub.format.contract import REFERENCE_CONFIG, parameter_counts, roster
    from dspark_hub.format.reader import read_header
    from dspark_hub.ops.init import init_checkpoint
    from dspark_hub.report import Finding, Report
