"""A golden fixture read as someone else's file: its metadata checked key by key, its tensors checked against the
shapes the checkpoint's config and the metadata imply before one byte of tensor data is read.

A fixture names its block size, its cases (batch, context rows, first position), its tolerances and the lm_head
it was computed with. Every one of these decides what `golden check` allocates and runs: a block size of 10^8,
a stand-in lm_head of 10^9 rows or a tensor of a gigabyte would allocate gigabytes. So the metadata must have
the types and ranges `write_golden` writes, every stored tensor must be one the cases name, with the dtype and
shape the checkpoint's config implies, and only then are the bytes read (through `format.folder.read_regular`:
the safetensors library never opens the path).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dspark_hub import schemas
from dspark_hub._text import short_json
from dspark_hub.errors import CheckpointFormatError, UsageError
from dspark_hub.format.folder import read_regular
from dspark_hub.format.jsonio import loads_strict
from dspark_hub.format.reader import SafetensorsHeader, read_header

if TYPE_CHECKING:
    import torch

#: The largest block a fixture may hold (the reference serves 7; `golden --block-size` takes up to this).
MAX_BLOCK_SIZE = 64
#: The largest batch and context a case may hold (`write_golden` writes 2 requests of 6 rows).
MAX_BATCH, MAX_CONTEXT_ROWS = 16, 256
_CASE_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
_JSON_METADATA = ("config", "weights_sha256", "lm_head", "tolerances", "cases")
_INPUTS = ("context_states", "position_ids", "anchor_ids", "drafted_tokens")
_REWRITE = "pass a fixture written by 'dspark-hub golden CKPT -o FILE'"
FLOAT_OUTPUTS = ("last_hidden_state", "markov_bias", "confidence", "greedy_logits")


def _refuse(path: Path, message: str) -> UsageError:
    return UsageError(f"{path}: {message}; {_REWRITE}")


def _whole(value: Any, least: int, most: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and least <= value <= most


def _tolerance(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0


def _check_lm_head(path: Path, head: Mapping[str, Any]) -> None:
    if head.get("kind") == "file":
        if not isinstance(head.get("sha256"), str):
            raise _refuse(path, "metadata lm_head.sha256 is not a string")
    elif head.get("kind") == "seeded-standin":
        if not _whole(head.get("seed"), 0, 2 ** 63 - 1):
            raise _refuse(path, f"metadata lm_head.seed is {short_json(head.get('seed'), 60)}, not a seed (an "
                                "integer 0..2^63-1)")
    else:
        raise _refuse(path, f"metadata lm_head.kind is {short_json(head.get('kind'), 60)}, not file or "
                            "seeded-standin")


def _check_metadata(path: Path, meta: dict[str, Any]) -> None:
    """The decoded metadata has the types and ranges `write_golden` writes (raises `UsageError` naming the key)."""
    for key in ("config", "lm_head", "tolerances", "cases", "weights_sha256"):
        if not isinstance(meta[key], dict):
            raise _refuse(path, f"metadata {key!r} is not a JSON object")
    if not isinstance(meta["config_sha256"], str):
        raise _refuse(path, "metadata 'config_sha256' is not a string")
    block = meta["block_size"]
    if not (isinstance(block, str) and block.isdigit() and 1 <= int(block) <= MAX_BLOCK_SIZE):
        raise _refuse(path, f"metadata block_size is {short_json(block, 60)}, not a block size 1..{MAX_BLOCK_SIZE}")
    meta["block_size"] = int(block)
    _check_lm_head(path, meta["lm_head"])
    for name, tol in meta["tolerances"].items():
        if not (isinstance(tol, dict) and _tolerance(tol.get("atol")) and _tolerance(tol.get("rtol"))):
            raise _refuse(path, f"metadata tolerances.{name} is {short_json(tol, 60)}, not {{\"atol\": x, \"rtol\": "
                                "y}} with finite x, y >= 0")
    missing = [name for name in FLOAT_OUTPUTS if name not in meta["tolerances"]]
    if missing:
        raise _refuse(path, f"metadata tolerances has no {', '.join(missing)}")
    if not meta["cases"]:
        raise _refuse(path, "metadata cases is empty")
    for case, spec in meta["cases"].items():
        if not _CASE_NAME.fullmatch(case) or not isinstance(spec, dict) or not _whole(
                spec.get("context_start"), 0, 2 ** 62) or not _whole(spec.get("batch"), 1, MAX_BATCH) or not _whole(
                spec.get("context_rows"), 1, MAX_CONTEXT_ROWS):
            raise _refuse(path, f"metadata cases.{short_json(case, 60)} is {short_json(spec, 80)}, not "
                                f"{{\"context_start\": n >= 0, \"batch\": 1..{MAX_BATCH}, \"context_rows\": "
                                f"1..{MAX_CONTEXT_ROWS}}}")


def read_fixture(path: Path) -> tuple[dict[str, Any], SafetensorsHeader]:
    """(metadata with its JSON fields decoded and checked, the strictly read header) of a golden fixture; no
    tensor data is read.

    Raises:
        UsageError: not a safetensors file, not a golden fixture, or metadata missing, not JSON, or out of range.
    """
    try:
        header = read_header(path)
    except CheckpointFormatError as e:
        if e.code == "SPECIAL_FILE":
            raise
        raise UsageError(f"{path}: not a safetensors file ({e.detail}); {_REWRITE}") from None
    meta: dict[str, Any] = dict(header.metadata or {})
    if schemas.current(meta.get("schema")) != schemas.GOLDEN_FIXTURE:
        raise UsageError(f"{path}: not a dspark-hub golden fixture (schema {meta.get('schema')!r:.60}); {_REWRITE}")
    for key in (*_JSON_METADATA, "config_sha256", "block_size"):
        try:
            meta[key] = loads_strict(meta[key], path=f"{path}:{key}") if key in _JSON_METADATA else meta[key]
        except (KeyError, CheckpointFormatError):
            raise UsageError(f"{path}: metadata {key!r} is missing or not JSON; {_REWRITE}") from None
    _check_metadata(path, meta)
    return meta, header


def expected_tensors(meta: Mapping[str, Any], config: Mapping[str, Any],
                     confidence: bool) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Tensor name -> (dtype, shape) of every tensor a fixture of `meta`'s cases holds for a checkpoint of `config`."""
    block, width = meta["block_size"], int(config["num_target_layers"]) * int(config["target_hidden_size"])
    hidden = int(config["hidden_size"])
    out: dict[str, tuple[str, tuple[int, ...]]] = {}
    for case, spec in meta["cases"].items():
        b, rows = spec["batch"], spec["context_rows"]
        shapes = {"context_states": ("F32", (b, rows, width)), "position_ids": ("I64", (b, rows + block)),
                  "anchor_ids": ("I64", (b,)), "drafted_tokens": ("I64", (b, block)),
                  "last_hidden_state": ("F32", (b, block, hidden)), "markov_bias": ("F32", (b, block)),
                  "greedy_tokens": ("I64", (b, block)), "greedy_logits": ("F32", (b, block))}
        out.update({f"{case}.{name}": spec for name, spec in shapes.items()})
        if confidence:
            out[f"{case}.confidence"] = ("F32", (b, block))
    return out


def load_checked(path: Path, header: SafetensorsHeader, meta: Mapping[str, Any], config: Mapping[str, Any],
                 confidence: bool) -> dict[str, torch.Tensor]:
    """The fixture's tensors, read only after each was found to be one the cases name, with the dtype and shape
    the checkpoint's `config` implies (so what is allocated is what a fixture of this draft needs), and with
    token ids and positions the draft can take.

    Raises:
        UsageError: a tensor missing, unknown, of another dtype or shape, or a value out of range.
    """
    from safetensors.torch import load  # torch: only a check that got this far pays for it

    expected = expected_tensors(meta, config, confidence)
    for name, info in header.tensors.items():
        if name not in expected:
            raise _refuse(path, f"holds tensor {name!r}, which no case of its metadata names")
        dtype, shape = expected[name]
        # An expected output of another shape is a comparison that fails (and says why); an input must fit.
        output = name.rsplit(".", 1)[1] not in _INPUTS and math.prod(info.shape) <= math.prod(shape)
        if info.dtype != dtype or (tuple(info.shape) != shape and not output):
            raise _refuse(path, f"{name} is {info.dtype} {list(info.shape)}; this checkpoint's config and the "
                                f"fixture's metadata imply {dtype} {list(shape)}")
    absent = [name for name in expected if name not in header.tensors and not name.endswith(".confidence")]
    if absent:
        raise _refuse(path, f"has no tensor {absent[0]!r}")
    tensors = load(read_regular(path))
    vocab = min(int(config["vocab_size"]), int(config.get("draft_vocab_size") or config["vocab_size"]))
    limit = config.get("max_position_embeddings")
    for case in meta["cases"]:
        for name, top in (("anchor_ids", vocab), ("drafted_tokens", vocab), ("position_ids", limit)):
            value = tensors[f"{case}.{name}"]
            if value.numel() and (int(value.min()) < 0 or (isinstance(top, int) and int(value.max()) >= top)):
                raise _refuse(path, f"{case}.{name} holds {int(value.min())}..{int(value.max())}, outside [0, {top}) "
                                    "of this checkpoint's config")
    return tensors
