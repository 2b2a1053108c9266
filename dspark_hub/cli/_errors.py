"""The one error boundary: an error becomes one line on stderr, and one JSON document with `--json`.

Library errors carry data and never name a flag: `UsageError(message, param="target")` names the
argument by its Python name, a message names other arguments as `` `name` `` (backticks), and
`RefusedOverwriteError(path)` says only that the path exists. Here the current command's own
click parameters turn those names into flags (`--target`, `--force`), so a flag is typed once, in
its `click.option`. One formatter per error type; `format_error` picks the first that matches.

Exit codes: 2 for usage and I/O errors (a `DsparkError` carries its own `exit_code`), 130 on
interrupt (143 on SIGTERM). A Ctrl-C while the Hub is being talked to ends the process within
`INTERRUPT_GRACE` seconds even where huggingface_hub's upload threads wait on a silent socket
(`exit_soon_if_stuck`). With `--json` the error also goes to stdout as
`{"schema": "dspark-hub/error/1", "ok": false, "error": {"code", "message", "hint"}}`.
Unknown exceptions are bugs and keep their traceback; `--debug` or `DSPARK_DEBUG=1` shows the
traceback of known ones too. Every line leaves through `_output`'s gate (no token, no control
character for a terminal): the `Error:` line, the JSON document, and `print_traceback`, which
`main()` uses for any traceback.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import threading
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, ClassVar

import click

from dspark_hub import schemas
from dspark_hub.cli._gate import terminal_text
from dspark_hub.cli._output import json_text
from dspark_hub.documents import Document
from dspark_hub.errors import DsparkError, RefusedOverwriteError
from dspark_hub.format.hub_http import scope_open

#: `` `name` `` in a library message: an argument named by its Python name.
_ARGUMENT = re.compile(r"`([A-Za-z_][A-Za-z0-9_]*)`")


@dataclass(frozen=True)
class ErrorReport(Document):
    """An error as the CLI shows it: a stable `code`, the message and the hint in CLI terms."""

    SCHEMA = schemas.command("error")
    KEYS = ("ok", "error=fields")

    code: str
    message: str
    hint: str | None = None
    exit_code: int = 2

    #: An error's document is never ok.
    ok: ClassVar[bool] = False

    def line(self) -> str:
        """The one stderr line (after click's `Error: `): `<message>; <hint>`."""
        return self.message + (f"; {self.hint}" if self.hint else "")

    @property
    def fields(self) -> dict[str, str | None]:
        return {"code": self.code, "message": self.message, "hint": self.hint}


def _current_command() -> click.Command | None:
    ctx = click.get_current_context(silent=True)
    return ctx.command if ctx is not None else None


def flag(command: click.Command | None, name: str) -> str | None:
    """How `command` spells its parameter `name` (Python name): `--drop-in`, or `PATH` for an argument."""
    for param in command.params if command is not None else ():
        if param.name == name:
            if isinstance(param, click.Option):
                return max(param.opts, key=len)
            return param.human_readable_name
    return None


def in_cli_terms(text: str, command: click.Command | None = None) -> str:
    """Replace every `` `name` `` that is a parameter of `command` (default: the running one) with its flag."""
    command = command if command is not None else _current_command()
    return _ARGUMENT.sub(lambda m: flag(command, m[1]) or m[0], text)


def format_dspark_error(error: DsparkError, command: click.Command | None) -> ErrorReport:
    """Any library error: its `param` becomes the flag that prefixes the message."""
    message = in_cli_terms(error.message, command)
    if error.param is not None:
        message = f"{flag(command, error.param) or error.param}: {message}"
    hint = in_cli_terms(error.hint, command) if error.hint else None
    return ErrorReport(error.error_code, message, hint, error.exit_code)


def format_refused_overwrite(error: RefusedOverwriteError, command: click.Command | None) -> ErrorReport:
    """`out/: already exists; pass --force to replace it` (the hint only where the command has `force`)."""
    force = flag(command, "force")
    report = format_dspark_error(error, command)
    hint = f"pass {force} to replace it" if force else report.hint
    return ErrorReport(report.code, report.message, hint, report.exit_code)


def format_os_error(error: OSError, command: click.Command | None) -> ErrorReport:
    """`<file>: <strerror>` for an I/O error the library did not wrap."""
    where = error.filename if error.filename is not None else "I/O"
    return ErrorReport("IO", f"{where}: {error.strerror or error}")


def format_click_error(error: click.ClickException, command: click.Command | None) -> ErrorReport:
    """Click's own usage errors (bad option value, missing argument): the JSON view only; click prints stderr."""
    ctx = getattr(error, "ctx", None)
    hint = f"try '{ctx.command_path} {ctx.help_option_names[0]}' for help" if ctx is not None else None
    return ErrorReport("USAGE", error.format_message(), hint, error.exit_code)


#: Exception type -> formatter, subclasses before their parents (the first match wins).
FORMATTERS: list[tuple[type[BaseException], Callable[[Any, click.Command | None], ErrorReport]]] = [
    (RefusedOverwriteError, format_refused_overwrite),
    (DsparkError, format_dspark_error),
    (OSError, format_os_error),
    (click.ClickException, format_click_error),
]


def format_error(error: BaseException, command: click.Command | None) -> ErrorReport:
    """The `ErrorReport` of a known error type.

    Raises:
        TypeError: no formatter handles this type (a bug: unknown errors keep their traceback).
    """
    for kind, formatter in FORMATTERS:
        if isinstance(error, kind):
            return formatter(error, command)
    raise TypeError(f"no formatter for {type(error).__name__}")


class CliError(click.ClickException):
    """What the boundary raises: click prints `Error: <line>` on stderr and exits with the code."""

    def __init__(self, report: ErrorReport) -> None:
        super().__init__(terminal_text(report.line()))
        # click declares exit_code a ClassVar; this error's code depends on the report.
        self.exit_code = report.exit_code   # type: ignore[misc]


def _debug(ctx: click.Context) -> bool:
    return bool(ctx.find_root().params.get("debug")) or os.environ.get("DSPARK_DEBUG", "") not in ("", "0")


def _print_json(report: ErrorReport) -> None:
    click.echo(json_text(report.to_dict()))


def print_traceback(error: BaseException) -> None:
    """A traceback (`--debug`, or a bug) on stderr, with every token redacted and control characters escaped."""
    click.echo(terminal_text("".join(traceback.format_exception(error))).rstrip("\n"), err=True)


@contextmanager
def boundary(ctx: click.Context, *, as_json: bool) -> Iterator[None]:
    """Run a command's parsing or body: known errors become `CliError` (and JSON on stdout with `--json`)."""
    try:
        yield
    except CliError:
        raise
    except click.ClickException as e:
        if as_json:
            _print_json(format_click_error(e, ctx.command))
        raise
    except (DsparkError, OSError) as e:
        if _debug(ctx):
            raise
        report = format_error(e, ctx.command)
        if as_json:
            _print_json(report)
        raise CliError(report) from None
    except KeyboardInterrupt:
        _say_interrupted()
        ctx.exit(130)


#: Seconds a Ctrl-C (or SIGTERM) leaves a Hub command to unwind before the process ends anyway.
INTERRUPT_GRACE = 1.0
_SAID = threading.Event()


def _say_interrupted() -> None:
    if not _SAID.is_set():
        _SAID.set()
        click.echo("interrupted", err=True)


def exit_soon_if_stuck(code: int) -> None:
    """While the Hub is being talked to, end the process with `code` in `INTERRUPT_GRACE` seconds if it has not
    ended by then: huggingface_hub's upload threads block on their sockets (up to `DSPARK_HUB_TIMEOUT`), and the
    interpreter waits for them at exit. Elsewhere, nothing: writers unwind as usual."""
    if not scope_open():
        return

    def end() -> None:
        if code == 130:
            _say_interrupted()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)

    timer = threading.Timer(INTERRUPT_GRACE, end)
    timer.daemon = True
    timer.start()


def on_sigterm(signum: int, frame: Any) -> None:
    """SIGTERM unwinds like Ctrl-C (writers clean up), exit 143, after `exit_soon_if_stuck(143)`."""
    exit_soon_if_stuck(143)
    sys.exit(143)


def on_sigint(signum: int, frame: Any) -> None:
    """SIGINT: Python's own KeyboardInterrupt, after `exit_soon_if_stuck(130)`."""
    exit_soon_if_stuck(130)
    signal.default_int_handler(signum, frame)
