"""The `dspark-hub` group: global options, every command group, and `main()`.

Exit codes: 0 no error finding, 1 error findings, 2 usage or I/O error, 130 interrupted.
Data goes to stdout (one JSON document with --json); progress, warnings and errors to stderr.
Each command lives in the module of its group (`verify.py`, `train.py`, `cards.py`, `hub.py`,
`golden.py`); errors are turned into one line in `_errors.py`, output goes out through `_output.emit`.
"""

from __future__ import annotations

import signal
import sys
import warnings

import click

from dspark_hub import __version__
from dspark_hub.cli import cards, golden, hub, train, verify
from dspark_hub.cli._errors import on_sigint, on_sigterm, print_traceback
from dspark_hub.cli._framework import DsparkGroup
from dspark_hub.cli._output import show_warning


@click.group(cls=DsparkGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "-V", "--version", prog_name="dspark-hub")
@click.option("--debug", is_flag=True, help="Show full tracebacks (or set DSPARK_DEBUG=1).")
def cli(debug: bool) -> None:
    """Verify, train, card and publish k3_dspark speculative-decoding drafts."""


for _command in (verify.verify, verify.diff, verify.convert, verify.init_command, train.init_teacher, train.rollouts,
                 train.finetune, train.eval_command, golden.golden, hub.export_code, hub.checksums, hub.package,
                 cards.card, hub.publish):
    cli.add_command(_command)


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
