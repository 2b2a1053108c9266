"""Fine-tune a speculators DSpark (`finetune --base B`, B saved by `speculators` 0.9.0): drop-in weights.

The model and its loss are the library's (`train.objective_speculators`, equal to speculators
0.9.0's training step). Each step packs the step's sequences into one row the way the library
packs them (document ids, per-document positions), draws the library's anchors
(`library_anchors`) with a generator seeded by (seed, step), and takes one AdamW step over every
trained tensor (fp32 master weights; `--dtype bfloat16` runs the forward under bf16 autocast),
with the k3 trainer's schedule (`objective.cosine_lr`: linear warmup, cosine to `min_lr_ratio`)
and gradient-norm clipping. The same options mean the same things, except:

- `loss`: the library's terms (`kl_div`, `rkl`, `jsd`, `ce`, `tv`, `nla`, `lk_hybrid`; `kl` is read as
  `kl_div`, the same KL(p || q)), reduced as the library reduces them (see `objective_speculators`);
- `block_size`: the base's `block_size` (the model is trained for it); another value is refused (the
  option's default reads as not given);
- `max_anchors`: per sequence, as for k3_dspark; the library draws its anchors over the packed row, so
  a row of `n` sequences gets the library's `max_anchors = n * max_anchors` (`anchors_per_row`).

Data: a rollouts folder (`dspark-hub rollouts --draft-config B/config.json`), vLLM extraction files
or speculators' `prepare-data` + `generate-offline-data` output (`hidden_state_files`). Their final
states are the target's lm_head input (after its final norm), so rows are `final_normed`. The
taps are B's `aux_hidden_state_layer_ids` in our convention (`draft_taps.tap_view`, through
`format.taps`); a folder recorded at other taps or another hidden size is refused naming it.

Output: B's own files with the trained weights: the same tensor names, dtypes (cast back to B's),
header bytes and `__metadata__`, sharding and index, `config.json` byte for byte; the frozen tensors
(a pruned vocabulary's `lm_head`, `d2t`, `t2d`) and every tensor not trained are B's bytes
(`format.writer.write_weights_like`), plus `training_log.jsonl` and `training_args.json`. States
(`save_every`, `resume`) use the k3 trainer's files and rotation (`step-NNNNNN.pt`, `latest.json`).
Not here (refused in one line): on-policy rounds, held-out eval during training, torchrun, FSDP and
devices other than the CPU.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from dspark_hub.errors import UsageError
from dspark_hub.format import contract
from dspark_hub.format import speculators as spec_format
from dspark_hub.format.jsonio import read_json_input
from dspark_hub.format.provenance import TRAINING_ARGS_NAME
from dspark_hub.format.writer import atomic_dir, atomic_file, check_writable, write_file, write_weights_like
from dspark_hub.progress import Progress, announce_plan, announce_total
from dspark_hub.train.data.draft_taps import tap_view
from dspark_hub.train.data.hidden_state_files import HiddenStateData, detect_format, open_training_data
from dspark_hub.train.data.rollouts import RolloutData
from dspark_hub.train.finetuning import objective
from dspark_hub.train.finetuning.checkpointer import POINTER_NAME, read_state, resume_file, rotate_states, state_files
from dspark_hub.train.finetuning.config import TrainConfig, default
from dspark_hub.train.finetuning.distributed import peak_memory_bytes
from dspark_hub.train.finetuning.draft_step import batch_indices
from dspark_hub.train.finetuning.objective_speculators import (
    Objective,
    PackedRow,
    SpeculatorsDSparkTrainer,
    library_anchors,
)
from dspark_hub.train.finetuning.plan import TrainPlan, packed_step_plan
from dspark_hub.train.finetuning.trainer import TrainResult
from dspark_hub.train.finetuning.training_log import TrainingLog
from dspark_hub.train.target.generate import Rollout
from dspark_hub.train.target.target import Target

#: Our k3_dspark term names the library spells otherwise (the same quantity).
LOSS_ALIASES = {"kl": "kl_div"}


def library_objective(config: TrainConfig) -> Objective:
    """The library's objective from the run's `loss`, `gamma`, `alpha` and `max_anchors` (its per-row budget for a
    batch of `batch_size` sequences: `anchors_per_row`)."""
    loss = {LOSS_ALIASES.get(name, name): float(weight) for name, weight in config.loss.items()}
    if config.max_anchors <= 0:
        raise UsageError(f"{config.max_anchors}; give the anchors per sequence (> 0)", param="max_anchors")
    return Objective(loss=loss, gamma=config.gamma, alpha=config.alpha, confidence_target=config.confidence_target,
                     max_anchors=anchors_per_row(config.max_anchors, config.batch_size))


def anchors_per_row(per_sequence: int, sequences: int) -> int:
    """The library's `max_anchors` (a packed row's) for a row of `sequences` sequences, `per_sequence` each:
    `--anchors` means anchors per sequence whatever the base's format."""
    return per_sequence * sequences


def refuse_unsupported(config: TrainConfig) -> None:
    """One line naming the first option a speculators run does not take (before anything is read)."""
    if "WORLD_SIZE" in os.environ and int(os.environ["WORLD_SIZE"]) > 1:
        raise UsageError("a speculators DSpark trains in one process here; run it without torchrun", param="base")
    unsupported = ((config.on_policy, "on_policy", "record rollouts first, then train on them"),
                   (config.fsdp, "fsdp", "it trains in one process"),
                   (config.eval_data, "eval_data", "measure the output with eval"))
    for given, name, instead in unsupported:
        if given:
            raise UsageError(f"not available for a speculators DSpark base yet; {instead}", param=name)
    if config.device not in (None, "cpu"):
        raise UsageError(f"{config.device!r}: a speculators DSpark trains on the CPU here", param="device")
    if config.keep_states < 0:
        raise UsageError(f"{config.keep_states}; keep the newest N states (N >= 1), or 0 to keep them all",
                         param="keep_states")


def read_base(base: str) -> dict[str, Any]:
    """B's config, refused in one line when it is no speculators DSpark this trainer can build."""
    from dspark_hub.verify.speculators import check_config

    where = Path(base) / contract.CONFIG_NAME
    config = read_json_input(where, what="a speculators DSpark checkpoint folder that holds config.json", param="base")
    if not spec_format.is_dspark(config):
        raise UsageError(f"{where}: {spec_format.TYPE_KEY} is {config.get(spec_format.TYPE_KEY)!r}; finetune trains "
                         "a k3_dspark or a speculators DSpark", param="base")
    if "mask_token_id" not in config:
        raise UsageError(f"{where}: no mask_token_id; the draft's blocks are [anchor, mask, ...], so write the mask "
                         "token it was built with", param="base")
    errors = [f for f in check_config(config) if f.severity == "error"]
    if errors:
        raise UsageError(f"{where}: {errors[0].where}: {errors[0].message}; {errors[0].hint}", param="base")
    return config


def serving_warnings(config: Mapping[str, Any]) -> list[str]:
    """What `verify` warns about serving this config (a gated or rnn Markov head vLLM will not load, ...)."""
    from dspark_hub.verify.speculators import check_config

    return [f"{f.where}: {f.message}; {f.hint}" for f in check_config(config)
            if f.severity == "warning" and f.code == "SERVING_UNSUPPORTED"]


def check_block_size(config: TrainConfig, base_config: Mapping[str, Any], base: str) -> int:
    """B's block size; a run that asks for another one is refused (the model is trained for its own)."""
    block = int(base_config.get("block_size", spec_format.DEFAULTS["block_size"]))
    if config.block_size not in (block, default("block_size")):
        raise UsageError(f"{config.block_size}: {base}/config.json trains blocks of {block} (its block_size); "
                         "leave the option out for a speculators DSpark", param="block_size")
    return block


def check_recorded_taps(data: RolloutData, view: Mapping[str, Any]) -> None:
    """A rollouts folder recorded at the draft's taps and hidden size, else one line naming the folder."""
    settings = data.manifest.get("settings", {})
    for key in ("target_layer_ids", "target_hidden_size"):
        if settings.get(key) != view[key]:
            raise UsageError(f"{data.folder}: recorded {key} {settings.get(key)}, the draft reads {view[key]} "
                             "(aux_hidden_state_layer_ids as our ids); record the rollouts with this draft's "
                             "config.json", param="data")


def packed_row(rollouts: Sequence[Rollout]) -> PackedRow:
    """The step's sequences as one of the library's packed rows (final states already normed)."""
    return PackedRow(
        taps=torch.cat([r.aux_hidden_states for r in rollouts]),
        input_ids=torch.cat([r.input_ids.long() for r in rollouts]),
        loss_mask=torch.cat([r.loss_mask for r in rollouts]).float(),
        last_hidden=torch.cat([r.final_hidden_states for r in rollouts]),
        document_ids=torch.cat([torch.full((r.input_ids.shape[0],), i, dtype=torch.long)
                                for i, r in enumerate(rollouts)]),
        positions=torch.cat([torch.arange(r.input_ids.shape[0]) for r in rollouts]),
        final_normed=True)


def read_target(target: Target) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The target's input embedding, lm_head and final norm weight (float32), read from its files."""
    return target.embedding().float(), target.lm_head().float(), target.final_norm().weight.float()


def check_roster(base: str, config: Mapping[str, Any], tensors: Mapping[str, torch.Tensor]) -> None:
    """B holds exactly the tensors its config implies (a tap or hidden-size mismatch shows in `fc.weight`)."""
    roster = spec_format.roster(config, dtype=None)
    for name in sorted(set(roster) | set(tensors)):
        if name not in tensors:
            raise UsageError(f"{base}: no tensor {name}; its config implies it ('dspark-hub verify {base}')",
                             param="base")
        if name not in roster:
            raise UsageError(f"{base}: {name} is not in the roster its config implies ('dspark-hub verify {base}')",
                             param="base")
        if tuple(tensors[name].shape) != roster[name].shape:
            raise UsageError(f"{base}: {name} is {list(tensors[name].shape)}, its config implies "
                             f"{list(roster[name].shape)} ('dspark-hub verify {base}')", param="base")


class SpeculatorsFinetune:
    """One run: the library's model and loss on our data, AdamW, the cosine schedule; `fit()` runs it."""

    def __init__(self, config: TrainConfig, progress: Progress | None = None) -> None:
        from dspark_hub.modeling.speculators_dspark import read_tensors

        self.config, self.progress = config, progress
        refuse_unsupported(config)
        config.refuse_own_inputs()
        self.out_checked = check_writable(Path(config.out), force=config.force)
        self.base_config = read_base(config.base)
        self.block_size = check_block_size(config, self.base_config, config.base)
        self.objective = library_objective(config)
        self.warnings = serving_warnings(self.base_config)
        if not config.data:
            raise UsageError("no training data; pass `data`", param="data")
        target = config.target or (RolloutData(config.data, param="data").target_path
                                     if detect_format(config.data, param="data") == "rollouts" else None)
        if not target:
            raise UsageError("no target; pass `target` (its embedding, lm_head and final norm)", param="target")
        config.refuse_own_inputs(target)
        self.target = Target.open(target, param="target")
        self.view = tap_view(self.base_config, self.target.config,
                             where=str(Path(config.base) / contract.CONFIG_NAME), target=self.target.path)
        self.data: RolloutData | HiddenStateData = open_training_data(
            config.data, draft_config=self.view, target=self.target, layer_ids=config.data_layer_ids,
            param="data")
        if isinstance(self.data, RolloutData):
            check_recorded_taps(self.data, self.view)
        self.total_steps = self._total_steps()
        tensors = read_tensors(config.base)
        check_roster(config.base, self.base_config, tensors)
        self.base_dtypes = {name: t.dtype for name, t in tensors.items()}
        torch.manual_seed(config.seed)
        self.model = SpeculatorsDSparkTrainer(
            self.base_config, {n: t.float() if t.is_floating_point() else t for n, t in tensors.items()},
            *read_target(self.target))
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=config.lr, betas=config.betas,
                                           weight_decay=config.weight_decay)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda s: objective.cosine_lr(
            s, total=self.total_steps, warmup=config.warmup, min_ratio=config.min_lr_ratio))
        self.state_dir = config.state_path if (config.save_every or config.resume or config.state_dir) else None
        self.step = self.tokens = self.peak_memory = self.trained_anchors = self.trained_slots = 0
        self.last_loss: float | None = None
        self.plan: TrainPlan | None = None
        self.log = TrainingLog(self.state_dir, rank=0)

    def _total_steps(self) -> int:
        config = self.config
        if config.steps:
            return config.steps
        if not config.epochs:
            raise UsageError("no step count; pass `steps` (or `epochs`)", param="steps")
        return max(1, int(config.epochs * max(1, len(self.data) // config.batch_size)))

    # -- one step --------------------------------------------------------------------------

    def anchors(self, row: PackedRow, sequences: int) -> torch.Tensor:
        """The library's anchors for this step's row of `sequences` sequences (`max_anchors` each, drawn over the
        row), from a generator seeded by (seed, step)."""
        generator = torch.Generator().manual_seed(objective.anchor_seed(self.config.seed, self.step, 0))
        budget = anchors_per_row(self.config.max_anchors, sequences)
        return library_anchors(row.loss_mask, budget, self.block_size, generator)

    def train_step(self) -> dict[str, Any]:
        config = self.config
        started = time.perf_counter()
        indices = batch_indices(len(self.data), config.batch_size, self.step, config.seed)
        row = packed_row([self.data[i] for i in indices])
        anchors = self.anchors(row, len(indices))
        if anchors.numel() == 0:
            raise UsageError(f"{self.data.folder}: step {self.step + 1}'s sequences have no supervised position "
                             f"before their last {self.block_size} tokens; give longer sequences", param="data")
        if self.plan is None:
            self.plan = self.plan_for(row, anchors, sequences=len(indices))
            announce_plan(self.progress, self.plan)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=config.bf16):
            result = self.model.loss(row, anchors, self.objective)
        self.optimizer.zero_grad(set_to_none=True)
        result.total.backward()
        params = self.model.parameters()
        grad_norm = torch.nn.utils.clip_grad_norm_(params, config.clip) if config.clip else torch.tensor(0.0)
        lr = self.scheduler.get_last_lr()[0]
        self.optimizer.step()
        self.scheduler.step()
        tokens, slots = int(row.loss_mask.sum()), int(result.mask.sum())
        seconds = time.perf_counter() - started
        peak = peak_memory_bytes(torch.device("cpu"))
        self.peak_memory = max(self.peak_memory, peak)
        self.tokens += tokens
        self.trained_anchors += int(anchors.numel())
        self.trained_slots += slots
        self.last_loss = float(result.total.detach())
        mask = result.mask
        overlap = float((result.accept_rate * mask).sum() / mask.sum().clamp_min(1.0))
        terms = {name.removesuffix("_loss"): float(value.detach()) for name, value in result.terms.items()}
        if result.confidence is not None:
            terms["confidence"] = float(result.confidence.detach())
        return {"step": self.step + 1, "loss": self.last_loss, **terms, "lr": float(lr), "grad_norm": float(grad_norm),
                "overlap": overlap, "anchors": int(anchors.numel()), "slots": slots, "tokens": tokens,
                "step_seconds": seconds,
                "tokens_per_second": tokens / seconds if seconds else 0.0, "peak_memory_bytes": peak, "device": "cpu"}

    def plan_for(self, row: PackedRow, anchors: torch.Tensor, *, sequences: int) -> TrainPlan:
        """What a step on `row` with `anchors` costs and needs (`plan.packed_step_plan`), before step 1."""
        model = self.model
        keys = model.block_keys(row, anchors)
        _, target_rows = model.slot_rows(anchors, row.input_ids.shape[0])
        trained = sum(t.numel() for t in model.parameters())
        frozen = sum(t.numel() for t in model.weights.values()) - trained
        return packed_step_plan(model.geometry, sequences=sequences, positions=int(row.input_ids.shape[0]),
                                supervised_tokens=int(row.loss_mask.sum()), anchors=int(anchors.numel()),
                                block_size=self.block_size, attention_keys=sum(keys) * self.block_size,
                                widest_keys=max(keys), target_rows=int(torch.unique(target_rows).numel()),
                                trained_parameters=trained, frozen_parameters=frozen, bf16=self.config.bf16,
                                supervised_slots=int(model.slot_mask(row, anchors).sum()), steps=self.total_steps)

    # -- states ----------------------------------------------------------------------------------

    def save_state(self) -> Path:
        """`state_dir/step-NNNNNN.pt` (trained tensors, optimizer, schedule, step, RNG), `latest.json`, rotation."""
        assert self.state_dir is not None
        path = self.state_dir / f"step-{self.step:06d}.pt"
        state = {"model": {n: t.detach() for n, t in self.model.named_trainable().items()},
                 "optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
                 "step": self.step, "tokens": self.tokens, "anchors": self.trained_anchors,
                 "slots": self.trained_slots, "rng": torch.get_rng_state(),
                 "config": self.config.to_dict()}
        with atomic_file(path, force=True) as handle:
            torch.save(state, handle)
        with atomic_file(self.state_dir / POINTER_NAME, force=True, mode="w") as handle:
            json.dump({"step": self.step, "file": path.name}, handle)
        rotate_states(self.state_dir, self.config.keep_states, latest=path.name)
        return path

    def load_state(self) -> bool:
        """Continue from the latest state (`latest.json`, else the newest file); False when there is none."""
        assert self.state_dir is not None
        file = resume_file(self.state_dir)
        if file is None:
            return False
        state = read_state(file, ("model", "optimizer", "scheduler", "step", "tokens", "rng"))
        with torch.no_grad():
            for name, tensor in self.model.named_trainable().items():
                tensor.copy_(state["model"][name])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.step, self.tokens = state["step"], state["tokens"]
        # states written before the counts were kept say nothing of them: the result counts from the resume
        self.trained_anchors, self.trained_slots = state.get("anchors", 0), state.get("slots", 0)
        torch.set_rng_state(state["rng"])
        self.log.truncate(self.step)
        return True

    # -- the run -------------------------------------------------------------------------------

    def fit(self) -> TrainResult:
        started = time.perf_counter()
        if self.state_dir is not None:
            self.state_dir.mkdir(parents=True, exist_ok=True)
            if not (self.config.resume and self.load_state()):
                self.log.restart()
        announce_total(self.progress, self.total_steps - self.step)
        if self.step == 0 and self.warnings:
            self.log.append({"step": 0, "warnings": self.warnings})
        while self.step < self.total_steps:
            entry = self.train_step()
            self.step += 1
            self.log.append(entry)
            if self.progress:
                self.progress(1)
            if self.config.save_every and self.step % self.config.save_every == 0:
                self.save_state()
        self.write_output()
        states = tuple(p.name for p in state_files(self.state_dir)) if self.state_dir is not None else ()
        return TrainResult(self.config.out, self.step, self.tokens, time.perf_counter() - started, self.last_loss,
                           None if self.state_dir is None else str(self.state_dir), 1, None, "cpu",
                           self.peak_memory, (), self.plan, states, warnings=tuple(self.warnings),
                           anchors=self.trained_anchors, supervised_slots=self.trained_slots)

    def trained_bytes(self) -> dict[str, bytes]:
        """Each trained tensor cast back to B's dtype, as the bytes B stores it in."""
        out = {}
        for name, tensor in self.model.named_trainable().items():
            cast = tensor.detach().to(self.base_dtypes[name]).contiguous()
            out[name] = cast.view(-1).view(torch.uint8).numpy().tobytes()
        return out

    def write_output(self) -> None:
        """B's files with the trained weights (`write_weights_like`), the log and the options, atomically."""
        with atomic_dir(self.config.out, force=self.config.force, checked=self.out_checked) as tmp:
            write_weights_like(self.config.base, tmp, self.trained_bytes())
            self.log.copy_into(tmp)
            trained = replace(self.config, block_size=self.block_size)      # the block size B trains with
            write_file(tmp / TRAINING_ARGS_NAME, json.dumps(trained.public_dict(), indent=2) + "\n")


def finetune_speculators(config: TrainConfig, progress: Progress | None = None) -> TrainResult:
    """Fine-tune a speculators DSpark base (see the module docstring); returns what it wrote and measured."""
    return SpeculatorsFinetune(config, progress).fit()
