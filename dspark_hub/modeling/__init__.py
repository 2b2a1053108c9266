"""The `k3_dspark` architecture for transformers, plus the toolkit's checkpoint I/O.

Importing this package imports torch and transformers and registers `k3_dspark` with
`AutoConfig`/`AutoModel` (idempotently). `import dspark_hub` never imports it.

- `register()`: make `AutoModel.from_pretrained(folder)` work on a pristine checkpoint.
- `load_checkpoint(folder)`: strict load; reports missing/unexpected tensors.
- `save_checkpoint(model, folder)`: single `model.safetensors` + `config.json` in the input's layout.
- `export_code(folder)`: ship the modeling files (config, model, roster) and an `auto_map` for `trust_remote_code`.
"""

from __future__ import annotations

from .checkpoint_io import (
    AUTO_MAP,
    ExportResult,
    LoadedCheckpoint,
    SaveResult,
    export_code,
    load_checkpoint,
    save_checkpoint,
)
from .configuration_k3_dspark import K3DSparkConfig
from .modeling_k3_dspark import K3DSparkModel

_registered = False


def register() -> None:
    """Register `k3_dspark` with `AutoConfig` and `AutoModel`. Safe to call any number of times."""
    global _registered
    if _registered:
        return
    from transformers import AutoConfig, AutoModel

    AutoConfig.register(K3DSparkConfig.model_type, K3DSparkConfig, exist_ok=True)
    AutoModel.register(K3DSparkConfig, K3DSparkModel, exist_ok=True)
    _registered = True


register()

__all__ = [
    "AUTO_MAP",
    "ExportResult",
    "K3DSparkConfig",
    "K3DSparkModel",
    "LoadedCheckpoint",
    "SaveResult",
    "export_code",
    "load_checkpoint",
    "register",
    "save_checkpoint",
]
