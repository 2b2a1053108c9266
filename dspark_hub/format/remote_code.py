"""The modeling code a checkpoint ships for `trust_remote_code`, and `export_code` that ships it.

Torch-free: the two modeling files are copied as bytes (read from the package's `modeling/`
folder without importing it), so `dspark-hub export-code` starts in a fraction of a second.
`AutoModel.from_pretrained(folder, trust_remote_code=True)` then works without dspark-hub.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from dspark_hub import schemas
from dspark_hub.errors import CheckpointFormatError, CheckpointNotFoundError, RefusedOverwriteError
from dspark_hub.format import contract
from dspark_hub.format.jsonio import json_type
from dspark_hub.format.writer import atomic_path

#: What `export_code` adds to `config.json`.
AUTO_MAP: dict[str, str] = {
    "AutoConfig": "configuration_k3_dspark.K3DSparkConfig",
    "AutoModel": "modeling_k3_dspark.K3DSparkModel",
}
CODE_FILES = ("configuration_k3_dspark.py", "modeling_k3_dspark.py")


@dataclass(frozen=True)
class ExportResult:
    """What `export_code` changed in the checkpoint folder `path`."""

    path: str
    written: list[str]
    unchanged: list[str]

    def to_dict(self) -> dict[str, Any]:
        return {"schema": schemas.command("export-code"), "path": self.path, "written": self.written,
                "unchanged": self.unchanged}


def checkpoint_folder(path: str | os.PathLike[str]) -> Path:
    """`path` as a folder that holds a `config.json`.

    Raises:
        CheckpointNotFoundError: it does not.
    """
    folder = Path(path)
    if not (folder / contract.CONFIG_NAME).is_file():
        raise CheckpointNotFoundError(f"{folder}: no {contract.CONFIG_NAME}; pass a checkpoint folder")
    return folder


def read_config(folder: Path) -> dict[str, Any]:
    """The folder's `config.json` as a dict.

    Raises:
        CheckpointFormatError: not readable JSON, or not an object.
    """
    path = folder / contract.CONFIG_NAME
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as exc:
        raise CheckpointFormatError("config-unreadable", f"not readable JSON ({str(exc).splitlines()[0]}); "
                                    "fix or restore the file", path=str(path)) from exc
    if not isinstance(config, dict):
        raise CheckpointFormatError("config-not-object", f"is a JSON {json_type(config)}, not an object; "
                                    "fix or restore the file", path=str(path))
    return config


def code_sources() -> dict[str, bytes]:
    """File name -> bytes of the two modeling files shipped for `trust_remote_code`."""
    modeling = resources.files("dspark_hub").joinpath("modeling")
    return {name: modeling.joinpath(name).read_bytes() for name in CODE_FILES}


def export_code(folder: str | os.PathLike[str], *, force: bool = False) -> ExportResult:
    """Make a checkpoint loadable with `trust_remote_code=True` where dspark-hub is not installed.

    Copies `configuration_k3_dspark.py` and `modeling_k3_dspark.py` into `folder` and adds
    `auto_map` (appended after the existing keys, whose order is kept) to its `config.json`.
    Each write goes to a temporary sibling, then is renamed. Files already identical are left alone.

    Raises:
        CheckpointNotFoundError: no `config.json` in `folder`.
        CheckpointFormatError: `config.json` is not a JSON object, or its `auto_map` is not one.
        RefusedOverwriteError: a code file or `auto_map` exists with other content and `force` is False.
    """
    path = checkpoint_folder(folder)
    config = read_config(path)
    existing_map = config.get("auto_map")
    if existing_map is None:
        existing_map = {}
    elif not isinstance(existing_map, dict):
        raise CheckpointFormatError("auto-map-not-object", f"'auto_map' is a JSON {json_type(existing_map)}, "
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
                tmp.write_bytes(data)
    return ExportResult(path=str(path), written=written, unchanged=unchanged)
