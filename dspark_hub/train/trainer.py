"""Fine-tune k3_dspark weights on teacher rollouts (`dspark-hub finetune`).

One process, or one per rank under `torchrun` (DDP with `device_ids`; `fsdp=True` shards with
FSDP2 `fully_shard` over a device mesh instead). The model and every batch live on the rank's
device: `device` (default `cuda` when torch sees a GPU, else `cpu`), indexed by `LOCAL_RANK` under
torchrun; nccl carries device tensors on GPUs, gloo on CPU. The global batch is split across ranks
by index; anchors are drawn per sequence from a seed of (seed, step, prompt index), and loss
denominators are summed over ranks, so N ranks compute the gradient one process computes on the
same global batch.

`embed_tokens` is frozen (saved bit-identical). AdamW over the other tensors, linear warmup then
cosine decay to `min_lr_ratio * lr`, gradient-norm clipping, fp32 master weights (`dtype="bf16"`
runs the forward under bf16 autocast of the device's type). The loss is computed `loss_chunk` (anchor, position) rows at
a time (`objective.chunked_loss_sums`; 0 = the whole `[B, A, K, V]` at once). Every `save_every`
steps the full training state (weights, optimizer, scheduler, step, RNG) goes to
`state_dir/step-NNNNNN.pt`, and once it is complete (written to a temporary sibling, renamed, and
`latest.json` pointing at it) the states beyond the newest `keep_states` are deleted (0 keeps them
all), so there is always at least one complete state; `resume=True` continues from the latest one
and reproduces the uninterrupted run. The state folder exists only when states are asked for
(`save_every`, `resume`, an explicit `state_dir`) or on-policy rounds need it for their rollouts.
A JSON-lines log (`training_log.jsonl`: step, loss terms, lr, grad norm, tokens, step seconds,
tokens/s, peak device memory, and eval results) is kept in the state folder (else in memory) and
written into the output. Before step 1 the trainer hands its `progress` callback a `TrainPlan`
(`plan.step_plan`: what the step costs and the memory it needs, estimated from the config and step
1's batch; `announce_plan`), and returns it in the result. States and the output are gathered once
into full state dicts and written by rank 0;
the output is written atomically with `modeling.save_checkpoint` in the base's layout (names,
config key order, safetensors metadata, dtype), so it passes `verify --drop-in BASE`.

Data (`data`): a rollouts folder, or hidden-state files from vLLM's extraction connector or
speculators' data pipeline (`hidden_state_files.open_training_data` detects which).

On-policy mode (`on_policy=True, rounds=K`): the prompts are split into K rounds; each round the
teacher greedily continues that round's prompts (`dspark_hub.rollouts`, resumable, under
`state_dir/round-NNN/`) in the teacher engine `engine` (`transformers` or `vllm`), the engine
releases its memory (vLLM: sleep mode where the platform has it, else its process stops; the log
says which), then the draft trains on those cached states for its share of the steps.
"On-policy" is the teacher's policy: under greedy speculative decoding the emitted tokens are the
teacher's greedy tokens whatever the draft proposes, so the teacher's own greedy continuations ARE
the serving distribution (dspark-algorithm.md §2.8; the SDDD card's batch-alternating scheduler);
the draft never decodes inside the loop.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch
import torch.distributed as dist
from torch import nn

from dspark_hub import schemas
from dspark_hub.errors import UsageError, about
from dspark_hub.format import contract
from dspark_hub.format.jsonio import load_json_object, loads_strict
from dspark_hub.format.provenance import TRAINING_ARGS_NAME, TRAINING_ARGS_PATHS, public_args
from dspark_hub.format.remote_code import require_k3_dspark
from dspark_hub.format.writer import atomic_dir, atomic_file, check_writable
from dspark_hub.progress import Progress, announce_plan, announce_total
from dspark_hub.train import objective
from dspark_hub.train.engines import DEFAULT_ENGINE, EngineOptions, TeacherEngine, open_engine, peak_rss_bytes
from dspark_hub.train.hidden_state_files import HiddenStateData, detect_format, open_training_data
from dspark_hub.train.plan import TrainPlan, step_plan
from dspark_hub.train.rollouts import RolloutData, make_rollouts, require_file
from dspark_hub.train.teacher import moved, read_json, read_lm_head

if TYPE_CHECKING:
    from dspark_hub.modeling import K3DSparkModel

#: What a training step reads rollouts from: a rollouts folder, or hidden-state files (speculators, vLLM).
TrainingData = RolloutData | HiddenStateData

LOG_NAME = "training_log.jsonl"
#: State file names: `step-NNNNNN.pt` (NNNNNN the optimizer steps taken).
STATE_PATTERN = re.compile(r"^step-(\d+)\.pt$")
#: Log keys that measure the machine (time, memory): they differ between runs that train identically.
MEASURED = ("step_seconds", "tokens_per_second", "peak_memory_bytes")


@dataclass
class TrainConfig:
    """Every `finetune` option (see `dspark-hub finetune --help`)."""

    base: str
    out: str
    data: str | None = None
    steps: int | None = None
    epochs: float | None = None
    lr: float = 3e-4
    min_lr_ratio: float = 0.1
    warmup: int = 0
    batch_size: int = 8
    block_size: int = 7
    max_anchors: int = 512
    loss_chunk: int = objective.DEFAULT_LOSS_CHUNK
    loss: dict[str, float] = field(default_factory=lambda: {"ce": 0.1, "tv": 0.9})
    gamma: float = 4.0
    alpha: float = 1.0
    clip: float = 1.0
    weight_decay: float = 0.0
    dtype: str = "fp32"
    seed: int = 0
    save_every: int = 0
    keep_states: int = 2
    resume: bool = False
    state_dir: str | None = None
    teacher: str | None = None
    on_policy: bool = False
    rounds: int = 1
    prompts: str | None = None
    max_new_tokens: int = 256
    eval_data: str | None = None
    eval_every: int = 0
    fsdp: bool = False
    dist_timeout: float = 120.0   # minutes a rank waits in a collective (rank 0's on-policy rollouts)
    force: bool = False
    device: str | None = None
    engine: str = DEFAULT_ENGINE
    engine_options: EngineOptions = field(default_factory=EngineOptions)
    data_layer_ids: list[int] | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def public_dict(self) -> dict[str, Any]:
        """`to_dict()` as published in `training_args.json`: Hub ids or digests instead of local paths."""
        return public_args(self.to_dict(), TRAINING_ARGS_PATHS, drop=("out", "state_dir"), weights=("base",))

    @property
    def state_path(self) -> Path:
        return Path(self.state_dir) if self.state_dir else Path(f"{self.out}.state")

    @property
    def uses_state_dir(self) -> bool:
        """States are asked for (`save_every`, `resume`, an explicit `state_dir`), or on-policy rounds keep
        their rollouts there."""
        return bool(self.save_every or self.resume or self.state_dir or self.on_policy)


@dataclass(frozen=True)
class TrainResult:
    """What a finished run wrote and measured."""

    path: str
    steps: int
    tokens: int
    seconds: float
    final_loss: float | None
    state_dir: str | None             # None: no state folder was used
    world_size: int
    eval: dict[str, Any] | None
    device: str = "cpu"
    peak_memory_bytes: int = 0
    engine_releases: tuple[str, ...] = ()
    plan: TrainPlan | None = None
    states: tuple[str, ...] = ()      # the state files kept, oldest first
    warnings: tuple[str, ...] = ()    # what the output will meet when served (e.g. a head vLLM does not load)

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"schema": schemas.command("finetune"), "path": self.path, "steps": self.steps, "tokens": self.tokens,
                "seconds": self.seconds, "tokens_per_second": self.tokens_per_second, "final_loss": self.final_loss,
                "state_dir": self.state_dir, "world_size": self.world_size, "eval": self.eval, "device": self.device,
                "peak_memory_bytes": self.peak_memory_bytes, "engine_releases": list(self.engine_releases),
                "plan": self.plan.to_dict() if self.plan else None, "states": list(self.states),
                "warnings": list(self.warnings)}


def chunkable_draft_logits(model: K3DSparkModel, lm_head_weight: torch.Tensor, hidden: torch.Tensor,
                           prev_ids: torch.Tensor) -> tuple[objective.DraftLogits, tuple[torch.Tensor, ...]]:
    """`model.draft_logits(hidden, lm_head, prev_ids)` split for `objective.chunked_loss_sums`.

    Returns `(draft_logits, inputs)`: the per-slot inputs are the hidden rows and their Markov
    features `markov_w1[prev_ids]`, gathered once here, so a chunk's backward does not build a
    dense `[vocab, markov_rank]` embedding gradient of its own; `draft_logits(hidden_rows,
    feature_rows)` adds `markov_w2(features)` to the lm_head logits.
    """
    markov = model.markov_head

    def draft_logits(rows: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        return model.draft_logits(rows, lm_head_weight) + markov.markov_w2(features).float()

    return draft_logits, (hidden, markov.markov_w1(prev_ids))


class DraftStep(nn.Module):
    """The unit DDP/FSDP wrap: one packed teacher-forced pass and its loss sums.

    The loss runs inside `forward` because the chunked loss recomputes the draft's logits (and
    so uses the Markov head's weights) in backward; DDP and FSDP only track parameters a
    `forward` uses. Returns `(terms, weight, stats)` of `objective.LossSums` (tensors and dicts,
    which DDP and FSDP can walk).
    """

    def __init__(self, model: K3DSparkModel, block_size: int, *, terms: list[str], gamma: float,
                 loss_chunk: int) -> None:
        super().__init__()
        self.model = model
        self.block_size = block_size
        self.terms = terms
        self.gamma = gamma
        self.loss_chunk = loss_chunk

    def forward(self, context_states: torch.Tensor, input_ids: torch.Tensor, anchors: torch.Tensor,
                anchor_valid: torch.Tensor, doc_ids: torch.Tensor, final_hidden: torch.Tensor,
                loss_mask: torch.Tensor, lm_head_weight: torch.Tensor) -> tuple:
        chunked = self.loss_chunk > 0
        out = self.model.teacher_forced(context_states, input_ids, anchors, block_size=self.block_size,
                                        lm_head_weight=None if chunked else lm_head_weight, doc_ids=doc_ids,
                                        anchor_valid=anchor_valid)
        targets = objective.TeacherTargets(final_hidden=final_hidden, loss_mask=loss_mask)
        hidden, prev_ids, labels, positions = out.last_hidden_state, out.prev_ids, out.labels, out.target_positions
        assert hidden is not None and prev_ids is not None and labels is not None and positions is not None
        if chunked:
            draft_logits, inputs = chunkable_draft_logits(self.model, lm_head_weight, hidden, prev_ids)
            sums = objective.chunked_loss_sums(draft_logits, inputs, out.confidence_logits, labels, positions,
                                               targets, lm_head_weight, terms=self.terms, gamma=self.gamma,
                                               chunk_rows=self.loss_chunk)
        else:
            assert out.logits is not None   # teacher_forced was given the lm_head
            with torch.autocast(context_states.device.type, enabled=False):
                sums = objective.loss_sums(out.logits.float(), out.confidence_logits, labels, positions, targets,
                                           lm_head_weight, terms=self.terms, gamma=self.gamma)
        return sums.terms, sums.weight, sums.stats


def launched_by_torchrun() -> bool:
    """True in a process `torchrun` started (it sets LOCAL_RANK and WORLD_SIZE, even for one process)."""
    return "LOCAL_RANK" in os.environ and "WORLD_SIZE" in os.environ


def resolve_device(requested: str | None = None) -> torch.device:
    """The rank's device: `requested` (default `cuda` when torch sees a GPU, else `cpu`); a bare `cuda`
    becomes `cuda:LOCAL_RANK`.

    Raises:
        UsageError: a CUDA device torch cannot see, or a device string torch does not know.
    """
    name = requested or ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise UsageError(f"device {name!r}: not a torch device; use cpu, cuda or cuda:N") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise UsageError(f"device {name!r}: torch sees no CUDA device here; use cpu")
        if device.index is None:
            device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        if device.index >= torch.cuda.device_count():
            raise UsageError(f"device {device}: torch sees {torch.cuda.device_count()} CUDA devices")
        torch.cuda.set_device(device)
    return device


def init_distributed(device: torch.device | None = None, timeout_minutes: float | None = None) -> tuple[int, int]:
    """(rank, world size); joins the process group when launched by torchrun (nccl on CUDA, else gloo).

    `timeout_minutes` bounds every collective (None: torch's default, 10 min for nccl): the other ranks
    wait in a barrier while rank 0 runs an on-policy rollout round, which can take far longer.
    """
    if launched_by_torchrun() and not dist.is_initialized():
        timeout = None if timeout_minutes is None else timedelta(minutes=timeout_minutes)
        if device is not None and device.type == "cuda":
            dist.init_process_group(backend="nccl", device_id=device, timeout=timeout)
        else:
            dist.init_process_group(backend="gloo", timeout=timeout)
    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def peak_memory_bytes(device: torch.device) -> int:
    """Peak memory on `device` since the last call: CUDA's peak allocated bytes, else the process's peak RSS."""
    if device.type == "cuda":
        peak = int(torch.cuda.max_memory_allocated(device))
        torch.cuda.reset_peak_memory_stats(device)
        return peak
    return peak_rss_bytes()


def _all_reduce(tensor: torch.Tensor) -> torch.Tensor:
    if dist.is_initialized():
        dist.all_reduce(tensor)
    return tensor


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def batch_indices(count: int, batch_size: int, local_step: int, seed: int) -> list[int]:
    """Global batch of a step: epoch-wise permutations (seeded per epoch), last partial batch dropped."""
    per_epoch = max(1, count // batch_size)
    epoch, position = divmod(local_step, per_epoch)
    generator = torch.Generator().manual_seed(seed * 7919 + epoch)
    order = torch.randperm(count, generator=generator).tolist()
    return order[position * batch_size:(position + 1) * batch_size]


def check_base_embedding(base: str | os.PathLike[str], teacher: str | os.PathLike[str]) -> str:
    """The base's frozen `embed_tokens.weight` must be the teacher's embedding, compared as `verify
    --frozen-embed` compares it (streamed; in the draft's dtype, so an F32 teacher counts through its
    exact BF16 rounding). Runtimes serve the draft with the target's embedding, and training never
    changes the frozen copy, so a draft trained on another embedding learns inputs it never sees.

    Returns:
        The verdict (`bit-identical`, or `identical after BF16 rounding ...`).

    Raises:
        UsageError: the embeddings differ, or the base holds none.
    """
    from dspark_hub.format.checkpoint import LocalSource, open_checkpoint
    from dspark_hub.verify.deep import check_frozen_embed

    result = check_frozen_embed(open_checkpoint(LocalSource(base)), teacher)
    comparison = result.comparison
    if result.draft is None:
        raise UsageError(f"{base}: holds no {contract.FROZEN_TENSORS[0]} to train beside", param="base")
    if not comparison.identical:
        raise UsageError(f"{base}: {contract.FROZEN_TENSORS[0]} is not {comparison.sameness} the teacher's "
                         f"{result.teacher_tensor.stored.location} ({comparison.evidence}); the runtime serves the "
                         "draft with the target's embedding, so train from a base that carries it: "
                         "'dspark-hub init DIR --embed-from TEACHER'", param="base")
    return str(comparison.verdict)


class Trainer:
    """Holds the model, optimizer and schedule of one run; `fit()` runs it."""

    def __init__(self, config: TrainConfig, progress: Progress | None = None) -> None:
        from dspark_hub.modeling import load_checkpoint

        self.config = config
        self.progress = progress
        self.loss_weights = objective.parse_loss(config.loss)
        self.device = resolve_device(config.device)
        if config.dist_timeout <= 0:
            raise UsageError(f"{config.dist_timeout}; give minutes > 0", param="dist_timeout")
        self.rank, self.world = init_distributed(self.device, config.dist_timeout)
        if config.batch_size < self.world:
            raise UsageError(f"{config.batch_size} is smaller than the {self.world} ranks; "
                             "each rank needs at least one sequence", param="batch_size")
        check_writable(Path(config.out), force=config.force)
        if config.keep_states < 0:
            raise UsageError(f"{config.keep_states}; keep the newest N states (N >= 1), or 0 to keep them all",
                             param="keep_states")
        # The cheap inputs first (configs, data, prompts): a mistyped path fails before the base loads.
        self.base_config = read_json(Path(config.base) / contract.CONFIG_NAME,
                                     what="a k3_dspark checkpoint folder that holds config.json", param="base")
        with about("base"):
            require_k3_dspark(self.base_config, Path(config.base))    # another format: say so before the data
        self._check_inputs()
        self.data = None if config.on_policy else self._open_data(config.data)
        torch.manual_seed(config.seed)
        loaded = load_checkpoint(config.base, dtype=torch.float32)
        self.base_config = loaded.config
        self.model = moved(loaded.model, self.device)
        self.model.embed_tokens.weight.requires_grad_(False)
        self.model.train()
        self.parameter_counts = (sum(p.numel() for p in self.model.parameters() if p.requires_grad),
                                 sum(p.numel() for p in self.model.parameters() if not p.requires_grad))
        self.save_dtype = getattr(torch, self.base_config.get("torch_dtype") or "bfloat16")
        self.lm_head = read_lm_head(self._teacher_path()).float().to(self.device)
        self.embedding = check_base_embedding(config.base, self._teacher_path())
        if config.loss_chunk < 0:
            raise UsageError(f"{config.loss_chunk}; use rows per chunk, or 0 for no chunking", param="loss_chunk")
        self.module = self._wrap(DraftStep(self.model, config.block_size, terms=list(self.loss_weights),
                                           gamma=config.gamma, loss_chunk=config.loss_chunk))
        trainable = [p for p in self.module.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(trainable, lr=config.lr, betas=(0.9, 0.95),
                                           weight_decay=config.weight_decay)
        self.total_steps = self._total_steps()
        if self.rank == 0:
            announce_total(progress, self.total_steps)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda s: objective.cosine_lr(
            s, total=self.total_steps, warmup=config.warmup, min_ratio=config.min_lr_ratio))
        self.step = 0
        self.tokens = 0
        self.last_loss: float | None = None
        self.last_eval: dict[str, Any] | None = None
        self.peak_memory = 0
        self.releases: list[str] = []
        self.plan: TrainPlan | None = None
        self.state_dir: Path | None = config.state_path if config.uses_state_dir else None
        self._log_lines: list[str] = []          # the log, when there is no state folder to keep it in

    # -- setup -----------------------------------------------------------------------------

    def _teacher_path(self) -> str:
        if self.config.teacher:
            return self.config.teacher
        teacher = getattr(self.data, "teacher_path", None)
        if teacher:
            return teacher
        raise UsageError("no teacher; pass `teacher` (its lm_head gives the target distributions)", param="teacher")

    def _check_inputs(self) -> None:
        """The teacher's config, on-policy's prompts and the eval data exist, before anything loads."""
        config = self.config
        if config.teacher:
            read_json(Path(config.teacher) / "config.json", what="a teacher folder that holds config.json",
                      param="teacher")
        if config.on_policy:
            if not (config.prompts and config.teacher):
                raise UsageError("needs `prompts` and `teacher`", param="on_policy")
            require_file(config.prompts, "a prompts JSONL file", param="prompts")
        if config.eval_data:
            detect_format(config.eval_data, param="eval_data")

    def _open_data(self, path: str | None) -> TrainingData:
        if not path:
            raise UsageError("no training data; pass `data` (or `on_policy` with `prompts`)", param="data")
        return open_training_data(path, draft_config=self.base_config, teacher=self.config.teacher,
                                  layer_ids=self.config.data_layer_ids, param="data")

    def _make_state_dir(self) -> None:
        """Rank 0 makes the state folder, once the run starts (a refused run leaves nothing behind)."""
        if self.rank == 0 and self.state_dir is not None:
            self.state_dir.mkdir(parents=True, exist_ok=True)

    def _wrap(self, step: DraftStep) -> nn.Module:
        if not dist.is_initialized():
            return step
        if self.config.fsdp:
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.fsdp import fully_shard

            mesh = init_device_mesh(self.device.type, (self.world,))
            for layer in step.model.layers:
                fully_shard(layer, mesh=mesh)
            # fully_shard returns `step` itself, its class swapped for an FSDPModule subclass
            return cast(nn.Module, fully_shard(step, mesh=mesh))
        from torch.nn.parallel import DistributedDataParallel

        uses_confidence = bool(self.model.confidence_head is not None and self.config.alpha)
        device_ids = [self.device.index] if self.device.type == "cuda" else None
        return DistributedDataParallel(step, device_ids=device_ids, find_unused_parameters=not uses_confidence)

    def _total_steps(self) -> int:
        config = self.config
        if config.steps:
            return config.steps
        if config.on_policy or not config.epochs:
            raise UsageError("no step count; pass `steps` (or `epochs` with `data`)", param="steps")
        assert self.data is not None   # off-policy: opened in __init__
        count = len(self.data)
        return max(1, int(config.epochs * max(1, count // config.batch_size)))

    # -- one step ----------------------------------------------------------------------------

    def train_step(self, data: TrainingData, local_step: int) -> dict[str, Any]:
        config = self.config
        started = time.perf_counter()
        indices = batch_indices(len(data), config.batch_size, local_step, config.seed)
        rollouts = [data[i] for i in indices[self.rank::self.world]]
        anchors = [objective.sample_anchors(r.loss_mask, config.max_anchors,
                                            objective.anchor_seed(config.seed, self.step, r.prompt_index))
                   for r in rollouts]
        batch = objective.collate(rollouts, anchors)
        if self.plan is None:
            self.plan = self.plan_for(batch)
            if self.rank == 0:
                announce_plan(self.progress, self.plan)
        batch = batch.to(self.device)
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=config.dtype == "bf16"):
            sums = objective.LossSums(*self.module(batch.context_states, batch.input_ids, batch.anchors,
                                                   batch.anchor_valid, batch.doc_ids, batch.final_hidden,
                                                   batch.loss_mask, self.lm_head))
        global_weight = _all_reduce(sums.weight.clone())
        loss = objective.combine(sums, self.loss_weights, config.alpha, global_weight, self.world)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        params = [p for p in self.module.parameters() if p.requires_grad]
        grad_norm = torch.nn.utils.clip_grad_norm_(params, config.clip) if config.clip else torch.tensor(0.0)
        lr = self.scheduler.get_last_lr()[0]
        self.optimizer.step()
        self.scheduler.step()
        entry = self._log_entry(sums, global_weight, float(grad_norm), float(lr), batch.tokens)
        seconds = time.perf_counter() - started     # float(grad_norm) above waited for the device
        peak = peak_memory_bytes(self.device)
        self.peak_memory = max(self.peak_memory, peak)
        entry.update(step_seconds=seconds, tokens_per_second=entry["tokens"] / seconds if seconds else 0.0,
                     peak_memory_bytes=peak, device=str(self.device))
        return entry

    def plan_for(self, batch: objective.Batch) -> TrainPlan:
        """What a step on `batch` (this rank's) costs and needs (`plan.step_plan`)."""
        config = self.config
        sequences, positions = batch.input_ids.shape
        trained, frozen = self.parameter_counts
        return step_plan(self.base_config, sequences=sequences, positions=positions,
                         tokens=int((batch.doc_ids >= 0).sum()), supervised_tokens=batch.tokens,
                         anchors=int(batch.anchors.shape[1]), valid_anchors=int(batch.anchor_valid.sum()),
                         block_size=config.block_size, vocabulary=int(self.lm_head.shape[0]),
                         target_hidden_size=int(self.lm_head.shape[1]), trained_parameters=trained,
                         frozen_parameters=frozen, loss_chunk=config.loss_chunk, bf16=config.dtype == "bf16",
                         world_size=self.world, sharded_states=config.fsdp and self.world > 1)

    def _log_entry(self, sums: objective.LossSums, global_weight: torch.Tensor, grad_norm: float, lr: float,
                   tokens: int) -> dict[str, Any]:
        names = sorted(sums.terms)
        packed = torch.stack([sums.terms[n].detach().float() for n in names]
                             + [sums.stats[k].float() for k in ("accuracy", "overlap", "slots")]
                             + [torch.tensor(float(tokens), device=global_weight.device)])
        packed = _all_reduce(packed)
        weight = float(global_weight.clamp_min(1e-8))
        values = {name: float(packed[i]) / weight for i, name in enumerate(names)}
        slots = max(float(packed[-2]), 1.0)
        loss = sum(self.loss_weights[n] * values[n] for n in self.loss_weights)
        loss += self.config.alpha * values.get("confidence", 0.0)
        self.tokens += int(packed[-1])
        self.last_loss = loss
        return {"step": self.step + 1, "loss": loss, **values, "lr": lr, "grad_norm": grad_norm,
                "accuracy": float(packed[-4]) / slots, "overlap": float(packed[-3]) / slots,
                "tokens": int(packed[-1])}

    # -- state -------------------------------------------------------------------------------

    def _state_dicts(self) -> tuple[dict[str, Any], dict[str, Any]]:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return get_state_dict(self.module, self.optimizer, options=options)

    def _require_state_dir(self) -> Path:
        if self.state_dir is None:
            raise UsageError("no state folder: pass `save_every`, `resume` or `state_dir`", param="state_dir")
        return self.state_dir

    def save_state(self) -> Path:
        """Write `state_dir/step-NNNNNN.pt` (rank 0), point `latest.json` at it, then rotate (`rotate_states`)."""
        state_dir = self._require_state_dir()
        model_state, optim_state = self._state_dicts()
        path = state_dir / f"step-{self.step:06d}.pt"
        if self.rank == 0:
            state = {"model": model_state, "optimizer": optim_state, "scheduler": self.scheduler.state_dict(),
                     "step": self.step, "tokens": self.tokens, "rng": torch.get_rng_state(),
                     "config": self.config.to_dict()}
            with atomic_file(path, force=True) as handle:
                torch.save(state, handle)
            with atomic_file(state_dir / "latest.json", force=True, mode="w") as handle:
                json.dump({"step": self.step, "file": path.name}, handle)
            rotate_states(state_dir, self.config.keep_states, latest=path.name)
        _barrier()
        return path

    def load_state(self) -> bool:
        """Restore the latest saved state (`latest.json`, else the highest-numbered file); False when there is none."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

        state_dir = self._require_state_dir()
        pointer = state_dir / "latest.json"
        if pointer.is_file():
            file = state_dir / load_json_object(pointer)["file"]
        else:
            found = state_files(state_dir)
            if not found:
                return False
            file = found[-1]
        if dist.is_initialized() and self.world > 1:
            state = self._broadcast_state(file)
        else:
            state = torch.load(file, weights_only=False, map_location="cpu")
            set_state_dict(self.module, self.optimizer, model_state_dict=state["model"],
                           optim_state_dict=state["optimizer"], options=StateDictOptions(full_state_dict=True))
        self.scheduler.load_state_dict(state["scheduler"])
        self.step, self.tokens = state["step"], state["tokens"]
        torch.set_rng_state(state["rng"])
        if self.rank == 0:
            self._truncate_log(self.step)
        return True

    def _broadcast_state(self, file: Path) -> dict[str, Any]:
        """Rank 0 reads the full state from `file`; the weights and optimizer go to every rank by broadcast
        (each rank keeps its own shard under FSDP2), the small rest (scheduler, step, tokens, RNG) as an object.

        One read of a state that can be tens of GB, instead of one per rank (in host memory, at once).
        Returns the small rest.
        """
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_model_state_dict,
            set_optimizer_state_dict,
        )

        state = torch.load(file, weights_only=False, map_location="cpu") if self.rank == 0 else {}
        options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
        set_model_state_dict(self.module, state.get("model", {}), options=options)
        set_optimizer_state_dict(self.module, self.optimizer, state.get("optimizer", {}), options=options)
        rest = [{key: state[key] for key in ("scheduler", "step", "tokens", "rng")} if self.rank == 0 else None]
        dist.broadcast_object_list(rest, src=0)
        assert rest[0] is not None   # broadcast from rank 0
        return rest[0]

    def _truncate_log(self, step: int) -> None:
        log = self._require_state_dir() / LOG_NAME
        if log.is_file():
            kept = [line for line in log.read_text().splitlines()
                    if loads_strict(line, path=str(log))["step"] <= step]
            log.write_text("".join(line + "\n" for line in kept))

    def log(self, entry: dict[str, Any]) -> None:
        """Append a line to the log (the state folder's `training_log.jsonl`, else memory); rank 0 only."""
        if self.rank != 0:
            return
        line = json.dumps(entry) + "\n"
        if self.state_dir is None:
            self._log_lines.append(line)
            return
        with open(self.state_dir / LOG_NAME, "a", encoding="utf-8") as handle:
            handle.write(line)

    def log_text(self) -> str:
        """The log so far (what the output's `training_log.jsonl` will hold)."""
        if self.state_dir is None:
            return "".join(self._log_lines)
        log = self.state_dir / LOG_NAME
        return log.read_text(encoding="utf-8") if log.is_file() else ""

    # -- loop --------------------------------------------------------------------------------

    def run_steps(self, data: TrainingData, start: int, stop: int, round_index: int | None = None) -> None:
        """Global steps `[max(start, self.step), stop)` on `data` (local step = step - start)."""
        for step in range(max(start, self.step), stop):
            entry = self.train_step(data, step - start)
            if round_index is not None:
                entry["round"] = round_index
            self.step = step + 1
            self.log(entry)
            if self.progress and self.rank == 0:
                self.progress(1)
            self._maybe_eval()
            if self.config.save_every and self.step % self.config.save_every == 0:
                self.save_state()

    def _maybe_eval(self) -> None:
        config = self.config
        due = config.eval_data and config.eval_every and (self.step % config.eval_every == 0
                                                           or self.step == self.total_steps)
        if not due or config.fsdp or config.eval_data is None:
            return
        if self.rank == 0:
            from dspark_hub.train.evaluate import measure_draft, measure_ngram

            data = open_training_data(config.eval_data, draft_config=self.base_config, teacher=self._teacher_path(),
                                      layer_ids=config.data_layer_ids)
            self.last_eval = {**measure_draft(self.model, self.lm_head, data, config.block_size).to_dict(),
                              "baseline": measure_ngram(data, config.block_size).overall.to_dict()}
            self.log({"step": self.step, "eval": self.last_eval})
        _barrier()

    def fit(self) -> TrainResult:
        started = time.perf_counter()
        if self.config.resume:
            self.load_state()
        elif self.rank == 0 and self.state_dir is not None:
            (self.state_dir / LOG_NAME).unlink(missing_ok=True)
        if self.config.on_policy:
            self._fit_on_policy()
        else:
            assert self.data is not None   # off-policy: opened in __init__
            self._make_state_dir()
            self.run_steps(self.data, 0, self.total_steps)
        self.write_output()
        states = tuple(p.name for p in state_files(self.state_dir)) if self.state_dir is not None else ()
        return TrainResult(self.config.out, self.step, self.tokens, time.perf_counter() - started, self.last_loss,
                           None if self.state_dir is None else str(self.state_dir), self.world, self.last_eval,
                           str(self.device), self.peak_memory, tuple(self.releases), self.plan, states)

    def _fit_on_policy(self) -> None:
        config = self.config
        assert config.prompts and config.teacher   # checked in __init__
        lines = [line for line in Path(config.prompts).read_text(encoding="utf-8").splitlines() if line.strip()]
        rounds = max(1, min(config.rounds, len(lines)))
        engine: TeacherEngine | None = None
        if self.rank == 0:
            engine = open_engine(config.engine, config.teacher, list(self.base_config["target_layer_ids"]),
                                 config.engine_options, releasable=rounds > 1)
        self._make_state_dir()     # after the engine was accepted
        try:
            for r in range(rounds):
                start, stop = self.total_steps * r // rounds, self.total_steps * (r + 1) // rounds
                if self.step >= stop:
                    continue
                folder = self._require_state_dir() / f"round-{r:03d}"
                if engine is not None:
                    folder.mkdir(parents=True, exist_ok=True)
                    chunk = lines[len(lines) * r // rounds:len(lines) * (r + 1) // rounds]
                    (folder / "prompts.jsonl").write_text("".join(line + "\n" for line in chunk), encoding="utf-8")
                    make_rollouts(config.teacher, folder / "prompts.jsonl", self.base_config, folder / "data",
                                  max_new_tokens=config.max_new_tokens, engine=engine)
                    if r + 1 < rounds:        # free the teacher's memory for the draft's updates
                        action = engine.release()
                        self.releases.append(action)
                        self.log({"step": self.step, "round": r, "engine": engine.name, "release": action})
                _barrier()
                self.run_steps(RolloutData(folder / "data"), start, stop, round_index=r)
        finally:
            if engine is not None:
                engine.close()

    def _full_model_state(self) -> dict[str, torch.Tensor] | None:
        """The draft's full state dict on CPU, gathered once (a collective under FSDP); None off rank 0."""
        if isinstance(self.module, nn.Module) and self.config.fsdp and dist.is_initialized():
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

            state = get_model_state_dict(self.module, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
            tensors = cast(dict[str, torch.Tensor], state)    # a full model state dict holds tensors only
            return {k.removeprefix("model."): v for k, v in tensors.items()} if self.rank == 0 else None
        if self.rank != 0:
            return None
        return {k: v.detach().to("cpu", copy=True) for k, v in self.model.state_dict().items()}

    def write_output(self) -> None:
        """Rank 0 writes the draft (base layout and dtype) plus the log and the options, atomically."""
        from dspark_hub.modeling import load_checkpoint, save_checkpoint

        state = self._full_model_state()
        if self.rank == 0:
            model = load_checkpoint(self.config.base, dtype=torch.float32).model
            assert state is not None   # gathered to rank 0
            model.load_state_dict(state)
            with atomic_dir(self.config.out, force=self.config.force) as tmp:
                save_checkpoint(model, tmp, dtype=self.save_dtype, force=True)
                log = None if self.state_dir is None else self.state_dir / LOG_NAME
                if log is not None and log.is_file():
                    shutil.copyfile(log, tmp / LOG_NAME)
                elif self._log_lines:
                    (tmp / LOG_NAME).write_text("".join(self._log_lines), encoding="utf-8")
                (tmp / TRAINING_ARGS_NAME).write_text(json.dumps(self.config.public_dict(), indent=2) + "\n")
        _barrier()


def state_files(state_dir: Path) -> list[Path]:
    """The complete states in `state_dir` (`step-NNNNNN.pt`), oldest first."""
    if not state_dir.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in state_dir.iterdir() if (m := STATE_PATTERN.match(p.name)) and p.is_file()]
    return [p for _, p in sorted(found)]


def rotate_states(state_dir: Path, keep: int, *, latest: str) -> list[Path]:
    """Delete all but the newest `keep` complete states (0 keeps all), never `latest`; returns what went.

    Runs after `latest` is complete and `latest.json` names it, so at least one complete state is
    always on disk. Leftover temporary files of states an earlier process did not finish
    (`.step-NNNNNN.pt.tmp-*`) go too: only rank 0 writes states, and its own write is done.
    """
    removed: list[Path] = []
    files = state_files(state_dir)
    if keep:
        removed += [p for p in files[:-keep] if p.name != latest]
    removed += [p for p in state_dir.glob(".step-*.pt.tmp-*") if p.is_file()]
    for path in removed:
        path.unlink(missing_ok=True)
    return removed


def finetune(config: TrainConfig, progress: Progress | None = None) -> TrainResult:
    """Run a fine-tuning job (see the module docstring); returns what it wrote and measured.

    A base of a format with its own trainer (`train.finetuners`) goes to it.
    """
    from dspark_hub.train.finetuners import finetuner_for

    run = finetuner_for(config.base)
    return run(config, progress) if run is not None else Trainer(config, progress).fit()
