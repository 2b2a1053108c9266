"""Training states (`state_dir/step-NNNNNN.pt`) and the full weights the output is written from.

Every `save_every` steps the full training state (weights, optimizer, scheduler, step, tokens,
RNG, options) goes to `state_dir/step-NNNNNN.pt`, and once it is complete (written to a temporary
sibling, renamed, and `latest.json` pointing at it) the states beyond the newest `keep_states`
are deleted (0 keeps them all), so there is always at least one complete state. States are
gathered once into full state dicts and written by rank 0; under torchrun rank 0 alone reads a
state back and broadcasts it (each rank keeps its own shard under FSDP2).

A state is read back as data only (`read_state`: `torch.load(weights_only=True)`: tensors, numbers,
strings and containers; a pickle that would import anything else is refused before it runs), and
only from the state folder itself: `latest.json` must name a `step-NNNNNN.pt` there (no path, no
`..`), and neither it nor the state may be a link (`resume_file`).
"""

from __future__ import annotations

import json
import os
import re
import stat
import warnings
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

from dspark_hub._text import short_json, shortened
from dspark_hub.errors import CheckpointFormatError, UsageError
from dspark_hub.format.folder import open_regular
from dspark_hub.format.jsonio import load_json_object
from dspark_hub.format.writer import atomic_file
from dspark_hub.train.finetuning.distributed import barrier
from dspark_hub.train.target.target import weights_only_refusal

#: State file names: `step-NNNNNN.pt` (NNNNNN the optimizer steps taken).
STATE_PATTERN = re.compile(r"^step-(\d+)\.pt$")
#: What a state holds besides the weights and the optimizer (broadcast as one object under torchrun).
REST = ("scheduler", "step", "tokens", "rng")
#: The state folder's pointer to its newest complete state: `{"step": N, "file": "step-NNNNNN.pt"}`.
POINTER_NAME = "latest.json"


def _is_regular(path: Path) -> bool:
    """A regular file itself (not a link to one, not a FIFO)."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def state_files(state_dir: Path) -> list[Path]:
    """The complete states in `state_dir` (`step-NNNNNN.pt`, regular files, not links), oldest first."""
    if not state_dir.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in state_dir.iterdir() if (m := STATE_PATTERN.match(p.name)) and _is_regular(p)]
    return [p for _, p in sorted(found)]


def resume_file(state_dir: Path) -> Path | None:
    """The state to resume from: the one `latest.json` names, else the newest state file; None when there is none.

    Raises:
        UsageError: `latest.json` is not a regular file holding a JSON object, or its `file` is not the
            name of a state file (`step-NNNNNN.pt`, a regular file) in `state_dir` itself: an absolute path,
            `..`, a subfolder or a link would load a file from elsewhere.
    """
    pointer = state_dir / POINTER_NAME
    if not os.path.lexists(pointer):
        odd = sorted(p for p in state_dir.iterdir() if STATE_PATTERN.match(p.name) and not _is_regular(p))
        if odd:
            raise UsageError(f"{odd[0]}: is not a regular file (a link, or a special file); a state is a file of "
                             "its own folder; remove it", param="state_dir")
        found = state_files(state_dir)
        return found[-1] if found else None
    fix = "a state pointer names a state file of its own folder (step-NNNNNN.pt); fix or delete it"
    if not _is_regular(pointer):
        raise UsageError(f"{pointer}: is not a regular file (a link, or a special file); {fix}", param="state_dir")
    try:
        name = load_json_object(pointer).get("file")
    except (CheckpointFormatError, OSError) as e:
        raise UsageError(f"{pointer}: {shortened(str(e))}; {fix}", param="state_dir") from None
    if not (isinstance(name, str) and STATE_PATTERN.fullmatch(name)):
        raise UsageError(f"{pointer}: names {short_json(name)} as the latest state; {fix}", param="state_dir")
    if not _is_regular(state_dir / name):
        raise UsageError(f"{pointer}: names {name}, which is not a regular file in {state_dir} (missing, a link "
                         f"or a special file); {fix}", param="state_dir")
    return state_dir / name


def read_state(path: Path, required: tuple[str, ...]) -> dict[str, Any]:
    """A training state written by `finetune`, read as data only: `torch.load(weights_only=True)`.

    Such a load rebuilds tensors, numbers, strings and containers and nothing else: a pickle that
    would import a function or a class is refused before any of it runs.

    Raises:
        UsageError: the file is not a regular file, not a state `torch.save` wrote, holds anything but
            data, or lacks one of the `required` keys (named, with what to do).
    """
    fix = "a state finetune wrote holds tensors and plain values only; delete it, or resume from another state"
    if tuple(int(part) for part in re.findall(r"\d+", torch.__version__)[:2]) < (2, 6):
        raise UsageError(f"{path}: reading a training state needs torch 2.6 or newer (this is {torch.__version__}, "
                         "whose weights-only load can still run code: CVE-2025-32434); upgrade torch",
                         param="state_dir")
    try:
        with open_regular(path) as handle, warnings.catch_warnings():
            warnings.simplefilter("ignore")          # torch warns about pickle protocols on stderr
            state = torch.load(handle, weights_only=True, map_location="cpu")
    except (CheckpointFormatError, OSError) as e:
        raise UsageError(f"{path}: {shortened(str(e))}; {fix}", param="state_dir") from None
    except Exception as e:    # torch.load raises pickle, zip and EOF errors of many types
        raise UsageError(f"{path}: refused ({weights_only_refusal(e)}); nothing in it ran; {fix}",
                         param="state_dir") from None
    missing = [key for key in required if not isinstance(state, dict) or key not in state]
    if missing:
        raise UsageError(f"{path}: not a training state (no {', '.join(missing)}); {fix}", param="state_dir")
    return cast(dict[str, Any], state)


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
            with atomic_file(state_dir / POINTER_NAME, force=True, mode="w") as handle:
                json.dump({"step": step, "file": path.name}, handle)
            rotate_states(state_dir, self.keep, latest=path.name)
        barrier()
        return path

    def latest(self) -> Path | None:
        """The state to resume from (`resume_file`): `latest.json`'s, else the newest file; None when there is none."""
        return resume_file(self.require_dir())

    def load(self, module: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any] | None:
        """Restore the weights and optimizer of the latest state into `module` and `optimizer`; returns the
        rest of it (`REST`: scheduler, step, tokens, RNG), or None when there is no state."""
        file = self.latest()
        if file is None:
            return None
        if dist.is_initialized() and self.world > 1:
            return self._broadcast(file, module, optimizer)
        state = read_state(file, ("model", "optimizer", *REST))
        set_state_dict(module, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"],
                       options=StateDictOptions(full_state_dict=True))
        return state

    def _broadcast(self, file: Path, module: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """Rank 0 reads the full state from `file`; the weights and optimizer go to every rank by broadcast
        (each rank keeps its own shard under FSDP2), the small rest (`REST`) as an object.

        One read of a state that can be tens of GB, instead of one per rank (in host memory, at once).
        Returns the small rest.
        """
        state = read_state(file, ("model", "optimizer", *REST)) if self.rank == 0 else {}
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
