"""Training commands: `rollouts`, `finetune`, `eval`, `compare`."""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import click

from dspark_hub.cli._framework import POSITIVE, command, force_option, json_option, quiet_option
from dspark_hub.cli._output import emit, progress, quiet_transformers
from dspark_hub.errors import CheckpointFormatError, DsparkError
from dspark_hub.format.jsonio import loads_strict
from dspark_hub.train.data.hidden_state_files import parse_layer_ids
from dspark_hub.train.data.rollouts import make_rollouts
from dspark_hub.train.evaluation.by_context import parse_edges
from dspark_hub.train.evaluation.compare import compare
from dspark_hub.train.evaluation.decoding import DEFAULT_SAMPLES, eval_sampling
from dspark_hub.train.evaluation.evaluate import DTYPES, ENGINES, evaluate
from dspark_hub.train.evaluation.probe import probe as probe_conventions
from dspark_hub.train.evaluation.sampled_acceptance import DRAFT_SAMPLE_METHODS
from dspark_hub.train.evaluation.serving import MEASURE, ServingOptions
from dspark_hub.train.finetuning import objective
from dspark_hub.train.finetuning.allocator import steady_allocator
from dspark_hub.train.finetuning.config import TRAIN_DTYPES, TrainConfig, check_betas, default
from dspark_hub.train.finetuning.threads import apply_threads, choose_threads
from dspark_hub.train.target.dtypes import DTYPE_ALIASES, canonical_dtype, dtype_spellings
from dspark_hub.train.target.engines import DEFAULT_ENGINE, MODES, EngineOptions, Mode, engine_names, option_param
from dspark_hub.train.target.toy import init_teacher as write_init_teacher


def keyword_default(function: Callable[..., Any], name: str) -> Any:
    """The default of `function`'s keyword `name`: a command's default is the library's, typed once there."""
    return inspect.signature(function).parameters[name].default


class AliasedOption(click.Option):
    """An option that also answers to old names (`aliases`), which `--help` and error messages do not show."""

    def __init__(self, *args: Any, aliases: tuple[str, ...] = (), **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.aliases = aliases

    def add_to_parser(self, parser: Any, ctx: click.Context) -> None:
        shown = self.opts
        self.opts = [*shown, *self.aliases]
        try:
            super().add_to_parser(parser, ctx)
        finally:
            self.opts = shown


def target_option(*, required: bool = False, help: str) -> Callable[[F], F]:
    """`--target DIR`: the large model the draft serves (the library's keyword `target`); `--teacher`, its name
    before 0.3, still works."""
    return click.option("--target", "target", cls=AliasedOption, aliases=("--teacher",), required=required,
                        metavar="DIR", help=help)


F = TypeVar("F", bound=Callable[..., Any])


class Dtype(click.ParamType):  # type: ignore[type-arg]  # click 8.1 ParamType is not generic
    """A dtype in either spelling (`bfloat16` or `bf16`), passed on as its torch name (`canonical_dtype`)."""

    name = "dtype"

    def __init__(self, allowed: tuple[str, ...]) -> None:
        self.allowed = allowed

    def get_metavar(self, param: click.Parameter, ctx: click.Context) -> str:
        return "[" + "|".join(dtype_spellings(self.allowed)) + "]"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        try:
            return canonical_dtype(str(value), self.allowed)
        except DsparkError as error:
            self.fail(error.message, param, ctx)


def _canonical_engine_dtype(_ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    """`--engine-dtype` in either spelling; `auto` and names the engine checks itself pass through."""
    return None if value is None else DTYPE_ALIASES.get(value, value)


def _betas(_ctx: click.Context, _param: click.Parameter, value: str) -> tuple[float, float]:
    """`--betas 0.9,0.95` -> (0.9, 0.95), refused in click's words when it is not two numbers in [0, 1)."""
    try:
        return check_betas(float(part) for part in value.split(","))
    except (ValueError, DsparkError) as error:
        message = error.message if isinstance(error, DsparkError) else f"{value!r}: not numbers"
        raise click.BadParameter(f"{message}; give B1,B2 in [0, 1), e.g. 0.9,0.95") from None


def _engine_args(_ctx: click.Context, _param: click.Parameter, values: tuple[str, ...]) -> dict[str, Any]:
    parsed: dict[str, Any] = {}
    for item in values:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise click.BadParameter(f"{item!r}: use KEY=VALUE, e.g. enable_chunked_prefill=false")
        try:
            parsed[key.strip()] = loads_strict(raw, path=key.strip())
        except CheckpointFormatError:
            parsed[key.strip()] = raw
    return parsed


def engine_option_group(f: Any) -> Any:
    """The target engine and its settings (`train.engines.EngineOptions`), for rollouts and on-policy finetune."""
    options = [
        click.option("--engine", type=click.Choice(engine_names()), default=DEFAULT_ENGINE, show_default=True,
                     help="Target engine: transformers in this process (the oracle), or the real vLLM engine."),
        click.option("--engine-dtype", "engine_dtype", metavar="DTYPE", callback=_canonical_engine_dtype,
                     help="Target dtype: float32, bfloat16, float16 (or fp32, bf16, fp16) or auto "
                          "[transformers: float32; vllm: auto]."),
        click.option("--engine-device", "engine_device", metavar="DEVICE", help="transformers: the target's device."),
        click.option("--tensor-parallel-size", "tensor_parallel_size", type=POSITIVE, help="vllm: GPUs per target."),
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


#: (the commands' keyword, the `EngineOptions` field) of every engine option.
ENGINE_KEYS = (("engine_dtype", "dtype"), ("engine_device", "device"), ("tensor_parallel_size", "tensor_parallel_size"),
               ("max_model_len", "max_model_len"), ("max_num_seqs", "max_num_seqs"),
               ("max_num_batched_tokens", "max_num_batched_tokens"),
               ("gpu_memory_utilization", "gpu_memory_utilization"), ("kv_cache_memory_bytes", "kv_cache_memory_bytes"),
               ("engine_python", "python"), ("engine_args", "engine_args"))


def pop_engine_options(options: dict[str, Any]) -> tuple[str, EngineOptions]:
    """(engine name, `EngineOptions`) taken out of a command's keyword arguments."""
    values = {name: options.pop(key) for key, name in ENGINE_KEYS}
    return options.pop("engine"), EngineOptions(**values)


#: `--threads`, on every command that runs torch on the CPU for a while (`train.threads`).
threads_option = click.option("--threads", type=POSITIVE, metavar="N",
                              help="CPU threads for torch [default: OMP_NUM_THREADS, else 1 + idle cores by the "
                                   "load average, at most every core].")


def use_threads(threads: int | None) -> Any:
    """Choose and apply the thread count; the `ThreadChoice` (`say_threads` shows it)."""
    choice = choose_threads(threads)
    apply_threads(choice)
    return choice


@contextmanager
def engine_option_flags() -> Iterator[None]:
    """An error about an `EngineOptions` field (`param="engine_options.device"`) names the command's own
    keyword (`engine_device`), which the error boundary turns into the flag (`--engine-device`)."""
    try:
        yield
    except DsparkError as error:
        keys = {option_param(name): key for key, name in ENGINE_KEYS}
        if error.param in keys:
            error.param = keys[error.param]
        raise


@command()
@target_option(required=True, help="The target: a local transformers causal LM folder.")
@click.option("--prompts", required=True, metavar="JSONL", help="Lines with messages, text or input_ids (+ dataset).")
@click.option("--draft-config", "draft_config", required=True, metavar="CONFIG",
              help="The draft's config.json (taps and pairing keys).")
@click.option("--out", required=True, metavar="DIR", help="Rollouts folder (resumed when it exists).")
@click.option("--max-new-tokens", "max_new_tokens", type=POSITIVE, default=256, show_default=True)
@click.option("--batch-size", "batch_size", type=POSITIVE, default=keyword_default(make_rollouts, "batch_size"),
              show_default=True, help="Equal-length prompts generated together.")
@click.option("--shard-size", "shard_size", type=POSITIVE, default=keyword_default(make_rollouts, "shard_size"),
              show_default=True, help="Sequences per shard.")
@click.option("--ignore-eos", "ignore_eos", is_flag=True, help="Always generate --max-new-tokens tokens.")
@click.option("--mode", type=click.Choice(MODES), default=keyword_default(make_rollouts, "mode"), show_default=True,
              help="generate: greedy continuations; prefill: record each line's sequence as it is (offline data, "
                   "with its loss_mask).")
@engine_option_group
@threads_option
@force_option
@quiet_option
@json_option
def rollouts(target: str, prompts: str, draft_config: str, out: str, max_new_tokens: int, batch_size: int,
             shard_size: int, ignore_eos: bool, mode: Mode, threads: int | None, force: bool, quiet: bool,
             as_json: bool, **engine: Any) -> None:
    """Write the target's greedy continuations with the draft's tap states (resumable safetensors shards)."""
    quiet_transformers(quiet or as_json)
    choice = use_threads(threads)
    engine_name, engine_options = pop_engine_options(engine)
    with progress("rollouts", unit="prompts", quiet=quiet or as_json) as bar, engine_option_flags():
        summary = make_rollouts(target, prompts, draft_config, out, max_new_tokens=max_new_tokens,
                                batch_size=batch_size, shard_size=shard_size, ignore_eos=ignore_eos, force=force,
                                mode=mode, engine=engine_name, engine_options=engine_options, progress=bar)
    say_threads(choice, show=not (quiet or as_json))
    emit(summary, as_json=as_json, renderer="render_rollouts")


@command(name="finetune")
@click.option("--base", required=True, metavar="CKPT",
              help="The checkpoint to start from: a k3_dspark or a speculators DSpark (docs/training-speculators.md).")
@click.option("--data", metavar="DIR", help="Rollouts folder ('dspark-hub rollouts'), or hidden-state files from "
                                            "vLLM's extraction connector or speculators' data pipeline.")
@click.option("--data-layer-ids", "data_layer_ids", metavar="IDS",
              help="vLLM/speculators aux layer ids the --data files hold, e.g. 3,24,48,72,90 (theirs = ours + 1; "
                   "default: the draft's taps).")
@click.option("--out", required=True, metavar="DIR", help="Output checkpoint folder (written atomically).")
@click.option("--steps", type=int, help="Optimizer steps.")
@click.option("--epochs", type=float, help="Passes over --data (instead of --steps).")
@click.option("--lr", type=float, default=default("lr"), show_default=True, help="Peak learning rate.")
@click.option("--min-lr-ratio", "min_lr_ratio", type=float, default=default("min_lr_ratio"), show_default=True,
              help="Cosine floor as a fraction of --lr.")
@click.option("--warmup", type=int, default=default("warmup"), show_default=True, help="Linear warmup steps.")
@click.option("--batch-size", "batch_size", type=int, default=default("batch_size"), show_default=True,
              help="Global sequences per step.")
@click.option("--block-size", "block_size", type=int, default=default("block_size"), show_default=True,
              help="K drafts per block.")
@click.option("--anchors", "max_anchors", type=int, default=default("max_anchors"), show_default=True,
              help="Max anchors per sequence (either format: a speculators base draws N x sequences over its packed "
                   "row).")
@click.option("--loss", default=default("loss"), show_default=True,
              help="JSON weights of ce, kl, tv; a speculators DSpark base takes the library's terms (kl_div, rkl, jsd, "
                   "ce, tv, nla, lk_hybrid).")
@click.option("--loss-chunk", "loss_chunk", type=click.IntRange(min=0), default=default("loss_chunk"),
              show_default=True, metavar="ROWS",
              help="(anchor, position) rows per loss chunk; bounds loss memory in the vocabulary (0 = no chunking).")
@click.option("--gamma", type=float, default=default("gamma"), show_default=True, help="Slot weight exp(-k/gamma).")
@click.option("--alpha", type=float, default=default("alpha"), show_default=True, help="Confidence-head BCE weight.")
@click.option("--confidence-target", "confidence_target", type=click.Choice(list(objective.CONFIDENCE_TARGETS)),
              default=default("confidence_target"), show_default=True,
              help="What the confidence head learns: overlap (sampled drafts at temperature 1, speculators'), greedy "
                   "(temperature 0) or greedy_drafts (greedy drafts at temperature 1, vLLM's default).")
@click.option("--clip", type=float, default=default("clip"), show_default=True, help="Gradient-norm clip (0 = off).")
@click.option("--weight-decay", "weight_decay", type=float, default=default("weight_decay"), show_default=True)
@click.option("--betas", default=",".join(str(b) for b in default("betas")), show_default=True, metavar="B1,B2",
              callback=_betas, help="AdamW's moment decays.")
@click.option("--dtype", type=Dtype(TRAIN_DTYPES), default=default("dtype"), show_default=True,
              help="bfloat16 = bf16 autocast over fp32 master weights.")
@click.option("--seed", type=int, default=default("seed"), show_default=True)
@click.option("--save-every", "save_every", type=int, default=default("save_every"), show_default=True,
              help="Steps between full training states (0 = none, and no state folder).")
@click.option("--keep-states", "keep_states", type=click.IntRange(min=0), default=default("keep_states"),
              show_default=True, metavar="N",
              help="Keep the newest N states, deleting older ones once a new one is complete (0 = keep all).")
@click.option("--resume", is_flag=True, help="Continue from the latest state in --state-dir.")
@click.option("--state-dir", "state_dir", metavar="DIR",
              help="Training states and their log [default: OUT.state, made only with --save-every, --resume "
                   "or --on-policy].")
@target_option(help="The target folder (its lm_head; its rollouts with --on-policy).")
@click.option("--on-policy", "on_policy", is_flag=True, help="Alternate target rollouts and draft updates.")
@click.option("--rounds", type=int, default=default("rounds"), show_default=True, help="On-policy rounds.")
@click.option("--prompts", metavar="JSONL", help="Prompts for --on-policy.")
@click.option("--max-new-tokens", "max_new_tokens", type=int, default=default("max_new_tokens"), show_default=True)
@click.option("--eval-data", "eval_data", metavar="DIR", help="Held-out rollouts for acceptance in the log.")
@click.option("--eval-every", "eval_every", type=int, default=default("eval_every"), show_default=True)
@click.option("--fsdp", is_flag=True, help="Shard with FSDP2 fully_shard under torchrun instead of DDP.")
@click.option("--dist-timeout", "dist_timeout", type=click.FloatRange(min=0, min_open=True),
              default=default("dist_timeout"), show_default=True, metavar="MINUTES",
              help="Under torchrun: how long a rank waits in a collective (on-policy rounds: while rank 0 rolls out).")
@click.option("--device", metavar="DEVICE", help="Training device [default: cuda when torch sees a GPU, else cpu]; "
                                                "under torchrun cuda means cuda:LOCAL_RANK.")
@engine_option_group
@threads_option
@force_option
@quiet_option
@json_option
def finetune_command(loss: str, data_layer_ids: str | None, threads: int | None, quiet: bool, as_json: bool,
                     **options: Any) -> None:
    """Fine-tune drop-in weights (k3_dspark or speculators DSpark) on target rollouts (one process or torchrun)."""
    from dspark_hub.train import finetune  # torch: only a run pays for it

    quiet_transformers(quiet or as_json)
    choice = use_threads(threads)
    steady_allocator()
    engine, engine_options = pop_engine_options(options)
    config = TrainConfig(**options, loss=objective.parse_loss(loss, terms=None), engine=engine,
                         engine_options=engine_options,
                         data_layer_ids=parse_layer_ids(data_layer_ids))
    # A run takes minutes to hours: its plan and progress go to stderr even with --json (stdout stays one document).
    with progress("finetune", unit="steps", quiet=quiet) as bar, engine_option_flags():
        result = finetune(config, progress=_Planned(bar, show=not quiet, threads=choice))
    if int(os.environ.get("RANK", "0")) == 0:   # under torchrun, rank 0 speaks for the run
        emit(result, as_json=as_json, renderer="render_training")


class _Planned:
    """The progress bar, plus the trainer's plan shown (on stderr) before step 1, with the thread choice."""

    def __init__(self, bar: Any, *, show: bool, threads: Any = None) -> None:
        self.bar, self.show, self.threads = bar, show, threads

    def __call__(self, n: int) -> None:
        self.bar(n)

    def set_total(self, total: int) -> None:
        self.bar.set_total(total)

    def plan(self, plan: Any) -> None:
        if self.show:
            from dspark_hub.cli._render import render_plan  # rich: on first use

            render_plan(plan)
            say_threads(self.threads, show=True)


def say_threads(choice: Any, *, show: bool) -> None:
    """The thread choice on stderr, said only once work has begun or ended (a refusal stays one line)."""
    if show and choice is not None:
        from dspark_hub.cli._render import render_threads  # rich: on first use

        render_threads(choice)


@command(name="init-teacher")
@click.argument("dst", metavar="DIR", type=click.Path(path_type=Path))
@click.option("--profile", type=click.Choice(["tiny"]), default="tiny", show_default=True,
              help="Size of the target: the target of 'dspark-hub init --profile tiny'.")
@click.option("--draft", metavar="CKPT",
              help="Pair with this k3_dspark draft: its config's target shapes and special ids, its embed_tokens "
                   "copied bit for bit (instead of --profile).")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--head-dim", "head_dim", type=POSITIVE, metavar="N",
              help="Attention head size [default: 16]; 32 or more for vLLM's CPU engine (--engine vllm).")
@force_option
@quiet_option
@json_option
def init_teacher(dst: Path, profile: str, draft: str | None, seed: int, head_dim: int | None, force: bool,
                 quiet: bool, as_json: bool) -> None:
    """Write a tiny random transformers target with an offline tokenizer (for toy training runs)."""
    quiet_transformers(quiet or as_json)
    with progress("init-teacher", unit="teachers", quiet=quiet or as_json) as bar:
        result = write_init_teacher(dst, profile=profile, draft=draft, seed=seed, force=force, head_dim=head_dim,
                       progress=bar)
    emit(result, as_json=as_json, renderer="render_init_teacher")


@command(name="eval")
@click.option("--draft", required=True, metavar="CKPT", help="The draft to measure (k3_dspark or speculators DSpark).")
@target_option(help="The target folder: continuations, taps, lm_head.")
@click.option("--prompts", metavar="JSONL", help="Held-out prompts, continued greedily by the target.")
@click.option("--data", metavar="DIR", help="A rollouts folder instead of --prompts (simulated engine).")
@click.option("--reference", metavar="CKPT", help="Also measure this draft on the same data; report the ratio.")
@click.option("--engine", type=click.Choice(ENGINES), default=keyword_default(evaluate, "engine"), show_default=True,
              help="simulated: vLLM's verify loop replayed in PyTorch; vllm: served and measured by vLLM itself.")
@click.option("--vllm-python", "vllm_python", metavar="PY",
              help="Python of a vLLM virtualenv at the pinned version (.ci/venv-vllm.sh) for --engine vllm "
                   "(default: this one).")
@click.option("--dtype", type=Dtype(DTYPES), default=keyword_default(evaluate, "dtype"), show_default=True,
              help="The vllm engine's dtype (the simulation is float32: only float32 can match it exactly).")
@click.option("--block-size", "block_size", type=POSITIVE, metavar="K",
              help="Drafted tokens per step (default: the speculators speculative_tokens; 7 for k3_dspark).")
@click.option("--max-new-tokens", "max_new_tokens", type=POSITIVE, default=keyword_default(evaluate, "max_new_tokens"),
              show_default=True)
@click.option("--ignore-eos", "ignore_eos", is_flag=True, help="Never stop a request at the target's EOS.")
@click.option("--batch-size", "batch_size", type=POSITIVE, default=keyword_default(evaluate, "batch_size"),
              show_default=True)
@click.option("--plot", type=click.Path(path_type=Path), help="Write a PNG of acceptance by position (matplotlib).")
@click.option("--temperature", type=click.FloatRange(min=0), default=0.0, show_default=True,
              help="Sample the target at this temperature as vLLM does (0: greedy, the exact counts).")
@click.option("--top-p", "top_p", type=click.FloatRange(0, 1, min_open=True), default=1.0, show_default=True,
              help="With --temperature: vLLM's top-p (1: off).")
@click.option("--top-k", "top_k", type=click.IntRange(min=0), default=0, show_default=True,
              help="With --temperature: vLLM's top-k (0: off).")
@click.option("--samples", type=POSITIVE, metavar="N",
              help=f"With --temperature: sampled paths a prompt [{DEFAULT_SAMPLES}].")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True,
              help="With --temperature: the seed of every path's random stream (per prompt and sample).")
@click.option("--draft-sample-method", "draft_sample_method", type=click.Choice(DRAFT_SAMPLE_METHODS),
              default="greedy", show_default=True,
              help="vLLM's draft_sample_method: greedy drafts the argmax at any temperature (vLLM's default); "
                   "probabilistic samples drafts from softmax(logits / T).")
@click.option("--k", "ks", metavar="KS", help="Also measure these k in the same run (1,2,4 or 1-7 or block: 1 to the "
              "draft's k), sharing the target's rollouts and the draft's context; each k as --block-size k counts.")
@click.option("--by-context", "by_context", is_flag=True,
              help="Acceptance per bucket of context length at the anchor (powers of two from 64).")
@click.option("--context-edges", "context_edges", metavar="LENGTHS", callback=lambda _c, _p, v: parse_edges(v)
              if v else None, help="The buckets' edges, e.g. 1024,4096,16384 (implies --by-context).")
@click.option("--costs", type=click.Choice([MEASURE]), help="Time a draft step and a verify pass against a target "
              "decode step here, for the expected speedup per k.")
@click.option("--draft-cost", "draft_cost", metavar="X[,X...]", callback=lambda _c, p, v: _floats(v, p),
              help="A draft step's cost in target decode steps on your hardware (one, or one per k).")
@click.option("--verify-cost", "verify_cost", metavar="X[,X...]", callback=lambda _c, p, v: _floats(v, p),
              help="Verifying k + 1 tokens, in target decode steps on your hardware (one, or one per k).")
@click.option("--profile", is_flag=True, help="Write speculation_profile.json beside the draft (Model-Optimizer's "
              "keys plus ours).")
@force_option
@threads_option
@quiet_option
@json_option
def eval_command(draft: str, target: str | None, prompts: str | None, data: str | None, reference: str | None,
                 engine: str, vllm_python: str | None, dtype: str, block_size: int | None, max_new_tokens: int,
                 ignore_eos: bool, batch_size: int, plot: Path | None, temperature: float, top_p: float, top_k: int,
                 samples: int | None, seed: int, draft_sample_method: str, ks: str | None, by_context: bool,
                 context_edges: list[int] | None, costs: str | None, draft_cost: list[float] | None,
                 verify_cost: list[float] | None, profile: bool, force: bool, threads: int | None, quiet: bool,
                 as_json: bool) -> None:
    """Acceptance of a draft with vLLM's definitions: simulated, or measured by vLLM serving it.

    Greedy by default (exact counts). With --temperature the target samples as vLLM does, each prompt
    --samples times, and the report gives 95% intervals over prompts and samples and the expected acceptance
    beside the counts (docs/acceptance.md). Exit 1 when a greedy vLLM measurement's outputs differ from plain
    greedy decoding's (not lossless).
    """
    quiet_transformers(quiet or as_json)
    sampling = eval_sampling(temperature, top_k=top_k, top_p=top_p, draft_sample_method=draft_sample_method,
                             samples=samples, seed=seed)
    choice = use_threads(threads)
    serving = ServingOptions(ks=ks, by_context=by_context, context_edges=context_edges, costs=costs,
                             draft_cost=draft_cost, verify_cost=verify_cost, profile=profile, force=force)
    with progress("eval", unit="prompts", quiet=quiet or as_json) as bar:
        result = evaluate(draft, target=target, prompts=prompts, data=data, reference=reference,
                          block_size=block_size, max_new_tokens=max_new_tokens, batch_size=batch_size,
                          plot=plot, ignore_eos=ignore_eos, engine=engine, vllm_python=vllm_python, dtype=dtype,
                          sampling=sampling, serving=serving if serving.asked else None, force=force, progress=bar)
    say_threads(choice, show=not (quiet or as_json))
    emit(result, as_json=as_json, renderer="render_eval")


@command(name="compare")
@click.argument("a", metavar="A.json")
@click.argument("b", metavar="B.json")
@click.option("--fail-if-worse", "fail_if_worse", type=click.FloatRange(min=0), metavar="DELTA",
              help="Exit 1 when B's acceptance length is below A's by more than DELTA with 95% confidence.")
@json_option
def compare_command(a: str, b: str, fail_if_worse: float | None, as_json: bool) -> None:
    """Compare two eval measurements of the same prompts: B - A in acceptance length, paired over prompts, with a
    95% interval.

    A and B are 'eval --json' documents of the same prompts, k, decoding and target (two drafts, two revisions,
    two engines or engine versions). Each prompt's samples are summed, and the difference gets a paired interval
    over prompts; the expected acceptance is compared when both are simulations, else the counts. Exit 1 only
    with --fail-if-worse when B is worse by more than DELTA with 95% confidence; 2 when the two cannot be paired.
    """
    emit(compare(a, b, fail_if_worse=fail_if_worse), as_json=as_json, renderer="render_compare")


@command(name="probe")
@click.argument("draft", metavar="DRAFT")
@target_option(help="The target folder (default with --data: the rollouts' target).")
@click.option("--prompts", metavar="JSONL", help="Prompts the target continues greedily [default: 24 built-in chat "
                                                 "prompts of six kinds].")
@click.option("--data", metavar="DIR", help="A rollouts folder instead: its sequences as they are.")
@click.option("--block-size", "block_size", type=POSITIVE, metavar="K",
              help="The served k (default: the speculators speculative_tokens; 7 for k3_dspark).")
@click.option("--max-new-tokens", "max_new_tokens", type=POSITIVE,
              default=keyword_default(probe_conventions, "max_new_tokens"), show_default=True,
              help="Anchors per prompt.")
@click.option("--batch-size", "batch_size", type=POSITIVE, default=keyword_default(probe_conventions, "batch_size"),
              show_default=True, help="Prompts the target continues together.")
@threads_option
@quiet_option
@json_option
def probe_command(draft: str, target: str | None, prompts: str | None, data: str | None, block_size: int | None,
                  max_new_tokens: int, batch_size: int, threads: int | None, quiet: bool, as_json: bool) -> None:
    """Name the conventions a draft's weights follow (taps, slot layout, d2t and the rest) from their behaviour on the
    target's greedy paths.

    Each convention is "as declared", the value the weights follow instead, or "cannot tell"; exit 1 when the weights
    contradict the config (docs/probe.md).
    """
    quiet_transformers(quiet or as_json)
    choice = use_threads(threads)
    with progress("probe", unit="items", quiet=quiet or as_json) as bar:
        result = probe_conventions(draft, target=target, prompts=prompts, data=data, block_size=block_size,
                                   max_new_tokens=max_new_tokens, batch_size=batch_size, progress=bar)
    say_threads(choice, show=not (quiet or as_json))
    emit(result, as_json=as_json, renderer="render_probe")


def _floats(text: str | None, param: click.Parameter) -> list[float] | None:
    """`0.1` or `1.0,1.02,1.05` as numbers (a click callback)."""
    if not text:
        return None
    try:
        return [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise click.BadParameter(f"{text!r} is not a list of numbers, e.g. 0.08 or 1.0,1.05", param=param) from None
