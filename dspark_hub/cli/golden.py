"""Golden-vector commands: `golden write` (the default) and `golden check`."""

from __future__ import annotations

from pathlib import Path

import click

from dspark_hub.cli._framework import DefaultCommandGroup, force_option, json_option
from dspark_hub.cli._output import emit, quiet_transformers


@click.group(cls=DefaultCommandGroup, default_command="write")
def golden() -> None:
    """Golden vectors: `golden CKPT -o FILE` (= `golden write`) writes a fixture of the reference forward;
    `golden check` recomputes it.

    \b
    dspark-hub golden CKPT -o golden.safetensors [--lm-head FILE] [--seed N] [--block-size K]
    dspark-hub golden check CKPT golden.safetensors [--lm-head FILE] [--atol X --rtol Y]
    """


@golden.command("write")
@click.argument("ckpt", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("-o", "--output", "output", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="The golden .safetensors file to write.")
@click.option("--lm-head", "lm_head", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="A safetensors file with the target's lm_head weight (default: a seeded stand-in).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seeds the inputs and the stand-in lm_head.")
@click.option("--block-size", "block_size", type=click.IntRange(min=1), default=7, show_default=True)
@force_option
@json_option
def golden_write(ckpt: Path, output: Path, lm_head: Path | None, seed: int, block_size: int, force: bool,
                 as_json: bool) -> None:
    """Write the golden fixture of CKPT to OUTPUT (also: `golden CKPT -o OUTPUT`)."""
    from dspark_hub.verify.golden import write_golden  # loads when the command runs (--help stays light)

    quiet_transformers(as_json)
    result = write_golden(ckpt, output, lm_head=lm_head, seed=seed, block_size=block_size, force=force)
    emit(result, as_json=as_json, renderer="render_golden_write")


@golden.command("check")
@click.argument("ckpt", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.argument("fixture", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--lm-head", "lm_head", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="The lm_head file the fixture was written with (if any).")
@click.option("--atol", type=float, default=None, help="Override the stored absolute tolerance.")
@click.option("--rtol", type=float, default=None, help="Override the stored relative tolerance.")
@json_option
def golden_check(ckpt: Path, fixture: Path, lm_head: Path | None, atol: float | None, rtol: float | None,
                 as_json: bool) -> None:
    """Recompute FIXTURE on CKPT and compare within the stored tolerances (exit 0 when all match, else 1)."""
    from dspark_hub.verify.golden import check_golden  # loads when the command runs (--help stays light)

    quiet_transformers(as_json)
    result = check_golden(ckpt, fixture, lm_head=lm_head, atol=atol, rtol=rtol)
    emit(result, as_json=as_json, renderer="render_golden_check")
