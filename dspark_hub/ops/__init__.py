"""Operations that write or compare whole checkpoints: `init`, `convert` (with `crosswalk`), `diff`.

Built on the format core and `verify` (a converted checkpoint is verified before it is reported).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dspark_hub._lazy import lazy_exports

# `convert` and `diff` are the submodules (`dspark_hub.ops.convert.convert`): a lazy name equal to a
# submodule's would turn into that module as soon as anything imports it.
__getattr__, __dir__ = lazy_exports(__name__, {"init_checkpoint": "init"})
__all__ = ["init_checkpoint"]

if TYPE_CHECKING:
    from dspark_hub.ops.init import init_checkpoint
