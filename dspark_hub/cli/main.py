"""The `dspark-hub` group: global options, the command table, and `main()`.

Exit codes: 0 no error finding, 1 error findings, 2 usage or I/O error, 130 interrupted.
Data goes to stdout (one JSON document with --json); progress, warnings and errors to stderr.
Each command lives in the module of its group (`verify.py`, `ops.py`, `train.py`, `cards.py`, `hub.py`,
`golden.py`) and is imported only when it runs (`COMMANDS`, click's lazy-group recipe): `dspark-hub --help`
lists the table's short help and imports no command module, and `checksums` imports no train or verify
module. Errors are turned into one line in `_errors.py`, output goes out through `_output.emit`.
"""

from __future__ import annotations

import importlib
import signal
import sys
import warnings
from collections.abc import Iterator, MutableMapping
from typing import Any

import click

from dspark_hub import __version__
from dspark_hub.cli._errors import on_sigint, on_sigterm, print_traceback
from dspark_hub.cli._framework import DsparkGroup
from dspark_hub.cli._output import show_warning

#: command name -> (module under `dspark_hub.cli`, the command's function, its short help). The short help is the
#: first sentence of the command's docstring (`_framework.first_sentence`; tests/test_cli_lazy.py compares them).
COMMANDS: dict[str, tuple[str, str, str]] = {
    "card": ("cards", "card", "Render a model card from computed facts (default), or lint one: 'card lint README.md'."),
    "checksums": ("hub", "checksums", "Write SHA256SUMS and checksums.json for FOLDER (or --check it against them)."),
    "compare": ("train", "compare_command", "Compare two eval measurements of the same prompts: B - A in acceptance "
                "length, paired over prompts, with a 95% interval."),
    "convert": ("ops", "convert", "Rewrite a near-miss export in SRC as a contract checkpoint in DST, reporting every "
                "change."),
    "diff": ("ops", "diff", "Compare checkpoint folders A and B: config keys, roster, and every common tensor's "
             "bytes."),
    "eval": ("train", "eval_command", "Acceptance of a draft with vLLM's definitions: simulated, or measured by vLLM "
             "serving it."),
    "export-code": ("hub", "export_code", "Copy the modeling files and an auto_map into FOLDER for trust_remote_code "
                    "loading."),
    "finetune": ("train", "finetune_command", "Fine-tune drop-in weights (k3_dspark or speculators DSpark) on target "
                 "rollouts (one process or torchrun)."),
    "golden": ("golden", "golden", "Golden vectors: `golden CKPT -o FILE` (= `golden write`) writes a fixture of the "
               "reference forward; `golden check` recomputes it."),
    "init": ("ops", "init_command", "Write a conforming k3_dspark checkpoint (config.json + model.safetensors) to DST, "
             "or with --target an untrained draft of either format sized for a transformers causal LM."),
    "init-teacher": ("train", "init_teacher", "Write a tiny random transformers target with an offline tokenizer (for "
                     "toy training runs)."),
    "package": ("hub", "package", "Write SHA256SUMS, checksums.json, .gitattributes, a .torrent with Hub web seeds "
                "and its magnet link."),
    "probe": ("train", "probe_command", "Name the conventions a draft's weights follow (taps, slot layout, d2t and "
              "the rest) from their behaviour on the target's greedy paths."),
    "publish": ("hub", "publish", "Gate (verify + card lint), upload CKPT to ORG/NAME, then compare the Hub's files "
                "with the local ones."),
    "rollouts": ("train", "rollouts", "Write the target's greedy continuations with the draft's tap states "
                 "(resumable safetensors shards)."),
    "verify": ("verify", "verify", "Check a checkpoint folder (or hf://ORG/NAME[@REV]) against its config, the "
               "runtime rules and the contract."),
}


def load_command(name: str) -> click.Command:
    """The command `name` of `COMMANDS`, its module imported now."""
    module, function, _ = COMMANDS[name]
    command: click.Command = getattr(importlib.import_module(f"dspark_hub.cli.{module}"), function)
    return command


class LazyCommands(MutableMapping[str, click.Command]):
    """`COMMANDS` as click's `Group.commands`: a command's module is imported when the command is looked up."""

    def __init__(self) -> None:
        self.loaded: dict[str, click.Command] = {}

    def __getitem__(self, name: str) -> click.Command:
        if name not in self.loaded:
            if name not in COMMANDS:
                raise KeyError(name)
            self.loaded[name] = load_command(name)
        return self.loaded[name]

    def __setitem__(self, name: str, command: click.Command) -> None:
        raise TypeError(f"{name}: add a command to COMMANDS, not to the group")

    def __delitem__(self, name: str) -> None:
        raise TypeError(f"{name}: the command table is COMMANDS")

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(COMMANDS))

    def __len__(self) -> int:
        return len(COMMANDS)


class LazyGroup(DsparkGroup):
    """A group whose commands are imported when they run; `--help` lists them from `COMMANDS`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.commands = LazyCommands()

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        return load_command(cmd_name) if cmd_name in COMMANDS else None

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, COMMANDS[name][2]) for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


def _print_version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if not value or ctx.resilient_parsing:
        return
    click.echo(f"dspark-hub, version {__version__}")
    ctx.exit()


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-V", "--version", is_flag=True, expose_value=False, is_eager=True, callback=_print_version,
              help="Show the version and exit.")
@click.option("--debug", is_flag=True, help="Show full tracebacks (or set DSPARK_DEBUG=1).")
def cli(debug: bool) -> None:
    """Verify, train, card and publish k3_dspark speculative-decoding drafts."""


def main() -> None:
    """Console-script entry point: SIGTERM unwinds like Ctrl-C so writers clean up (a Hub command ends within a
    second either way: `exit_soon_if_stuck`); a traceback (`--debug`, or a bug) is printed through the output gate
    (no token), exit 1 as Python's own would."""
    signal.signal(signal.SIGTERM, on_sigterm)
    signal.signal(signal.SIGINT, on_sigint)
    warnings.showwarning = show_warning
    try:
        cli(prog_name="dspark-hub")
    except Exception as error:
        print_traceback(error)
        sys.exit(1)
