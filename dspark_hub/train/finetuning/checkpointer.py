"""Training states (`state_dir/step-NNNNNN.pt`) and the full weights the output is written from.

Every `save_every` steps the full training state (weights, optimizer, scheduler, step, tokens,
RNG, options) goes to `state_dir/step-NNNNNN.pt`, and once it is complete (written to a temporary
sibling, renamed, and `latest.json` pointing at it) the states beyond the newest `keep_states`
are deleted (0 keeps them all), so there is always at least one complete state. States are
gathered once into full state dicts and written by rank 0; under torchrun rank 0 alone reads a
state back and broadcasts it (each rank keeps its own shard under FSDP2).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, cast

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
    set_state_dict,
)

from dspark_hub.errors import UsageError
from dspark_hub.format.jsonio import load_json_object
from dspark_hub.format.writer import atomic_file
from dspark_hub.train.finetuning.distributed import barrier

#: State file names: `step-NNNNNN.pt` (NNNNNN the optimizer steps taken).
STATE_PATTERN = re.compile(r"^step-(\d+)\.pt$")
#: What a state holds besides the weights and the optimizer (broadcast as one object under torchrun).
REST = ("scheduler", "step", "tokens", "rng")


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


class Checkpointer:
    """Saves and restores the training state of one run in `state_dir` (None: the run keeps no states)."""

    def __init__(self, state_dir: Path | None, rank: int, world: int, keep: int) -> None:
        self.state_dir = state_dir
        self.rank, self.world, self.keep = rank, world, keep

    def require_dir(self) -> Path:
        if self.state_dir is None:
            raise UsageError("no state folder: pass `save_every`, `resume` or `state_dir`", param="state_dir")
        return self.state_dir

    def make_dir(self) -> None:
        """Rank 0 makes the state folder, once the run starts (a refused run leaves nothing behind)."""
        if self.rank == 0 and self.state_dir is not None:
            self.state_dir.mkdir(parents=True, exist_ok=True)

    def kept(self) -> tuple[str, ...]:
        """The state files on disk, oldest first."""
        return tuple(p.name for p in state_files(self.state_dir)) if self.state_dir is not None else ()

    def save(self, module: nn.Module, optimizer: torch.optim.Optimizer, rest: dict[str, Any]) -> Path:
        """Write `state_dir/step-NNNNNN.pt` (rank 0), point `latest.json` at it, then rotate (`rotate_states`).

        `rest` holds what the state carries besides the weights and the optimizer (`REST`, and the options).
        """
        step = int(rest["step"])
        state_dir = self.require_dir()
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        model_state, optim_state = get_state_dict(module, optimizer, options=options)
        path = state_dir / f"step-{step:06d}.pt"
        if self.rank == 0:
            state = {"model": model_state, "optimizer": optim_state, **rest}
            with atomic_file(path, force=True) as handle:
                torch.save(state, handle)
            with atomic_file(state_dir / "latest.json", force=True, mode="w") as handle:
                json.dump({"step": step, "file": path.name}, handle)
            rotate_states(state_dir, self.keep, latest=path.name)
        barrier()
        return path

    def latest(self) -> Path | None:
        """The state to resume from: `latest.json`'s, else the highest-numbered file; None when there is none."""
        state_dir = self.require_dir()
        pointer = state_dir / "latest.json"
        if pointer.is_file():
            return state_dir / str(load_json_object(pointer)["file"])
        found = state_files(state_dir)
        return found[-1] if found else None

    def load(self, module: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any] | None:
        """Restore the weights and optimizer of the latest state into `module` and `optimizer`; returns the
        rest of it (`REST`: scheduler, step, tokens, RNG), or None when there is no state."""
        file = self.latest()
        if file is None:
            return None
        if dist.is_initialized() and self.world > 1:
            return self._broadcast(file, module, optimizer)
        state = torch.load(file, weights_only=False, map_location="cpu")
        set_state_dict(module, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"],
                       options=StateDictOptions(full_state_dict=True))
        return cast(dict[str, Any], state)

    def _broadcast(self, file: Path, module: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """Rank 0 reads the full state from `file`; the weights and optimizer go to every rank by broadcast
        (each rank keeps its own shard under FSDP2), the small rest (`REST`) as an object.

        One read of a state that can be tens of GB, instead of one per rank (in host memory, at once).
        Returns the small rest.
        """
        state = torch.load(file, weights_only=False, map_location="cpu") if self.rank == 0 else {}
        options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
        set_model_state_dict(module, state.get("model", {}), options=options)
        set_optimizer_state_dict(module, optimizer, state.get("optimizer", {}), options=options)
        rest = [{key: state[key] for key in REST} if self.rank == 0 else None]
        dist.broadcast_object_list(rest, src=0)
        assert rest[0] is not None   # broadcast from rank 0
        return rest[0]


def full_model_state(module: nn.Module, model: nn.Module, rank: int, *,
                     sharded: bool) -> dict[str, torch.Tensor] | None:
    """The draft's full state dict on CPU, gathered once (a collective when `sharded` by FSDP); None off rank 0.

    `module` is what the ranks train (the wrapped `DraftStep`), `model` the draft inside it.
    """
    if sharded and dist.is_initialized():
        state = get_model_state_dict(module, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        tensors = cast(dict[str, torch.Tensor], state)    # a full model state dict holds tensors only
        return {k.removeprefix("model."): v for k, v in tensors.items()} if rank == 0 else None
    if rank != 0:
        return None
    return {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
