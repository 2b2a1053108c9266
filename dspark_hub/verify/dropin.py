"""`--drop-in`: identity with a reference draft (config, roster, file layout, metadata).

A drop-in replacement changes only the weights: runtimes and caches keyed on the reference's
layout must not be able to tell the files apart by anything but their bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dspark_hub._text import short_json
from dspark_hub.errors import UsageError
from dspark_hub.format import contract
from dspark_hub.format.checkpoint import CheckpointView, LocalSource, open_checkpoint
from dspark_hub.format.registry import K3_DSPARK
from dspark_hub.report import Finding, error, info
from dspark_hub.verify.family import FAMILIES, Fingerprint, fingerprint, methods_text

#: Keys that may appear in a drop-in's config beyond the reference's (reported as info).
#: The `__metadata__` transformers' `save_pretrained` writes.
_TRANSFORMERS_METADATA = {"format": "pt"}
ALLOWED_EXTRA_KEYS = {"auto_map": "added by 'dspark-hub export-code' for trust_remote_code; runtimes ignore it"}


def _fmt(value: object) -> str:
    return short_json(value)   # the reference's config is someone else's file: a value may be 50 MB


@dataclass(frozen=True)
class DropInReference:
    """What a drop-in must equal: config, roster, file layout and per-file metadata."""

    name: str
    config: dict[str, Any]
    tensors: dict[str, tuple[tuple[int, ...], str]]
    files: dict[str, tuple[int, int, dict[str, str] | None]]   # file -> (size, header length, metadata)
    family: str = K3_DSPARK                                   # `verify.family` name of the reference


def bundled_reference(name: str) -> DropInReference:
    config = contract.REFERENCES[name]
    specs = contract.roster(config)
    header = contract.header_bytes(specs, contract.TORCHSPEC_METADATA)
    return DropInReference(
        name=name, config=config,
        tensors={n: (s.shape, s.dtype) for n, s in specs.items()},
        files={contract.WEIGHTS_NAME: (contract.expected_file_size(config), len(header),
                                       dict(contract.TORCHSPEC_METADATA))},
    )


def reference_from_view(view: CheckpointView) -> DropInReference:
    return DropInReference(
        name=view.location, config=view.config or {},
        tensors={n: (info.shape, info.dtype) for n, (_, info) in view.tensors.items()},
        files={f: (view.files[f], h.header_length, h.metadata) for f, h in view.headers.items()},
        family=fingerprint(view.config, view.tensors).family,
    )


def dropin_family_finding(found: Fingerprint, ref: DropInReference) -> Finding:
    """The one finding for a drop-in check across draft families: nothing else about it is comparable."""
    theirs = FAMILIES[ref.family].title
    return error("DROPIN_FAMILY", contract.CONFIG_NAME,
                 f"this is {found.spec.title}, {ref.name} is {theirs}: a checkpoint of another draft "
                 f"family is never a drop-in replacement ({'; '.join(found.evidence)})",
                 f"compare it with a reference of its own family; it is served by {methods_text(found.spec)}")


def resolve_reference(ref: str) -> DropInReference:
    """`kimi-k3` (bundled) or a local checkpoint folder.

    Raises:
        UsageError: neither a bundled reference nor a readable folder.
    """
    if ref in contract.REFERENCES:
        return bundled_reference(ref)
    if not Path(ref).is_dir():
        raise UsageError(f"{ref!r} is neither a bundled reference ({', '.join(contract.REFERENCES)}) "
                         "nor a checkpoint folder", param="drop_in")
    view = open_checkpoint(LocalSource(ref))
    if view.config is None or not view.tensors:
        raise UsageError(f"{ref}: cannot be read as a reference (verify it first)", param="drop_in")
    return reference_from_view(view)


def check_drop_in(view: CheckpointView, ref: DropInReference) -> list[Finding]:
    """Demand identity with `ref`: config keys and values, roster, shapes, dtypes, layout, metadata."""
    out: list[Finding] = []
    where_ref = f"drop-in {ref.name}"
    config = view.config or {}
    for key in ref.config:
        if key not in config:
            out.append(error("DROPIN_CONFIG_KEY_MISSING", f"config.json:{key}", f"{key} is missing; {where_ref} "
                             f"has {_fmt(ref.config[key])}", f"add {key} with the reference value"))
        elif config[key] != ref.config[key]:
            out.append(error("DROPIN_CONFIG_VALUE", f"config.json:{key}", f"{key} is {_fmt(config[key])}, "
                             f"{where_ref} has {_fmt(ref.config[key])}; not a drop-in replacement",
                             "a drop-in changes only the weights"))
    for key in config:
        if key in ref.config:
            continue
        if key in ALLOWED_EXTRA_KEYS:
            out.append(info("DROPIN_ALLOWED_EXTRA_KEY", f"config.json:{key}", ALLOWED_EXTRA_KEYS[key]))
        else:
            out.append(error("DROPIN_CONFIG_EXTRA_KEY", f"config.json:{key}", f"{key} is not in {where_ref}'s "
                             "config", f"remove {key}"))
    present = {n: (info.shape, info.dtype) for n, (_, info) in view.tensors.items()}
    for name in sorted(set(ref.tensors) - set(present)):
        out.append(error("DROPIN_TENSOR_MISSING", name, f"is in {where_ref} but not here"))
    for name in sorted(set(present) - set(ref.tensors)):
        out.append(error("DROPIN_TENSOR_EXTRA", name, f"is not in {where_ref}", "remove it"))
    for name in sorted(set(present) & set(ref.tensors)):
        (shape, dtype), (rshape, rdtype) = present[name], ref.tensors[name]
        if tuple(shape) != tuple(rshape):
            out.append(error("DROPIN_SHAPE", name, f"has shape {list(shape)}, {where_ref} has {list(rshape)}",
                             "same architecture name, different dimensions: not a drop-in"))
        if dtype != rdtype:
            out.append(error("DROPIN_DTYPE", name, f"is {dtype}, {where_ref} has {rdtype}"))
    out += _drop_in_files(view, ref, where_ref)
    return out


def _drop_in_files(view: CheckpointView, ref: DropInReference, where_ref: str) -> list[Finding]:
    out: list[Finding] = []
    mine = set(view.headers)
    if mine != set(ref.files):
        out.append(error("DROPIN_LAYOUT", "weights", f"weight files are {sorted(mine)}, {where_ref} has "
                         f"{sorted(ref.files)}", "merge or split the weights to the same file layout "
                         "('dspark-hub convert' merges shards)"))
        return out
    for name, (size, header_len, metadata) in ref.files.items():
        header = view.headers[name]
        same_metadata = header.metadata == metadata
        if not same_metadata:
            out.append(error("DROPIN_METADATA", name, f"__metadata__ is {_fmt(header.metadata)}, {where_ref} has "
                             f"{_fmt(metadata)}", _rewrite_hint(metadata)))
        if view.files[name] != size or header.header_length != header_len:
            why = "" if same_metadata else " (the header holds the other metadata)"
            out.append(error("DROPIN_FILE_SIZE", name, f"{view.files[name]:,} bytes with a {header.header_length:,}"
                             f"-byte header, {where_ref} has {size:,} with {header_len:,}{why}",
                             _rewrite_hint(metadata) if same_metadata else "the fix for DROPIN_METADATA fixes this"))
    return out


def _rewrite_hint(metadata: dict[str, str] | None) -> str:
    """How to rewrite the weights in the reference's layout: 'dspark-hub convert' when that is the contract's."""
    if metadata == contract.TORCHSPEC_METADATA:
        return (f"rewrite the weights with 'dspark-hub convert' (the contract's layout and metadata "
                f"{_fmt(metadata)}; transformers' save_pretrained writes {_fmt(_TRANSFORMERS_METADATA)}), or save "
                "the model with dspark_hub.modeling.save_checkpoint")
    return (f"save the model with dspark_hub.modeling.save_checkpoint(model, out, metadata={_fmt(metadata)}): "
            "the same names, shapes, dtypes and safetensors metadata as the reference")
