"""Where output goes: the result of a command on stdout (`emit`), progress on stderr.

Data goes to stdout: one JSON document with `--json`, else the human view a renderer draws.
Progress, warnings and errors go to stderr. On a terminal progress is a rich bar; off a terminal
(nohup, CI, a log file) it is a plain line every `INTERVAL` seconds and one at the end, so a log
shows that a long run is alive and when it will end (and transformers' own bars stay off, see
`quiet_transformers`). `--quiet` and `--json` silence both.

rich loads on first use (`_terminal`: the consoles, `TerminalText`, the bar): `--help`, `--json` and a
log's plain lines never import it. Everything printed passes one gate here: no token huggingface_hub would
send (`redaction.redact_tokens`) and,
for people, no control character: a tensor name, config value, metadata or file name holding
`\x1b]0;...\x07`, `\x1b[2J`, `\r` or `\x9b` is shown as that text (`terminal_text`), so a
checkpoint cannot retitle the terminal, clear the screen or overwrite its own findings. `--json`
keeps JSON's own escaping (`json.dumps` writes `\u001b`).
"""

from __future__ import annotations

import json
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Protocol

import click

from dspark_hub.cli._gate import terminal_text
from dspark_hub.redaction import redact_tokens


def stderr_is_terminal() -> bool:
    """Whether stderr is a terminal, as rich's console decides it (`FORCE_COLOR`, `TTY_COMPATIBLE`, ...)."""
    return bool(console("stderr").is_terminal)


def console(name: str) -> Any:
    """The rich console `stdout` or `stderr` (`_terminal.TerminalConsole`), made on first use."""
    from dspark_hub.cli import _terminal  # rich: loaded by the first command that draws or asks

    return getattr(_terminal, name)


def __getattr__(name: str) -> Any:
    """`stdout`, `stderr`, `TerminalText`: the rich-backed names of `_terminal`, loaded on first use."""
    if name in ("stdout", "stderr", "TerminalText", "TerminalConsole"):
        from dspark_hub.cli import _terminal  # rich: on first use

        return getattr(_terminal, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


#: Seconds between two progress lines off a terminal.
INTERVAL = 10.0
#: The clock of those lines (tests replace it).
CLOCK: Callable[[], float] = time.monotonic

class Result(Protocol):
    """What a library call returns to a command: its `--json` document, and `ok` where it has findings."""

    def to_dict(self) -> Mapping[str, object]: ...     # a TypedDict, or a dict[str, Any]


def json_text(data: Any) -> str:
    """One JSON document as `--json` prints it: JSON's own escaping, every token redacted."""
    return redact_tokens(json.dumps(data, indent=2))


def print_json(data: Any) -> None:
    click.echo(json_text(data))


def echo_line(line: str, *, err: bool = False) -> None:
    """A plain line (progress in a log) through the same gate as the consoles."""
    click.echo(terminal_text(line), err=err)


def show_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int, file: Any = None,
                 line: str | None = None) -> None:
    """Python's warnings through the same gate (`warnings.showwarning`): huggingface_hub warns with text a
    server sent (the warnings of its metadata validation)."""
    echo_line(warnings.formatwarning(message, category, filename, lineno, line).rstrip("\n"), err=True)


def emit(result: Result, *, as_json: bool, renderer: str) -> None:
    """Print a command's result, the one way every command does, and exit 1 when `result.ok` is False.

    `--json` prints `result.to_dict()`; otherwise the function `renderer` of `_render` draws the human view
    (`_render` and rich load here, on first use: a `--json` run never imports them). A result without `ok`
    (nothing to find) exits 0.
    """
    if as_json:
        print_json(result.to_dict())
    else:
        from dspark_hub.cli import _render  # rich: only a human view pays for it

        getattr(_render, renderer)(result)
    if not getattr(result, "ok", True):
        click.get_current_context().exit(1)


def quiet_transformers(quiet: bool) -> None:
    """transformers' own bars (`Loading weights`, `Writing model shards`) only on a terminal: off one (a log,
    CI) they would fill the log with carriage returns, and our plain progress lines say how far a run is.
    With --quiet or --json its advisories go too (they go to stderr otherwise)."""
    if quiet or not stderr_is_terminal():
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        if quiet:
            hf_logging.set_verbosity_error()


# ----------------------------------------------------------------------------- progress

class Bar(Protocol):
    """What `progress` yields: a `Progress` callback (amount done since the last call) with a total."""

    def __call__(self, n: int) -> None: ...

    def set_total(self, total: int) -> None: ...

    def stage(self, description: str, done: int, total: int) -> None:
        """Absolute progress of a named stage (e.g. hashing, then torrent pieces)."""


class _Silent:
    def __call__(self, n: int) -> None:
        pass

    def set_total(self, total: int) -> None:
        pass

    def stage(self, description: str, done: int, total: int) -> None:
        pass


def size_text(n: float, *, binary: bool = False) -> str:
    """`1.2 GB` (decimal: files, rates) or, `binary`, `8.1 GiB` (memory); `96 bytes` either way."""
    step, units = (1024, ("bytes", "KiB", "MiB", "GiB", "TiB")) if binary else (1000, ("bytes", "kB", "MB", "GB", "TB"))
    for unit in units:
        if n < step or unit == units[-1]:
            return f"{n:,.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= step
    raise AssertionError("unreachable")


def _duration(seconds: float) -> str:
    s = round(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


class LogProgress:
    """Progress as plain lines for a log: at most one per `interval` seconds, and a last one at the end.

    `sha256: 1.2 GB of 7.1 GB (17%), 150.0 MB/s, ETA 39s, elapsed 7s`. `unit` is `bytes` or the
    plural of what is counted: `finetune: 120 of 2,000 steps (6%), 2.10 steps/s, ETA 14m55s, elapsed 57s`.
    A run shorter than one interval prints nothing.
    """

    def __init__(self, description: str, *, unit: str = "bytes", total: int | None = None,
                 write: Callable[[str], None], clock: Callable[[], float] | None = None,
                 interval: float | None = None) -> None:
        self.description, self.unit, self.total, self.write = description, unit, total, write
        self.clock = clock or CLOCK
        self.interval = INTERVAL if interval is None else interval
        self.start = self.last = self.clock()
        self.done = 0
        self.printed = False
        self.finished: int | None = None     # `done` when the `done` line was printed
        self._lock = threading.Lock()   # hashing and diff report from worker threads

    def __call__(self, n: int) -> None:
        with self._lock:
            self.done += n
            self._tick(complete=bool(self.total) and self.done >= (self.total or 0))

    def set_total(self, total: int) -> None:
        self.total = total

    def stage(self, description: str, done: int, total: int) -> None:
        with self._lock:
            self.description, self.done, self.total = description, done, total
            self._tick()

    def _amount(self, n: float) -> str:
        return size_text(n) if self.unit == "bytes" else f"{n:,.0f}"

    def _rate(self, elapsed: float) -> str:
        rate = self.done / elapsed if elapsed > 0 else 0.0
        return f"{size_text(rate)}/s" if self.unit == "bytes" else f"{rate:,.2f} {self.unit}/s"

    def line(self, now: float) -> str:
        """The progress line at time `now`."""
        elapsed = now - self.start
        parts = [f"{self.description}: {self._amount(self.done)}"]
        if self.total:
            parts[0] += f" of {self._amount(self.total)}" + ("" if self.unit == "bytes" else f" {self.unit}")
            parts[0] += f" ({100 * self.done / self.total:.0f}%)"
        elif self.unit != "bytes":
            parts[0] += f" {self.unit}"
        parts.append(self._rate(elapsed))
        if self.total and self.done and self.done < self.total:
            parts.append(f"ETA {_duration(elapsed * (self.total - self.done) / self.done)}")
        parts.append(f"elapsed {_duration(elapsed)}")
        return ", ".join(parts)

    def _tick(self, *, complete: bool = False) -> None:
        """A line when the interval has passed; the count reaching its total prints the `done` line at once
        (so `finish` does not repeat it)."""
        now = self.clock()
        if complete and (self.printed or now - self.start >= self.interval):
            self.last, self.printed, self.finished = now, True, self.done
            self.write(self.line(now) + ", done")
        elif now - self.last >= self.interval:
            self.last = now
            self.printed = True
            self.write(self.line(now))

    def finish(self) -> None:
        """The last line, `... done`, when the run was long enough to print any and it is not printed yet."""
        if self.printed and self.finished != self.done:
            self.write(self.line(self.clock()) + ", done")


@contextmanager
def progress(description: str, *, unit: str = "bytes", total: int | None = None,
             quiet: bool = False) -> Iterator[Bar]:
    """Progress of one long call on stderr: a rich bar on a terminal, `LogProgress` lines elsewhere.

    Yields a callback to pass to the library as `progress=`. `quiet` (`--quiet`, `--json`) shows nothing.
    """
    if quiet:
        yield _Silent()
        return
    if not stderr_is_terminal():
        log = LogProgress(description, unit=unit, total=total, write=lambda line: echo_line(line, err=True))
        yield log
        log.finish()
        return
    from dspark_hub.cli._terminal import rich_bar  # rich: only a bar on a terminal pays for it

    with rich_bar(description, unit=unit, total=total) as bar:
        yield bar
