"""Fine-tune k3_dspark weights on teacher rollouts (`dspark-hub finetune`).

One process, or one per rank under `torchrun` (DDP; gloo on CPU, nccl on GPU; `fsdp=True` shards
with FSDP2 `fully_shard` instead). The global batch is split across ranks by index; anchors are
drawn per sequence from a seed of (seed, step, prompt index), and loss denominators are summed over
ranks, so N ranks compute the gradient one process computes on the same global batch.

`embed_tokens` is frozen (saved bit-identical). AdamW over the other tensors, linear warmup then
cosine decay to `min_lr_ratio * lr`, gradient-norm clipping, fp32 master weights (`dtype="bf16"`
runs the forward under bf16 autocast). The loss is computed `loss_chunk` (anchor, position) rows at
a time (`objective.chunked_loss_sums`; 0 = the whole `[B, A, K, V]` at once). Every `save_every`
steps the full training state (weights, optimizer, scheduler, step, RNG) goes to
`state_dir/step-NNNNNN.pt`; `resume=True` continues from the latest one and reproduces the
uninterrupted run. A JSON-lines log (`training_log.jsonl`: step, loss terms, lr, grad norm, tokens,
and eval results) is kept in `state_dir` and copied into the output, which is written atomically
with `modeling.save_checkpoint` in the base's layout (names, config key order, safetensors metadata,
dtype), so it passes `verify --drop-in BASE`.

On-policy mode (`on_policy=True, rounds=K`): the prompts are split into K rounds; each round the
teacher greedily continues that round's prompts (`dspark_hub.rollouts`, resumable, under
`state_dir/round-NNN/`), then the draft trains on those cached states for its share of the steps.
"On-policy" is the teacher's policy: under greedy speculative decoding the emitted tokens are the
teacher's greedy tokens whatever the draft proposes, so the teacher's own greedy continuations ARE
the serving distribution (dspark-algorithm.md §2.8; the SDDD card's batch-alternating scheduler);
the draft never decodes inside the loop.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from dspark_hub import schemas
from dspark_hub.errors import UsageError
from dspark_hub.format.jsonio import load_json_object, loads_strict
from dspark_hub.format.provenance import TRAINING_ARGS_NAME, TRAINING_ARGS_PATHS, public_args
from dspark_hub.format.writer import atomic_dir, atomic_file, check_writable
from dspark_hub.progress import Progress, announce_total
from dspark_hub.train import objective
from dspark_hub.train.rollouts import RolloutData, make_rollouts
from dspark_hub.train.teacher import read_lm_head

LOG_NAME = "training_log.jsonl"


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
    force: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def public_dict(self) -> dict[str, Any]:
        """`to_dict()` as published in `training_args.json`: Hub ids or digests instead of local paths."""
        return public_args(self.to_dict(), TRAINING_ARGS_PATHS, drop=("out", "state_dir"), weights=("base",))

    @property
    def state_path(self) -> Path:
        return Path(self.state_dir) if self.state_dir else Path(f"{self.out}.state")


@dataclass(frozen=True)
class TrainResult:
    """What a finished run wrote and measured."""

    path: str
    steps: int
    tokens: int
    seconds: float
    final_loss: float | None
    state_dir: str
    world_size: int
    eval: dict[str, Any] | None

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"schema": schemas.command("finetune"), "path": self.path, "steps": self.steps, "tokens": self.tokens,
                "seconds": self.seconds, "tokens_per_second": self.tokens_per_second, "final_loss": self.final_loss,
                "state_dir": self.state_dir, "world_size": self.world_size, "eval": self.eval}


def chunkable_draft_logits(model: nn.Module, lm_head_weight: torch.Tensor, hidden: torch.Tensor,
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

    def __init__(self, model: nn.Module, block_size: int, *, terms: list[str], gamma: float,
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
        targets = SimpleNamespace(final_hidden=final_hidden, loss_mask=loss_mask)
        if chunked:
            draft_logits, inputs = chunkable_draft_logits(self.model, lm_head_weight, out.last_hidden_state,
                                                          out.prev_ids)
            sums = objective.chunked_loss_sums(draft_logits, inputs, out.confidence_logits, out.labels,
                                               out.target_positions, targets, lm_head_weight, terms=self.terms,
                                               gamma=self.gamma, chunk_rows=self.loss_chunk)
        else:
            with torch.autocast(context_states.device.type, enabled=False):
                sums = objective.loss_sums(out.logits.float(), out.confidence_logits, out.labels,
                                           out.target_positions, targets, lm_head_weight, terms=self.terms,
                                           gamma=self.gamma)
        return sums.terms, sums.weight, sums.stats


def init_distributed() -> tuple[int, int]:
    """(rank, world size); joins the process group when launched by torchrun."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not dist.is_initialized():
        dist.init_process_group(backend="nccl" if torch.cuda.is_available() else "gloo")
    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


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


class Trainer:
    """Holds the model, optimizer and schedule of one run; `fit()` runs it."""

    def __init__(self, config: TrainConfig, progress: Progress | None = None) -> None:
        from dspark_hub.modeling import load_checkpoint

        self.config = config
        self.progress = progress
        self.loss_weights = objective.parse_loss(config.loss)
        self.rank, self.world = init_distributed()
        if config.batch_size < self.world:
            raise UsageError(f"{config.batch_size} is smaller than the {self.world} ranks; "
                             "each rank needs at least one sequence", param="batch_size")
        check_writable(Path(config.out), force=config.force)
        torch.manual_seed(config.seed)
        loaded = load_checkpoint(config.base, dtype=torch.float32)
        self.base_config = loaded.config
        self.model = loaded.model
        self.model.embed_tokens.weight.requires_grad_(False)
        self.model.train()
        self.save_dtype = getattr(torch, self.base_config.get("torch_dtype") or "bfloat16")
        self.lm_head = read_lm_head(self._teacher_path()).float()
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
        self.state_dir = config.state_path
        if self.rank == 0:
            self.state_dir.mkdir(parents=True, exist_ok=True)

    # -- setup -----------------------------------------------------------------------------

    def _teacher_path(self) -> str:
        if self.config.teacher:
            return self.config.teacher
        if self.config.data:
            teacher = RolloutData(self.config.data).teacher_path
            if teacher:
                return teacher
        raise UsageError("no teacher; pass `teacher` (its lm_head gives the target distributions)")

    def _wrap(self, step: DraftStep) -> nn.Module:
        if self.world == 1:
            return step
        if self.config.fsdp:
            from torch.distributed.fsdp import fully_shard

            for layer in step.model.layers:
                fully_shard(layer)
            return fully_shard(step)
        from torch.nn.parallel import DistributedDataParallel

        uses_confidence = bool(self.model.confidence_head is not None and self.config.alpha)
        return DistributedDataParallel(step, find_unused_parameters=not uses_confidence)

    def _total_steps(self) -> int:
        config = self.config
        if config.steps:
            return config.steps
        if config.on_policy or not config.epochs:
            raise UsageError("no step count; pass `steps` (or `epochs` with `data`)")
        count = len(RolloutData(config.data))
        return max(1, int(config.epochs * max(1, count // config.batch_size)))

    # -- one step ----------------------------------------------------------------------------

    def train_step(self, data: Any, local_step: int) -> dict[str, Any]:
        config = self.config
        indices = batch_indices(len(data), config.batch_size, local_step, config.seed)
        rollouts = [data[i] for i in indices[self.rank::self.world]]
        anchors = [objective.sample_anchors(r.loss_mask, config.max_anchors,
                                            objective.anchor_seed(config.seed, self.step, r.prompt_index))
                   for r in rollouts]
        batch = objective.collate(rollouts, anchors)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=config.dtype == "bf16"):
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
        return self._log_entry(sums, global_weight, float(grad_norm), lr, batch.tokens)

    def _log_entry(self, sums: objective.LossSums, global_weight: torch.Tensor, grad_norm: float, lr: float,
                   tokens: int) -> dict[str, Any]:
        names = sorted(sums.terms)
        packed = torch.stack([sums.terms[n].detach().float() for n in names]
                             + [sums.stats[k].float() for k in ("accuracy", "overlap", "slots")]
                             + [torch.tensor(float(tokens))])
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

    def save_state(self) -> Path:
        """Write `state_dir/step-NNNNNN.pt` (rank 0) and point `latest.json` at it."""
        model_state, optim_state = self._state_dicts()
        path = self.state_dir / f"step-{self.step:06d}.pt"
        if self.rank == 0:
            state = {"model": model_state, "optimizer": optim_state, "scheduler": self.scheduler.state_dict(),
                     "step": self.step, "tokens": self.tokens, "rng": torch.get_rng_state(),
                     "config": self.config.to_dict()}
            with atomic_file(path, force=True) as handle:
                torch.save(state, handle)
            with atomic_file(self.state_dir / "latest.json", force=True, mode="w") as handle:
                json.dump({"step": self.step, "file": path.name}, handle)
        _barrier()
        return path

    def load_state(self) -> bool:
        """Restore the latest saved state; False when there is none."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

        pointer = self.state_dir / "latest.json"
        if not pointer.is_file():
            return False
        state = torch.load(self.state_dir / load_json_object(pointer)["file"], weights_only=False)
        set_state_dict(self.module, self.optimizer, model_state_dict=state["model"],
                       optim_state_dict=state["optimizer"], options=StateDictOptions(full_state_dict=True))
        self.scheduler.load_state_dict(state["scheduler"])
        self.step, self.tokens = state["step"], state["tokens"]
        torch.set_rng_state(state["rng"])
        if self.rank == 0:
            self._truncate_log(self.step)
        return True

    def _truncate_log(self, step: int) -> None:
        log = self.state_dir / LOG_NAME
        if log.is_file():
            kept = [line for line in log.read_text().splitlines()
                    if loads_strict(line, path=str(log))["step"] <= step]
            log.write_text("".join(line + "\n" for line in kept))

    def log(self, entry: dict[str, Any]) -> None:
        if self.rank == 0:
            with open(self.state_dir / LOG_NAME, "a", encoding="utf-8") as handle:
                handle.write(json.dumps(entry) + "\n")

    # -- loop --------------------------------------------------------------------------------

    def run_steps(self, data: Any, start: int, stop: int, round_index: int | None = None) -> None:
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
        if not due or config.fsdp:
            return
        if self.rank == 0:
            from dspark_hub.train.evaluate import measure_draft, measure_ngram

            data = RolloutData(config.eval_data)
            self.last_eval = {**measure_draft(self.model, self.lm_head, data, config.block_size).to_dict(),
                              "baseline": measure_ngram(data, config.block_size).overall.to_dict()}
            self.log({"step": self.step, "eval": self.last_eval})
        _barrier()

    def fit(self) -> TrainResult:
        started = time.perf_counter()
        if self.config.resume:
            self.load_state()
        elif self.rank == 0:
            (self.state_dir / LOG_NAME).unlink(missing_ok=True)
        if self.config.on_policy:
            self._fit_on_policy()
        else:
            if not self.config.data:
                raise UsageError("no training data; pass `data` (or `on_policy` with `prompts`)")
            self.run_steps(RolloutData(self.config.data), 0, self.total_steps)
        self.write_output()
        return TrainResult(self.config.out, self.step, self.tokens, time.perf_counter() - started, self.last_loss,
                           str(self.state_dir), self.world, self.last_eval)

    def _fit_on_policy(self) -> None:
        config = self.config
        if not (config.prompts and config.teacher):
            raise UsageError("needs `prompts` and `teacher`", param="on_policy")
        lines = [line for line in Path(config.prompts).read_text(encoding="utf-8").splitlines() if line.strip()]
        rounds = max(1, min(config.rounds, len(lines)))
        for r in range(rounds):
            start, stop = self.total_steps * r // rounds, self.total_steps * (r + 1) // rounds
            if self.step >= stop:
                continue
            folder = self.state_dir / f"round-{r:03d}"
            if self.rank == 0:
                folder.mkdir(parents=True, exist_ok=True)
                chunk = lines[len(lines) * r // rounds:len(lines) * (r + 1) // rounds]
                (folder / "prompts.jsonl").write_text("".join(line + "\n" for line in chunk), encoding="utf-8")
                make_rollouts(config.teacher, folder / "prompts.jsonl", self.base_config, folder / "data",
                              max_new_tokens=config.max_new_tokens)
            _barrier()
            self.run_steps(RolloutData(folder / "data"), start, stop, round_index=r)

    def write_output(self) -> None:
        """Rank 0 writes the draft (base layout and dtype) plus the log and the options, atomically."""
        from dspark_hub.modeling import load_checkpoint, save_checkpoint

        model = self.model
        if self.config.fsdp and self.world > 1:
            model_state, _ = self._state_dicts()
            if self.rank == 0:
                model = load_checkpoint(self.config.base, dtype=torch.float32).model
                model.load_state_dict({k.removeprefix("model."): v for k, v in model_state.items()})
        if self.rank == 0:
            with atomic_dir(self.config.out, force=self.config.force) as tmp:
                save_checkpoint(model, tmp, dtype=self.save_dtype, force=True)
                log = self.state_dir / LOG_NAME
                if log.is_file():
                    shutil.copyfile(log, tmp / LOG_NAME)
                (tmp / TRAINING_ARGS_NAME).write_text(json.dumps(self.config.public_dict(), indent=2) + "\n")
        _barrier()


def finetune(config: TrainConfig, progress: Progress | None = None) -> TrainResult:
    """Run a fine-tuning job (see the module docstring); returns what it wrote and measured."""
    return Trainer(config, progress).fit()
