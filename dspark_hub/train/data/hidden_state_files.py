"""Training data from vLLM's hidden-state extraction or speculators' data pipeline, read as rollouts.

`open_training_data(path, ...)` detects what `path` holds:

- `rollouts`: a folder written by `dspark-hub rollouts` (`manifest.json`), read by `RolloutData`;
- `speculators`: a `speculators prepare-data` folder (HF `datasets.save_to_disk`: `state.json`,
  `data-*.arrow` with `input_ids` and `loss_mask` per row) whose `hidden_states/` holds
  `hs_<row>.safetensors`, what `speculators generate-offline-data` writes; or that
  `hidden_states/` folder itself. Loss masks come from the Arrow rows (1 = supervised, as ours);
- `vllm-extraction`: a folder of safetensors files as vLLM's hidden-states connector writes them
  (any names). They carry no loss mask: every token is supervised.

Each file holds `hidden_states [T, n, H]` (n residual streams at vLLM/speculators aux layer ids,
ascending; the last is the target's last layer before its final norm) and `token_ids [T]`.
FP8 files (the hs-connectors FP8 backend: float8_e4m3fn `hidden_states` and float32
`hidden_states_scales [T, 1, 1]`) are dequantized. The files do not say which ids they hold:
`layer_ids` (theirs, e.g. `[3, 24, 48, 72, 90]`, with or without the last layer) says it, and
without it the files must hold exactly the draft's taps plus the last layer, which only their
count can check. Their id `k` is our `target_layer_ids` entry `format.taps.layer_id_from_residual(k)`
= `k - 1`; a draft tap the files lack, or a hidden size other than the draft's
`target_hidden_size`, is refused in one line naming the file. Files with more taps than the draft
needs are fine: the draft's columns are picked.

The final hidden state (the lm_head input our objective needs) is the target's final norm,
read from its weights, applied to the last column, as speculators' own trainer does.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from dspark_hub._compat import renamed_keywords
from dspark_hub.errors import CheckpointFormatError, MissingDependencyError, UsageError
from dspark_hub.format.folder import FolderListing, data_folder, listed_file, open_regular
from dspark_hub.format.jsonio import loads_strict, read_json_input
from dspark_hub.format.reader import SafetensorsHeader, read_header
from dspark_hub.format.taps import layer_id_from_residual, residual_index
from dspark_hub.train.data.checks import INT64_MAX, check_token_ids
from dspark_hub.train.data.draft_taps import check_target_matches
from dspark_hub.train.data.rollouts import MANIFEST, RolloutData
from dspark_hub.train.target.generate import Rollout
from dspark_hub.train.target.target import FinalNorm, Target
from dspark_hub.train.target.tensors import read_tensors

# torch, safetensors and pyarrow (speculators' Arrow files) are imported inside the readers: the
# CLI imports this module (`parse_layer_ids`) for `--help`.

DataFormat = Literal["rollouts", "speculators", "vllm-extraction"]
FLOAT_DTYPES = {"F32", "BF16", "F16", "F8_E4M3"}
INDEX_DTYPES = {"I64", "I32"}
ARROW_HINT = "pip install 'dspark-hub[speculators]' (pyarrow)"


def detect_format(path: str | os.PathLike[str], *, param: str | None = None) -> DataFormat:
    """What a training-data path holds (see the module docstring); `param` names the caller's argument.

    Raises:
        UsageError: the path does not exist, or is none of the three.
    """
    folder = Path(path)
    if not folder.exists():
        raise UsageError(f"{folder}: not found; pass a rollouts folder or a folder of hidden-state files",
                         param=param)
    if (folder / MANIFEST).is_file():
        return "rollouts"
    if _is_arrow_dataset(folder) or (folder.name == "hidden_states" and _is_arrow_dataset(folder.parent)):
        return "speculators"
    if folder.is_dir() and any(folder.glob("*.safetensors")):
        return "vllm-extraction"
    raise UsageError(f"{folder}: neither a rollouts folder ({MANIFEST}), a speculators data folder (state.json, "
                     "data-*.arrow, hidden_states/) nor a folder of hidden-state safetensors files", param=param)


def _is_arrow_dataset(folder: Path) -> bool:
    return (folder / "state.json").is_file() and any(folder.glob("*.arrow"))


@dataclass(frozen=True)
class _File:
    path: Path
    length: int
    layers: int
    hidden: int
    fp8: bool
    header: SafetensorsHeader


def _check_file(path: Path) -> _File:
    """The shape facts of one hidden-state file, from its header only (no tensor data read)."""
    try:
        header = read_header(path)
    except CheckpointFormatError as exc:
        raise UsageError(f"{exc.message}; not a hidden-state file") from None
    tensors = header.tensors
    hs, ids = tensors.get("hidden_states"), tensors.get("token_ids")
    if hs is None or ids is None:
        raise UsageError(f"{path}: has {', '.join(sorted(tensors)) or 'no tensors'}; a hidden-state file holds "
                         "hidden_states [T, n, H] and token_ids [T]")
    if len(hs.shape) != 3 or hs.dtype not in FLOAT_DTYPES or len(ids.shape) != 1 or ids.dtype not in INDEX_DTYPES:
        raise UsageError(f"{path}: hidden_states is {hs.dtype} {list(hs.shape)} and token_ids {ids.dtype} "
                         f"{list(ids.shape)}; expected a float [T, n, H] and an integer [T]")
    if hs.shape[0] != ids.shape[0]:
        raise UsageError(f"{path}: hidden_states has {hs.shape[0]} rows and token_ids {ids.shape[0]}")
    fp8 = hs.dtype == "F8_E4M3"
    scales = tensors.get("hidden_states_scales")
    if fp8 and scales is None:
        raise UsageError(f"{path}: FP8 hidden_states without hidden_states_scales")
    if fp8 and scales is not None and (scales.dtype not in FLOAT_DTYPES - {"F8_E4M3"} or len(scales.shape) != 3
                                       or scales.shape[0] != hs.shape[0] or scales.shape[1:] != (1, 1)):
        raise UsageError(f"{path}: hidden_states_scales is {scales.dtype} {list(scales.shape)}; expected a float "
                         f"[{hs.shape[0]}, 1, 1], one scale per token")
    return _File(path, hs.shape[0], hs.shape[1], hs.shape[2], fp8, header)


def resolve_columns(layers: int, draft_taps: list[int], num_hidden_layers: int, layer_ids: list[int] | None,
                    where: str) -> tuple[list[int], list[int]]:
    """(columns of the draft's taps, the files' ids) for files holding `layers` residual streams.

    Args:
        layers: the files' `n`.
        draft_taps: the draft's `target_layer_ids` (ours).
        num_hidden_layers: the target's layer count (id of the last column).
        layer_ids: the files' aux ids in vLLM/speculators convention, with or without the last layer;
            None = the draft's taps plus the last layer.
        where: the file named in messages.

    Raises:
        UsageError: the ids do not fit the files, or a draft tap is missing.
    """
    taps = sorted(draft_taps)
    if layer_ids is None:
        # A tap at the target's last layer is that layer's column: the files hold it once.
        ids = sorted({residual_index(t) for t in taps} | {num_hidden_layers})
        if layers != len(ids):
            raise UsageError(f"{where}: holds {layers} layers, the draft's taps plus the last name {len(ids)} "
                             f"(target_layer_ids {taps}); give the ids the files were captured at")
    else:
        ids = sorted(set(int(k) for k in layer_ids))
        if ids[-1] != num_hidden_layers:
            ids.append(num_hidden_layers)
        if len(ids) != layers:
            raise UsageError(f"{where}: holds {layers} layers, the given layer ids name {len(ids)} "
                             f"({ids}, the last layer {num_hidden_layers} included)")
    # Every column is a candidate tap: the last is the final state's input and may be a tap as well.
    ours = [layer_id_from_residual(k) for k in ids]
    missing = [t for t in taps if t not in ours]
    if missing:
        raise UsageError(f"{where}: captured at vLLM/speculators ids {ids} = target_layer_ids {ours}; the draft taps "
                         f"{taps}, {missing} missing")
    return [ours.index(t) for t in taps], ids


def check_rollout_layer_ids(data: RolloutData, layer_ids: list[int]) -> None:
    """Accept layer ids for a rollouts folder only when they name its own taps (vLLM/speculators convention,
    with or without the last layer): a recipe may pass the same ids whichever data it was given.

    Raises:
        UsageError: the ids name other layers than the folder's taps.
    """
    settings = data.manifest.get("settings", {})
    taps = sorted(settings.get("target_layer_ids", []))
    theirs = [residual_index(t) for t in taps]
    given = sorted(set(int(k) for k in layer_ids))
    last = settings.get("target_num_hidden_layers")
    if given and given[-1] == last and last not in theirs:
        given = given[:-1]
    if given != theirs:
        raise UsageError(f"{data.folder}: a rollouts folder records its own taps, target_layer_ids {taps} = "
                         f"vLLM/speculators ids {theirs}; the layer ids {sorted(layer_ids)} name others (leave them "
                         "out for a rollouts folder)", param="data_layer_ids")


def _arrow_files(listing: FolderListing) -> list[Path]:
    """The Arrow files of a `datasets.save_to_disk` folder (`listing`'s root): those `state.json` names, confined
    to the folder, else its `data-*.arrow` files."""
    state_path = listing.root / "state.json"
    named = read_json_input(state_path).get("_data_files", [])
    if not isinstance(named, list) or not all(isinstance(e, dict) for e in named):
        raise UsageError(f"{state_path}: _data_files is not a list of objects; speculators data lists its Arrow "
                         "files there")
    if named:
        return [listed_file(listing, e.get("filename"), named_in=str(state_path), key=f"_data_files[{i}].filename")
                for i, e in enumerate(named)]
    return [listing.root / n for n in listing.files if "/" not in n and Path(n).match("data-*.arrow")]


def _arrow_rows(listing: FolderListing) -> list[dict[str, Any]]:
    """`input_ids` and `loss_mask` of every row of a `datasets.save_to_disk` folder (`listing`'s root), in row
    order."""
    try:
        import pyarrow as pa
        import pyarrow.ipc as ipc
    except ImportError:
        raise MissingDependencyError(f"reading speculators data ({listing.root}) needs pyarrow; {ARROW_HINT}") from None

    rows: list[dict[str, Any]] = []
    for path in _arrow_files(listing):
        try:
            with open_regular(path) as handle, ipc.open_stream(handle) as reader:   # pyarrow never opens the path
                table = reader.read_all()
        except pa.ArrowException as e:
            raise UsageError(f"{path}: not an Arrow stream ({str(e).splitlines()[0] if str(e) else e}); pass "
                             "speculators prepare-data output") from None
        missing = {"input_ids", "loss_mask"} - set(table.column_names)
        if missing:
            raise UsageError(f"{path}: no {', '.join(sorted(missing))} column; speculators data rows "
                             "carry input_ids and loss_mask")
        columns = table.column("input_ids").to_pylist(), table.column("loss_mask").to_pylist()
        for ids, mask in zip(*columns, strict=True):
            _check_row(ids, mask, f"{path}: row {len(rows)}")
            rows.append({"input_ids": ids, "loss_mask": mask})
    return rows


def _check_row(ids: Any, mask: Any, where: str) -> None:
    def ints(values: Any, top: int) -> bool:
        return isinstance(values, list) and all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= top
                                                for v in values)

    if not ints(ids, INT64_MAX) or not ints(mask, 1) or len(ids) != len(mask):
        raise UsageError(f"{where}: input_ids and loss_mask are not two lists of the same length of token ids "
                         "and 0/1; pass speculators prepare-data output")


def _files_and_rows(folder: Path, *, speculators: bool) -> tuple[list[dict[str, Any]] | None, list[tuple[int, Path]],
                                                                 int]:
    """(speculators rows or None, (row, file) of each hidden-state file, how many rows have no file); the files
    are those the data folder's listing holds (`format.folder.data_folder`: no link out, no special file)."""
    if not speculators:
        listing = data_folder(folder)
        files = [folder / name for name in listing.files if "/" not in name and name.endswith(".safetensors")]
        if not files:
            raise UsageError(f"{folder}: holds no regular *.safetensors file; pass a folder of hidden-state files")
        return None, list(enumerate(files)), 0
    data_dir = folder if _is_arrow_dataset(folder) else folder.parent
    files_dir = folder if folder.name == "hidden_states" and not _is_arrow_dataset(folder) else folder / "hidden_states"
    listing = data_folder(data_dir)
    rows = _arrow_rows(listing)
    prefix = files_dir.relative_to(data_dir).as_posix()
    candidates = [(i, f"{prefix}/hs_{i}.safetensors") for i in range(len(rows))]
    present = [(i, data_dir / name) for i, name in candidates if name in listing.files]
    if not present:
        raise UsageError(f"{files_dir}: no hs_<row>.safetensors for any of the {len(rows)} rows of {data_dir}")
    return rows, present, len(candidates) - len(present)


class HiddenStateData:
    """vLLM-extraction or speculators files as a dataset of `Rollout`s (`len`, `data[i]`), read lazily."""

    target_path: str | None = None

    @renamed_keywords(teacher="target")
    def __init__(self, path: str | os.PathLike[str], *, draft_config: dict[str, Any],
                 target: str | os.PathLike[str] | Target, layer_ids: list[int] | None = None,
                 final_norm: FinalNorm | None = None) -> None:
        folder = Path(path)
        self.format: DataFormat = detect_format(folder)
        if self.format == "rollouts":
            raise UsageError(f"{folder}: is a rollouts folder; read it with RolloutData")
        target = Target.open(target, param="target")
        self.target_path = target.path
        check_target_matches(target.config, draft_config, target_name=target.path)
        self.final_norm = final_norm or target.final_norm()
        hidden = int(draft_config["target_hidden_size"])
        num_layers = int(draft_config["target_num_hidden_layers"])
        self.rows, present, self.missing = _files_and_rows(folder, speculators=self.format == "speculators")
        self.vocab_size = draft_config.get("vocab_size")
        self.files: list[tuple[int, _File]] = []
        for row, file_path in present:
            facts = _check_file(file_path)
            if facts.hidden != hidden:
                raise UsageError(f"{file_path}: hidden size {facts.hidden}, the draft's target_hidden_size is "
                                 f"{hidden}")
            if self.files and facts.layers != self.files[0][1].layers:
                raise UsageError(f"{file_path}: holds {facts.layers} layers, {self.files[0][1].path.name} "
                                 f"{self.files[0][1].layers}; one capture per dataset")
            self.files.append((row, facts))
        self.columns, self.layer_ids = resolve_columns(self.files[0][1].layers, list(draft_config["target_layer_ids"]),
                                                       num_layers, layer_ids, str(self.files[0][1].path))
        self.folder = folder

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> Rollout:
        import torch

        row, facts = self.files[i]
        names = ["hidden_states", "token_ids", *(["hidden_states_scales"] if facts.fp8 else [])]
        hidden, tokens, *scales = read_tensors(facts.path, facts.header, names)
        tokens = tokens.long()
        if isinstance(self.vocab_size, int):
            check_token_ids(tokens, self.vocab_size, f"{facts.path}: token_ids",
                            fix="extract the states with the target the draft pairs with")
        if facts.fp8:
            hidden = hidden.to(torch.bfloat16) * scales[0].to(torch.bfloat16)
        if self.rows is not None:
            record = self.rows[row]
            if record["input_ids"] != tokens.tolist():
                raise UsageError(f"{facts.path}: token_ids differ from row {row}'s input_ids of the speculators "
                                 "data; the files and the rows come from different runs")
            mask = torch.tensor(record["loss_mask"], dtype=torch.uint8)
        else:
            mask = torch.ones(facts.length, dtype=torch.uint8)
        aux = hidden[:, self.columns].flatten(1).to(torch.bfloat16)
        final = self.final_norm(hidden[:, -1]).to(torch.bfloat16)
        start = int(mask.nonzero()[0]) if bool(mask.any()) else facts.length
        return Rollout(row, None, tokens, start, aux, final, (0, 0), mask)

    def __iter__(self) -> Iterator[Rollout]:
        return (self[i] for i in range(len(self)))

    def describe(self) -> dict[str, Any]:
        """What the training log records about the data."""
        return {"format": self.format, "path": str(self.folder), "sequences": len(self), "missing_files": self.missing,
                "layer_ids": self.layer_ids, "tap_columns": self.columns, "final_norm": self.final_norm.describe()}


@renamed_keywords(teacher="target")
def open_training_data(path: str | os.PathLike[str], *, draft_config: dict[str, Any],
                       target: str | os.PathLike[str] | Target | None,
                       layer_ids: list[int] | None = None, param: str | None = None) -> RolloutData | HiddenStateData:
    """Rollouts, speculators or vLLM-extraction data at `path`, as a dataset of `Rollout`s.

    `param` names the caller's argument `path` came from, in the errors about the path itself.

    Raises:
        UsageError: unknown format, no target for hidden-state files, or files that do not fit
            the draft (one line naming the file and what differs).
        MissingDependencyError: speculators data without pyarrow.
    """
    if detect_format(path, param=param) == "rollouts":
        data = RolloutData(path, param=param)
        if layer_ids is not None:
            check_rollout_layer_ids(data, layer_ids)
        for key in ("target_layer_ids", "target_hidden_size", "vocab_size"):
            if key in draft_config and data.settings[key] != draft_config[key]:
                raise UsageError(f"{path}: recorded {key} {data.settings[key]}, the draft reads "
                                 f"{draft_config[key]}; record the rollouts with this draft's config.json",
                                 param=param)
        return data
    if target is None:
        raise UsageError(f"{path}: hidden-state files need the target folder (its final norm and lm_head)")
    return HiddenStateData(path, draft_config=draft_config, target=target, layer_ids=layer_ids)


def write_hidden_state_file(path: str | os.PathLike[str], hidden_states: Any, token_ids: Any) -> None:
    """Write one file in the extraction connector's layout (tests and exports)."""
    from safetensors.torch import save_file

    save_file({"hidden_states": hidden_states.contiguous(), "token_ids": token_ids.long().contiguous()}, str(path))


def parse_layer_ids(text: str | None) -> list[int] | None:
    """`"3,24,48"` or `"[3, 24, 48]"` -> ids; None stays None."""
    if text is None:
        return None
    try:
        values = (loads_strict(text, path="data_layer_ids") if text.strip().startswith("[")
                  else [int(v) for v in text.split(",") if v.strip()])
    except ValueError:
        values = None
    if not values or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values):
        raise UsageError(f"layer ids {text!r}: give non-negative integers, e.g. 3,24,48,72,90")
    return values
