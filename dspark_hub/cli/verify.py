"""The `verify` command (its library call: `dspark_hub.verify.verify`)."""

from __future__ import annotations

import click

from dspark_hub.cli._framework import command, endpoint_option, json_option, quiet_option
from dspark_hub.cli._output import emit, progress
from dspark_hub.format import contract
from dspark_hub.verify.runtimes.loaders import RUNTIMES


def runtime_choices() -> list[str]:
    """`--runtime` choices, derived from the runtimes registry (never typed twice)."""
    return [*RUNTIMES, "all"]


@command()
@click.argument("path")
@click.option("--drop-in", "drop_in", metavar="REF",
              help=f"Also demand drop-in identity with a bundled reference ({', '.join(contract.REFERENCES)}) "
                   "or a checkpoint folder.")
@click.option("--deep", is_flag=True, help="Also stream every weight file: SHA-256, NaN/inf counts, all-zero "
                                          "matrices, per-tensor mean/std/max|x| (local folders).")
@click.option("--frozen-embed", "frozen_embed", metavar="TARGET",
              help="Demand embed_tokens.weight be bit-identical to the embedding in the TARGET checkpoint "
                   "(folder, sharded or not, or a .safetensors file).")
@click.option("--runtime", "runtime", multiple=True, type=click.Choice(runtime_choices()),
              help="Judge every tensor through this runtime's loader (repeatable, or 'all') and print its "
                   "serving command.")
@click.option("--execute", "execute", is_flag=True,
              help="With --runtime vllm: run vLLM's own draft loader on the folder (CPU, in a child process; needs "
                   "vLLM importable in this Python) and report what it did instead of the rules' verdicts.")
@click.option("--target", "target", metavar="TARGET",
              help="Check the pairing with this target model (folder or hf://ORG/NAME[@REV]).")
@click.option("--block-size", "block_size", type=click.IntRange(min=1), default=None,
              help="Draft tokens per block for the serving commands (not a config key; default 7, the "
                   "reference draft's).")
@click.option("--probe", is_flag=True,
              help="Also run the draft on --target's greedy paths and name the conventions its weights follow "
                   "(dspark-hub probe): a contradiction is an error, an undetermined convention a note.")
@click.option("--probe-prompts", "probe_prompts", metavar="JSONL",
              help="The prompts --probe continues [default: dspark-hub probe's 24 built-in chat prompts].")
@click.option("--eval", "eval_json", metavar="EVAL.json", help="'eval --k ... --json' output or a "
              "speculation_profile.json: a served k beyond the trained block states what it measured.")
@click.option("--against-hub", "against_hub", metavar="ORG/NAME[@REV]",
              help="Also compare every local file with the Hub's SHA-256 and sizes.")
@endpoint_option
@quiet_option
@json_option
def verify(path: str, drop_in: str | None, deep: bool, frozen_embed: str | None, runtime: tuple[str, ...],
           execute: bool, target: str | None, block_size: int | None, probe: bool, probe_prompts: str | None,
           eval_json: str | None, against_hub: str | None, endpoint: str | None, quiet: bool, as_json: bool) -> None:
    """Check a checkpoint folder (or hf://ORG/NAME[@REV]) against its config, the runtime rules and the contract.

    A Hub path is verified from config.json, the index and the safetensors headers only
    (HTTP range requests); the weights are never downloaded.
    Exit codes: 0 no error finding, 1 error findings, 2 usage or I/O error.
    """
    from dspark_hub.verify import checks  # loads when the command runs (--help stays light)

    if probe and target is None:
        raise click.UsageError("--probe runs the draft on the target's greedy paths: pass --target")
    if probe_prompts is not None and not probe:
        raise click.UsageError("--probe-prompts goes with --probe")
    reads_bytes = deep or frozen_embed is not None or target is not None
    with progress("verify --deep" if deep else "verify", quiet=quiet or as_json or not reads_bytes) as bar:
        report = checks.verify(path, drop_in=drop_in, deep=deep, frozen_embed=frozen_embed,
                               runtime=list(runtime) or None, target=target, block_size=block_size,
                               against_hub=against_hub, endpoint=endpoint, execute=execute, eval_json=eval_json,
                               progress=bar)
    if probe:
        from dspark_hub.train.evaluation.probe_gate import add_to_report  # torch: only a probe pays for it

        with progress("verify --probe", unit="items", quiet=quiet or as_json) as bar:
            add_to_report(report, path, target=target, block_size=block_size, prompts=probe_prompts, progress=bar)
    emit(report, as_json=as_json, renderer="render_verify")
