"""Click plumbing shared by every command: the command and group classes, and the shared options.

Every command is a `DsparkCommand` (groups hand the class down through `command_class`), so
every command runs inside the one error boundary of `_errors.py`, for its own arguments too.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import click

from dspark_hub.cli._errors import boundary

#: Counts and sizes that must be at least 1.
POSITIVE = click.IntRange(min=1)


def first_sentence(command: click.Command) -> str:
    """The command's summary for a command list: its first sentence, whole (click cuts it at 45 characters)."""
    text = command.short_help or (inspect.cleandoc(command.help).split("\n\n")[0] if command.help else "")
    text = " ".join(text.split())
    end = text.find(". ")
    return text if end < 0 else text[:end + 1]


class DsparkCommand(click.Command):
    """A command whose parsing and body run inside the error boundary."""

    def get_short_help_str(self, limit: int = 45) -> str:
        return first_sentence(self)

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        with boundary(ctx, as_json="--json" in args):
            return super().parse_args(ctx, args)

    def invoke(self, ctx: click.Context) -> Any:
        with boundary(ctx, as_json=bool(ctx.params.get("as_json"))):
            return super().invoke(ctx)


class DsparkGroup(click.Group):
    """A group whose commands are `DsparkCommand`s; its own parsing runs inside the boundary too."""

    command_class = DsparkCommand

    def get_short_help_str(self, limit: int = 45) -> str:
        return first_sentence(self)

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        with boundary(ctx, as_json="--json" in args):
            return super().parse_args(ctx, args)

    def resolve_command(self, ctx: click.Context,
                        args: list[str]) -> tuple[str | None, click.Command | None, list[str]]:
        with boundary(ctx, as_json="--json" in args):
            return super().resolve_command(ctx, args)


class DefaultCommandGroup(DsparkGroup):
    """A group whose first argument, when it is not a subcommand, goes to `default_command`.

    So `dspark-hub card CKPT --meta M -o README.md` means `dspark-hub card render CKPT ...`
    while `dspark-hub card lint README.md` reaches `lint`; likewise `golden CKPT -o F` and
    `golden check` (a checkpoint folder literally named like a subcommand needs the explicit form).
    """

    def __init__(self, *args: Any, default_command: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.default_command = default_command

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in ctx.help_option_names:
            args = [self.default_command, *args]
        return super().parse_args(ctx, args)


def command(name: str | None = None, **kwargs: Any) -> Callable[[Callable[..., Any]], DsparkCommand]:
    """`click.command` with `DsparkCommand` (commands are defined here and added to the group in `main`)."""
    return click.command(name, cls=DsparkCommand, **kwargs)


def json_option(f: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("--json", "as_json", is_flag=True, help="Print one JSON document (stable schema).")(f)


def force_option(f: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("--force", is_flag=True, help="Replace an existing output.")(f)


def endpoint_option(f: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("--endpoint", envvar="HF_ENDPOINT", metavar="URL",
                        help="The Hub endpoint (default: $HF_ENDPOINT, else the public Hub).")(f)


def quiet_option(f: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("-q", "--quiet", is_flag=True, help="No progress output.")(f)
