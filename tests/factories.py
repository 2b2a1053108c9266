"""Tiny real checkpoints built in code for tests.

Fixtures are written with the `safetensors` library itself (or raw bytes for malformed
files), not with the code under test, so a bug in our writer cannot hide a bug in our reader.
"""

from __future__ import annotations

import copy
import json
import os
import struct
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from dspark_hub.format import contract

TINY = contract.TINY_CONFIG


def tiny_config(**changes: Any) -> dict[str, Any]:
    """A copy of the tiny config with keys replaced (value `...` deletes the key)."""
    cfg = copy.deepcopy(TINY)
    for key, value in changes.items():
        if value is ...:
            cfg.pop(key, None)
        else:
            cfg[key] = value
    return cfg


def tensors_for(config: Mapping[str, Any], *, seed: int = 0,
                dtype: torch.dtype = torch.bfloat16) -> dict[str, torch.Tensor]:
    """Random tensors for every roster entry of `config` (norms are ones)."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, spec in contract.roster(config).items():
        if name.endswith("norm.weight"):
            out[name] = torch.ones(spec.shape, dtype=dtype)
        else:
            out[name] = (torch.randn(spec.shape, generator=g) * 0.02).to(dtype)
    return out


def write_config(folder: Path, config: Mapping[str, Any] | str) -> None:
    text = config if isinstance(config, str) else json.dumps(config, indent=2) + "\n"
    (folder / "config.json").write_text(text)


def write_checkpoint(folder: Path, *, config: Mapping[str, Any] | str | None = None,
                     tensors: Mapping[str, torch.Tensor] | None = None,
                     mutate: Callable[[dict[str, torch.Tensor]], None] | None = None,
                     metadata: Mapping[str, str] | None = contract.TORCHSPEC_METADATA,
                     shards: int = 1) -> Path:
    """Write config.json plus model.safetensors (or `shards` files with an index)."""
    folder.mkdir(parents=True, exist_ok=True)
    cfg = TINY if config is None else config
    write_config(folder, cfg)
    state = dict(tensors) if tensors is not None else tensors_for(TINY if isinstance(cfg, str) else cfg)
    if mutate:
        mutate(state)
    meta = dict(metadata) if metadata is not None else None
    if shards == 1:
        save_file(state, str(folder / contract.WEIGHTS_NAME), metadata=meta)
        return folder
    names = sorted(state)
    weight_map, total = {}, 0
    for i in range(shards):
        part = names[i::shards]
        file = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        save_file({n: state[n] for n in part}, str(folder / file), metadata=meta)
        for n in part:
            weight_map[n] = file
            total += state[n].numel() * state[n].element_size()
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / contract.INDEX_NAME).write_text(json.dumps(index, indent=2))
    return folder


def raw_safetensors(path: Path, header: Mapping[str, Any] | bytes, data: bytes = b"", *,
                    length: int | None = None) -> Path:
    """Write a (possibly malformed) safetensors file from a header object or raw header bytes."""
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    n = len(raw) if length is None else length
    path.write_bytes(struct.pack("<Q", n) + raw + data)
    return path


def sparse_reference(folder: Path, config: Mapping[str, Any] = contract.REFERENCE_CONFIG) -> Path:
    """A full-size-shaped checkpoint whose tensor bytes are a sparse hole (no disk used).

    Header-level work (verify, card facts) sees exactly what the 7.12 GB file shows.
    """
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_bytes(contract.config_bytes(config))
    header = contract.expected_header(config)
    path = folder / contract.WEIGHTS_NAME
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header)
        f.truncate(contract.expected_file_size(config))
    return folder


def file_digest(path: Path) -> str:
    import hashlib
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def tree_digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): file_digest(p) for p in sorted(folder.rglob("*")) if p.is_file()
            and not os.path.islink(p)}


def nested_dirs(folder: Path, levels: int, *, name: str = "d", file: str = "notes.txt") -> str:
    """`levels` folders one inside the other under `folder`, a small file at the bottom; its relative path.

    Made without recursion (`os.makedirs` recurses once a level). Remove it with `remove_nested`:
    pytest's own clean-up (`shutil.rmtree`) recurses too and fails on it.
    """
    deepest = folder
    for _ in range(levels):
        deepest = deepest / name
        deepest.mkdir()
    (deepest / file).write_text("at the bottom")
    return f"{name}/" * levels + file


def remove_nested(top: Path) -> None:
    """Remove a folder tree of any depth, bottom-up, without recursion."""
    stack: list[tuple[str, bool]] = [(str(top), False)]
    while stack:
        path, emptied = stack.pop()
        if os.path.islink(path) or not os.path.isdir(path):
            os.unlink(path)
        elif emptied:
            os.rmdir(path)
        else:
            stack.append((path, True))
            stack.extend((os.path.join(path, entry), False) for entry in os.listdir(path))
