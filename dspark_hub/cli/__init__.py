"""The `dspark-hub` command line: one module per command group, one error boundary, one `emit()`.

Nothing imports `cli`; it imports every area. `main` is the console-script entry point.
"""

from __future__ import annotations

from dspark_hub.cli.main import cli, main

__all__ = ["cli", "main"]
