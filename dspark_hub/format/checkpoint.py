"""Open a checkpoint folder (local or on the Hub) at header level: config, index, headers.

A `Source` is anything that can list its files and read byte ranges; `LocalSource`
reads a folder, `dspark_hub.hub.HubSource` reads a Hub repo with HTTP range requests.
`open_checkpoint` never reads tensor data and never imports checkpoint code: problems
it meets become findings on the returned `CheckpointView`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from dspark_hub.errors import CheckpointFormatError, CheckpointNotFoundError, HubError, UsageError
from dspark_hub.format import contract
from dspark_hub.format.folder import LISTING_CODES, FolderProblem, list_folder, open_regular
from dspark_hub.format.jsonio import json_type, loads_strict
from dspark_hub.format.reader import SafetensorsHeader, ShardIndex, TensorInfo, parse_index, read_header_with
from dspark_hub.report import Finding, error, warning
from dspark_hub.schemas import GOLDEN_FIXTURE, current

#: Findings `open_checkpoint` makes about a folder, besides the reader's `FORMAT_CODES` for each
#: weight file and the index. Append-only: tools match on them.
FOLDER_CODES: dict[str, str] = {
    "CONFIG_MISSING": "no config.json",
    "CONFIG_INVALID_JSON": "config.json is not one JSON object (syntax, UTF-8, NaN/Infinity)",
    "CONFIG_DUPLICATE_KEY": "config.json repeats a key",
    "NO_WEIGHTS": "no *.safetensors file",
    "FILE_UNREADABLE": "a file cannot be read",
    "STRAY_WEIGHTS_FILE": "a safetensors file the index does not name",
    "INDEX_MISSING": "several weight files and no index",
    "INDEX_MISSING_FILE": "the index names a file that is absent",
    "INDEX_WRONG_FILE": "a tensor is not in the file the index names",
    "INDEX_UNLISTED_TENSOR": "a tensor is in a shard but not in the index",
    "INDEX_TOTAL_SIZE": "metadata.total_size disagrees with the shards",
    "TENSOR_IN_TWO_FILES": "a tensor is stored twice",
    "GOLDEN_IN_WEIGHTS_FOLDER": "a golden-vector fixture beside the weights",
    "FILE_TOO_LARGE": "config.json or the index is larger than any real one; it is not read",
    **LISTING_CODES,
}


class Source(Protocol):
    """Where a checkpoint's bytes come from."""

    @property
    def location(self) -> str:
        """Where the checkpoint is, as the user named it (a folder, a Hub URL)."""

    def list_files(self) -> dict[str, int]:
        """Relative path -> size in bytes, for every file of the checkpoint."""

    def read_bytes(self, name: str, start: int, length: int) -> bytes:
        """`length` bytes of file `name` from offset `start` (fewer at end of file)."""


class LocalSource:
    """A checkpoint folder on disk; its files are `folder.list_folder`'s (the entries it leaves out are
    `problems`, which `open_checkpoint` reports)."""

    def __init__(self, folder: str | os.PathLike[str]) -> None:
        path = Path(folder)
        if not path.exists():
            raise CheckpointNotFoundError(f"{folder}: no such file or directory", hint="pass a checkpoint folder")
        if not path.is_dir():
            what = "is a file" if path.is_file() else "is not a folder"
            raise CheckpointNotFoundError(f"{folder}: {what}", hint="pass the checkpoint folder that holds it "
                                          f"(and its config.json): {path.parent}")
        self.root = path
        self.location = str(folder)
        self.problems: tuple[FolderProblem, ...] = ()

    def list_files(self) -> dict[str, int]:
        listing = list_folder(self.root)
        self.problems = listing.problems
        return listing.files

    def path(self, name: str) -> Path:
        return self.root / name

    def read_bytes(self, name: str, start: int, length: int) -> bytes:
        with open_regular(self.root / name, display=name) as f:
            f.seek(start)
            return f.read(length)


@dataclass
class CheckpointView:
    """What a checkpoint holds at header level, plus the problems met while reading it."""

    source: Source
    files: dict[str, int]
    config: dict[str, Any] | None = None
    index: ShardIndex | None = None
    layout: str | None = None                       # "single" | "sharded" | None
    headers: dict[str, SafetensorsHeader] = field(default_factory=dict)
    tensors: dict[str, tuple[str, TensorInfo]] = field(default_factory=dict)   # name -> (file, info)
    findings: list[Finding] = field(default_factory=list)

    @property
    def location(self) -> str:
        return self.source.location

    def local_path(self, name: str) -> Path:
        """Where file `name` of a local checkpoint is on disk.

        Raises:
            UsageError: the checkpoint is not a local folder (a Hub checkpoint has no path to read).
        """
        if not isinstance(self.source, LocalSource):
            raise UsageError(f"{self.location}: reading {name} needs a local checkpoint folder")
        return self.source.path(name)

    @property
    def weight_files(self) -> list[str]:
        return list(self.headers)


#: How a `config.json` that is not a well-formed JSON object is reported (`jsonio.JSON_CODES` renamed);
#: `verify` and `load_checkpoint` share it.
CONFIG_JSON_CODES: dict[str, str] = {
    "DUPLICATE_KEY": "CONFIG_DUPLICATE_KEY", "NOT_UTF8": "CONFIG_INVALID_JSON", "NOT_JSON": "CONFIG_INVALID_JSON",
    "NON_FINITE_NUMBER": "CONFIG_INVALID_JSON", "NOT_OBJECT": "CONFIG_INVALID_JSON",
}
_JSON_HINTS = {"DUPLICATE_KEY": "write each key once",
               "NON_FINITE_NUMBER": "write a finite number (JSON has no NaN or Infinity)"}


def _load_config(source: Source, view: CheckpointView) -> None:
    name = contract.CONFIG_NAME
    if name not in view.files:
        if _left_out(source, name):   # already reported (a FIFO, a link out of the folder, ...)
            return
        view.findings.append(error("CONFIG_MISSING", name, "no config.json in the checkpoint folder",
                                   "add the config.json the draft was trained with"))
        return
    data = read_at_most(source, name, view.files[name], contract.MAX_CONFIG_BYTES)
    if data is None:
        view.findings.append(_too_large(name, view.files[name], contract.MAX_CONFIG_BYTES))
        return
    try:
        doc = loads_strict(data, path=name)
    except CheckpointFormatError as e:
        where = f"{name}:{e.tensor}" if e.tensor else name
        view.findings.append(error(CONFIG_JSON_CODES.get(e.code, e.code), where, e.detail,
                                   _JSON_HINTS.get(e.code, "fix the JSON syntax")))
        return
    if not isinstance(doc, dict):
        view.findings.append(error("CONFIG_INVALID_JSON", name, f"is a JSON {json_type(doc)}, not an object",
                                   "config.json must be one JSON object"))
        return
    view.config = doc


def _read_header(source: Source, name: str, size: int, view: CheckpointView) -> None:
    try:
        header = read_header_with(lambda start, length: source.read_bytes(name, start, length),
                                  file_size=size, path=name)
    except CheckpointFormatError as e:
        view.findings.append(error(e.code, name if e.tensor is None else f"{name}:{e.tensor}", e.detail, e.hint))
        return
    except HubError:
        raise   # the Hub failed, not the file: the check cannot run (exit 2)
    except OSError as e:
        view.findings.append(error("FILE_UNREADABLE", name, f"cannot be read ({e})", "check permissions"))
        return
    view.headers[name] = header


def read_at_most(source: Source, name: str, size: int, limit: int) -> bytes | None:
    """The whole of a small file, or None when it holds more than `limit` bytes: never more than `limit + 1`
    bytes are read, whatever size the listing gives (a Hub source checks the bytes against the listing)."""
    data = source.read_bytes(name, 0, min(size, limit + 1))
    return data if len(data) <= limit else None


def _too_large(name: str, size: int, limit: int) -> Finding:
    return error("FILE_TOO_LARGE", name, f"is listed at {size:,} bytes and holds more than {limit:,}, more than "
                 "any real one; it is not read", "replace it with the file the model was saved with")


def _load_index(source: Source, view: CheckpointView) -> ShardIndex | None:
    name = contract.INDEX_NAME
    data = read_at_most(source, name, view.files[name], contract.MAX_JSON_BYTES)
    if data is None:
        view.findings.append(_too_large(name, view.files[name], contract.MAX_JSON_BYTES))
        return None
    try:
        return parse_index(data, path=name)
    except CheckpointFormatError as e:      # parse_index raises INDEX_* codes only
        view.findings.append(error(e.code, name if e.tensor is None else f"{name}:{e.tensor}", e.detail,
                                   "regenerate the index (or merge the shards with 'dspark-hub convert')"))
        return None


def _collect_single(view: CheckpointView) -> None:
    header = next(iter(view.headers.values()), None)
    if header is None:
        return
    for tname, info in header.tensors.items():
        view.tensors[tname] = (header.path, info)


def _collect_sharded(view: CheckpointView, index: ShardIndex) -> None:
    where = contract.INDEX_NAME
    for shard in index.files:
        if shard not in view.files:
            view.findings.append(error("INDEX_MISSING_FILE", shard, f"named by {where} but not in the folder",
                                       "download the missing shard or regenerate the index"))
    owner: dict[str, str] = {}
    for file, header in view.headers.items():
        for tname, info in header.tensors.items():
            if tname in owner:
                view.findings.append(error("TENSOR_IN_TWO_FILES", tname, f"is stored in both {owner[tname]} and "
                                           f"{file}; runtimes load one of them at random",
                                           "keep one copy and regenerate the index"))
                continue
            owner[tname] = file
            view.tensors[tname] = (file, info)
            mapped = index.weight_map.get(tname)
            if mapped is None:
                view.findings.append(error("INDEX_UNLISTED_TENSOR", tname, f"is in {file} but not in {where}'s "
                                           "weight_map; loaders that follow the index never see it",
                                           "regenerate the index"))
            elif mapped != file:
                view.findings.append(error("INDEX_WRONG_FILE", tname, f"{where} maps it to {mapped} but it is in "
                                           f"{file}", "regenerate the index"))
    for tname, file in index.weight_map.items():
        if tname not in owner and file in view.headers:
            view.findings.append(error("INDEX_WRONG_FILE", tname, f"{where} maps it to {file}, which does not "
                                       "hold it", "regenerate the index"))
    if index.total_size is not None:
        data = sum(info.nbytes for _, info in view.tensors.values())
        if data != index.total_size:
            view.findings.append(error("INDEX_TOTAL_SIZE", where, f"metadata.total_size is {index.total_size:,} "
                                       f"but the shards hold {data:,} bytes of tensor data", "regenerate the index"))


def _set_aside_golden(source: Source, files: dict[str, int], candidates: list[str],
                      view: CheckpointView) -> list[str]:
    """Drop golden-vector fixtures from the weight files (named 'golden', schema checked), with a finding."""
    weights = []
    for name in candidates:
        if "golden" in name.lower():
            def read(start: int, length: int, name: str = name) -> bytes:
                return source.read_bytes(name, start, length)

            try:
                header = read_header_with(read, file_size=files[name], path=name)
            except HubError:
                raise
            except (CheckpointFormatError, OSError):
                header = None
            if header is not None and current((header.metadata or {}).get("schema")) == GOLDEN_FIXTURE:
                view.findings.append(error("GOLDEN_IN_WEIGHTS_FOLDER", name, "a golden-vector fixture beside the "
                                           "weights: runtimes that load every top-level *.safetensors would read "
                                           "its tensors as weights", f"move it to {contract.GOLDEN_DIR}/{name}"))
                continue
        weights.append(name)
    return weights


def open_checkpoint(source: Source) -> CheckpointView:
    """Read config, index and every safetensors header of a checkpoint; never tensor data.

    Raises:
        CheckpointNotFoundError: the source cannot be listed at all.
    """
    files = source.list_files()
    view = CheckpointView(source=source, files=files)
    for problem in getattr(source, "problems", ()):
        view.findings.append(error(problem.code, problem.path, problem.detail, problem.hint))
    _load_config(source, view)
    weight_files = [f for f in files if f.endswith(".safetensors") and "/" not in f]
    weight_files = _set_aside_golden(source, files, weight_files, view)
    if contract.INDEX_NAME in files:
        view.layout = "sharded"
        index = _load_index(source, view)
        view.index = index
        shards = index.files if index is not None else weight_files
        for shard in shards:
            if shard in files:
                _read_header(source, shard, files[shard], view)
        if index is not None:
            _collect_sharded(view, index)
        for stray in sorted(set(weight_files) - set(shards)):
            view.findings.append(warning("STRAY_WEIGHTS_FILE", stray, f"is not named by {contract.INDEX_NAME}; "
                                         "loaders that follow the index ignore it", "delete it or re-shard"))
    elif weight_files:
        view.layout = "single" if len(weight_files) == 1 else "sharded"
        if len(weight_files) > 1:
            view.findings.append(error("INDEX_MISSING", contract.INDEX_NAME, f"{len(weight_files)} safetensors files "
                                       "but no index; loaders cannot tell which file holds which tensor",
                                       "merge them with 'dspark-hub convert' or add an index"))
        for name in weight_files:
            _read_header(source, name, files[name], view)
        if len(weight_files) == 1:
            _collect_single(view)
        else:
            for file, header in view.headers.items():
                for tname, info in header.tensors.items():
                    view.tensors.setdefault(tname, (file, info))
    elif not any(_left_out(source, name) for name in _top_level_weights(source)):
        view.findings.append(_no_weights(view))
    return view


def _left_out(source: Source, name: str) -> bool:
    """Whether the listing left `name` out with a problem of its own (so "missing" would be a second, wrong word)."""
    return any(p.path == name for p in getattr(source, "problems", ()))


def _top_level_weights(source: Source) -> list[str]:
    return [p.path for p in getattr(source, "problems", ()) if p.path.endswith(".safetensors") and "/" not in p.path]


#: Weight files saved with Python's pickle (torch.save): never read, since unpickling runs code.
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")


def _no_weights(view: CheckpointView) -> Finding:
    """NO_WEIGHTS, naming the pickled weight files (`pytorch_model.bin`, ...) when that is what the folder holds."""
    pickles = sorted(f for f in view.files if "/" not in f and f.endswith(PICKLE_SUFFIXES))
    if not pickles:
        return error("NO_WEIGHTS", view.location, "no *.safetensors file in the checkpoint folder",
                     "export the weights as model.safetensors")
    named = ", ".join(pickles)
    return error("NO_WEIGHTS", pickles[0], f"no *.safetensors file; the weights are in {named}, a Python pickle "
                 "(torch.save), which is not read: unpickling can run arbitrary code",
                 "save the weights as safetensors (save_pretrained(..., safe_serialization=True) or "
                 "safetensors.torch.save_file), then verify again")
