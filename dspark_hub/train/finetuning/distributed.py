"""The ranks of a `finetune` run: device, process group, collectives, and the DDP / FSDP2 wrapping.

One process, or one per rank under `torchrun`. The rank's device is `device` (default `cuda` when
torch sees a GPU, else `cpu`), indexed by `LOCAL_RANK` under torchrun; nccl carries device
tensors on GPUs, gloo on CPU. Every collective here is a no-op without a process group.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import cast

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel

from dspark_hub.errors import UsageError
from dspark_hub.train.target.engines import peak_rss_bytes


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


@contextmanager
def leaving_process_group() -> Iterator[None]:
    """Runs the body; when it returns, leaves the process group it joined (a group joined before stays the
    caller's). A gloo group left to the interpreter's exit can abort a rank as it ends (SIGABRT, "terminate
    called without an active exception": 5 of 20 two-rank launches on torch 2.13's CPU build, 0 of 20 with the
    group destroyed). Not after an error: destroying while another rank waits in a collective can hang."""
    joined_before = dist.is_initialized()
    yield
    if dist.is_initialized() and not joined_before:
        dist.destroy_process_group()


def peak_memory_bytes(device: torch.device) -> int:
    """Peak memory on `device` since the last call: CUDA's peak allocated bytes, else the process's peak RSS."""
    if device.type == "cuda":
        peak = int(torch.cuda.max_memory_allocated(device))
        torch.cuda.reset_peak_memory_stats(device)
        return peak
    return peak_rss_bytes()


def all_reduce(tensor: torch.Tensor) -> torch.Tensor:
    """`tensor` summed over the ranks, in place (itself without a process group)."""
    if dist.is_initialized():
        dist.all_reduce(tensor)
    return tensor


def barrier() -> None:
    """Wait for every rank (nothing to wait for without a process group)."""
    if dist.is_initialized():
        dist.barrier()


def is_distributed() -> bool:
    """A process group is up (the run has ranks to wrap for, gather from and broadcast to)."""
    return dist.is_initialized()


def wrap(step: nn.Module, layers: nn.ModuleList, device: torch.device, world: int, *, fsdp: bool,
         find_unused_parameters: bool) -> nn.Module:
    """`step` as the ranks train it: itself in one process; FSDP2 `fully_shard` over a device mesh
    (each of `layers`, then `step`) with `fsdp`; else DDP (with `device_ids` on CUDA)."""
    if not dist.is_initialized():
        return step
    if fsdp:
        mesh = init_device_mesh(device.type, (world,))
        for layer in layers:
            fully_shard(layer, mesh=mesh)
        # fully_shard returns `step` itself, its class swapped for an FSDPModule subclass
        return cast(nn.Module, fully_shard(step, mesh=mesh))
    device_ids = [device.index] if device.type == "cuda" else None
    return DistributedDataParallel(step, device_ids=device_ids, find_unused_parameters=find_unused_parameters)
