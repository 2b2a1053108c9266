"""A CPU-safe subclass of vLLM's `ExampleHiddenStatesConnector` (loaded by vLLM, by module path).

vLLM's hidden-state extraction (`speculative_config.method = "extract_hidden_states"`) stores the
requested residual streams in a cache-only layer; a KV connector copies each finished request's
rows out and writes `{shared_storage_path}/{request_id}.safetensors` (`hidden_states [T, n, H]`,
ids ascending, and `token_ids [T]`) next to a `.lock` file held while writing. That is the file
speculators' data pipeline reads, and the one our vLLM engine reads.

Upstream's connector copies device -> pinned host memory on a CUDA stream; on a CPU build the
pinned allocation fails ("pin_memory=True requires a CUDA or other accelerator backend"). This
subclass overrides only `_submit_async_write`: the same slot mapping and `extract_from_kv_cache`,
then a synchronous write through upstream's own `_write_tensors` with an always-complete event,
which releases the lock, and that event registered so upstream's `get_finished` reports the
request done in the same step. Everything else (lock files, file names, `include_output_tokens`,
the file format) is upstream's, so the files are byte-compatible.

It relies on private members (`PINNED_MEMBERS`) of the connector of vLLM's pinned series (`vllm.pin`);
importing this module checks they are there and fails loudly, naming what changed, when an upgrade moves them.
"""

from __future__ import annotations

import fcntl
import inspect
import os

import torch  # noqa: TID253 - runs only inside the vLLM engine process, which has imported torch already
from vllm.distributed.kv_transfer.kv_connector.v1 import example_hidden_states_connector as upstream
from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
    ExampleHiddenStatesConnector,
    PendingSave,
    extract_from_kv_cache,
)

from dspark_hub.vllm.pin import PINNED_SERIES

#: Upstream members the subclass reads or writes; `check_upstream()` names any that disappear.
PINNED_MEMBERS = ("_submit_async_write", "_write_tensors", "get_finished", "request_finished", "wait_for_save",
                  "register_kv_caches")
PINNED_ATTRIBUTES = ("_is_tp_rank_zero", "_kv_cache", "_block_size", "_lock_fds", "use_lock", "_req_copy_events",
                     "_kv_transfer_config")
PINNED_MODULE_NAMES = ("PendingSave", "extract_from_kv_cache", "load_hidden_states", "cleanup_hidden_states")


def check_upstream() -> list[str]:
    """What this subclass needs from upstream but no longer finds (empty when all is there)."""
    missing = [f"ExampleHiddenStatesConnector.{name}" for name in PINNED_MEMBERS
               if not callable(getattr(ExampleHiddenStatesConnector, name, None))]
    missing += [f"example_hidden_states_connector.{name}" for name in PINNED_MODULE_NAMES
                if not hasattr(upstream, name)]
    source = inspect.getsource(ExampleHiddenStatesConnector)
    missing += [f"ExampleHiddenStatesConnector().{name}" for name in PINNED_ATTRIBUTES
                if f"self.{name}" not in source]
    fields = getattr(PendingSave, "__dataclass_fields__", {})
    missing += [f"PendingSave.{name}" for name in ("req_id", "filename", "token_ids", "block_ids")
                if name not in fields]
    return missing


_MISSING = check_upstream()
if _MISSING:
    raise ImportError(f"vLLM's ExampleHiddenStatesConnector changed ({', '.join(_MISSING)} missing); "
                      f"dspark_hub's CPU connector is written for vLLM {PINNED_SERIES}.*")


class _CompletedEvent:
    """Stands in for `torch.cuda.Event`: the copy is synchronous, so it is always complete."""

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        return None


class CpuHiddenStatesConnector(ExampleHiddenStatesConnector):  # type: ignore[misc]  # vLLM ships no types
    """`ExampleHiddenStatesConnector` with a synchronous host copy (no CUDA stream, event or pinned memory)."""

    def _submit_async_write(self, pending: PendingSave) -> None:
        if not self._is_tp_rank_zero:
            return
        if self._kv_cache is None:
            raise RuntimeError("hidden-states cache not registered before the first save")
        block_ids = torch.tensor(pending.block_ids, dtype=torch.long)
        offsets = torch.arange(self._block_size, dtype=torch.long)
        slot_mapping = (block_ids[:, None] * self._block_size + offsets[None, :]).flatten()
        num_tokens = pending.token_ids.shape[0]
        hidden_states = extract_from_kv_cache(self._kv_cache, slot_mapping, num_tokens).cpu()
        tensors = {"hidden_states": hidden_states.contiguous(), "token_ids": pending.token_ids.clone()}

        os.makedirs(os.path.dirname(pending.filename), exist_ok=True)
        lock_fd = self._lock_fds.pop(pending.req_id, None)
        if lock_fd is None and self.use_lock:
            lock_fd = os.open(pending.filename + ".lock", os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
        done = _CompletedEvent()
        self._write_tensors(tensors, done, pending.filename, lock_fd)  # upstream's writer; releases the lock
        self._req_copy_events[pending.req_id] = done


def connector_config(storage_path: str, *, cpu: bool) -> dict[str, object]:
    """The `kv_transfer_config` naming this connector (on CPU) or upstream's (on an accelerator)."""
    config: dict[str, object] = {"kv_role": "kv_producer",
                                 "kv_connector_extra_config": {"shared_storage_path": storage_path}}
    if cpu:
        config.update(kv_connector="CpuHiddenStatesConnector", kv_connector_module_path=__name__)
    else:
        config.update(kv_connector="ExampleHiddenStatesConnector")
    return config
