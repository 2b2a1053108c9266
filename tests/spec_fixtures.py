"""The checked-in checkpoints saved by the real speculators 0.9.0 library, and mutated copies of them.

The fixtures live in `tests/fixtures/speculators/` (regenerate with `bash .ci/venv-speculators.sh
--write`; see `make_fixtures.py` there). Tests never write into that folder: `copy_fixture`
copies one into `tmp_path`, and the mutators change the copy with the `safetensors` library.
"""

from __future__ import annotations

import copy
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

ROOT = Path(__file__).parent / "fixtures" / "speculators"
MANIFEST: dict[str, Any] = json.loads((ROOT / "MANIFEST.json").read_text())
VERIFIER = ROOT / "verifier-qwen3-tiny"
#: fixture name -> declared speculators family ("dspark", "eagle3", ...), verifier excluded.
FAMILY_OF = {name: entry["family"] for name, entry in MANIFEST["fixtures"].items() if entry["family"] != "verifier"}
DSPARK = sorted(name for name, family in FAMILY_OF.items() if family == "dspark")
OTHERS = sorted(name for name, family in FAMILY_OF.items() if family != "dspark")


def fixture(name: str) -> Path:
    return ROOT / name


def copy_fixture(tmp_path: Path, name: str, dest: str | None = None) -> Path:
    out = tmp_path / (dest or name)
    shutil.copytree(ROOT / name, out)
    return out


def read_config(folder: Path) -> dict[str, Any]:
    return json.loads((folder / "config.json").read_text())


def edit_config(folder: Path, change: Callable[[dict[str, Any]], None]) -> Path:
    config = read_config(folder)
    change(config)
    (folder / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return folder


def set_key(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    """A config change: set a dotted key (`...` deletes it)."""
    def change(config: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node = config
        for p in parents:
            node = node[p]
        if value is ...:
            node.pop(last, None)
        else:
            node[last] = copy.deepcopy(value)
    return change


def edit_tensors(folder: Path, change: Callable[[dict[str, torch.Tensor]], None]) -> Path:
    """Rewrite a single-file fixture's weights (metadata kept)."""
    path = folder / "model.safetensors"
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        metadata = f.metadata()
    tensors = load_file(str(path))
    change(tensors)
    save_file(tensors, str(path), metadata=metadata)
    return folder


def rename(old: str, new: str) -> Callable[[dict[str, torch.Tensor]], None]:
    return lambda t: t.__setitem__(new, t.pop(old))


def drop(name: str) -> Callable[[dict[str, torch.Tensor]], None]:
    return lambda t: t.pop(name)


def add(name: str, shape: tuple[int, ...]) -> Callable[[dict[str, torch.Tensor]], None]:
    return lambda t: t.__setitem__(name, torch.zeros(shape, dtype=torch.bfloat16))


def reshape(name: str, shape: tuple[int, ...]) -> Callable[[dict[str, torch.Tensor]], None]:
    return lambda t: t.__setitem__(name, torch.zeros(shape, dtype=t[name].dtype))
