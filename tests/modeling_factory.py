"""Tiny real `k3_dspark` checkpoints for the modeling tests (written with safetensors.torch)."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dspark_hub.format import contract


def tiny_config(**overrides: Any) -> dict[str, Any]:
    """A deep copy of `contract.TINY_CONFIG` with `overrides` applied (order kept)."""
    config = copy.deepcopy(contract.TINY_CONFIG)
    config.update(overrides)
    return config


def write_tiny_checkpoint(folder: Path, *, config: Mapping[str, Any] | None = None,
                          metadata: Mapping[str, str] | None = contract.TORCHSPEC_METADATA,
                          rename: Mapping[str, str] | None = None, seed: int = 0) -> Path:
    """Write `config.json` (published layout) and a bf16 `model.safetensors` with random weights.

    Norm weights are drawn around 1 so tests see non-trivial but sane activations. `rename`
    maps contract names to the names actually written (to fake misnamed exports).
    """
    import torch
    from safetensors.torch import save_file

    config = dict(config or contract.TINY_CONFIG)
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for name, spec in contract.roster(config).items():
        values = torch.randn(spec.shape, generator=generator) * 0.1
        if name.endswith("norm.weight"):
            values = values + 1.0
        tensors[(rename or {}).get(name, name)] = values.to(torch.bfloat16)
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / contract.WEIGHTS_NAME), metadata=dict(metadata) if metadata else None)
    (folder / contract.CONFIG_NAME).write_bytes(contract.config_bytes(config))
    return folder
