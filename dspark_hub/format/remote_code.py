"""The modeling code a checkpoint ships for `trust_remote_code`, and `export_code` that ships it.

Torch-free: the code files are copied as bytes (the two modeling files read from the package's
`modeling/` folder without importing it, the stdlib-only roster from here), so
`dspark-hub export-code` starts in a fraction of a second.
`AutoModel.from_pretrained(folder, trust_remote_code=True)` then works without dspark-hub.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from dspark_hub import schemas
from dspark_hub.documents import Document
from dspark_hub.errors import CheckpointFormatError, CheckpointNotFoundError, RefusedOverwriteError
from dspark_hub.format import contract, speculators
from dspark_hub.format.checkpoint import CONFIG_JSON_CODES
from dspark_hub.format.jsonio import json_type, load_json_object
from dspark_hub.format.writer import atomic_path, write_file

#: What `export_code` adds to `config.json`.
AUTO_MAP: dict[str, str] = {
    "AutoConfig": "configuration_k3_dspark.K3DSparkConfig",
    "AutoModel": "modeling_k3_dspark.K3DSparkModel",
}
#: The files `export_code` ships. The roster's one source is the format core's (stdlib only); the
#: modeling file imports it as a sibling, and in the package `modeling/roster_k3_dspark.py` re-exports it.
CODE_FILES = ("configuration_k3_dspark.py", "modeling_k3_dspark.py", "roster_k3_dspark.py")
#: `CheckpointFormatError.code`s of loading and exporting. Append-only: tools match on them.
LOAD_CODES: dict[str, str] = {
    "CONFIG_INVALID_JSON": "config.json is not one JSON object (syntax, UTF-8, NaN/Infinity)",
    "CONFIG_DUPLICATE_KEY": "config.json repeats a key",
    "FILE_UNREADABLE": "config.json cannot be read",
    "STATE_DICT_MISMATCH": "tensor names or shapes do not match the model the config describes",
    "AUTO_MAP_NOT_OBJECT": "config.json's auto_map is not a JSON object",
    "NOT_K3_DSPARK": "config.json names another model type or draft format than k3_dspark",
}


@dataclass(frozen=True)
class ExportResult(Document):
    """What `export_code` changed in the checkpoint folder `path`."""

    SCHEMA = schemas.command("export-code")

    path: str
    written: list[str]
    unchanged: list[str]


def checkpoint_folder(path: str | os.PathLike[str]) -> Path:
    """`path` as a folder that holds a `config.json`.

    Raises:
        CheckpointNotFoundError: it does not.
    """
    folder = Path(path)
    if not (folder / contract.CONFIG_NAME).is_file():
        raise CheckpointNotFoundError(f"{folder}: no {contract.CONFIG_NAME}", hint="pass a checkpoint folder")
    return folder


def read_config(folder: Path) -> dict[str, Any]:
    """The folder's `config.json`, read as `verify` reads it (strict JSON, one object).

    Raises:
        CheckpointFormatError: `CONFIG_INVALID_JSON`, `CONFIG_DUPLICATE_KEY` or `FILE_UNREADABLE`.
    """
    path = folder / contract.CONFIG_NAME
    try:
        return load_json_object(path, codes=CONFIG_JSON_CODES)
    except CheckpointFormatError as e:
        raise CheckpointFormatError(e.code, f"{e.detail}; fix or restore the file", path=str(path),
                                    tensor=e.tensor) from None
    except OSError as e:
        raise CheckpointFormatError("FILE_UNREADABLE", f"cannot be read ({e.strerror or e}); check permissions",
                                    path=str(path)) from None


def require_k3_dspark(config: dict[str, Any], folder: Path) -> None:
    """Refuse a config that names another model or draft format: this modeling code builds k3_dspark only.

    Raises:
        CheckpointFormatError: `NOT_K3_DSPARK`.
    """

    for key in ("model_type", speculators.TYPE_KEY):
        value = config.get(key)
        if value is not None and value != contract.MODEL_TYPE:
            raise CheckpointFormatError("NOT_K3_DSPARK", f"{key} is {value!r}: not a k3_dspark draft, which is all "
                                        "the k3_dspark modeling code builds ('dspark-hub verify' names the format)",
                                        path=str(folder / contract.CONFIG_NAME))


def code_sources() -> dict[str, bytes]:
    """File name -> bytes of the code files shipped for `trust_remote_code` (config, model, roster)."""
    package = resources.files("dspark_hub")
    where = {"roster_k3_dspark.py": package.joinpath("format")}
    return {name: where.get(name, package.joinpath("modeling")).joinpath(name).read_bytes() for name in CODE_FILES}


def export_code(folder: str | os.PathLike[str], *, force: bool = False) -> ExportResult:
    """Make a checkpoint loadable with `trust_remote_code=True` where dspark-hub is not installed.

    Copies `configuration_k3_dspark.py`, `modeling_k3_dspark.py` and `roster_k3_dspark.py` into `folder` and adds
    `auto_map` (appended after the existing keys, whose order is kept) to its `config.json`.
    Each write goes to a temporary sibling, then is renamed. Files already identical are left alone.

    Raises:
        CheckpointNotFoundError: no `config.json` in `folder`.
        CheckpointFormatError: `config.json` is not one strict JSON object, or its `auto_map` is not one
            (`AUTO_MAP_NOT_OBJECT`); or `NOT_K3_DSPARK`: it names another model type or draft format
            (its own auto_map stays).
        RefusedOverwriteError: a code file or `auto_map` exists with other content and `force` is False.
    """
    path = checkpoint_folder(folder)
    config = read_config(path)
    require_k3_dspark(config, path)
    existing_map = config.get("auto_map")
    if existing_map is None:
        existing_map = {}
    elif not isinstance(existing_map, dict):
        raise CheckpointFormatError("AUTO_MAP_NOT_OBJECT", f"'auto_map' is a JSON {json_type(existing_map)}, "
                                    "not an object; remove it (export-code writes it) or make it an object",
                                    path=str(path / contract.CONFIG_NAME))
    pending: dict[Path, bytes] = {path / name: data for name, data in code_sources().items()}
    new_config = {**config, "auto_map": {**existing_map, **AUTO_MAP}}
    pending[path / contract.CONFIG_NAME] = contract.config_bytes(new_config)

    clashing_map = any(existing_map.get(key, value) != value for key, value in AUTO_MAP.items())
    written, unchanged = [], []
    for target, data in pending.items():
        if target.exists() and target.read_bytes() == data:
            unchanged.append(target.name)
            continue
        clashes = clashing_map if target.name == contract.CONFIG_NAME else target.exists()
        if clashes and not force:
            raise RefusedOverwriteError(str(target))
        written.append(target.name)
    for target, data in pending.items():
        if target.name in written:
            with atomic_path(target, force=True) as tmp:
                write_file(tmp, data)
    return ExportResult(path=str(path), written=written, unchanged=unchanged)
