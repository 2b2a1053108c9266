"""Say which checkpoint or file was used without naming a local path: a Hub id, or a digest.

Records that get published (`training_args.json`, a model card's harness line) must not carry
`./base` or `/home/me/teacher`: the path means nothing to a reader and leaks the author's disk
layout. `identify(path)` gives `{"hub": "org/name@rev"}` for a folder inside a Hugging Face cache
snapshot and `{"sha256": ...}` otherwise (a file's digest, or per-file digests of a folder).
`public_args(args, path_keys)` applies it to a record of options; `is_local_path_value` tells a
path left by an older writer from a Hub id or an identity.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from dspark_hub.format.folder import list_folder, open_regular

#: What `finetune` writes beside the weights, and its fields that name inputs by path.
TRAINING_ARGS_NAME = "training_args.json"
TRAINING_ARGS_PATHS = ("base", "data", "teacher", "prompts", "eval_data", "out", "state_dir")

_NAME = r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}"
#: `org/name` or `org/name@revision`: how a Hub model is named.
HUB_ID = re.compile(rf"^{_NAME}/{_NAME}(@[A-Za-z0-9._/-]+)?$")
#: A folder inside the Hugging Face cache: `.../models--org--name/snapshots/<commit>`.
HUB_SNAPSHOT = re.compile(r"models--(?P<org>[^/]+?)--(?P<name>[^/]+)/snapshots/(?P<rev>[0-9a-f]{40})")
#: Files of a folder whose digests identify it; weight files only when asked (they can be large).
_DESCRIPTORS = (".json", ".jsonl", ".txt", ".model")
_CHUNK = 16 << 20


def is_hub_id(text: str) -> bool:
    """Whether `text` reads as a Hub model id (`org/name[@rev]`) rather than a local path."""
    return bool(HUB_ID.match(text)) and ".." not in text and not text.startswith(("./", "../"))


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open_regular(path) as handle:
        while block := handle.read(_CHUNK):
            digest.update(block)
    return digest.hexdigest()


def identify(path: str | os.PathLike[str], *, weights: bool = True) -> dict[str, Any] | None:
    """A Hub id or digests for a local file or folder; None when it does not exist.

    Args:
        path: the file or folder.
        weights: for a folder, also hash its `*.safetensors` files (otherwise only its JSON and
            text files: the config, index or manifest, which is enough for data folders and cheap
            for a teacher of hundreds of GB).

    Returns:
        `{"hub": "org/name@rev"}` inside a Hugging Face cache snapshot, `{"sha256": hex}` for a file,
        `{"sha256": {file: hex}}` for a folder.
    """
    p = Path(path)
    if not p.exists():
        return None
    snapshot = HUB_SNAPSHOT.search(p.resolve().as_posix())
    if snapshot:
        return {"hub": f"{snapshot['org']}/{snapshot['name']}@{snapshot['rev']}"}
    if p.is_file():
        return {"sha256": _sha256(p)}
    suffixes = _DESCRIPTORS + ((".safetensors",) if weights else ())
    files = [f for f in list_folder(p).files if "/" not in f and f.endswith(suffixes)]
    return {"sha256": {f: _sha256(p / f) for f in files}}


def public_args(args: Mapping[str, Any], path_keys: Iterable[str], *, drop: Iterable[str] = (),
                weights: Iterable[str] = ()) -> dict[str, Any]:
    """`args` with every local path replaced by `identify(...)` (a Hub id stays as it is).

    Args:
        args: an options record (e.g. `TrainConfig.to_dict()`).
        path_keys: the keys whose string values are paths (or Hub ids).
        drop: keys to leave out (e.g. the output folder itself).
        weights: path keys whose folders are hashed with their weight files.
    """
    paths, dropped, heavy = set(path_keys), set(drop), set(weights)
    out: dict[str, Any] = {}
    for key, value in args.items():
        if key in dropped:
            continue
        if key in paths and isinstance(value, str):
            out[key] = {"hub": value} if is_hub_id(value) and not Path(value).exists() else \
                identify(value, weights=key in heavy)
        else:
            out[key] = value
    return out


def is_local_path_value(value: Any) -> bool:
    """A string an older writer left where an identity belongs (anything that is not a Hub id)."""
    return isinstance(value, str) and not is_hub_id(value)


def describe(identity: Any) -> str | None:
    """An identity as a short public text: `org/name@rev`, or `sha256 config.json 1a2b3c4d5e6f, ...`.

    Returns None for anything that is not an identity (a bare local path included).
    """
    if isinstance(identity, Mapping):
        hub = identity.get("hub")
        if isinstance(hub, str):
            return hub
        digests = identity.get("sha256")
        if isinstance(digests, str):
            return f"sha256 {digests[:12]}"
        if isinstance(digests, Mapping) and digests:
            return "sha256 " + ", ".join(f"{name} {str(d)[:12]}" for name, d in sorted(digests.items()))
        return None
    if isinstance(identity, str) and is_hub_id(identity):
        return identity
    return None


def local_paths(doc: Mapping[str, Any], keys: Iterable[str] = TRAINING_ARGS_PATHS) -> dict[str, str]:
    """The `keys` of a record that still hold local paths (an older writer's), key -> path."""
    return {key: doc[key] for key in keys if is_local_path_value(doc.get(key))}
