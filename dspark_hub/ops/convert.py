"""`convert SRC DST`: turn a known near-miss export into a contract checkpoint, reporting every change.

What it repairs:

- names: strips wrapper prefixes (`contract.FOREIGN_PREFIXES`) and renames trainer-internal
  names (`contract.KNOWN_MISNAMES`: `fc`, `hidden_norm`, `norm`);
- drops tensors runtimes skip (`contract.SKIPPED_EXTRAS`: a shipped `lm_head.weight`);
- casts F32/F16 tensors to BF16 (round to nearest even, NaN stays NaN);
- merges shards into one `model.safetensors` in sorted-name order, with the contract metadata;
- config: removes `contract.FORBIDDEN_KEYS` (`rope_interleave`) and the transformers-v5 `dtype`
  alias, adds missing contract keys with their reference values unless they set tensor
  dimensions, sets `torch_dtype` to match the tensors, and writes keys in the published order
  (unknown keys after).

It streams one tensor at a time, writes into a temporary folder renamed to DST at the end
(an interrupted run leaves no DST), never modifies SRC, and refuses an existing DST without
`force`. Other files in SRC (README, tokenizer, ...) are not copied; each is reported.

JSON (schema `dspark-hub/convert/1`)::

    {
      "schema": "dspark-hub/convert/1",
      "ok": bool,                      # DST passes a header-level verify
      "input": str,                    # SRC
      "path": str,                     # DST, what was written
      "tensors": int, "weights_bytes": int,
      "changes": [{"kind": str, "target": str, "detail": str}],
      "verify": {"ok": bool, "errors": [{"code": str, "where": str}]}   # header-level verify of DST
    }

Change kinds: `strip_prefix`, `rename`, `drop`, `cast`, `merge`, `metadata`, `config_remove`,
`config_add`, `config_set`, `config_order`, `config_note`, `skip_file`.
"""

from __future__ import annotations

import copy
import functools
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dspark_hub import schemas
from dspark_hub._text import plural
from dspark_hub.documents import Document
from dspark_hub.errors import ConversionRefusedError, UsageError
from dspark_hub.format import contract
from dspark_hub.format.checkpoint import CheckpointView, LocalSource, open_checkpoint
from dspark_hub.format.contract import TensorSpec
from dspark_hub.format.registry import DEFAULT_FORMAT, FORMATS, by_cli_name, titles
from dspark_hub.format.tensorio import BytesLike, TensorLocation, cast_bytes, iter_elements, view_location
from dspark_hub.format.writer import atomic_dir, check_writable, refuse_own_inputs, write_file, write_safetensors
from dspark_hub.ops.crosswalk import crosswalk
from dspark_hub.progress import Progress, announce_total
from dspark_hub.verify.checks import verify
from dspark_hub.verify.family import detect, methods_text

SCHEMA = schemas.command("convert")
#: Float dtypes convert casts to BF16 (`tensorio.EXACT_CASTS`).
CAST_TO_BF16 = ("F32", "F16")
CHUNK_ELEMENTS = 4 << 20
#: Reader findings convert can repair (it merges shards without an index).
_REPAIRABLE = {"INDEX_MISSING"}
#: The transformers-v5 spelling of `torch_dtype`; the contract writes `torch_dtype`.
DTYPE_ALIAS = "dtype"


@dataclass(frozen=True)
class Change(Document):
    """One thing convert did (or deliberately did not do)."""

    kind: str
    target: str
    detail: str


@dataclass(frozen=True)
class TensorPlan:
    """One output tensor: where its bytes come from and whether they are cast."""

    source: TensorLocation
    spec: TensorSpec

    @property
    def cast(self) -> bool:
        return self.source.info.dtype != self.spec.dtype


@dataclass
class ConvertReport(Document):
    """What `convert` wrote and every change it made."""

    SCHEMA = SCHEMA
    KEYS = ("ok", "input=src", "path=dst", "tensors", "weights_bytes", "changes", "verify=verify_outcome")

    src: str
    dst: str
    tensors: int = 0
    weights_bytes: int = 0
    changes: list[Change] = field(default_factory=list)
    verify_ok: bool = False
    verify_errors: list[tuple[str, str]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """DST was written and passes a header-level verify."""
        return self.verify_ok

    @property
    def verify_outcome(self) -> dict[str, Any]:
        return {"ok": self.verify_ok, "errors": [{"code": c, "where": w} for c, w in self.verify_errors]}


# ---------------------------------------------------------------- names

def contract_name(name: str) -> tuple[str, list[str]]:
    """The contract name of an exported tensor name, and the wrapper prefixes stripped from it."""
    stripped: list[str] = []
    while prefix := next((p for p in contract.FOREIGN_PREFIXES if name.startswith(p)), None):
        stripped.append(prefix)
        name = name[len(prefix):]
    return contract.KNOWN_MISNAMES.get(name, name), stripped


def plan_tensors(view: CheckpointView) -> tuple[list[TensorPlan], list[Change]]:
    """Output tensors in sorted-name order, plus the renames, drops and casts that produce them.

    Raises:
        UsageError: two exported tensors map to the same contract name.
    """
    plans: dict[str, TensorPlan] = {}
    origin: dict[str, str] = {}
    changes: list[Change] = []
    for name in sorted(view.tensors):
        _, info = view.tensors[name]
        target, stripped = contract_name(name)
        if stripped:
            changes.append(Change("strip_prefix", name, f"-> {target} (removed {''.join(stripped)!r})"))
        elif target != name:
            changes.append(Change("rename", name, f"-> {target} (trainer-internal name)"))
        if target in contract.SKIPPED_EXTRAS:
            changes.append(Change("drop", name, f"dropped {list(info.shape)} {info.dtype} ({info.nbytes:,} bytes): "
                                  "runtimes skip it and use the target's own"))
            continue
        if target in plans:
            raise UsageError(f"{name}: maps to {target}, which {origin[target]} already provides; "
                             "remove one of them before converting")
        dtype = contract.CONTRACT_DTYPE if info.dtype in CAST_TO_BF16 else info.dtype
        if dtype != info.dtype:
            changes.append(Change("cast", target, f"{info.dtype} -> {dtype} (round to nearest even)"))
        plans[target] = TensorPlan(source=view_location(view, name), spec=TensorSpec(target, info.shape, dtype))
        origin[target] = name
    return [plans[n] for n in sorted(plans)], changes


# ---------------------------------------------------------------- bytes

def tensor_chunks(plans: list[TensorPlan]) -> Callable[[TensorSpec], Iterator[BytesLike]]:
    """Chunk producer for `writer.write_safetensors`: reads each tensor's source byte range."""
    by_name = {p.spec.name: p for p in plans}

    def produce(spec: TensorSpec) -> Iterator[BytesLike]:
        plan = by_name[spec.name]
        for piece in iter_elements(plan.source, CHUNK_ELEMENTS):
            yield cast_bytes(piece, plan.source.info.dtype, plan.spec.dtype) if plan.cast else piece

    return produce


# ---------------------------------------------------------------- config

@functools.cache
def dimension_keys() -> frozenset[str]:
    """Config keys that change the tensor roster (found by perturbing the reference config)."""
    base = contract.roster(contract.REFERENCE_CONFIG)
    keys = set()
    for key, value in contract.REFERENCE_CONFIG.items():
        probe = dict(contract.REFERENCE_CONFIG)
        if isinstance(value, bool):
            probe[key] = not value
        elif isinstance(value, int):
            probe[key] = value + 1
        else:
            continue
        if contract.roster(probe) != base:
            keys.add(key)
    return frozenset(keys)


def _ordered(config: dict[str, Any]) -> dict[str, Any]:
    known = [k for k in contract.REFERENCE_CONFIG if k in config]
    return {k: config[k] for k in known + [k for k in config if k not in contract.REFERENCE_CONFIG]}


def repair_config(config: dict[str, Any], tensor_dtypes: set[str]) -> tuple[dict[str, Any], list[Change]]:
    """The repaired config (published key order) and each change made to it.

    Args:
        config: the exported config.
        tensor_dtypes: the dtypes of the output tensors (sets `torch_dtype` when they agree).
    """
    cfg = copy.deepcopy(config)
    changes: list[Change] = []
    for key, why in contract.FORBIDDEN_KEYS.items():
        if key in cfg:
            changes.append(Change("config_remove", key, f"removed {key}={json.dumps(cfg.pop(key))}: {why}"))
    if DTYPE_ALIAS in cfg:
        removed = json.dumps(cfg.pop(DTYPE_ALIAS))
        changes.append(Change("config_remove", DTYPE_ALIAS, f"removed {DTYPE_ALIAS}={removed}: "
                              "the transformers-v5 alias of torch_dtype, which the contract writes"))
    torch_dtype = next((n for n, d in contract.TORCH_DTYPE_NAMES.items() if {d} == tensor_dtypes), None)
    if torch_dtype and "torch_dtype" in cfg and cfg["torch_dtype"] != torch_dtype:
        changes.append(Change("config_set", "torch_dtype", f"{json.dumps(cfg['torch_dtype'])} -> "
                              f"{json.dumps(torch_dtype)} (the dtype of the converted tensors)"))
        cfg["torch_dtype"] = torch_dtype
    for key, value in contract.REFERENCE_CONFIG.items():
        if key in cfg:
            continue
        if key in dimension_keys():
            changes.append(Change("config_note", key, "missing and not added: it sets tensor dimensions; add "
                                  "the value the weights were trained with"))
            continue
        cfg[key] = copy.deepcopy(torch_dtype if key == "torch_dtype" and torch_dtype else value)
        changes.append(Change("config_add", key, f"added {key}={json.dumps(cfg[key])} (reference value)"))
    ordered = _ordered(cfg)
    if [k for k in ordered if k in config] != [k for k in config if k in ordered]:
        changes.append(Change("config_order", contract.CONFIG_NAME, "keys written in the published order"))
    return ordered, changes


# ---------------------------------------------------------------- entry point

_REPAIRABLE_TITLES = titles(f for f in FORMATS.values() if f.repairable)
_TRAINABLE_TITLES = titles(f for f in FORMATS.values() if f.trainable)


def _open_source(src: Path, *, to: str | None = None, from_: str | None = None) -> CheckpointView:
    """Open SRC and refuse, before anything is written, what convert cannot turn into a k3_dspark checkpoint.

    Raises:
        UsageError: SRC cannot be read.
        ConversionRefusedError: SRC is of another draft family (naming it and what serves it), is not in
            the `from_` format, or the conversion between formats is not lossless.
    """
    view = open_checkpoint(LocalSource(src))
    blocking = [f for f in view.findings if f.severity == "error" and f.code not in _REPAIRABLE]
    if blocking:
        f = blocking[0]
        raise UsageError(f"{src}/{f.where}: {f.message}; convert cannot repair this (see 'dspark-hub verify {src}')")
    config = view.config or {}
    fmt, found = detect(config, view.tensors)
    target = by_cli_name(to) if to else DEFAULT_FORMAT
    if from_ is not None and (fmt is None or fmt.cli_name != from_):
        raise ConversionRefusedError(f"{src}: is {found.spec.title}, not a {by_cli_name(from_).title} checkpoint "
                                     f"({'; '.join(found.evidence) or 'nothing identifies it'})",
                                     family=found.family, target=target.name)
    if fmt is None:
        claim = " although config.json says k3_dspark" if config.get("model_type") == contract.MODEL_TYPE else ""
        raise ConversionRefusedError(
            f"{src}: is {found.spec.title}{claim} ({'; '.join(found.evidence) or 'nothing identifies it'}); "
            f"convert only rewrites {_REPAIRABLE_TITLES} exports and cannot make one of it",
            family=found.family, target=target.name,
            hint=f"serve it as it is ({methods_text(found.spec)}), or train a {_TRAINABLE_TITLES} draft")
    if fmt is not target:
        walk = crosswalk(list(view.tensors), config, fmt, target)
        if not walk.lossless:
            raise ConversionRefusedError(
                f"{src}: is {found.spec.title}; converting it to {target.title} is not lossless: {walk.reason()} "
                "(the context path, norms, MLP, Markov and confidence heads map one to one; the attention does not)",
                family=found.family, target=target.name, detail=walk.to_dict(),
                hint=f"serve it as it is ({methods_text(found.spec)}), or train a {target.title} draft")
    if not target.repairable:
        raise ConversionRefusedError(f"{src}: is already {found.spec.title}, so there is nothing to convert "
                                     f"(renames and layout repairs are for {_REPAIRABLE_TITLES} exports)",
                                     family=found.family, target=target.name)
    model_type = config.get("model_type", contract.MODEL_TYPE)
    if model_type != contract.MODEL_TYPE:
        raise UsageError(f"{src}/config.json: model_type {model_type!r} is not a k3_dspark export; "
                         "convert only repairs near-miss k3_dspark layouts")
    return view


def _layout_changes(view: CheckpointView, plans: list[TensorPlan]) -> list[Change]:
    changes = []
    files = view.weight_files
    if files != [contract.WEIGHTS_NAME]:
        changes.append(Change("merge", contract.WEIGHTS_NAME, f"wrote {plural(len(plans), 'tensor')} from "
                              f"{', '.join(files)} "
                              "into one file" + (f" (dropped {contract.INDEX_NAME})" if view.index else "")))
    for name, header in view.headers.items():
        if header.metadata != contract.TORCHSPEC_METADATA:
            changes.append(Change("metadata", name, f"__metadata__ {header.metadata} -> "
                                  f"{contract.TORCHSPEC_METADATA}"))
    handled = set(files) | {contract.CONFIG_NAME, contract.INDEX_NAME}
    for name in view.files:
        if name not in handled:
            changes.append(Change("skip_file", name, "not copied; copy it yourself if it belongs with the draft"))
    return changes


def convert(src: str | os.PathLike[str], dst: str | os.PathLike[str], *, force: bool = False,
            to: str | None = None, from_: str | None = None, progress: Progress | None = None) -> ConvertReport:
    """Convert a near-miss k3_dspark export in SRC into a contract checkpoint in DST.

    Between draft formats (`to`/`from_` name one: `k3_dspark`, `speculators`) it writes only a
    lossless mapping (`ops.crosswalk`); k3_dspark <-> speculators DSpark never is (the attention
    differs), so that is refused naming the tensors without a counterpart. Every refusal comes
    before anything is written.

    Args:
        src: the exported checkpoint folder (never modified).
        dst: the output folder (created atomically).
        force: replace an existing DST.
        to: the format to write (default `k3_dspark`).
        from_: the format SRC must be in (default: whatever it is).
        progress: called with the number of tensor bytes written; told the total first.

    Returns:
        A `ConvertReport` listing every change and a header-level verify of DST.

    Raises:
        RefusedOverwriteError: DST exists and `force` is False.
        UsageError: DST is SRC, inside it or contains it; SRC cannot be read or is not a k3_dspark export;
            two tensors map to one contract name.
        ConversionRefusedError: SRC is of another draft family, or the format conversion is not lossless.
    """

    src_p, dst_p = Path(src), Path(dst)
    refuse_own_inputs(dst_p, [("src", src_p)], param="dst", folder=True)
    checked = check_writable(dst_p, force=force)
    view = _open_source(src_p, to=to, from_=from_)
    plans, changes = plan_tensors(view)
    config, config_changes = repair_config(view.config or {}, {p.spec.dtype for p in plans})
    report = ConvertReport(src=os.fspath(src), dst=os.fspath(dst), tensors=len(plans),
                           changes=changes + _layout_changes(view, plans) + config_changes)
    announce_total(progress, sum(p.spec.nbytes for p in plans))
    with atomic_dir(dst_p, force=force, checked=checked) as tmp:
        write_file(tmp / contract.CONFIG_NAME, contract.config_bytes(config))
        report.weights_bytes = write_safetensors(tmp / contract.WEIGHTS_NAME, [p.spec for p in plans],
                                                 tensor_chunks(plans), metadata=contract.TORCHSPEC_METADATA,
                                                 progress=progress)
    written = verify(dst_p)
    report.verify_ok = written.ok
    report.verify_errors = [(f.code, f.where) for f in written.errors]
    return report
