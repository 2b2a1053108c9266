"""Tiny real k3_dspark checkpoints for the Hub, checksum and package tests (written with safetensors)."""

from __future__ import annotations

from pathlib import Path

from dspark_hub.format import contract


def write_tiny_checkpoint(folder: Path, *, seed: int = 0, pad_mib: int = 0, shards: int = 1) -> Path:
    """config.json plus model.safetensors (or `shards` shard files) from the tiny roster.

    `pad_mib` adds an extra `padding.weight` tensor of that many MiB so a file is "multi-MB".
    """
    import torch
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    (folder / contract.CONFIG_NAME).write_bytes(contract.config_bytes(contract.TINY_CONFIG))
    g = torch.Generator().manual_seed(seed)
    state = {name: torch.randn(spec.shape, generator=g).to(torch.bfloat16)
             for name, spec in contract.roster(contract.TINY_CONFIG).items()}
    if pad_mib:
        state["padding.weight"] = torch.randn(pad_mib * 1024 * 1024 // 2, generator=g).to(torch.bfloat16)
    names = sorted(state)
    if shards == 1:
        save_file(state, str(folder / contract.WEIGHTS_NAME), metadata=dict(contract.TORCHSPEC_METADATA))
        return folder
    for i in range(shards):
        part = {n: state[n] for n in names[i::shards]}
        save_file(part, str(folder / f"model-{i + 1:05d}-of-{shards:05d}.safetensors"),
                  metadata=dict(contract.TORCHSPEC_METADATA))
    return folder
