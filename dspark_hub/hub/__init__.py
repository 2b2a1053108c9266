"""Publishing: checksum sidecars, release packages (torrent, magnet) and the Hub upload with its gate.

- `checksums`: write `SHA256SUMS` / `checksums.json`, check a folder against them.
- `package`: sidecars, `.gitattributes`, a deterministic torrent with Hub web seeds.
- `publish`: one commit through huggingface_hub, then a comparison of what landed.
- `release`: `publish_checkpoint()`, the preflight gate (verify, card lint, sidecars) in front of it.

Reading from the Hub is part of the format core (`format.remote`), so `verify hf://...` needs
nothing from here. Imports `verify`, `cards` (the card lint of the gate) and the format core.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dspark_hub._lazy import lazy_exports

# `publish` and `package` are the submodules (`dspark_hub.hub.publish.publish`): a lazy name equal to a
# submodule's would turn into that module as soon as anything imports it.
__getattr__, __dir__ = lazy_exports(__name__, {
    "plan_publish": "publish", "publish_checkpoint": "release",
    "write_checksums": "checksums", "check_checksums": "checksums",
})
__all__ = ["check_checksums", "plan_publish", "publish_checkpoint", "write_checksums"]

if TYPE_CHECKING:
    from dspark_hub.hub.checksums import check_checksums, write_checksums
    from dspark_hub.hub.publish import plan_publish
    from dspark_hub.hub.release import publish_checkpoint
