"""The `dspark-hub` command line: parse arguments, call one library function, render the result.

Exit codes: 0 no error finding, 1 error findings, 2 usage or I/O error, 130 interrupted.
Data goes to stdout (one JSON document with --json); progress, warnings and errors to stderr.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any, Callable

import click
from rich.table import Table
from rich.text import Text

from dspark_hub import __version__
from dspark_hub.format import contract
from dspark_hub.train import objective
from dspark_hub.train.engines import MODES
from dspark_hub.cli._render import (_file_problems_table, _render_publication, count_bar, print_json, progress_bar,
                      render_convert, render_deep, render_diff, render_eval, render_findings, render_report,
                      render_sections, stderr, stdout, verdict_line)
from dspark_hub.errors import CheckpointNotFoundError, DsparkError


class DsparkGroup(click.Group):
    """The one error boundary: a `DsparkError` becomes one line on stderr and its exit code."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except DsparkError as e:
            if _debug(ctx):
                raise
            raise _cli_error(e.message, e.hint, e.exit_code) from None
        except OSError as e:
            if _debug(ctx):
                raise
            where = e.filename or "I/O"
            raise _cli_error(f"{where}: {e.strerror or e}", None, 2) from None
        except KeyboardInterrupt:
            stderr.print("interrupted")
            ctx.exit(130)


def _debug(ctx: click.Context) -> bool:
    return bool(ctx.params.get("debug")) or os.environ.get("DSPARK_DEBUG", "") not in ("", "0")


def _cli_error(message: str, hint: str | None, code: int) -> click.ClickException:
    err = click.ClickException(message + (f"\n  hint: {hint}" if hint else ""))
    err.exit_code = code
    return err


#: Counts and sizes that must be at least 1.
POSITIVE = click.IntRange(min=1)


def json_option(f: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("--json", "as_json", is_flag=True, help="Print one JSON document (stable schema).")(f)


def force_option(f: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("--force", is_flag=True, help="Replace an existing output.")(f)


def endpoint_option(f: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("--endpoint", envvar="HF_ENDPOINT", metavar="URL",
                        help="The Hub endpoint (default: $HF_ENDPOINT, else the public Hub).")(f)


def quiet_option(f: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("-q", "--quiet", is_flag=True, help="No progress bar.")(f)


@click.group(cls=DsparkGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="dspark-hub")
@click.option("--debug", is_flag=True, help="Show full tracebacks (or set DSPARK_DEBUG=1).")
def cli(debug: bool) -> None:
    """Verify, train, card and publish k3_dspark speculative-decoding drafts."""


def quiet_transformers(quiet: bool) -> None:
    """With --quiet or --json, silence transformers' own bars and advisories (they go to stderr otherwise)."""
    if quiet:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        hf_logging.set_verbosity_error()


def engine_option_group(f: Callable[..., Any]) -> Callable[..., Any]:
    """The teacher engine and its settings (`train.engines.EngineOptions`), for rollouts and on-policy finetune."""
    from dspark_hub.train.engines import DEFAULT_ENGINE, engine_names

    options = [
        click.option("--engine", type=click.Choice(engine_names()), default=DEFAULT_ENGINE, show_default=True,
                     help="Teacher engine: transformers in this process (the oracle), or the real vLLM engine."),
        click.option("--engine-dtype", "engine_dtype", metavar="DTYPE",
                     help="Teacher dtype: float32, bfloat16, float16 or auto [transformers: float32; vllm: auto]."),
        click.option("--engine-device", "engine_device", metavar="DEVICE", help="transformers: the teacher's device."),
        click.option("--tensor-parallel-size", "tensor_parallel_size", type=POSITIVE, help="vllm: GPUs per teacher."),
        click.option("--max-model-len", "max_model_len", type=POSITIVE, help="vllm: longest sequence."),
        click.option("--max-num-seqs", "max_num_seqs", type=POSITIVE, help="vllm: sequences per engine step."),
        click.option("--max-num-batched-tokens", "max_num_batched_tokens", type=POSITIVE,
                     help="vllm: tokens per engine step (chunked prefill)."),
        click.option("--gpu-memory-utilization", "gpu_memory_utilization", type=click.FloatRange(0, 1, min_open=True),
                     help="vllm: fraction of device memory (of system RAM on CPU) the engine may take."),
        click.option("--kv-cache-memory-bytes", "kv_cache_memory_bytes", type=POSITIVE,
                     help="vllm: KV cache size [CPU default 512 MiB]."),
        click.option("--engine-python", "engine_python", metavar="PYTHON",
                     help="vllm: interpreter to run the engine in (a virtualenv with vllm, e.g. .ci/venv-vllm.sh's)."),
        click.option("--engine-arg", "engine_args", multiple=True, metavar="KEY=VALUE", callback=_engine_args,
                     help="vllm: any other vllm.LLM argument (VALUE is JSON, else a string); repeatable."),
    ]
    for option in reversed(options):
        f = option(f)
    return f


def _engine_args(_ctx: click.Context, _param: click.Parameter, values: tuple[str, ...]) -> dict[str, Any]:
    import json

    parsed: dict[str, Any] = {}
    for item in values:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise click.BadParameter(f"{item!r}: use KEY=VALUE, e.g. enable_chunked_prefill=false")
        try:
            parsed[key.strip()] = json.loads(raw)
        except ValueError:
            parsed[key.strip()] = raw
    return parsed


def pop_engine_options(options: dict[str, Any]) -> tuple[str, Any]:
    """(engine name, `EngineOptions`) taken out of a command's keyword arguments."""
    from dspark_hub.train.engines import EngineOptions

    values = {name: options.pop(key) for key, name in (
        ("engine_dtype", "dtype"), ("engine_device", "device"), ("tensor_parallel_size", "tensor_parallel_size"),
        ("max_model_len", "max_model_len"), ("max_num_seqs", "max_num_seqs"),
        ("max_num_batched_tokens", "max_num_batched_tokens"), ("gpu_memory_utilization", "gpu_memory_utilization"),
        ("kv_cache_memory_bytes", "kv_cache_memory_bytes"), ("engine_python", "python"),
        ("engine_args", "engine_args"))}
    return options.pop("engine"), EngineOptions(**values)


def runtime_choices() -> list[str]:
    """`--runtime` choices, derived from the runtimes registry (never typed twice)."""
    from dspark_hub.verify.runtimes import RUNTIMES

    return [*RUNTIMES, "all"]


@cli.command()
@click.argument("path")
@click.option("--drop-in", "drop_in", metavar="REF",
              help=f"Also demand drop-in identity with a bundled reference ({', '.join(contract.REFERENCES)}) "
                   "or a checkpoint folder.")
@click.option("--deep", is_flag=True, help="Also stream every weight file: SHA-256, NaN/inf counts, all-zero "
                                          "matrices, per-tensor mean/std/max|x| (local folders).")
@click.option("--frozen-embed", "frozen_embed", metavar="TEACHER",
              help="Demand embed_tokens.weight be bit-identical to the embedding in the TEACHER checkpoint "
                   "(folder, sharded or not, or a .safetensors file).")
@click.option("--runtime", "runtime", multiple=True, type=click.Choice(runtime_choices()),
              help="Judge every tensor through this runtime's loader (repeatable, or 'all') and print its "
                   "serving command.")
@click.option("--target", "target", metavar="TARGET",
              help="Check the pairing with this target model (folder or hf://ORG/NAME[@REV]).")
@click.option("--block-size", "block_size", type=click.IntRange(min=1), default=None,
              help="Draft tokens per block for the serving commands (not a config key; default 7, the "
                   "reference draft's).")
@click.option("--against-hub", "against_hub", metavar="ORG/NAME[@REV]",
              help="Also compare every local file with the Hub's SHA-256 and sizes.")
@endpoint_option
@quiet_option
@json_option
@click.pass_context
def verify(ctx: click.Context, path: str, drop_in: str | None, deep: bool, frozen_embed: str | None,
           runtime: tuple[str, ...], target: str | None, block_size: int | None, against_hub: str | None,
           endpoint: str | None, quiet: bool, as_json: bool) -> None:
    """Check a checkpoint folder (or hf://ORG/NAME[@REV]) against its config, the runtime rules and the contract.

    A Hub path is verified from config.json, the index and the safetensors headers only
    (HTTP range requests); the weights are never downloaded.
    Exit codes: 0 no error finding, 1 error findings, 2 usage or I/O error.
    """
    from dspark_hub.verify import checks

    options = dict(drop_in=drop_in, runtime=list(runtime) or None, target=target, block_size=block_size,
                   against_hub=against_hub, endpoint=endpoint)
    if deep or frozen_embed is not None:
        from dspark_hub.verify.deep import planned_bytes

        total = planned_bytes(path, deep=deep, frozen_embed=frozen_embed)
        with progress_bar("verify --deep" if deep else "frozen-embed", total,
                          enabled=not (quiet or as_json)) as advance:
            report = checks.verify(path, deep=deep, frozen_embed=frozen_embed, progress=advance, **options)
    else:
        report = checks.verify(path, **options)
    if as_json:
        print_json(report.to_dict())
    else:
        render_report(report)
        render_deep(report)
        render_sections(report)
    ctx.exit(0 if report.ok else 1)


@cli.command()
@click.argument("dst", type=click.Path(path_type=Path))
@click.option("--profile", type=click.Choice(sorted(contract.PROFILES)), default="tiny", show_default=True,
              help="kimi-k3 writes the full reference shape (7.12 GB).")
@click.option("--init", "init_kind", type=click.Choice(["random", "zeros"]), default="random", show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@force_option
@quiet_option
@json_option
def init(dst: Path, profile: str, init_kind: str, seed: int, force: bool, quiet: bool, as_json: bool) -> None:
    """Write a conforming k3_dspark checkpoint (config.json + model.safetensors) to DST."""
    from dspark_hub.format.writer import check_writable
    from dspark_hub.ops.init import init_checkpoint

    check_writable(dst, force=force)
    cfg = contract.profile_config(profile)
    total = sum(s.nbytes for s in contract.roster(cfg).values())
    with progress_bar(f"init {profile}", total, enabled=not (quiet or as_json)) as advance:
        out = init_checkpoint(dst, profile=profile, init=init_kind, seed=seed, force=force, progress=advance)
    size = (out / contract.WEIGHTS_NAME).stat().st_size
    if as_json:
        print_json({"schema": "dspark-hub/init/1", "path": str(out), "profile": profile, "init": init_kind,
                    "seed": seed, "weights_bytes": size})
    else:
        stdout.print(f"wrote {out} ({profile}, {init_kind}, {size:,} bytes); check it with: dspark-hub verify {out}")


@cli.command()
@click.option("--teacher", required=True, metavar="DIR", help="Local transformers causal LM folder.")
@click.option("--prompts", required=True, metavar="JSONL", help="Lines with messages, text or input_ids (+ dataset).")
@click.option("--draft-config", "draft_config", required=True, metavar="CONFIG",
              help="The draft's config.json (taps and pairing keys).")
@click.option("--out", required=True, metavar="DIR", help="Rollouts folder (resumed when it exists).")
@click.option("--max-new-tokens", "max_new_tokens", type=POSITIVE, default=256, show_default=True)
@click.option("--batch-size", "batch_size", type=POSITIVE, default=8, show_default=True,
              help="Equal-length prompts generated together.")
@click.option("--shard-size", "shard_size", type=POSITIVE, default=256, show_default=True, help="Sequences per shard.")
@click.option("--ignore-eos", "ignore_eos", is_flag=True, help="Always generate --max-new-tokens tokens.")
@click.option("--mode", type=click.Choice(MODES), default="generate", show_default=True,
              help="generate: greedy continuations; prefill: record each line's sequence as it is (offline data, "
                   "with its loss_mask).")
@engine_option_group
@force_option
@quiet_option
@json_option
def rollouts(teacher: str, prompts: str, draft_config: str, out: str, max_new_tokens: int, batch_size: int,
             shard_size: int, ignore_eos: bool, mode: str, force: bool, quiet: bool, as_json: bool,
             **engine: Any) -> None:
    """Write teacher greedy continuations with the draft's tap states (resumable safetensors shards)."""
    from dspark_hub.train.rollouts import make_rollouts

    quiet_transformers(quiet or as_json)
    engine_name, engine_options = pop_engine_options(engine)
    with count_bar("rollouts", enabled=not (quiet or as_json)) as (advance, set_total):
        summary = make_rollouts(teacher, prompts, draft_config, out, max_new_tokens=max_new_tokens,
                                batch_size=batch_size, shard_size=shard_size, ignore_eos=ignore_eos, force=force,
                                mode=mode, engine=engine_name, engine_options=engine_options,
                                progress=advance, total=set_total)
    if as_json:
        print_json(summary.to_dict())
        return
    agreement = "-" if summary.greedy_agreement is None else f"{summary.greedy_agreement:.4f}"
    stdout.print(f"wrote {summary.written} sequences ({summary.skipped} already there) to {summary.out}: "
                 f"{summary.sequences} sequences, {summary.continuation_tokens:,} supervised tokens, "
                 f"{summary.shards} shards, greedy agreement {agreement} ({summary.engine} engine, {summary.mode})")


@cli.command()
@click.option("--base", required=True, metavar="CKPT", help="The k3_dspark checkpoint to start from.")
@click.option("--data", metavar="DIR", help="Rollouts folder ('dspark-hub rollouts'), or hidden-state files from "
                                            "vLLM's extraction connector or speculators' data pipeline.")
@click.option("--data-layer-ids", "data_layer_ids", metavar="IDS",
              help="vLLM/speculators aux layer ids the --data files hold, e.g. 3,24,48,72,90 (theirs = ours + 1; "
                   "default: the draft's taps).")
@click.option("--out", required=True, metavar="DIR", help="Output checkpoint folder (written atomically).")
@click.option("--steps", type=int, help="Optimizer steps.")
@click.option("--epochs", type=float, help="Passes over --data (instead of --steps).")
@click.option("--lr", type=float, default=3e-4, show_default=True, help="Peak learning rate.")
@click.option("--min-lr-ratio", "min_lr_ratio", type=float, default=0.1, show_default=True,
              help="Cosine floor as a fraction of --lr.")
@click.option("--warmup", type=int, default=0, show_default=True, help="Linear warmup steps.")
@click.option("--batch-size", "batch_size", type=int, default=8, show_default=True, help="Global sequences per step.")
@click.option("--block-size", "block_size", type=int, default=7, show_default=True, help="K drafts per block.")
@click.option("--anchors", "max_anchors", type=int, default=512, show_default=True, help="Max anchors per sequence.")
@click.option("--loss", default='{"ce":0.1,"tv":0.9}', show_default=True, help="JSON weights of ce, kl, tv.")
@click.option("--loss-chunk", "loss_chunk", type=click.IntRange(min=0), default=objective.DEFAULT_LOSS_CHUNK,
              show_default=True, metavar="ROWS",
              help="(anchor, position) rows per loss chunk; bounds loss memory in the vocabulary (0 = no chunking).")
@click.option("--gamma", type=float, default=4.0, show_default=True, help="Slot weight exp(-k/gamma).")
@click.option("--alpha", type=float, default=1.0, show_default=True, help="Confidence-head BCE weight.")
@click.option("--clip", type=float, default=1.0, show_default=True, help="Gradient-norm clip (0 = off).")
@click.option("--weight-decay", "weight_decay", type=float, default=0.0, show_default=True)
@click.option("--dtype", type=click.Choice(["fp32", "bf16"]), default="fp32", show_default=True,
              help="bf16 = bf16 autocast over fp32 master weights.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--save-every", "save_every", type=int, default=0, show_default=True, help="Steps between states.")
@click.option("--resume", is_flag=True, help="Continue from the latest state in --state-dir.")
@click.option("--state-dir", "state_dir", metavar="DIR", help="Training states and log (default OUT.state).")
@click.option("--teacher", metavar="DIR", help="Teacher folder (lm_head; rollouts with --on-policy).")
@click.option("--on-policy", "on_policy", is_flag=True, help="Alternate teacher rollouts and draft updates.")
@click.option("--rounds", type=int, default=1, show_default=True, help="On-policy rounds.")
@click.option("--prompts", metavar="JSONL", help="Prompts for --on-policy.")
@click.option("--max-new-tokens", "max_new_tokens", type=int, default=256, show_default=True)
@click.option("--eval-data", "eval_data", metavar="DIR", help="Held-out rollouts for acceptance in the log.")
@click.option("--eval-every", "eval_every", type=int, default=0, show_default=True)
@click.option("--fsdp", is_flag=True, help="Shard with FSDP2 fully_shard under torchrun instead of DDP.")
@click.option("--device", metavar="DEVICE", help="Training device [default: cuda when torch sees a GPU, else cpu]; "
                                                "under torchrun cuda means cuda:LOCAL_RANK.")
@engine_option_group
@force_option
@quiet_option
@json_option
def finetune(quiet: bool, as_json: bool, **options: Any) -> None:
    """Fine-tune drop-in k3_dspark weights on teacher rollouts (one process or torchrun)."""
    from dspark_hub.train.hidden_state_files import parse_layer_ids
    from dspark_hub.train.objective import parse_loss
    from dspark_hub.train.trainer import TrainConfig, finetune as run

    quiet_transformers(quiet or as_json)
    engine, engine_options = pop_engine_options(options)
    config = TrainConfig(**{**options, "loss": parse_loss(options["loss"]), "engine": engine,
                            "engine_options": engine_options,
                            "data_layer_ids": parse_layer_ids(options["data_layer_ids"])})
    with count_bar("finetune", enabled=not (quiet or as_json)) as (advance, set_total):
        if config.steps:
            set_total(config.steps)
        result = run(config, progress=advance)
    if int(os.environ.get("RANK", "0")) != 0:
        return
    if as_json:
        print_json(result.to_dict())
        return
    loss = "-" if result.final_loss is None else f"{result.final_loss:.4f}"
    stdout.print(f"wrote {result.out}: {result.steps} steps, {result.tokens:,} tokens, "
                 f"{result.tokens_per_second:,.0f} tokens/s on {result.device}, final loss {loss} "
                 f"(log: {result.state_dir})")
    for action in result.engine_releases:
        stdout.print(f"between rounds: {action}")
    if result.eval:
        stdout.print(f"held-out acceptance length {result.eval['acceptance_length']:.4f} "
                     f"(prompt lookup {result.eval['baseline']['acceptance_length']:.4f})")


@cli.command(name="eval")
@click.option("--draft", required=True, metavar="CKPT", help="The k3_dspark checkpoint to measure.")
@click.option("--teacher", metavar="DIR", help="Teacher folder (rollouts and lm_head).")
@click.option("--prompts", metavar="JSONL", help="Held-out prompts, continued greedily by the teacher.")
@click.option("--data", metavar="DIR", help="A rollouts folder instead of --prompts.")
@click.option("--reference", metavar="CKPT", help="Also measure this draft on the same data; report the ratio.")
@click.option("--block-size", "block_size", type=POSITIVE, default=7, show_default=True)
@click.option("--max-new-tokens", "max_new_tokens", type=POSITIVE, default=256, show_default=True)
@click.option("--batch-size", "batch_size", type=POSITIVE, default=8, show_default=True)
@click.option("--plot", type=click.Path(path_type=Path), help="Write a PNG of acceptance by position (matplotlib).")
@quiet_option
@json_option
def eval_command(draft: str, teacher: str | None, prompts: str | None, data: str | None, reference: str | None,
                 block_size: int, max_new_tokens: int, batch_size: int, plot: Path | None, quiet: bool,
                 as_json: bool) -> None:
    """Simulated acceptance of a draft on held-out prompts, next to a prompt-lookup drafter."""
    from dspark_hub.train.evaluate import evaluate, plot_acceptance, require_matplotlib

    quiet_transformers(quiet or as_json)
    if plot is not None:
        require_matplotlib()   # fail before the long run, not after it
    with count_bar("eval", enabled=not (quiet or as_json)) as (advance, _):
        result = evaluate(draft, teacher=teacher, prompts=prompts, data=data, reference=reference,
                          block_size=block_size, max_new_tokens=max_new_tokens, batch_size=batch_size,
                          progress=advance)
    if plot is not None:
        plot_acceptance(result, plot)
    if as_json:
        print_json(result.to_dict())
    else:
        render_eval(result.to_dict())


@cli.command("export-code")
@click.argument("folder", type=click.Path(path_type=Path))
@force_option
@json_option
def export_code(folder: Path, force: bool, as_json: bool) -> None:
    """Copy the modeling files and an auto_map into FOLDER for trust_remote_code loading."""
    from dspark_hub.modeling import export_code as export

    result = export(folder, force=force)
    if as_json:
        print_json({"schema": "dspark-hub/export-code/1", **result.to_dict()})
        return
    stdout.print(f"{folder}: wrote {', '.join(result.written) or 'nothing'}"
                 + (f" (unchanged: {', '.join(result.unchanged)})" if result.unchanged else "")
                 + "; load with AutoModel.from_pretrained(folder, trust_remote_code=True)")


@cli.command()
@click.argument("folder", type=click.Path(path_type=Path))
@click.option("--check", is_flag=True, help="Verify FOLDER against its SHA256SUMS / checksums.json instead.")
@force_option
@quiet_option
@json_option
@click.pass_context
def checksums(ctx: click.Context, folder: Path, check: bool, force: bool, quiet: bool, as_json: bool) -> None:
    """Write SHA256SUMS and checksums.json for FOLDER (or --check it against them)."""
    from dspark_hub.hub import checksums as sums

    if not folder.is_dir():
        raise CheckpointNotFoundError(f"{folder}: not a directory; pass a checkpoint folder")
    total = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    with progress_bar("sha256", total, enabled=not (quiet or as_json)) as advance:
        if check:
            problems = sums.check_checksums(folder, progress=advance)
        else:
            written = sums.write_checksums(folder, force=force, progress=advance)
    if not check:
        if as_json:
            print_json({"path": str(folder), **written.manifest.to_dict()})
        else:
            stdout.print(f"wrote {written.sums_path} and {written.manifest_path} "
                         f"({len(written.manifest.files)} files, {written.manifest.total_bytes:,} bytes); "
                         f"check with: sha256sum -c SHA256SUMS (in {folder})")
        return
    if as_json:
        print_json({"schema": "dspark-hub/checksums-check/1", "path": str(folder), "ok": not problems,
                    "problems": [p.to_dict() for p in problems]})
    elif problems:
        _file_problems_table(f"checksum problems in {folder}", problems)
    else:
        stdout.print(f"OK  {folder}: every file matches its checksum")
    ctx.exit(1 if problems else 0)


@cli.command()
@click.argument("ckpt", type=click.Path(path_type=Path))
@click.option("--repo", "repo_id", required=True, metavar="ORG/NAME", help="The Hub repo the web seeds point at.")
@click.option("--revision", default="main", show_default=True, help="The revision the web seeds point at "
              "(a commit sha is best).")
@click.option("-o", "--out", "out_dir", required=True, type=click.Path(path_type=Path), help="Package folder.")
@endpoint_option
@force_option
@quiet_option
@json_option
def package(ckpt: Path, repo_id: str, revision: str, out_dir: Path, endpoint: str | None, force: bool,
            quiet: bool, as_json: bool) -> None:
    """Write SHA256SUMS, checksums.json, .gitattributes, a .torrent with Hub web seeds and its magnet link."""
    from dspark_hub.hub.package import package as build

    with progress_bar("checksums", None, enabled=not (quiet or as_json)) as bar:
        result = build(ckpt, repo_id, out_dir=out_dir, revision=revision, endpoint=endpoint, force=force,
                       progress=bar.stage)
    if as_json:
        print_json(result.to_dict())
        return
    stdout.print(f"wrote {out_dir}: {', '.join(sorted(result.files))}")
    stdout.print(f"infohash {result.infohash}")
    stdout.print(f"magnet   {result.magnet}")


class DefaultCommandGroup(click.Group):
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


@cli.group(cls=DefaultCommandGroup, default_command="render")
def card() -> None:
    """Render a model card from computed facts (default), or lint one: 'card lint README.md'."""


@card.command("render")
@click.argument("ckpt", required=False, type=click.Path(path_type=Path))
@click.option("--meta", required=True, type=click.Path(path_type=Path), help="Card source: cards/<name>/card.yaml.")
@click.option("--eval", "eval_json", type=click.Path(path_type=Path), help="Evaluation JSON ('dspark-hub eval --json').")
@click.option("--train-log", type=click.Path(path_type=Path), help="Training log (JSON lines).")
@click.option("--checksums-from", type=click.Path(path_type=Path),
              help="Manifest of known SHA-256 digests (JSON or sha256sum output), used instead of hashing.")
@click.option("--no-hash", is_flag=True, help="Do not hash files the manifest does not cover (their digest shows as —).")
@click.option("-o", "--output", required=True, type=click.Path(path_type=Path), help="Where to write the card.")
@force_option
@quiet_option
@json_option
def card_render(ckpt: Path | None, meta: Path, eval_json: Path | None, train_log: Path | None,
                checksums_from: Path | None, no_hash: bool, output: Path, force: bool, quiet: bool,
                as_json: bool) -> None:
    """Render a model card for CKPT (omit CKPT when the weights are not at hand) to OUTPUT."""
    import hashlib

    from dspark_hub.cards.render import render_card
    from dspark_hub.format.writer import atomic_file, check_writable

    check_writable(output, force=force)
    with progress_bar("hashing", None, enabled=not (quiet or as_json)) as advance:
        text = render_card(meta, ckpt, eval_json, train_log, checksums_from=checksums_from, hash_files=not no_hash,
                           progress=advance)
    data = text.encode("utf-8")
    with atomic_file(output, force=force) as f:
        f.write(data)
    if as_json:
        print_json({"schema": "dspark-hub/card/1", "path": str(output), "bytes": len(data),
                    "lines": text.count("\n"), "sha256": hashlib.sha256(data).hexdigest()})
    else:
        stdout.print(f"wrote {output} ({len(data):,} bytes); check it with: dspark-hub card lint {output}"
                     + (f" --checkpoint {ckpt}" if ckpt else ""))


@card.command("lint")
@click.argument("readme", type=click.Path(path_type=Path))
@click.option("--checkpoint", type=click.Path(path_type=Path), help="Also check the card's weight facts against it.")
@json_option
@click.pass_context
def card_lint(ctx: click.Context, readme: Path, checkpoint: Path | None, as_json: bool) -> None:
    """Check a model card: front matter, acceptance arithmetic, duplicate rows, and weight facts."""
    from dspark_hub.cards.lint import lint_card

    report = lint_card(readme, checkpoint)
    if as_json:
        print_json(report.to_dict())
    else:
        render_findings(report.sorted_findings(), f"findings for {report.path}")
        stdout.print(verdict_line(report.ok, len(report.errors), report.path))
    ctx.exit(0 if report.ok else 1)


@cli.command()
@click.argument("ckpt", type=click.Path(path_type=Path))
@click.argument("repo_id", metavar="ORG/NAME")
@click.option("--drop-in", "drop_in", metavar="REF", help="The gate also demands drop-in identity with REF.")
@click.option("--private", is_flag=True, default=None, help="Create the repository private.")
@click.option("--revision", metavar="BRANCH", help="Commit to this branch (created from main if missing).")
@click.option("--tag", metavar="TAG", help="Tag the new commit.")
@click.option("--with-remote-code", is_flag=True, help="Also upload the modeling code and an auto_map.")
@click.option("--dry-run", is_flag=True, help="Print the plan (every file, size, LFS or regular); send nothing.")
@endpoint_option
@quiet_option
@json_option
@click.pass_context
def publish(ctx: click.Context, ckpt: Path, repo_id: str, drop_in: str | None, private: bool | None,
            revision: str | None, tag: str | None, with_remote_code: bool, dry_run: bool, endpoint: str | None,
            quiet: bool, as_json: bool) -> None:
    """Gate (verify + card lint), upload CKPT to ORG/NAME, then compare the Hub's files with the local ones.

    The token comes from huggingface_hub's usual sources (HF_TOKEN, 'hf auth login') and is never printed.
    """
    from dspark_hub.hub.release import publish_checkpoint

    with progress_bar("sha256", None, enabled=not (quiet or as_json)) as advance:
        outcome = publish_checkpoint(ckpt, repo_id, drop_in=drop_in, private=private, revision=revision, tag=tag,
                                     with_remote_code=with_remote_code, endpoint=endpoint, dry_run=dry_run,
                                     progress=advance)
    if as_json:
        print_json(outcome.to_dict())
    else:
        _render_publication(outcome)
    ctx.exit(0 if outcome.ok else 1)


@cli.group(cls=DefaultCommandGroup, default_command="write")
def golden() -> None:
    """Golden vectors: `golden CKPT -o FILE` writes a fixture of the reference forward; `golden check` recomputes it.

    \b
    dspark-hub golden CKPT -o golden.safetensors [--lm-head FILE] [--seed N] [--block-size K]
    dspark-hub golden check CKPT golden.safetensors [--lm-head FILE] [--atol X --rtol Y]
    """


@golden.command("write", hidden=True)
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
    """Write the golden fixture of CKPT."""
    from dspark_hub.verify.golden import write_golden

    quiet_transformers(as_json)

    result = write_golden(ckpt, output, lm_head=lm_head, seed=seed, block_size=block_size, force=force)
    if as_json:
        print_json(result)
    else:
        stdout.print(f"wrote {result['path']} ({result['bytes']:,} bytes; cases "
                     f"{', '.join(f'{c} from position {p}' for c, p in result['cases'].items())}); "
                     f"check it with: dspark-hub golden check {ckpt} {output}")


@golden.command("check")
@click.argument("ckpt", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.argument("fixture", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--lm-head", "lm_head", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="The lm_head file the fixture was written with (if any).")
@click.option("--atol", type=float, default=None, help="Override the stored absolute tolerance.")
@click.option("--rtol", type=float, default=None, help="Override the stored relative tolerance.")
@json_option
@click.pass_context
def golden_check(ctx: click.Context, ckpt: Path, fixture: Path, lm_head: Path | None, atol: float | None,
                 rtol: float | None, as_json: bool) -> None:
    """Recompute FIXTURE on CKPT and compare within the stored tolerances (exit 0 when all match, else 1)."""
    from dspark_hub.verify.golden import check_golden

    quiet_transformers(as_json)

    result = check_golden(ckpt, fixture, lm_head=lm_head, atol=atol, rtol=rtol)
    if as_json:
        print_json(result.to_dict())
    else:
        table = Table(title=f"golden check {fixture}", expand=False)
        for col in ("tensor", "ok", "max |diff|", "tolerance"):
            table.add_column(col)
        for c in result.comparisons:
            tol = f"atol {c['atol']:g} rtol {c['rtol']:g}" if "atol" in c else "exact"
            diff = "-" if c.get("max_abs") is None else f"{c['max_abs']:.3g}"
            table.add_row(c["tensor"], Text("yes", style="green") if c["ok"] else Text("NO", style="bold red"), diff, tol)
        stdout.print(table)
        for problem in result.problems:
            stdout.print(Text.assemble(("problem", "bold red"), f": {problem}"))
        stdout.print(Text("OK", style="bold green") if result.ok else Text("FAILED", style="bold red"))
    ctx.exit(0 if result.ok else 1)


@cli.command()
@click.argument("a", type=click.Path(path_type=Path))
@click.argument("b", type=click.Path(path_type=Path))
@quiet_option
@json_option
@click.pass_context
def diff(ctx: click.Context, a: Path, b: Path, quiet: bool, as_json: bool) -> None:
    """Compare checkpoint folders A and B: config keys, roster, and every common tensor's bytes.

    Per tensor: identical bytes, or the relative L2 change ||b-a||/||a||. Exit code 0 whether or not
    they differ (read "identical" / "weights_only" in the output); 1 when a side could not be read
    whole (its problems are listed); 2 on usage or I/O error.
    """
    from dspark_hub.ops.diff import diff as diff_checkpoints, planned_bytes

    with progress_bar("diff", planned_bytes(a, b), enabled=not (quiet or as_json)) as advance:
        result = diff_checkpoints(a, b, progress=advance)
    if as_json:
        print_json(result.to_dict())
    else:
        render_diff(result)
    ctx.exit(1 if any(f.severity == "error" for _, f in result.problems) else 0)


@cli.command()
@click.argument("src", type=click.Path(path_type=Path))
@click.argument("dst", type=click.Path(path_type=Path))
@force_option
@quiet_option
@json_option
@click.pass_context
def convert(ctx: click.Context, src: Path, dst: Path, force: bool, quiet: bool, as_json: bool) -> None:
    """Rewrite a near-miss export in SRC as a contract checkpoint in DST, reporting every change.

    Renames trainer names, strips model./module. prefixes, drops lm_head, casts F32/F16 to BF16,
    merges shards, repairs the config. SRC is never modified. Exit codes: 0 written and DST passes
    verify, 1 written but DST still has verify errors (so 'convert && publish' stops), 2 usage or I/O error.
    """
    from dspark_hub.ops.convert import convert as convert_checkpoint, planned_bytes
    from dspark_hub.format.writer import check_writable

    check_writable(dst, force=force)
    with progress_bar("convert", planned_bytes(src), enabled=not (quiet or as_json)) as advance:
        result = convert_checkpoint(src, dst, force=force, progress=advance)
    if as_json:
        print_json(result.to_dict())
    else:
        render_convert(result)
    ctx.exit(0 if result.verify_ok else 1)


def main() -> None:
    """Console-script entry point: SIGTERM unwinds like Ctrl-C so writers clean up."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    cli(prog_name="dspark-hub")
