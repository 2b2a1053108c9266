"""Human views of library results: one renderer per result type, on stdout. The commands import them from here.

Everything the renderers do turns a library result into text; nothing computes. `--json` output
does not pass through here: `emit` prints the result's own `to_dict()`. Each concern has its module:
`_table` (tables that never cut a name), `_render_verify`, `_render_ops`, `_render_train` and
`_render_release` (release, cards and golden vectors).
"""

from __future__ import annotations

from dspark_hub.cli._render_ops import render_convert, render_diff, render_init
from dspark_hub.cli._render_release import (
    render_card_lint,
    render_checksum_check,
    render_checksums,
    render_export,
    render_golden_check,
    render_golden_write,
    render_package,
    render_publication,
    render_written_card,
)
from dspark_hub.cli._render_train import (
    plan_lines,
    render_eval,
    render_init_teacher,
    render_plan,
    render_rollouts,
    render_training,
)
from dspark_hub.cli._render_verify import render_verify
from dspark_hub.cli._table import Column, print_table

__all__ = [
    "Column", "plan_lines", "print_table", "render_card_lint", "render_checksum_check",
    "render_checksums", "render_convert", "render_diff", "render_eval", "render_export",
    "render_golden_check", "render_golden_write", "render_init", "render_init_teacher", "render_package",
    "render_plan", "render_publication", "render_rollouts", "render_training", "render_verify",
    "render_written_card",
]
