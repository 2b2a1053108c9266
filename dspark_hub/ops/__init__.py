"""Operations that write or compare whole checkpoints: `init`, `convert` (with `crosswalk`), `diff`.

Built on the format core and `verify` (a converted checkpoint is verified before it is reported).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dspark_hub._lazy import lazy_exports

__getattr__, __dir__ = lazy_exports(__name__, {"convert": "convert", "diff": "diff", "init_checkpoint": "init"})
__all__ = ["convert", "diff", "init_checkpoint"]

if TYPE_CHECKING:
    from dspark_hub.ops.convert import convert
    from dspark_hub.ops.diff import diff
    from dspark_hub.ops.init import init_checkpoint
