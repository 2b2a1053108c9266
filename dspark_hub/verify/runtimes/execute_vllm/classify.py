"""The verdicts of one executed load: per checkpoint tensor (`classify`) and per parameter (`parameters`).

A stacked vLLM parameter (`qkv_proj`, `gate_up_proj`, K3's `context_kv_proj`) is judged per shard,
under the checkpoint name that fills it, from the models' own name mappers.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from dspark_hub.verify.runtimes.execute_vllm.result import (
    TENSOR_VERDICTS,
    ExecutedParameter,
    ExecutedStatus,
    ExecutedTensor,
)
from dspark_hub.verify.runtimes.execute_vllm.trace import Trace
from dspark_hub.verify.runtimes.vllm_rules import ShardId

if TYPE_CHECKING:
    import torch


def _stacked_labels(model: torch.nn.Module | None) -> dict[tuple[str, ShardId], str]:
    """(stacked suffix, shard id) -> the checkpoint suffix it comes from, from the models' own mappers."""
    labels: dict[tuple[str, ShardId], str] = {}
    for module in (model, getattr(model, "model", None)):
        mapper = getattr(type(module), "hf_to_vllm_mapper", None) if module is not None else None
        for orig, (new, shard) in (getattr(mapper, "orig_to_new_stacked", None) or {}).items():
            labels[(new.strip("."), shard)] = orig.strip(".")
    return labels


def _shards(model: torch.nn.Module | None, pname: str,
            labels: dict[tuple[str, ShardId], str]) -> list[tuple[str, int]] | None:
    """[(checkpoint name, rows)] of a stacked parameter along dim 0, else None."""
    from vllm.model_executor.layers.linear import MergedColumnParallelLinear, QKVParallelLinear

    modname, _, leaf = pname.rpartition(".")
    if model is None:
        return None
    try:
        module = model.get_submodule(modname)
    except AttributeError:
        return None
    parent, _, short = modname.rpartition(".")
    base = checkpoint_name(f"{parent}.{short}" if parent else short)
    if isinstance(module, QKVParallelLinear):
        q = module.num_heads * module.head_size
        kv = module.num_kv_heads * module.head_size
        v = module.num_kv_heads * getattr(module, "v_head_size", module.head_size)
        return [(_swap(base, short, labels.get((short, s), s)) + f".{leaf}", n)
                for s, n in (("q", q), ("k", kv), ("v", v))]
    if not isinstance(module, MergedColumnParallelLinear) or len(module.output_sizes) < 2:
        return None
    out = []
    for i, n in enumerate(module.output_sizes):
        label = labels.get((short, i))
        out.append((_swap(base, short, label) + f".{leaf}" if label else f"{base}.{leaf}[shard {i}]", n))
    return out


def _swap(base: str, short: str, label: str) -> str:
    return base[: len(base) - len(short)] + label


def checkpoint_name(vllm_name: str) -> str:
    if vllm_name.startswith("model."):
        return vllm_name[len("model."):]
    return "d2t" if vllm_name == "draft_id_to_target_id" else vllm_name


def parameters(t: Trace, replaced: Mapping[str, str]) -> dict[str, ExecutedParameter]:
    model, snap = t.model, t.snapshot or {}
    labels = _stacked_labels(model)
    raised_for = set(t.strict.get("raised_for") or ())
    out: dict[str, ExecutedParameter] = {}
    for pname, entry in snap.items():
        if pname in replaced or any(pname.startswith(r + ".") for r in replaced):
            continue
        rows = entry["rows_unwritten"]
        parts = _shards(model, pname, labels) or [(checkpoint_name(pname), len(rows))]
        offset = 0
        for name, n in parts:
            unwritten = rows[offset:offset + n]
            where = pname if len(parts) == 1 else f"{pname} rows [{offset}, {offset + n})"
            offset += n
            if not any(unwritten):
                out[name] = {"status": "written", "verdict": None, "vllm": where}
            else:
                fatal = pname in raised_for
                out[name] = {"status": "never written", "verdict": "fatal" if fatal else "ignored", "vllm": where,
                             "detail": ("the strict check raises for it: start-up fails" if fatal else
                                        "vLLM starts and serves with it uninitialised")
                             + ("" if all(unwritten) else f" ({sum(unwritten)} of {n} rows)")}
    return out


def classify(t: Trace, header_names: list[str], raised: Mapping[str, str]) -> dict[str, ExecutedTensor]:
    out: dict[str, ExecutedTensor] = {}
    for name in header_names:
        status: ExecutedStatus
        if name in raised:
            status, detail = "raised", raised[name]
        elif t.writes.get(name):
            params = sorted({p if s is None else f"{p} (shard {s})" for p, s in t.writes[name]})
            status, detail = "consumed", "written to " + ", ".join(params)
        elif name in t.dropped:
            status, detail = "dropped by design", f"vLLM's name mapping drops it ({t.dropped[name]})"
        elif name in t.mapped:
            status, detail = "silently dropped", "reached the module loader; nothing written and nothing raised"
        elif name in t.order:
            status, detail = "dropped by design", "the model's load_weights skips it before any name mapping"
        else:
            status, detail = "dropped by design", "never read by vLLM's weight iterator"
        out[name] = {"status": status, "verdict": TENSOR_VERDICTS[status], "detail": detail}
    return out

