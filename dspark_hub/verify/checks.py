"""`verify`: check a checkpoint against its own config, the runtime rules and (optionally)
a drop-in reference. Returns a `Report`; never raises for problems *in* the checkpoint.

Header level only: reads JSON and safetensors headers, never tensor data, never
imports `auto_map` code.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from dspark_hub._text import plural
from dspark_hub.errors import ContractError, UsageError
from dspark_hub.format import contract
from dspark_hub.format.checkpoint import CheckpointView, LocalSource, Source, open_checkpoint
from dspark_hub.format.registry import DEFAULT_FORMAT, FORMATS, K3, SPECULATORS, DraftFormat, RosterHints
from dspark_hub.format.remote import parse_hf_url, source_for
from dspark_hub.report import Finding, Report, Summary, error, warning
from dspark_hub.verify.codes import HUB_FILE_CODES
from dspark_hub.verify.dropin import DropInReference, check_drop_in, dropin_family_finding, resolve_reference
from dspark_hub.verify.family import Fingerprint, detect, methods_text
from dspark_hub.verify.k3_config import k3_config_findings
from dspark_hub.verify.speculators import check_config as speculators_config_findings

# ---------------------------------------------------------------- config rules

#: Every config rule each format's library and runtimes enforce, by `DraftFormat.name` (the format
#: core cannot hold them: the rules live in verify). A test keeps one row per registered format.
CONFIG_RULES: dict[str, Callable[[Mapping[str, Any]], list[Finding]]] = {
    K3.name: k3_config_findings, SPECULATORS.name: speculators_config_findings}


def config_findings(fmt: DraftFormat, config: Mapping[str, Any]) -> list[Finding]:
    """Every config rule of `fmt` that `config` breaks."""
    return CONFIG_RULES[fmt.name](config)


def family_findings(found: Fingerprint, config: Mapping[str, Any]) -> list[Finding]:
    """One finding naming the family of a folder no draft format covers (none for a covered one)."""
    if found.family in FORMATS:
        return []
    model_type = config.get("model_type")
    if found.family == "unknown":
        return [error("WRONG_MODEL_TYPE", "config.json:model_type",
                      f"model_type is {json.dumps(model_type)}, not 'k3_dspark', and the config names no speculators "
                      "algorithm; this folder holds another kind of model", "point verify at a draft folder")]
    claimed = model_type == contract.MODEL_TYPE
    claim = " although config.json says k3_dspark" if claimed else ""
    where = "config.json:speculators_model_type" if found.spec.speculators_type else "config.json:model_type"
    return [error("FOREIGN_DRAFT_FAMILY", where,
                  f"this is {found.spec.title}{claim}, not a draft format dspark-hub verifies "
                  f"({', '.join(f.title for f in FORMATS.values())}) ({'; '.join(found.evidence)})",
                  _mismatched_config_hint(found) if claimed else
                  f"serve it with the method that fits ({methods_text(found.spec)}), or verify a DSpark draft")]


def _mismatched_config_hint(found: Fingerprint) -> str:
    """The step for weights under a config.json of another family: every runtime reads the config first, so
    no serving method fits until the config matches the weights."""
    if found.family == "gqa_dspark":
        return ("the tensors are a GQA DSpark body (the speculators DSpark layout): restore the config.json "
                "speculators saved with these weights (\"speculators_model_type\": \"dspark\"), then verify again; "
                "a k3_dspark config makes every runtime build MLA layers these weights cannot fill")
    return ("restore the config.json that was saved with these weights, then verify again; a k3_dspark config "
            "makes every runtime build MLA layers these weights cannot fill")


def check_config(config: Mapping[str, Any], names: Iterable[str] = ()) -> list[Finding]:
    """The config rules of the draft format the folder is in (`format.registry`).

    `names` (the checkpoint's tensor names) sharpen the family check: a folder of another
    draft family gets one finding naming it instead of a format's rules.
    """
    fmt, found = detect(config, names)
    return config_findings(fmt, config) if fmt is not None else family_findings(found, config)


# ---------------------------------------------------------------- roster

def _strip_prefix(name: str) -> tuple[str | None, str]:
    for prefix in contract.FOREIGN_PREFIXES:
        if name.startswith(prefix):
            return prefix, name[len(prefix):]
    return None, name


def check_roster(present: Mapping[str, tuple[tuple[int, ...], str]],
                 expected: Mapping[str, contract.TensorSpec], *, drop_in: bool = False,
                 hints: RosterHints | None = None) -> list[Finding]:
    """Compare present tensors (name -> (shape, dtype)) with a roster; explain known wrong layouts.

    `hints` are the format's words for known wrong layouts (default: the k3_dspark contract's).
    """
    hints = hints or DEFAULT_FORMAT.hints
    out: list[Finding] = []
    missing = [n for n in expected if n not in present]
    unexpected = [n for n in present if n not in expected]
    explained: set[str] = set()

    prefixed: dict[str, list[str]] = {}
    for name in unexpected:
        prefix, bare = _strip_prefix(name)
        if prefix and bare in expected and bare not in present:
            prefixed.setdefault(prefix, []).append(name)
            explained.update({name, bare})
    for prefix, names in prefixed.items():
        carry = "carries" if len(names) == 1 else "carry"
        out.append(error("FOREIGN_PREFIX", f"{prefix}*", f"{plural(len(names), 'tensor')} {carry} the {prefix!r} "
                         f"prefix (e.g. {names[0]}); runtimes look the contract names up without it and ignore these",
                         f"strip the {prefix!r} prefix ('dspark-hub convert')"))
    for wrong, right in hints.misnames.items():
        for name in unexpected:
            prefix, bare = _strip_prefix(name)
            if bare == wrong and right in missing:
                out.append(error("TRAINER_NAME", name, f"is the trainer-internal name of {right}; "
                                 f"{hints.misname_why}", f"rename {name} -> {right} ('dspark-hub convert')"))
                explained.update({name, right})
    for name in unexpected:
        if name in explained:
            continue
        if name in hints.skipped_extras:
            shape, dtype = present[name]
            make = error if drop_in else warning
            out.append(make("SHIPPED_LM_HEAD", name, f"is not in the contract (shape {list(shape)}, {dtype}); "
                            "runtimes skip it and use the target's lm_head, so it only costs download bytes",
                            "drop it ('dspark-hub convert')"))
        else:
            out.append(error("UNEXPECTED_TENSOR", name, "is not in the roster the config implies; runtimes that "
                             "ignore unknown names drop it silently",
                             "remove it, or fix the config if the architecture really differs"))
    for name in missing:
        if name not in explained:
            spec = expected[name]
            out.append(error("MISSING_TENSOR", name, f"is missing (expected {list(spec.shape)} {spec.dtype})",
                             hints.missing_hint))
    for name, spec in expected.items():
        if name not in present:
            continue
        shape, dtype = present[name]
        if tuple(shape) != spec.shape:
            transposed = tuple(reversed(spec.shape)) == tuple(shape) and len(shape) == 2
            out.append(error("SHAPE_MISMATCH", name, f"has shape {list(shape)}, the config implies "
                             f"{list(spec.shape)}", "re-export it transposed" if transposed else
                             "fix the export or the config so they agree"))
        if dtype != spec.dtype:
            out.append(error("DTYPE_MISMATCH", name, f"is {dtype}, the contract stores {spec.dtype}",
                             hints.dtype_hint))
    return out


# ---------------------------------------------------------------- summary

def summarize(view: CheckpointView, fmt: DraftFormat | None = None) -> Summary:
    """What the checkpoint holds; parameters are counted the way `fmt` (default k3_dspark) counts them."""
    shapes = {name: info.shape for name, (_, info) in view.tensors.items()}
    metas = [h.metadata for h in view.headers.values()]
    return Summary(
        model_type=(view.config or {}).get("model_type"),
        format=fmt.name if fmt else None,
        layout=view.layout,
        files=[{"name": name, "size": view.files[name]} for name in view.headers],
        tensors=len(view.tensors),
        parameters=(fmt or DEFAULT_FORMAT).counts(shapes).to_dict() if shapes else None,
        bytes=sum(view.files[name] for name in view.headers),
        dtypes=dict(Counter(info.dtype for _, info in view.tensors.values())),
        metadata=metas[0] if len(metas) == 1 else None,
    )


def _dtype_consistency(config: Mapping[str, Any], view: CheckpointView) -> list[Finding]:
    """The declared float dtype (`torch_dtype`, or transformers 5's `dtype`) against the float tensors."""
    key = "torch_dtype" if "torch_dtype" in config else "dtype"
    declared = config.get(key)
    want = contract.TORCH_DTYPE_NAMES.get(declared) if isinstance(declared, str) else None
    floats = set(contract.TORCH_DTYPE_NAMES.values())
    dtypes = {info.dtype for _, info in view.tensors.values() if info.dtype in floats}
    if want is None or not dtypes or dtypes == {want}:
        return []
    return [error("TORCH_DTYPE_MISMATCH", f"config.json:{key}", f"{key} is {declared!r} but the float "
                  f"tensors are {', '.join(sorted(dtypes))}", f"cast the tensors or fix {key}")]


def _metadata_findings(view: CheckpointView, fmt: DraftFormat | None = None) -> list[Finding]:
    out = []
    for name, header in view.headers.items():
        if header.metadata == {}:
            out.append(warning("EMPTY_METADATA", name, "__metadata__ is an empty map, which crashes some loaders "
                               "(fastsafetensors)", "write {\"torchspec_version\": \"0.1.0\"} or no metadata"))
        order = list(header.tensors)
        if (fmt or DEFAULT_FORMAT).sorted_data and view.layout == "single" and order != sorted(order):
            out.append(warning("TENSOR_ORDER", name, "tensor data is not in sorted-name order, unlike the "
                               "published file; the bytes (and so the SHA-256) cannot match a drop-in",
                               "re-export with safetensors (which sorts names)"))
    return out


# ---------------------------------------------------------------- entry point

def _check_format(report: Report, view: CheckpointView, fmt: DraftFormat, *, drop_in: bool) -> None:
    """A format's config rules, its roster and the declared dtype, into `report`."""
    config = view.config or {}
    broken = config_findings(fmt, config)
    report.findings.extend(broken)
    try:
        expected = fmt.roster(config)
    except ContractError as e:
        expected = None
        where = f"config.json:{e.key}"
        said = any(f.where == where and f.severity == "error" for f in broken)
        if view.tensors and not said:   # said once
            report.findings.append(error("ROSTER_UNDECIDABLE", where, str(e),
                                         "fix the config; the tensor roster depends on it"))
    if expected is not None:   # what a MISSING_TENSOR hint points at
        report.sections["roster"] = {name: {"shape": list(spec.shape), "dtype": spec.dtype}
                                     for name, spec in expected.items()}
    if not view.tensors:
        return
    if expected is not None:
        present = {n: (info.shape, info.dtype) for n, (_, info) in view.tensors.items()}
        report.findings.extend(check_roster(present, expected, drop_in=drop_in, hints=fmt.hints))
    report.findings.extend(_dtype_consistency(config, view))


def verify_view(view: CheckpointView, *, drop_in: str | DropInReference | None = None) -> Report:
    """Run every header-level check on an opened checkpoint, against the draft format it is in.

    The format comes from `verify.family.detect` (a declared type first, tensor names second);
    a folder of another family gets one finding naming it, and with a drop-in reference of
    another family one finding naming both.
    """
    ref = resolve_reference(drop_in) if isinstance(drop_in, str) else drop_in
    config = view.config
    fmt, found = detect(config, view.tensors) if config is not None else (None, None)
    report = Report(path=view.location, summary=summarize(view, fmt))
    report.findings.extend(view.findings)
    across = ref is not None and found is not None and found.family != ref.family
    if found is not None and (fmt is None or across):
        report.sections["family"] = found.to_dict()
    if across and found is not None and ref is not None:
        report.findings.append(dropin_family_finding(found, ref))
    elif config is not None and fmt is None and found is not None:
        report.findings.extend(family_findings(found, config))
    if fmt is not None:
        _check_format(report, view, fmt, drop_in=ref is not None)
    report.findings.extend(_metadata_findings(view, fmt))
    if ref is not None and not across:
        report.findings.extend(check_drop_in(view, ref))
    return report


def check_against_hub(report: Report, folder: str, hub_ref: str, *,
                      endpoint: str | None = None) -> None:
    """Compare local files with a Hub revision's LFS SHA-256 / blob ids and sizes (into `report`)."""
    from dspark_hub.verify.against_hub import compare_with_hub  # optional: loads with its flag

    repo_id, revision = parse_hf_url(hub_ref if hub_ref.startswith("hf://") else f"hf://{hub_ref}")
    comparison = compare_with_hub(folder, repo_id, revision, endpoint=endpoint)
    report.sections["against_hub"] = comparison.to_dict()
    for problem in comparison.problems:
        report.findings.append(error(HUB_FILE_CODES[problem.kind], problem.path, problem.message,
                                     "re-download the file, or publish the local folder if it is the intended one"))


def _execute_runtimes(runtime: str | list[str] | None, *, local: bool) -> str | list[str]:
    """The runtimes to judge when vLLM's loader is to be executed (vllm unless named); refuse what cannot run."""
    from dspark_hub.verify.runtimes.execute_vllm import require_vllm  # optional: loads with its flag

    if not local:
        raise UsageError("runs vLLM's loader over the tensors of a local folder; pass a local folder", param="execute")
    names = ["vllm"] if runtime is None else runtime
    if "vllm" not in names and "all" not in names and names != "all":
        raise UsageError("runs vLLM's loader; add vllm to `runtime`", param="execute")
    require_vllm()
    return names


def verify(path: str | os.PathLike[str] | Source, *, drop_in: str | None = None, deep: bool = False,
           frozen_embed: str | os.PathLike[str] | None = None, runtime: str | list[str] | None = None,
           target: str | os.PathLike[str] | Source | None = None, block_size: int | None = None,
           against_hub: str | None = None, endpoint: str | None = None, execute: bool = False,
           eval_json: str | os.PathLike[str] | None = None, progress: Callable[[int], None] | None = None) -> Report:
    """Verify a checkpoint folder (or `hf://` repo) at header level, and optionally its bytes.

    Args:
        path: a checkpoint folder, an `hf://org/name[@rev]` URL, or a `Source`.
        drop_in: also demand drop-in identity with a bundled reference (`kimi-k3`) or a folder.
        deep: also stream every weight file: SHA-256, NaN/inf, all-zero matrices (`deep.py`; local only).
        frozen_embed: a teacher checkpoint (folder or file) whose embedding `embed_tokens.weight` must
            equal bit for bit (local only).
        runtime: also judge the checkpoint through these runtimes' loaders (`all`, or names from
            `runtimes.loaders.RUNTIMES`) and add their serving commands.
        target: also check the pairing with this target (folder or `hf://`); hashes both embeddings.
        block_size: draft tokens per block for the serving commands (default: the reference's 7).
        against_hub: `ORG/NAME[@REV]`: also compare every local file with the Hub's digests and sizes.
        endpoint: the Hub endpoint for `hf://` paths and `against_hub` (default: HF_ENDPOINT).
        execute: run vLLM's own draft loader on the folder (CPU, a child process of this Python;
            `verify.runtimes.execute_vllm`) and report what it did for `vllm` instead of the rules' verdicts;
            implies `runtime="vllm"` when no runtime is given. Needs vLLM importable here.
        eval_json: an `eval --k ... --json` document or a speculation_profile.json: a served k beyond the
            trained block (`SERVED_K_BEYOND_BLOCK`, checked with `runtime`, `block_size` or this) states what the
            document measured of it.
        progress: called with bytes read by the deep and frozen-embed passes.

    Returns:
        A `Report`; `report.ok` is False when any finding is an error.

    Raises:
        CheckpointNotFoundError: the path does not exist or cannot be listed.
        UsageError: `drop_in` names neither a bundled reference nor a folder; `deep`, `frozen_embed`,
            `against_hub` or `execute` on an `hf://` path; the teacher holds no embedding; `execute`
            without vLLM importable (`execute_vllm.VllmNotAvailable`) or with `runtime` not naming vllm.
        VllmInternalsMoved: `execute` with a vLLM whose internals the engine cannot hook.
        HubError: the Hub cannot be read.

    Example:
        >>> verify("ckpt").ok
        True
    """
    ref = resolve_reference(drop_in) if isinstance(drop_in, str) else drop_in
    measured = None
    if eval_json is not None:      # read before any long pass: a wrong file fails first
        from dspark_hub.verify.served_k import read_measurement  # optional: loads with its flag
        measured = read_measurement(eval_json)
    source = source_for(path, endpoint=endpoint)
    if against_hub is not None and not isinstance(source, LocalSource):
        raise UsageError("compares a local folder with the Hub; pass a local folder", param="against_hub")
    if execute:
        runtime = _execute_runtimes(runtime, local=isinstance(source, LocalSource))
    view = open_checkpoint(source)
    report = verify_view(view, drop_in=ref)
    if deep or frozen_embed is not None:
        from dspark_hub.verify import deep as byte_level  # numpy only when tensor bytes are read
        byte_level.extend_report(report, view, deep=deep, frozen_embed=frozen_embed, progress=progress)
    if runtime is not None:
        from dspark_hub.verify.runtimes.report import extend_report  # optional: loads with its flag
        extend_report(report, view, runtime, block_size=block_size, execute=execute)
    if runtime is not None or block_size is not None or eval_json is not None:
        from dspark_hub.verify.served_k import served_k_findings  # optional: loads with its flag
        report.findings += served_k_findings(view, block_size, measured,
                                             os.path.basename(eval_json) if eval_json is not None else "the eval")
    if target is not None:
        from dspark_hub.verify import pairing  # optional: loads with its flag
        pairing.extend_report(report, view, target, progress=progress, endpoint=endpoint)
    if against_hub is not None:
        check_against_hub(report, source.location, against_hub, endpoint=endpoint)
    return report
