"""Fine-tune k3_dspark weights on target rollouts (`dspark-hub finetune`): the training loop.

One process, or one per rank under `torchrun` (DDP with `device_ids`; `fsdp=True` shards with
FSDP2 `fully_shard` over a device mesh instead; `train.distributed`). The model and every batch
live on the rank's device. The global batch is split across ranks by index; anchors are drawn per
sequence from a seed of (seed, step, prompt index), and loss denominators are summed over ranks,
so N ranks compute the gradient one process computes on the same global batch.

`embed_tokens` is frozen (saved bit-identical). AdamW over the other tensors, linear warmup then
cosine decay to `min_lr_ratio * lr`, gradient-norm clipping, fp32 master weights (`dtype="bfloat16"`
runs the forward under bf16 autocast of the device's type). One step's forward and loss:
`train.draft_step`. Training states, their rotation and `resume`: `train.checkpointer`; the state
folder exists only when states are asked for (`save_every`, `resume`, an explicit `state_dir`) or
on-policy rounds need it for their rollouts. The JSON-lines log: `train.training_log`. Before
step 1 the trainer hands its `progress` callback a `TrainPlan` (`plan.step_plan`: what the step
costs and the memory it needs, estimated from the config and step 1's batch; `announce_plan`), and
returns it in the result. The output is written atomically by rank 0 with
`modeling.save_checkpoint` in the base's layout (names, config key order, safetensors metadata,
dtype), so it passes `verify --drop-in BASE`.

Data (`data`): a rollouts folder, or hidden-state files from vLLM's extraction connector or
speculators' data pipeline (`hidden_state_files.open_training_data` detects which). On-policy
rounds (`on_policy=True, rounds=K`): `train.on_policy`.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from dspark_hub import schemas
from dspark_hub._compat import renamed_keywords
from dspark_hub.documents import Document
from dspark_hub.errors import UsageError, about
from dspark_hub.format import contract
from dspark_hub.format.checkpoint import LocalSource, open_checkpoint
from dspark_hub.format.jsonio import read_json_input
from dspark_hub.format.provenance import TRAINING_ARGS_NAME
from dspark_hub.format.remote_code import require_k3_dspark
from dspark_hub.format.writer import atomic_dir, check_writable, write_file
from dspark_hub.progress import Progress, announce_plan, announce_total
from dspark_hub.train.data.hidden_state_files import HiddenStateData, detect_format, open_training_data
from dspark_hub.train.data.rollouts import RolloutData, read_prompts, require_file
from dspark_hub.train.evaluation.drafters import measure_draft, measure_ngram
from dspark_hub.train.finetuning import objective
from dspark_hub.train.finetuning.checkpointer import Checkpointer, full_model_state, rotate_states, state_files
from dspark_hub.train.finetuning.config import TrainConfig
from dspark_hub.train.finetuning.distributed import (
    all_reduce,
    barrier,
    init_distributed,
    is_distributed,
    peak_memory_bytes,
    resolve_device,
    wrap,
)
from dspark_hub.train.finetuning.draft_step import DraftStep, batch_indices, chunkable_draft_logits
from dspark_hub.train.finetuning.on_policy import fit_on_policy
from dspark_hub.train.finetuning.plan import TrainPlan, step_plan
from dspark_hub.train.finetuning.training_log import LOG_NAME, MEASURED, TrainingLog
from dspark_hub.train.target.target import Target, moved

if TYPE_CHECKING:
    from dspark_hub.modeling import K3DSparkModel

#: The names callers import from here, though they live in the modules the trainer was split into.
__all__ = ["LOG_NAME", "MEASURED", "TrainConfig", "TrainResult", "Trainer", "check_base_embedding",
           "chunkable_draft_logits", "resolve_device", "rotate_states", "state_files"]

#: What a training step reads rollouts from: a rollouts folder, or hidden-state files (speculators, vLLM).
TrainingData = RolloutData | HiddenStateData


@dataclass(frozen=True)
class TrainResult(Document):
    """What a finished run wrote and measured."""

    SCHEMA = schemas.command("finetune")
    KEYS = ("path", "steps", "tokens", "seconds", "tokens_per_second", "final_loss", "state_dir", "world_size", "eval",
            "device", "peak_memory_bytes", "engine_releases", "plan", "states", "warnings", "anchors",
            "supervised_slots")

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
    anchors: int = 0                  # anchors trained, over every step and rank
    supervised_slots: int = 0         # of their block slots, those whose label counted in the loss

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0


@renamed_keywords(teacher="target")
def check_base_embedding(base: str | os.PathLike[str], target: str | os.PathLike[str]) -> str:
    """The base's frozen `embed_tokens.weight` must be the target's embedding, compared as `verify
    --frozen-embed` compares it (streamed; in the draft's dtype, so an F32 target counts through its
    exact BF16 rounding). Runtimes serve the draft with the target's embedding, and training never
    changes the frozen copy, so a draft trained on another embedding learns inputs it never sees.

    Returns:
        The verdict (`bit-identical`, or `identical after BF16 rounding ...`).

    Raises:
        UsageError: the embeddings differ, or the base holds none.
    """
    # verify.deep imports numpy (its byte scan): only a run that starts pays for it
    from dspark_hub.verify.deep import check_frozen_embed

    result = check_frozen_embed(open_checkpoint(LocalSource(base)), target)
    comparison = result.comparison
    if result.draft is None:
        raise UsageError(f"{base}: holds no {contract.FROZEN_TENSORS[0]} to train beside", param="base")
    if not comparison.identical:
        raise UsageError(f"{base}: {contract.FROZEN_TENSORS[0]} is not {comparison.sameness} the target's "
                         f"{result.target_tensor.stored.location} ({comparison.evidence}); the runtime serves the "
                         "draft with the target's embedding, so train from a base that carries it: "
                         "'dspark-hub init DIR --embed-from TARGET'", param="base")
    return str(comparison.verdict)


class Trainer:
    """Holds the model, optimizer and schedule of one run; `fit()` runs it."""

    def __init__(self, config: TrainConfig, progress: Progress | None = None) -> None:
        self.config = config
        self.progress = progress
        self.loss_weights = objective.parse_loss(config.loss)
        self.device = resolve_device(config.device)
        if config.dist_timeout <= 0:
            raise UsageError(f"{config.dist_timeout}; give minutes > 0", param="dist_timeout")
        self.rank, self.world = init_distributed(self.device, config.dist_timeout)
        self._check_options()
        # The cheap inputs first (configs, data, prompts): a mistyped path fails before the base loads.
        self.base_config = read_json_input(Path(config.base) / contract.CONFIG_NAME,
                                     what="a k3_dspark checkpoint folder that holds config.json", param="base")
        with about("base"):
            require_k3_dspark(self.base_config, Path(config.base))    # another format: say so before the data
        self._check_inputs()
        self.data = None if config.on_policy else self._open_data(config.data)
        torch.manual_seed(config.seed)
        self.target = self._target()
        self.model = self._load_model()
        self.lm_head = self.target.lm_head().float().to(self.device)
        self.embedding = check_base_embedding(config.base, self.target.path)
        if config.loss_chunk < 0:
            raise UsageError(f"{config.loss_chunk}; use rows per chunk, or 0 for no chunking", param="loss_chunk")
        step = DraftStep(self.model, config.block_size, terms=list(self.loss_weights), gamma=config.gamma,
                         loss_chunk=config.loss_chunk, confidence_target=config.confidence_target)
        uses_confidence = bool(self.model.confidence_head is not None and config.alpha)
        self.module = wrap(step, self.model.layers, self.device, self.world, fsdp=config.fsdp,
                           find_unused_parameters=not uses_confidence)
        trainable = [p for p in self.module.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(trainable, lr=config.lr, betas=config.betas,
                                           weight_decay=config.weight_decay)
        self.total_steps = self._total_steps()
        if self.rank == 0:
            announce_total(progress, self.total_steps)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda s: objective.cosine_lr(
            s, total=self.total_steps, warmup=config.warmup, min_ratio=config.min_lr_ratio))
        self.step = 0
        self.tokens = self.trained_anchors = self.trained_slots = 0
        self.last_loss: float | None = None
        self.last_eval: dict[str, Any] | None = None
        self.peak_memory = 0
        self.releases: list[str] = []
        self.plan: TrainPlan | None = None
        self.state_dir: Path | None = config.state_path if config.uses_state_dir else None
        self.checkpointer = Checkpointer(self.state_dir, self.rank, self.world, config.keep_states)
        self.training_log = TrainingLog(self.state_dir, self.rank)

    # -- setup -----------------------------------------------------------------------------

    def _check_options(self) -> None:
        """Options that cannot work, refused before anything is read."""
        config = self.config
        if config.batch_size < self.world:
            raise UsageError(f"{config.batch_size} is smaller than the {self.world} ranks; "
                             "each rank needs at least one sequence", param="batch_size")
        config.refuse_own_inputs()
        self.out_checked = check_writable(Path(config.out), force=config.force)
        if config.keep_states < 0:
            raise UsageError(f"{config.keep_states}; keep the newest N states (N >= 1), or 0 to keep them all",
                             param="keep_states")

    def _load_model(self) -> K3DSparkModel:
        """The base draft in float32 on the device, its embedding frozen, in training mode."""
        # modeling imports transformers and registers its classes: only a run that starts pays for it
        from dspark_hub.modeling import load_checkpoint

        loaded = load_checkpoint(self.config.base, dtype=torch.float32)
        self.base_config = loaded.config
        model = moved(loaded.model, self.device)
        model.embed_tokens.weight.requires_grad_(False)
        model.train()
        self.parameter_counts = (sum(p.numel() for p in model.parameters() if p.requires_grad),
                                 sum(p.numel() for p in model.parameters() if not p.requires_grad))
        self.save_dtype = getattr(torch, self.base_config.get("torch_dtype") or "bfloat16")
        return model

    def _target(self) -> Target:
        """The target given, else the one the rollouts folder names (opened once for the run)."""
        if self.given_target is not None:
            return self.given_target
        target = getattr(self.data, "target_path", None)
        if isinstance(target, str) and target:
            self.config.refuse_own_inputs(target)
            return Target.open(target, param="target")
        raise UsageError("no target; pass `target` (its lm_head gives the target distributions)", param="target")

    def _check_inputs(self) -> None:
        """The target's config, on-policy's prompts and the eval data exist, before anything loads."""
        config = self.config
        self.given_target = Target.open(config.target, param="target") if config.target else None
        if config.on_policy:
            if not (config.prompts and config.target):
                raise UsageError("needs `prompts` and `target`", param="on_policy")
            require_file(config.prompts, "a prompts JSONL file", param="prompts")
            read_prompts(config.prompts, self.given_target, param="prompts", budget=config.max_new_tokens)  # every line
        if config.eval_data:
            detect_format(config.eval_data, param="eval_data")

    def _open_data(self, path: str | None) -> TrainingData:
        if not path:
            raise UsageError("no training data; pass `data` (or `on_policy` with `prompts`)", param="data")
        return open_training_data(path, draft_config=self.base_config, target=self.given_target,
                                  layer_ids=self.config.data_layer_ids, param="data")

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
        batch = self._batch(data, local_step)
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=config.bf16):
            sums = objective.LossSums(*self.module(batch.context_states, batch.input_ids, batch.anchors,
                                                   batch.anchor_valid, batch.doc_ids, batch.final_hidden,
                                                   batch.loss_mask, self.lm_head))
        global_weight = all_reduce(sums.weight.clone())
        loss = objective.combine(sums, self.loss_weights, config.alpha, global_weight, self.world)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        params = [p for p in self.module.parameters() if p.requires_grad]
        grad_norm = torch.nn.utils.clip_grad_norm_(params, config.clip) if config.clip else torch.tensor(0.0)
        lr = self.scheduler.get_last_lr()[0]
        self.optimizer.step()
        self.scheduler.step()
        entry = self._log_entry(sums, global_weight, float(grad_norm), float(lr), batch.tokens,
                                int(batch.anchor_valid.sum()))
        seconds = time.perf_counter() - started     # float(grad_norm) above waited for the device
        peak = peak_memory_bytes(self.device)
        self.peak_memory = max(self.peak_memory, peak)
        entry.update(step_seconds=seconds, tokens_per_second=entry["tokens"] / seconds if seconds else 0.0,
                     peak_memory_bytes=peak, device=str(self.device))
        return entry

    def _batch(self, data: TrainingData, local_step: int) -> objective.Batch:
        """This rank's share of the step's global batch, with its anchors, on the device (the plan made
        from it before step 1)."""
        config = self.config
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
        return batch.to(self.device)

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
                         frozen_parameters=frozen, loss_chunk=config.loss_chunk, bf16=config.bf16,
                         world_size=self.world, sharded_states=config.fsdp and self.world > 1,
                         supervised_slots=objective.supervised_slots(batch.loss_mask, batch.anchors, batch.anchor_valid,
                                                                     config.block_size),
                         steps=self.total_steps)

    def _log_entry(self, sums: objective.LossSums, global_weight: torch.Tensor, grad_norm: float, lr: float,
                   tokens: int, anchors: int) -> dict[str, Any]:
        names = sorted(sums.terms)
        counts = torch.tensor([float(tokens), float(anchors)], device=global_weight.device)
        packed = torch.cat([torch.stack([sums.terms[n].detach().float() for n in names]
                                        + [sums.stats[k].float() for k in ("accuracy", "overlap", "slots")]), counts])
        packed = all_reduce(packed)
        weight = float(global_weight.clamp_min(1e-8))
        values = {name: float(packed[i]) / weight for i, name in enumerate(names)}
        accuracy, overlap, slots, tokens_sum, anchors_sum = (float(v) for v in packed[len(names):])
        loss = sum(self.loss_weights[n] * values[n] for n in self.loss_weights)
        loss += self.config.alpha * values.get("confidence", 0.0)
        self.tokens += int(tokens_sum)
        self.trained_anchors += int(anchors_sum)
        self.trained_slots += int(slots)
        self.last_loss = loss
        return {"step": self.step + 1, "loss": loss, **values, "lr": lr, "grad_norm": grad_norm,
                "accuracy": accuracy / max(slots, 1.0), "overlap": overlap / max(slots, 1.0),
                "tokens": int(tokens_sum), "anchors": int(anchors_sum), "slots": int(slots)}

    # -- state and log -------------------------------------------------------------------------

    def save_state(self) -> Path:
        """Write `state_dir/step-NNNNNN.pt` (rank 0), point `latest.json` at it, then rotate (`rotate_states`)."""
        return self.checkpointer.save(self.module, self.optimizer, {
            "scheduler": self.scheduler.state_dict(), "step": self.step, "tokens": self.tokens,
            "anchors": self.trained_anchors, "slots": self.trained_slots,
            "rng": torch.get_rng_state(), "config": self.config.to_dict()})

    def load_state(self) -> bool:
        """Restore the latest saved state (`latest.json`, else the highest-numbered file); False when there is none."""
        rest = self.checkpointer.load(self.module, self.optimizer)
        if rest is None:
            return False
        self.scheduler.load_state_dict(rest["scheduler"])
        self.step, self.tokens = rest["step"], rest["tokens"]
        # states written before the counts were kept say nothing of them: the result counts from the resume
        self.trained_anchors, self.trained_slots = rest.get("anchors", 0), rest.get("slots", 0)
        torch.set_rng_state(rest["rng"])
        self.training_log.truncate(self.step)
        return True

    def log(self, entry: dict[str, Any]) -> None:
        """Append a line to the log (the state folder's `training_log.jsonl`, else memory); rank 0 only."""
        self.training_log.append(entry)

    def log_text(self) -> str:
        """The log so far (what the output's `training_log.jsonl` will hold)."""
        return self.training_log.text()

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
            data = open_training_data(config.eval_data, draft_config=self.base_config, target=self.target,
                                      layer_ids=config.data_layer_ids)
            self.last_eval = {**measure_draft(self.model, self.lm_head, data, config.block_size).to_dict(),
                              "baseline": measure_ngram(data, config.block_size).overall.to_dict()}
            self.log({"step": self.step, "eval": self.last_eval})
        barrier()

    def fit(self) -> TrainResult:
        started = time.perf_counter()
        if self.config.resume:
            self.load_state()
        else:
            self.training_log.restart()
        if self.config.on_policy:
            fit_on_policy(self)
        else:
            assert self.data is not None   # off-policy: opened in __init__
            self.checkpointer.make_dir()
            self.run_steps(self.data, 0, self.total_steps)
        self.write_output()
        return TrainResult(self.config.out, self.step, self.tokens, time.perf_counter() - started, self.last_loss,
                           None if self.state_dir is None else str(self.state_dir), self.world, self.last_eval,
                           str(self.device), self.peak_memory, tuple(self.releases), self.plan,
                           self.checkpointer.kept(), anchors=self.trained_anchors, supervised_slots=self.trained_slots)

    def write_output(self) -> None:
        """Rank 0 writes the draft (base layout and dtype) plus the log and the options, atomically."""
        # modeling imports transformers: only a run that ends pays for it
        from dspark_hub.modeling import load_checkpoint, save_checkpoint

        state = full_model_state(self.module, self.model, self.rank, sharded=self.config.fsdp and is_distributed())
        if self.rank == 0:
            model = load_checkpoint(self.config.base, dtype=torch.float32).model
            assert state is not None   # gathered to rank 0
            model.load_state_dict(state)
            with atomic_dir(self.config.out, force=self.config.force, checked=self.out_checked) as tmp:
                save_checkpoint(model, tmp, dtype=self.save_dtype, force=True)
                self.training_log.copy_into(tmp)
                write_file(tmp / TRAINING_ARGS_NAME, json.dumps(self.config.public_dict(), indent=2) + "\n")
        barrier()

