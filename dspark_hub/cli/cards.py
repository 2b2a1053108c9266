"""Model-card commands: `card` (render, the default) and `card lint`."""

from __future__ import annotations

from pathlib import Path

import click

from dspark_hub.cli._framework import DefaultCommandGroup, force_option, json_option, quiet_option
from dspark_hub.cli._output import emit, progress


@click.group(cls=DefaultCommandGroup, default_command="render")
def card() -> None:
    """Render a model card from computed facts (default), or lint one: 'card lint README.md'."""


@card.command("render")
@click.argument("ckpt", required=False, type=click.Path(path_type=Path))
@click.option("--meta", required=True, type=click.Path(path_type=Path), help="Card source: cards/<name>/card.yaml.")
@click.option("--eval", "eval_json", type=click.Path(path_type=Path),
              help="Evaluation JSON ('dspark-hub eval --json').")
@click.option("--train-log", type=click.Path(path_type=Path), help="Training log (JSON lines).")
@click.option("--probe", "probe_json", type=click.Path(path_type=Path), metavar="PROBE.json",
              help="Record the conventions checked by behaviour ('dspark-hub probe --json'), with its numbers.")
@click.option("--checksums-from", type=click.Path(path_type=Path),
              help="Manifest of known SHA-256 digests (JSON or sha256sum output), used instead of hashing.")
@click.option("--no-hash", is_flag=True,
              help="Do not hash files the manifest does not cover (their digest shows as —).")
@click.option("-o", "--output", required=True, type=click.Path(path_type=Path), help="Where to write the card.")
@force_option
@quiet_option
@json_option
def card_render(ckpt: Path | None, meta: Path, eval_json: Path | None, train_log: Path | None,
                probe_json: Path | None, checksums_from: Path | None, no_hash: bool, output: Path, force: bool,
                quiet: bool, as_json: bool) -> None:
    """Render a model card for CKPT (omit CKPT when the weights are not at hand) to OUTPUT."""
    from dspark_hub.cards.render import write_card  # loads when the command runs (--help stays light)

    with progress("hashing", quiet=quiet or as_json) as bar:
        result = write_card(meta, ckpt, output, eval_json=eval_json, train_log=train_log,
                            checksums_from=checksums_from, hash_files=not no_hash, force=force, progress=bar,
                            probe_json=probe_json)
    emit(result, as_json=as_json, renderer="render_written_card")


@card.command("lint")
@click.argument("readme", type=click.Path(path_type=Path))
@click.option("--checkpoint", type=click.Path(path_type=Path), help="Also check the card's weight facts against it.")
@click.option("--eval", "eval_json", type=click.Path(path_type=Path), metavar="EVAL.json",
              help="Also check the acceptance labels against this eval file ('eval --json').")
@json_option
def card_lint(readme: Path, checkpoint: Path | None, eval_json: Path | None, as_json: bool) -> None:
    """Check a model card: front matter, acceptance arithmetic and labels, duplicate rows, and weight facts."""
    from dspark_hub.cards.lint import lint_card  # loads when the command runs (--help stays light)

    emit(lint_card(readme, checkpoint, eval_json=eval_json), as_json=as_json, renderer="render_card_lint")
