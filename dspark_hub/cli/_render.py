"""Human views of library results: one renderer per result type, on stdout. `emit` looks them up here by name.

Everything the renderers do turns a library result into text; nothing computes. `--json` output
does not pass through here: `emit` prints the result's own `to_dict()`. Each concern has its module:
`_table` (tables that never cut a name), `_render_verify`, `_render_ops`, `_render_train` and
`_render_release` (release, cards and golden vectors). A renderer's module loads on first use (a verify
report never imports the training renderers).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

#: renderer -> the module (under `dspark_hub.cli`) that defines it, imported on first use.
RENDERERS: dict[str, str] = {
    "Column": "_table",
    "plan_lines": "_render_train",
    "print_table": "_table",
    "render_card_lint": "_render_release",
    "render_checksum_check": "_render_release",
    "render_checksums": "_render_release",
    "render_compare": "_render_train",
    "render_convert": "_render_ops",
    "render_diff": "_render_ops",
    "render_eval": "_render_train",
    "render_export": "_render_release",
    "render_golden_check": "_render_release",
    "render_golden_write": "_render_release",
    "render_init": "_render_ops",
    "render_init_target": "_render_ops",
    "render_init_teacher": "_render_train",
    "render_package": "_render_release",
    "render_plan": "_render_train",
    "render_probe": "_render_train",
    "render_publication": "_render_release",
    "render_rollouts": "_render_train",
    "render_threads": "_render_train",
    "render_training": "_render_train",
    "render_verify": "_render_verify",
    "render_written_card": "_render_release",
}
__all__ = sorted(RENDERERS)


def __getattr__(name: str) -> Any:
    if name not in RENDERERS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"dspark_hub.cli.{RENDERERS[name]}"), name)

if TYPE_CHECKING:
    pass
