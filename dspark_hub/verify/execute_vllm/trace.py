"""What one traced load records (`Trace`), and the per-process state of the hooks (`STATE`)."""

from __future__ import annotations

import bisect
import contextlib
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dspark_hub.verify.runtimes_vllm import ShardId

if TYPE_CHECKING:
    import torch

#: What integer parameters are filled with before loading (floating ones get NaN).
INT_SENTINEL = -(2 ** 62)


class Trace:
    """What the hooks record during one load (one round)."""

    def __init__(self, excluded: set[str]) -> None:
        self.excluded = excluded
        self.order: list[str] = []                           # source names in the order vLLM read them
        self._ivals: list[tuple[int, int, str]] = []         # (start, end, name): views and detach() copies
        self.in_flight: str | None = None
        self.mapped: set[str] = set()                        # sources that reached a WeightsMapper
        self.dropped: dict[str, str] = {}                    # source -> the mapping rule that dropped it
        self.writes: dict[str, list[tuple[str, ShardId | None]]] = {}   # source -> [(vLLM param, shard)]
        self.failed_write: str | None = None                 # source whose weight loader raised
        self.param_names: dict[int, str] = {}
        self.model: torch.nn.Module | None = None
        self.snapshot: dict[str, Any] | None = None
        self.strict: dict[str, Any] = {"ran": False}
        self.phase = "config"

    def add_source(self, name: str, tensor: torch.Tensor) -> None:
        self.order.append(name)
        with contextlib.suppress(Exception):
            tensor._dspark_src = name   # type: ignore[attr-defined]  # our marker on vLLM's tensor
        start = tensor.data_ptr()
        if start:
            item = (start, start + max(1, tensor.numel() * tensor.element_size()), name)
            bisect.insort(self._ivals, item)
            with contextlib.suppress(TypeError):
                weakref.finalize(tensor, self._drop_interval, item)

    def _drop_interval(self, item: tuple[int, int, str]) -> None:
        i = bisect.bisect_left(self._ivals, item)
        if i < len(self._ivals) and self._ivals[i] == item:
            del self._ivals[i]

    def source_of(self, tensor: torch.Tensor) -> str | None:
        name = getattr(tensor, "_dspark_src", None)
        if isinstance(name, str):
            return name
        try:
            ptr = tensor.data_ptr()
        except Exception:
            return None
        i = bisect.bisect_right(self._ivals, (ptr, float("inf"), "")) - 1
        if i >= 0 and self._ivals[i][0] <= ptr < self._ivals[i][1]:
            return self._ivals[i][2]
        return None


@dataclass
class _State:
    """Per process: the round being traced, and the set-up done once."""

    trace: Trace | None = None
    installed: bool = False
    distributed: bool = False
    version: str | None = None


STATE = _State()


def current_trace() -> Trace | None:
    """The round being traced, or None (the hooks stay installed between rounds)."""
    return STATE.trace


def tracing() -> Trace:
    """The round being traced, from a hook that only `execute` triggers."""
    if STATE.trace is None:
        raise RuntimeError("a vLLM loader hook ran outside dspark_hub.verify.execute_vllm.execute")
    return STATE.trace


def record_write(t: Trace, pname: str, loaded_weight: torch.Tensor, shard: object) -> str | None:
    src = t.source_of(loaded_weight)
    if src is not None:
        t.writes.setdefault(src, []).append((pname, shard if isinstance(shard, (int, str, type(None)))
                                             else str(shard)))
    return src


def snapshot(model: torch.nn.Module) -> dict[str, Any]:
    """Per parameter: which rows (per shard for stacked parameters) are still NaN (the sentinel for ints)."""
    import torch

    out: dict[str, Any] = {}
    with torch.no_grad():
        for pname, p in model.named_parameters():
            data = p.data
            bad = torch.isnan(data) if data.dtype.is_floating_point else data == INT_SENTINEL
            rows = bad.reshape(data.shape[0], -1).any(dim=1).tolist() if data.dim() >= 1 else [bool(bad.any())]
            out[pname] = {"shape": list(data.shape), "rows_unwritten": rows}
    return out

