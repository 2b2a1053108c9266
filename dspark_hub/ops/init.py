"""`init`: write a conforming k3_dspark checkpoint from a profile or a config (streamed, atomic).

The frozen `embed_tokens.weight` is a copy of the target's embedding in a real draft. With
`embed_from=TARGET` it is copied from the target, bit for bit, streamed (never the whole target
in memory), found where the target keeps it (`contract.TARGET_EMBED_NAMES`, single file or
sharded, as `verify --target` finds it), and cast to the draft's BF16 with round to nearest even
when the target stores F32 or F16. Without it the embedding is random (or zeros), and the result
says so (`InitResult.embedding`): pairing checks against the target fail until it is copied.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from dspark_hub import schemas
from dspark_hub.documents import Document
from dspark_hub.errors import UsageError, about
from dspark_hub.format import contract
from dspark_hub.format.contract import TensorSpec
from dspark_hub.format.tensorio import (
    EXACT_CASTS,
    BytesLike,
    TensorLocation,
    cast_chunks,
    cast_text,
    iter_range,
    locate_tensor,
)
from dspark_hub.format.writer import (
    Checked,
    atomic_dir,
    check_writable,
    refuse_own_inputs,
    write_file,
    write_safetensors,
)
from dspark_hub.progress import Progress, announce_total

INIT_STD = 0.02
INIT_KINDS = ("random", "zeros")
_CHUNK_BYTES = 64 << 20
#: Bytes of the target's embedding read at a time (an F32 piece and its BF16 cast stay under ~100 MB).
_EMBED_CHUNK_BYTES = 16 << 20


@dataclass(frozen=True)
class EmbeddingSource(Document):
    """Where the written `embed_tokens.weight` came from."""

    KEYS = ("source=kind", "teacher=target", "teacher_dtype=target_dtype", "cast")

    kind: Literal["teacher", "random", "zeros"]
    target: str | None = None    # `path:tensor` of the target's embedding
    target_dtype: str | None = None
    cast: str | None = None       # e.g. "BF16 rounding (nearest even) of the F32", when the dtypes differ

    @property
    def warning(self) -> str | None:
        """Why a draft with this embedding will not pair with its target (None for a copied one)."""
        if self.kind == "teacher":
            return None
        return (f"embed_tokens.weight is {self.kind}, not the target's embedding: a draft shares its target's "
                "embedding frozen, so a pairing check against the target fails until the target's embedding "
                "is copied in (init_checkpoint(..., embed_from=TARGET))")


@dataclass(frozen=True)
class InitResult(Document):
    """What `init_checkpoint` wrote."""

    SCHEMA = schemas.command("init")
    KEYS = ("path", "profile", "init", "seed", "weights_bytes", "embedding", "warnings")

    path: Path
    profile: str | None      # None when a config was given instead
    init: str
    seed: int
    weights_bytes: int
    embedding: EmbeddingSource = EmbeddingSource("random")

    @property
    def warnings(self) -> list[str]:
        return [w for w in (self.embedding.warning,) if w]


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


def init_chunks(kind: str, seed: int) -> Callable[[TensorSpec], Iterator[BytesLike]]:
    """Chunk producer for `init`: norms are ones, biases zeros, matrices N(0, 0.02) or zeros."""
    if kind not in INIT_KINDS:
        raise UsageError(f"{kind!r} is not one of {', '.join(INIT_KINDS)}", param="init")
    import torch

    generator = torch.Generator().manual_seed(seed)

    def produce(spec: TensorSpec) -> Iterator[BytesLike]:
        for n in _row_chunks(spec):
            if _is_norm(spec.name):
                values = torch.ones(n, dtype=torch.bfloat16)
            elif kind == "zeros" or spec.name.endswith(".bias"):
                values = torch.zeros(n, dtype=torch.bfloat16)
            else:
                values = torch.empty(n).normal_(0.0, INIT_STD, generator=generator).to(torch.bfloat16)
            yield values.view(torch.uint8).numpy().data

    return produce


def target_embedding(target: str | os.PathLike[str], spec: TensorSpec) -> TensorLocation:
    """The target's embedding, checked against the draft's `embed_tokens.weight` (headers only).

    Raises:
        CheckpointNotFoundError: `target` does not exist.
        UsageError: it holds no embedding, its shape is not the draft's [vocab_size, hidden_size], or
            its dtype has no exact cast to the draft's.
    """
    with about("embed_from"):
        found = locate_tensor(target, contract.TARGET_EMBED_NAMES)
    shape, dtype = tuple(found.info.shape), found.info.dtype
    if shape != spec.shape:
        raise UsageError(f"{found.describe()} is {list(shape)}, the draft's {spec.name} is {list(spec.shape)} "
                         "(vocab_size x hidden_size); pass the target the draft is built for", param="embed_from")
    if dtype != spec.dtype and (dtype, spec.dtype) not in EXACT_CASTS:
        raise UsageError(f"{found.describe()} is {dtype}; only {spec.dtype} or "
                         f"{' / '.join(sorted(a for a, b in EXACT_CASTS if b == spec.dtype))} convert exactly to the "
                         f"draft's {spec.dtype}", param="embed_from")
    return found


def _with_embedding(chunks: Callable[[TensorSpec], Iterator[BytesLike]],
                    source: TensorLocation) -> Callable[[TensorSpec], Iterator[BytesLike]]:
    """`chunks`, except that `embed_tokens.weight` streams from the target (cast when the dtypes differ)."""
    def produce(spec: TensorSpec) -> Iterator[BytesLike]:
        if spec.name != contract.FROZEN_TENSORS[0]:
            yield from chunks(spec)
            return
        pieces = iter_range(source.path, *source.byte_range, chunk_bytes=_EMBED_CHUNK_BYTES)
        yield from pieces if source.info.dtype == spec.dtype else cast_chunks(pieces, source.info.dtype, spec.dtype)

    return produce


def init_checkpoint(dst: str | os.PathLike[str], *, profile: str = "tiny", config: Mapping[str, Any] | None = None,
                    init: str = "random", seed: int = 0, force: bool = False,
                    embed_from: str | os.PathLike[str] | None = None,
                    progress: Progress | None = None, extra_files: Mapping[str, bytes] | None = None,
                    checked: Checked | None = None) -> InitResult:
    """Write a conforming checkpoint: `config.json` plus one `model.safetensors`.

    Args:
        dst: output folder (created atomically).
        profile: `kimi-k3` (the full reference shape, 7.12 GB) or `tiny`.
        config: a config to use instead of a profile.
        init: `random` (seeded N(0, 0.02) matrices) or `zeros`; norms are always ones.
        seed: seed for `random`.
        force: replace an existing `dst`.
        embed_from: a target checkpoint (folder, sharded or not, or a .safetensors file) whose
            embedding becomes `embed_tokens.weight`, bit for bit (F32/F16 rounded to nearest even).
        progress: called with the number of tensor bytes written (see `dspark_hub.progress`).
        extra_files: name -> bytes written beside the weights (e.g. `init --target`'s provenance).
        checked: what the caller's `check_writable(dst)` found, when it checked before this call.

    Returns:
        An `InitResult` (`result.path` is the output folder; `result.embedding` says where the
        frozen embedding came from, and `result.warnings` why a random one will not pair).

    Raises:
        RefusedOverwriteError: `dst` exists and `force` is False (checked before any work).
        UsageError: `init` is not a known kind, `dst` is the current folder or a parent of it, or the
            target's embedding does not fit the draft (checked before anything is written).
        CheckpointNotFoundError: `embed_from` does not exist.
    """
    refuse_own_inputs(dst, [("embed_from", embed_from)], param="dst", folder=True)
    checked = checked or check_writable(Path(dst), force=force)
    cfg = dict(config) if config is not None else contract.profile_config(profile)
    roster = contract.roster(cfg)
    specs = list(roster.values())
    chunks = init_chunks(init, seed)
    embedding = EmbeddingSource("zeros" if init == "zeros" else "random")
    if embed_from is not None:
        spec = roster[contract.FROZEN_TENSORS[0]]
        source = target_embedding(embed_from, spec)
        chunks = _with_embedding(chunks, source)
        embedding = EmbeddingSource("teacher", target=source.describe(), target_dtype=source.info.dtype,
                                    cast=None if source.info.dtype == spec.dtype
                                    else cast_text(source.info.dtype, spec.dtype))
    announce_total(progress, sum(s.nbytes for s in specs))
    with atomic_dir(dst, force=force, checked=checked) as tmp:
        write_file(tmp / contract.CONFIG_NAME, contract.config_bytes(cfg))
        for name, data in (extra_files or {}).items():
            write_file(tmp / name, data)
        write_safetensors(tmp / contract.WEIGHTS_NAME, specs, chunks, metadata=contract.TORCHSPEC_METADATA,
                          progress=progress)
    out = Path(dst)
    return InitResult(path=out, profile=profile if config is None else None, init=init, seed=seed,
                      weights_bytes=(out / contract.WEIGHTS_NAME).stat().st_size, embedding=embedding)
