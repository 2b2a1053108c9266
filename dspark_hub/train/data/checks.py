"""What a data folder must be before training or eval reads a byte of it: the rollouts manifest's keys and types,
its shard files confined to the folder, each shard's tensors where the manifest says they are (their bytes are
read by `train.target.tensors`, the one reader of tensor bytes).

A data folder (a rollouts folder, a folder of hidden-state files) follows the rules of a model folder
(`format.folder.data_folder`: no link out, no FIFO, socket or device, UTF-8 names). A manifest is someone
else's file: every key the readers use is checked for presence and type here, once, so a bad one is one line
naming the file and the key instead of a `KeyError` deep in a training step.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dspark_hub._text import short_json
from dspark_hub.errors import UsageError
from dspark_hub.format.folder import FolderListing, listed_file, read_regular
from dspark_hub.format.reader import SafetensorsHeader, read_header

if TYPE_CHECKING:
    import torch

#: The largest value an int64 holds (token ids, lengths).
INT64_MAX = (1 << 63) - 1
#: Shard tensor dtypes per field: token ids and mask exactly, hidden states any float the writers use.
FIELD_DTYPES = {"input_ids": ("I64",), "loss_mask": ("U8",), "aux_hidden_states": ("BF16", "F16", "F32"),
                "final_hidden_states": ("BF16", "F16", "F32")}
_REWRITE = "write the folder again with 'dspark-hub rollouts --force'"


def _refuse(path: str, message: str) -> UsageError:
    return UsageError(f"{path}: {message}; {_REWRITE}")


def _key(doc: Mapping[str, Any], key: str, where: str, path: str) -> Any:
    if key not in doc:
        raise _refuse(path, f"no {where}{key}")
    return doc[key]


def _object(value: Any, where: str, path: str) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise _refuse(path, f"{where} is {short_json(value, 60)}, not an object")
    return value


def _list(value: Any, where: str, path: str) -> Sequence[Any]:
    if not isinstance(value, list):
        raise _refuse(path, f"{where} is {short_json(value, 60)}, not a list")
    return value


def whole(value: Any, where: str, path: str, *, least: int = 0) -> int:
    """`value` when it is an integer in `[least, INT64_MAX]` (a JSON `true` is not one)."""
    if isinstance(value, bool) or not isinstance(value, int) or not least <= value <= INT64_MAX:
        raise _refuse(path, f"{where} is {short_json(value, 60)}, not an integer >= {least}")
    return value


def _text(value: Any, where: str, path: str, *, optional: bool = False) -> str | None:
    if (value is None and optional) or isinstance(value, str):
        return value
    raise _refuse(path, f"{where} is {short_json(value, 60)}, not a string")


#: settings key -> how it is checked (the keys `rollouts` writes and `finetune`/`eval` read).
_SETTINGS = ("teacher", "prompts_sha256", "max_new_tokens", "target_layer_ids", "target_hidden_size",
             "target_num_hidden_layers", "vocab_size")


def _check_settings(settings: Mapping[str, Any], path: str) -> None:
    for key in _SETTINGS:
        value = _key(settings, key, "settings.", path)
        where = f"settings.{key}"
        if key in ("teacher", "prompts_sha256"):
            _text(value, where, path)
        elif key == "target_layer_ids":
            ids = [whole(v, f"{where}[{i}]", path) for i, v in enumerate(_list(value, where, path))]
            if not ids:
                raise _refuse(path, f"{where} is empty")
        else:
            whole(value, where, path, least=0 if key == "max_new_tokens" else 1)


def _check_sequence(value: Any, where: str, path: str) -> Mapping[str, Any]:
    seq = _object(value, where, path)
    whole(_key(seq, "prompt_index", f"{where}.", path), f"{where}.prompt_index", path)
    length = whole(_key(seq, "length", f"{where}.", path), f"{where}.length", path, least=1)
    prompt = whole(_key(seq, "prompt_length", f"{where}.", path), f"{where}.prompt_length", path)
    if prompt > length:
        raise _refuse(path, f"{where}.prompt_length {prompt} is longer than its length {length}")
    _text(seq.get("dataset"), f"{where}.dataset", path, optional=True)
    if "supervised_tokens" in seq:
        whole(seq["supervised_tokens"], f"{where}.supervised_tokens", path)
    if "greedy_agreement" in seq:
        pair = _list(seq["greedy_agreement"], f"{where}.greedy_agreement", path)
        counts = [whole(v, f"{where}.greedy_agreement[{i}]", path) for i, v in enumerate(pair)]
        if len(counts) != 2 or counts[0] > counts[1]:
            raise _refuse(path, f"{where}.greedy_agreement is {short_json(pair, 60)}, not [agree, total]")
    return seq


def check_rollouts_manifest(manifest: Mapping[str, Any], path: str) -> list[tuple[str, Mapping[str, Any]]]:
    """Every (shard file, sequence) a rollouts manifest lists, once each key a reader uses has its type.

    Raises:
        UsageError: a missing key or a value of the wrong type, named by its key path
            (`manifest.json: shards[0].sequences[3].prompt_length is "7", not an integer >= 0`).
    """
    _check_settings(_object(_key(manifest, "settings", "", path), "settings", path), path)
    teacher = _object(_key(manifest, "teacher", "", path), "teacher", path)
    _text(_key(teacher, "label", "teacher.", path), "teacher.label", path)
    _text(manifest.get("chat_template_sha256"), "chat_template_sha256", path, optional=True)
    entries: list[tuple[str, Mapping[str, Any]]] = []
    seen: set[int] = set()
    for s, shard in enumerate(_list(_key(manifest, "shards", "", path), "shards", path)):
        shard = _object(shard, f"shards[{s}]", path)
        file = _text(_key(shard, "file", f"shards[{s}].", path), f"shards[{s}].file", path)
        assert file is not None
        for q, seq in enumerate(_list(_key(shard, "sequences", f"shards[{s}].", path), f"shards[{s}].sequences",
                                      path)):
            checked = _check_sequence(seq, f"shards[{s}].sequences[{q}]", path)
            if checked["prompt_index"] in seen:
                raise _refuse(path, f"shards[{s}].sequences[{q}].prompt_index {checked['prompt_index']} is listed "
                                    "twice")
            seen.add(checked["prompt_index"])
            entries.append((file, checked))
    return entries


def shard_headers(listing: FolderListing, entries: list[tuple[str, Mapping[str, Any]]],
                  settings: Mapping[str, Any], manifest_path: str) -> dict[str, tuple[Path, SafetensorsHeader]]:
    """Each shard the manifest names, confined to the folder, with its strictly read header; every sequence's
    four tensors present with the dtypes and shapes its length and the settings imply.

    Raises:
        CheckpointFormatError: a shard named outside the folder or not in it (`format.folder.listed_file`), or
            not a valid safetensors file.
        UsageError: a tensor missing, or of another dtype or shape.
    """
    headers: dict[str, tuple[Path, SafetensorsHeader]] = {}
    hidden = int(settings["target_hidden_size"])
    widths = {"aux_hidden_states": len(settings["target_layer_ids"]) * hidden, "final_hidden_states": hidden}
    for s, (file, seq) in enumerate(entries):
        if file not in headers:
            shard = listed_file(listing, file, named_in=manifest_path, key=f"shard file (entry {s})")
            headers[file] = (shard, read_header(shard))
        shard, header = headers[file]
        length = seq["length"]
        for field, dtypes in FIELD_DTYPES.items():
            name = f"{seq['prompt_index']}.{field}"
            info = header.tensors.get(name)
            shape = [length] if field in ("input_ids", "loss_mask") else [length, widths[field]]
            if info is None:
                raise UsageError(f"{shard}: no tensor {name!r}, which {manifest_path} lists; {_REWRITE}")
            if info.dtype not in dtypes or list(info.shape) != shape:
                raise UsageError(f"{shard}: {name} is {info.dtype} {list(info.shape)}, the manifest implies "
                                 f"{' or '.join(dtypes)} {shape}; {_REWRITE}")
    return headers


def check_token_ids(ids: torch.Tensor, vocab_size: int, where: str, *, fix: str = _REWRITE) -> None:
    """Refuse token ids outside `[0, vocab_size)` before an embedding lookup fails on them.

    Raises:
        UsageError: naming the tensor (`where`) and the first id out of range.
    """
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab_size):
        bad = int(ids[(ids < 0) | (ids >= vocab_size)][0])
        raise UsageError(f"{where}: token id {bad} is outside the vocabulary [0, {vocab_size}); {fix}")


def check_mask(mask: torch.Tensor, where: str) -> None:
    """Refuse a loss mask other than 0/1 per token.

    Raises:
        UsageError: naming the tensor (`where`).
    """
    if mask.numel() and int(mask.max()) > 1:
        raise UsageError(f"{where}: holds {int(mask.max())}; a loss mask is 0 or 1 per token; {_REWRITE}")


# ---------------------------------------------------------------- prompts files

_PROMPT_KINDS = ("messages", "text", "input_ids")


def prompt_lines(path: str | os.PathLike[str]) -> list[tuple[int, str]]:
    """(line number, line) of every non-blank line of a prompts JSONL file, read as strict UTF-8.

    Lines end at `\\n` only: U+2028 and the other separators `str.splitlines` knows are text inside a JSON string.

    Raises:
        UsageError: the bytes are not UTF-8 (naming the line and byte).
        CheckpointFormatError: `SPECIAL_FILE`, a FIFO, socket or device (never opened).
    """
    raw = read_regular(path)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise UsageError(f"{path}:{line}: byte 0x{raw[e.start]:02x} is not UTF-8 text; a prompts file is UTF-8 JSON "
                         "lines") from None
    return [(n, line.rstrip("\r")) for n, line in enumerate(text.split("\n"), start=1) if line.strip()]


def _token_ids(value: Any, where: str, key: str = "input_ids") -> list[int]:
    if not isinstance(value, list) or not value or not all(
            isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= INT64_MAX for v in value):
        bad = next((v for v in value if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= INT64_MAX),
                   None) if isinstance(value, list) and value else value
        raise UsageError(f"{where}: {key} holds {short_json(bad, 60)}; give a non-empty list of token ids "
                         f"(integers 0..{INT64_MAX})")
    return value


def prompt_kind(record: Mapping[str, Any], where: str) -> str:
    """Which of messages, text, input_ids the prompt `record` carries, once its value and `dataset` have the
    right JSON types (a `true` is no token id, a number no text).

    Raises:
        UsageError: none or several of them, or a value of the wrong type (naming the line and key).
    """
    kinds = [key for key in _PROMPT_KINDS if key in record]
    if len(kinds) != 1:
        raise UsageError(f"{where}: needs exactly one of messages, text, input_ids (has {kinds or 'none'})")
    kind, value = kinds[0], record[kinds[0]]
    if kind == "input_ids":
        _token_ids(value, where)
    elif kind == "text" and (not isinstance(value, str) or not value):
        raise UsageError(f"{where}: text is {short_json(value, 60)}; give the prompt as a non-empty string")
    elif kind == "messages" and (not isinstance(value, list) or not value or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), (str, list))
            for m in value)):
        raise UsageError(f"{where}: messages is {short_json(value, 60)}; give a non-empty list of "
                         '{"role": "...", "content": "..."} objects')
    dataset = record.get("dataset")
    if dataset is not None and not isinstance(dataset, str):
        raise UsageError(f"{where}: dataset is {short_json(dataset, 60)}; give a label string (or leave it out)")
    return kind


def check_prompt_ids(ids: list[int], where: str, *, vocab_size: int | None, context: int | None,
                     budget: int = 0) -> None:
    """Refuse prompt token ids the target cannot take: outside its vocabulary, or a prompt that with the `budget`
    tokens to come runs past its context (`max_position_embeddings`), which would be silently run.

    Raises:
        UsageError: naming the line, the id or the length, and the limit.
    """
    ids = _token_ids(ids, where, "the prompt")
    if vocab_size is not None:
        bad = next((i for i in ids if i >= vocab_size), None)
        if bad is not None:
            raise UsageError(f"{where}: token id {bad} is outside the target's vocabulary [0, {vocab_size}); give "
                             "ids of the target's tokenizer")
    if context is not None and len(ids) + budget > context:
        more = f" + {budget:,} tokens to generate" if budget else ""
        raise UsageError(f"{where}: the prompt is {len(ids):,} tokens{more}, longer than the target's context of "
                         f"{context:,} (max_position_embeddings); shorten the prompt")
