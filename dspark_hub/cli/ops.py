"""Checkpoint operations: `init`, `convert`, `diff` (the `ops` area's commands)."""

from __future__ import annotations

from pathlib import Path

import click
from click.core import ParameterSource

from dspark_hub.cli._framework import command, force_option, json_option, quiet_option
from dspark_hub.cli._output import emit, progress
from dspark_hub.errors import UsageError
from dspark_hub.format import contract
from dspark_hub.format.registry import FORMATS
from dspark_hub.format.writer import refuse_own_inputs
from dspark_hub.ops.init import INIT_KINDS, init_checkpoint
from dspark_hub.ops.target_draft import init_for_target
from dspark_hub.train.data.rollouts import token_counts


@command()
@click.argument("a", type=click.Path(path_type=Path))
@click.argument("b", type=click.Path(path_type=Path))
@quiet_option
@json_option
def diff(a: Path, b: Path, quiet: bool, as_json: bool) -> None:
    """Compare checkpoint folders A and B: config keys, roster, and every common tensor's bytes.

    Per tensor: identical bytes, or the relative L2 change ||b-a||/||a||. Exit code 0 whether or not
    they differ (read "identical" / "weights_only" in the output); 1 when a side could not be read
    whole (its problems are listed); 2 on usage or I/O error.
    """
    from dspark_hub.ops.diff import diff as diff_checkpoints  # loads when the command runs (--help stays light)

    with progress("diff", quiet=quiet or as_json) as bar:
        result = diff_checkpoints(a, b, progress=bar)
    emit(result, as_json=as_json, renderer="render_diff")


def format_choices() -> list[str]:
    """`--to`/`--from` choices, derived from the draft formats registry (never typed twice)."""
    return [f.cli_name for f in FORMATS.values()]


@command()
@click.argument("src", type=click.Path(path_type=Path))
@click.argument("dst", type=click.Path(path_type=Path))
@click.option("--to", "to", type=click.Choice(format_choices()), default=None,
              help="Draft format to write (default k3_dspark); written only where the mapping is lossless.")
@click.option("--from", "from_", type=click.Choice(format_choices()), default=None,
              help="Draft format SRC must be in (default: whatever it is).")
@force_option
@quiet_option
@json_option
def convert(src: Path, dst: Path, to: str | None, from_: str | None, force: bool, quiet: bool,
            as_json: bool) -> None:
    """Rewrite a near-miss export in SRC as a contract checkpoint in DST, reporting every change.

    Renames trainer names, strips model./module. prefixes, drops lm_head, casts F32/F16 to BF16,
    merges shards, repairs the config. SRC is never modified. Exit codes: 0 written and DST passes
    verify, 1 written but DST still has verify errors (so 'convert && publish' stops), 2 usage or I/O error.
    """
    from dspark_hub.ops.convert import convert as convert_checkpoint  # loads when the command runs (--help stays light)

    with progress("convert", quiet=quiet or as_json) as bar:
        result = convert_checkpoint(src, dst, force=force, to=to, from_=from_, progress=bar)
    emit(result, as_json=as_json, renderer="render_convert")


@command("init")
@click.argument("dst", type=click.Path(path_type=Path))
@click.option("--profile", type=click.Choice(sorted(contract.PROFILES)), default="tiny", show_default=True,
              help="kimi-k3 writes the full reference shape (7.12 GB). Not with --target.")
@click.option("--init", "init", type=click.Choice(INIT_KINDS), default="random", show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--embed-from", "embed_from", metavar="TEACHER",
              help="Copy embed_tokens.weight from the TARGET's embedding (folder, sharded or not, or a "
                   ".safetensors file), bit for bit; F32/F16 is rounded to nearest even BF16. Without it the "
                   "frozen embedding is random and 'verify --target' fails until it is copied. Not with --target "
                   "(which copies T's).")
@click.option("--target", metavar="T", help="Size the draft for this transformers causal LM (its config and "
              "embedding only): hidden size, vocabulary, embedding, taps and mask token from T (instead of --profile).")
@click.option("--format", "fmt", type=click.Choice(format_choices()), default="k3_dspark",
              show_default=True, help="With --target: the draft format.")
@click.option("--taps", metavar="IDS", help="With --target: T's layers to tap, e.g. 1,7,14 (default: spread as "
              "the K3 recipes place them).")
@click.option("--layers", type=click.IntRange(min=1), default=2, show_default=True, help="With --target: draft layers.")
@click.option("--block-size", "block_size", type=click.IntRange(min=1), default=8, show_default=True,
              help="With --target: tokens drafted per step (speculators config; recorded for k3_dspark).")
@click.option("--draft-vocab", "draft_vocab", type=click.IntRange(min=1), metavar="N",
              help="With --target --format speculators: keep the N most frequent target ids of --vocab-from.")
@click.option("--vocab-from", "vocab_from", metavar="DATA",
              help="With --target: token frequencies, a rollouts folder or a prompts JSONL tokenized by T.")
@click.option("--mla-widths-from", "mla_widths_from", type=click.Choice(sorted(contract.PROFILES)),
              metavar="PROFILE", help="With --target --format k3_dspark: take this profile's MLA widths "
              "(kv_lora_rank, qk_nope/qk_rope/v_head_dim; kimi-k3: 512, 128/64/128, what vLLM's GPU MLA backends "
              "take) instead of scaling them from T's head size.")
@force_option
@quiet_option
@json_option
def init_command(dst: Path, profile: str, init: str, seed: int, embed_from: str | None, target: str | None,
                 fmt: str, taps: str | None, layers: int, block_size: int, draft_vocab: int | None,
                 vocab_from: str | None, mla_widths_from: str | None, force: bool, quiet: bool,
                 as_json: bool) -> None:
    """Write a conforming k3_dspark checkpoint (config.json + model.safetensors) to DST, or with --target an
    untrained draft of either format sized for a transformers causal LM."""
    _refuse_ignored_options(target)
    if target is not None:
        _init_for_target(dst, target, fmt=fmt, taps=taps, layers=layers, block_size=block_size,
                         draft_vocab=draft_vocab, vocab_from=vocab_from, init=init, seed=seed,
                         mla_widths_from=mla_widths_from, force=force, quiet=quiet, as_json=as_json)
        return
    with progress(f"init {profile}", quiet=quiet or as_json) as bar:
        result = init_checkpoint(dst, profile=profile, init=init, seed=seed, force=force, embed_from=embed_from,
                                 progress=bar)
    emit(result, as_json=as_json, renderer="render_init")


#: init's options that only a profile-sized draft reads, and those that only a draft sized for --target reads.
_PROFILE_OPTIONS = {"profile": "`target` sizes the draft from T's config; for a profile's MLA widths use "
                               "`mla_widths_from`",
                    "embed_from": "`target` copies T's own embedding"}
_TARGET_OPTIONS = ("fmt", "taps", "layers", "block_size", "draft_vocab", "vocab_from", "mla_widths_from")


def _refuse_ignored_options(target: str | None) -> None:
    """A given option the chosen way of sizing would ignore is refused in one line naming both options."""
    ctx = click.get_current_context()
    given = [name for name in ctx.params if ctx.get_parameter_source(name) not in (ParameterSource.DEFAULT, None)]
    for name in given:
        if target is not None and name in _PROFILE_OPTIONS:
            raise UsageError(f"not with `target`: {_PROFILE_OPTIONS[name]}; drop `{name}`", param=name)
        if target is None and name in _TARGET_OPTIONS:
            raise UsageError(f"applies only with `target` (a draft sized for T; a profile's draft ignores it): add "
                             f"`target` or drop `{name}`", param=name)


def _tap_list(text: str) -> list[int]:
    try:
        return [int(part) for part in text.replace(",", " ").split()]
    except ValueError:
        raise click.BadParameter(f"{text!r} is not a list of layer numbers, e.g. 1,7,14", param_hint="--taps") from None


def _init_for_target(dst: Path, target: str, *, fmt: str, taps: str | None, layers: int, block_size: int,
                     draft_vocab: int | None, vocab_from: str | None, init: str, seed: int,
                     mla_widths_from: str | None, force: bool, quiet: bool, as_json: bool) -> None:
    refuse_own_inputs(dst, [("vocab_from", vocab_from)], param="dst", folder=True)   # the library sees counts only
    counts = token_counts(vocab_from, target, param="vocab_from") if vocab_from else None
    with progress(f"init --target {Path(target).name}", quiet=quiet or as_json) as bar:
        result = init_for_target(dst, target, fmt=fmt, layers=layers, block_size=block_size,
                                 taps=_tap_list(taps) if taps else None, draft_vocab=draft_vocab,
                                 token_counts=counts, init=init, seed=seed, mla_widths_from=mla_widths_from,
                                 force=force, progress=bar)
    emit(result, as_json=as_json, renderer="render_init_target")
