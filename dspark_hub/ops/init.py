"""`init`: write a conforming k3_dspark checkpoint from a profile or a config (streamed, atomic)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dspark_hub import schemas
from dspark_hub.errors import UsageError
from dspark_hub.format import contract
from dspark_hub.format.contract import TensorSpec
from dspark_hub.format.writer import atomic_dir, check_writable, write_safetensors
from dspark_hub.progress import Progress, announce_total

INIT_STD = 0.02
INIT_KINDS = ("random", "zeros")
_CHUNK_BYTES = 64 << 20


@dataclass(frozen=True)
class InitResult:
    """What `init_checkpoint` wrote."""

    path: Path
    profile: str | None      # None when a config was given instead
    init: str
    seed: int
    weights_bytes: int

    def to_dict(self) -> dict[str, Any]:
        return {"schema": schemas.command("init"), "path": str(self.path), "profile": self.profile,
                "init": self.init, "seed": self.seed, "weights_bytes": self.weights_bytes}


def _is_norm(name: str) -> bool:
    return name.endswith("norm.weight")


def _row_chunks(spec: TensorSpec) -> Iterator[int]:
    """Element counts per piece, whole rows, about 64 MiB each."""
    row = spec.numel // spec.shape[0] if spec.shape and spec.shape[0] else spec.numel
    per = max(1, _CHUNK_BYTES // max(1, row * 2)) * row
    left = spec.numel
    while left > 0:
        n = min(per, left)
        yield n
        left -= n


def init_chunks(kind: str, seed: int) -> Callable[[TensorSpec], Iterator[bytes | memoryview]]:
    """Chunk producer for `init`: norms are ones, biases zeros, matrices N(0, 0.02) or zeros."""
    if kind not in INIT_KINDS:
        raise UsageError(f"{kind!r} is not one of {', '.join(INIT_KINDS)}", param="init")
    import torch

    generator = torch.Generator().manual_seed(seed)

    def produce(spec: TensorSpec) -> Iterator[bytes | memoryview]:
        for n in _row_chunks(spec):
            if _is_norm(spec.name):
                values = torch.ones(n, dtype=torch.bfloat16)
            elif kind == "zeros" or spec.name.endswith(".bias"):
                values = torch.zeros(n, dtype=torch.bfloat16)
            else:
                values = torch.empty(n).normal_(0.0, INIT_STD, generator=generator).to(torch.bfloat16)
            yield values.view(torch.uint8).numpy().data

    return produce


def init_checkpoint(dst: str | os.PathLike[str], *, profile: str = "tiny", config: Mapping[str, Any] | None = None,
                    init: str = "random", seed: int = 0, force: bool = False,
                    progress: Progress | None = None) -> InitResult:
    """Write a conforming checkpoint: `config.json` plus one `model.safetensors`.

    Args:
        dst: output folder (created atomically).
        profile: `kimi-k3` (the full reference shape, 7.12 GB) or `tiny`.
        config: a config to use instead of a profile.
        init: `random` (seeded N(0, 0.02) matrices) or `zeros`; norms are always ones.
        seed: seed for `random`.
        force: replace an existing `dst`.
        progress: called with the number of tensor bytes written (see `dspark_hub.progress`).

    Returns:
        An `InitResult` (`result.path` is the output folder).

    Raises:
        RefusedOverwriteError: `dst` exists and `force` is False (checked before any work).
        UsageError: `init` is not a known kind, or `dst` is the current folder or a parent of it.
    """
    check_writable(Path(dst), force=force)
    cfg = dict(config) if config is not None else contract.profile_config(profile)
    specs = list(contract.roster(cfg).values())
    chunks = init_chunks(init, seed)
    announce_total(progress, sum(s.nbytes for s in specs))
    with atomic_dir(dst, force=force) as tmp:
        (tmp / contract.CONFIG_NAME).write_bytes(contract.config_bytes(cfg))
        write_safetensors(tmp / contract.WEIGHTS_NAME, specs, chunks, metadata=contract.TORCHSPEC_METADATA,
                          progress=progress)
    out = Path(dst)
    return InitResult(path=out, profile=profile if config is None else None, init=init, seed=seed,
                      weights_bytes=(out / contract.WEIGHTS_NAME).stat().st_size)
