"""The CLI's error contract for tests: exit 2, one line on stderr naming the thing and the fix, no traceback."""

from __future__ import annotations

from typing import Any


def assert_one_line_error(result: Any, *words: str, one_line: bool = True) -> str:
    """Assert a CliRunner result failed as a usage/I-O error whose last stderr line holds every word.

    `one_line=False` allows click's own usage errors (a usage line, a blank line, then `Error: ...`).
    """
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    if one_line:
        assert len(lines) == 1, result.stderr
    assert all(w in lines[-1] for w in words), lines[-1]
    return lines[-1]
