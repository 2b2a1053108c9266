"""rich, on first use: the consoles every human view is drawn on, `TerminalText`, and the progress bar.

`_output` holds the gate (`terminal_text`: tokens redacted, control characters written out) and loads this
module only when something is drawn for a person, so `--help` and `--json` never import rich.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any, cast

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)
from rich.segment import Segment
from rich.text import Text

from dspark_hub.cli._gate import CONTROL, escape, terminal_text
from dspark_hub.redaction import redact_tokens


class TerminalText(Text):
    """rich's `Text` with its strings written out first: rich itself keeps `\x1b` and drops `\r` or `\b` unseen.

    Renderers build every `Text` with this class, so a name is measured as it will be shown.
    """

    def __init__(self, text: str = "", *args: Any, **kwargs: Any) -> None:
        super().__init__(terminal_text(text), *args, **kwargs)

    def append(self, text: str | Text, style: Any = None) -> Text:
        return super().append(terminal_text(text) if isinstance(text, str) else text, style)

    @classmethod
    def assemble(cls, *parts: Any, **kwargs: Any) -> TerminalText:
        return cast(TerminalText, super().assemble(*parts, **kwargs))


class TerminalConsole(Console):
    """A rich console whose every line goes through `terminal_text`.

    Strings are escaped before rich measures (and would silently drop `\r` or `\b` from) them; the
    rendered segments are escaped again, for `Text` a renderer built itself, and the result is redacted.
    Control segments (rich's own cursor moves for a progress bar) pass as they are.
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        # rich fixes COLUMNS and LINES when a console is made; these are made once a process, and a process
        # (CliRunner in the tests, a library caller) may draw for several widths in turn: read them at each use.
        self._width = self._height = None

    def render_str(self, text: str, **kwargs: Any) -> Text:
        return super().render_str(terminal_text(text), **kwargs)

    def _render_buffer(self, buffer: Iterable[Segment]) -> str:
        safe = (segment if segment.control else Segment(CONTROL.sub(escape, segment.text), segment.style)
                for segment in buffer)
        return redact_tokens(super()._render_buffer(safe))


# Markup and emoji are off: tensor names, keys and paths come from checkpoints and are printed as they
# are ('bad[/x]name' must not crash, ':smile:' must not become a picture). Styles use `Text`.
# soft_wrap keeps commands, URLs and paths on one line for copy and paste.
stdout = TerminalConsole(highlight=False, soft_wrap=True, markup=False, emoji=False)
stderr = TerminalConsole(stderr=True, highlight=False, soft_wrap=True, markup=False, emoji=False)


class _RichBar:
    def __init__(self, progress: Any, task: Any) -> None:
        self._progress, self._task = progress, task

    def __call__(self, n: int) -> None:
        self._progress.advance(self._task, n)

    def set_total(self, total: int) -> None:
        self._progress.update(self._task, total=total)

    def stage(self, description: str, done: int, total: int) -> None:
        self._progress.update(self._task, description=description, completed=done, total=total)


@contextmanager
def rich_bar(description: str, *, unit: str, total: int | None) -> Iterator[_RichBar]:
    """A rich bar on stderr: bytes with their rate, anything else as `done/total`."""
    columns = ((DownloadColumn(), TransferSpeedColumn()) if unit == "bytes" else (MofNCompleteColumn(),))
    with Progress(TextColumn("{task.description}"), BarColumn(), *columns, TimeRemainingColumn(),
                  console=stderr) as bar:
        yield _RichBar(bar, bar.add_task(description, total=total))
