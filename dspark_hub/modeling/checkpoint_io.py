"""Load, save and ship code for `k3_dspark` checkpoints (the toolkit side; never copied into checkpoints).

`save_checkpoint` writes what the published artifact looks like (one `model.safetensors`, the
input's safetensors metadata, a `config.json` with the input's key set and order), which
`save_pretrained` cannot: it stamps `{"format": "pt"}` and sorts the config keys.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import torch

from dspark_hub.documents import Document
from dspark_hub.errors import CheckpointFormatError, RefusedOverwriteError
from dspark_hub.format import contract
from dspark_hub.format.folder import folder_files

# export_code lives in the format core, torch-free, so `dspark-hub export-code` never imports torch.
from dspark_hub.format.remote_code import (
    AUTO_MAP,
    CODE_FILES,
    ExportResult,
    code_sources,
    export_code,
    require_k3_dspark,
)
from dspark_hub.format.remote_code import checkpoint_folder as _folder
from dspark_hub.format.remote_code import read_config as _read_config
from dspark_hub.format.writer import atomic_path, write_file

from .configuration_k3_dspark import ordered_config
from .modeling_k3_dspark import K3DSparkModel

_SOURCE_ATTR = "_dspark_source"


@dataclass
class LoadedCheckpoint(Document):
    """A checkpoint loaded into a `K3DSparkModel`, with what is needed to write it back alike."""

    KEYS = ("metadata", "missing_keys", "unexpected_keys", "mismatched_keys")

    model: K3DSparkModel
    config: dict[str, Any]
    metadata: dict[str, str] | None
    missing_keys: list[str] = field(default_factory=list)
    unexpected_keys: list[str] = field(default_factory=list)
    mismatched_keys: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.missing_keys or self.unexpected_keys or self.mismatched_keys)


@dataclass(frozen=True)
class SaveResult(Document):
    """What `save_checkpoint` wrote."""

    folder: str
    tensor_count: int
    dtype: str
    metadata: dict[str, str] | None
    config_keys: list[str]


# ----------------------------------------------------------------------------- load


def read_metadata(folder: str | os.PathLike[str]) -> dict[str, str] | None:
    """The `__metadata__` of the folder's single `model.safetensors` (None if absent or sharded)."""
    from safetensors import safe_open

    path = Path(folder) / contract.WEIGHTS_NAME
    if not path.is_file():
        return None
    with safe_open(str(path), framework="pt") as handle:
        metadata: dict[str, str] | None = handle.metadata()
    return metadata


def load_checkpoint(folder: str | os.PathLike[str], *, strict: bool = True,
                    dtype: torch.dtype | str = "auto") -> LoadedCheckpoint:
    """Load a checkpoint folder into `K3DSparkModel` (mmap-backed, low memory).

    Args:
        folder: holds `config.json` and `model.safetensors` (or an index and shards).
        strict: raise when a tensor is missing, unexpected or of the wrong shape.
        dtype: parameter dtype; "auto" keeps the config's (`torch_dtype`).

    Returns:
        The model plus the input's raw config, safetensors metadata and the key report.
        The model remembers config and metadata, so `save_checkpoint(model, out)` writes alike.

    Raises:
        CheckpointNotFoundError: no `config.json` in `folder`.
        CheckpointFormatError: `config.json` is not one strict JSON object (`CONFIG_INVALID_JSON`,
            `CONFIG_DUPLICATE_KEY`), or `strict` and the tensor names or shapes do not match the model
            (`STATE_DICT_MISMATCH`); or `NOT_K3_DSPARK`: config.json names another model type or draft format.
    """
    path = _folder(folder)
    folder_files(path)     # the folder rules before transformers opens any file natively (a FIFO would block it)
    raw_config = _read_config(path)
    require_k3_dspark(raw_config, path)
    # With output_loading_info, from_pretrained returns (model, info); its annotation names the model only.
    model, info = cast(tuple[K3DSparkModel, dict[str, list[Any]]],
                       K3DSparkModel.from_pretrained(str(path), dtype=dtype, output_loading_info=True,
                                                     ignore_mismatched_sizes=not strict, weights_only=True))
    loaded = LoadedCheckpoint(
        model=model,
        config=raw_config,
        metadata=read_metadata(path),
        missing_keys=sorted(info["missing_keys"]),
        unexpected_keys=sorted(info["unexpected_keys"]),
        mismatched_keys=sorted(str(item[0]) for item in info["mismatched_keys"]),
    )
    if strict and not loaded.ok:
        problems = [f"{label} {', '.join(keys[:5])}{' ...' if len(keys) > 5 else ''}"
                    for label, keys in (("missing", loaded.missing_keys), ("unexpected", loaded.unexpected_keys),
                                        ("mismatched", loaded.mismatched_keys)) if keys]
        raise CheckpointFormatError("STATE_DICT_MISMATCH", f"tensors do not match the model: {'; '.join(problems)}; "
                                    "run 'dspark-hub verify' for the full list", path=str(path))
    setattr(model, _SOURCE_ATTR, {"config": raw_config, "metadata": loaded.metadata})
    return loaded


# ----------------------------------------------------------------------------- save


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def checkpoint_config(model: K3DSparkModel, *, dtype: torch.dtype,
                      like: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The `config.json` document for `model` saved in `dtype`.

    With `like` (the input's config), the key set and order are exactly `like`'s, values from
    the model. Without it, the published order, then any extra keys the config carries.
    """
    values = model.config.to_diff_dict()
    values["architectures"] = [type(model).__name__]
    values["torch_dtype"] = _dtype_name(dtype)
    if like is None:
        return ordered_config(values)
    return {key: values.get(key, like[key]) for key in like}


def _write_bytes_atomic(path: Path, data: bytes) -> None:
    with atomic_path(path, force=True) as tmp:
        write_file(tmp, data)


_INHERIT: Any = object()


def save_checkpoint(
    model: K3DSparkModel,
    folder: str | os.PathLike[str],
    *,
    metadata: Mapping[str, str] | None = _INHERIT,
    config_like: Mapping[str, Any] | None = _INHERIT,
    dtype: torch.dtype | None = None,
    force: bool = False,
) -> SaveResult:
    """Write `model` as a drop-in checkpoint: one `model.safetensors` plus `config.json`.

    Tensor names are the model's state-dict names (the contract's, no prefix), in the model's
    dtype unless `dtype` is given. Each file is written to a temporary sibling and renamed.

    Args:
        model: the draft.
        folder: output folder (created if needed).
        metadata: safetensors `__metadata__`. Default: the loaded input's (e.g.
            `{"torchspec_version": "0.1.0"}`) when the model came from `load_checkpoint`, else none.
        config_like: the input config whose key set and order to reproduce. Default: the loaded
            input's; else the published layout (`dspark_hub.contract.config_bytes` format).
        dtype: cast tensors on the way out (the model is not changed).
        force: replace existing `model.safetensors` / `config.json` in `folder`.

    Raises:
        RefusedOverwriteError: an output file exists and `force` is False.
    """
    from safetensors.torch import save_file

    source = getattr(model, _SOURCE_ATTR, None) or {}
    if metadata is _INHERIT:
        metadata = source.get("metadata")
    if config_like is _INHERIT:
        config_like = source.get("config")
    out = Path(folder)
    targets = [out / contract.WEIGHTS_NAME, out / contract.CONFIG_NAME]
    for target in targets:
        if target.exists() and not force:
            raise RefusedOverwriteError(str(target))
    out.mkdir(parents=True, exist_ok=True)

    state = {name: tensor.detach().to(dtype or tensor.dtype).contiguous()
             for name, tensor in model.state_dict().items()}
    saved_dtype = dtype or next(iter(state.values())).dtype
    document = checkpoint_config(model, dtype=saved_dtype, like=config_like)
    with atomic_path(targets[0], force=True) as tmp:
        save_file(state, str(tmp), metadata=dict(metadata) if metadata else None)
    _write_bytes_atomic(targets[1], contract.config_bytes(document))
    return SaveResult(folder=str(out), tensor_count=len(state), dtype=_dtype_name(saved_dtype),
                      metadata=dict(metadata) if metadata else None, config_keys=list(document))


__all__ = ["AUTO_MAP", "CODE_FILES", "ExportResult", "LoadedCheckpoint", "SaveResult", "checkpoint_config",
           "code_sources", "export_code", "load_checkpoint", "read_metadata", "save_checkpoint"]
