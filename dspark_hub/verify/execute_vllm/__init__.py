"""Load a draft folder through vLLM's own draft loader, on CPU, and report what it did.

`execute(folder)` needs a Python where vLLM is importable (the pinned one: `.ci/venv-vllm.sh`). It
builds vLLM's real draft model for the folder's format (`k3_dspark`: `K3DSparkForCausalLM`; a
speculators DSpark: `Qwen3DSparkForCausalLM`), fills every parameter with NaN, runs the loader the
DSpark proposer runs (`load_dspark_model` -> `get_model` -> `DefaultModelLoader.load_model`, its
strict check `track_weights_loading` included) and returns, per checkpoint tensor, what happened to
it and, per parameter (stacked parameters per shard, named by the checkpoint names that fill them),
whether anything was written. Only vLLM's code runs, over tensors vLLM reads with safetensors: the
checkpoint's `auto_map`/`config.py` is never imported (`trust_remote_code=False`).

vLLM stops at the first tensor that raises. So that every tensor that would raise is named, the
engine then loads again without it (a new round, a new model) until a load gets through the tensor
stream; the last round's strict check and NaN state give the parameter verdicts. `rounds` says how
many loads it took.

Per tensor (executed status -> the verdict `verify --runtime` uses):
``consumed`` -> ``loaded`` (it reached a parameter's weight loader),
``dropped by design`` -> ``skipped`` (a name rule of vLLM's maps it to nothing, or the model's
``load_weights`` skips it before any mapping), ``silently dropped`` -> ``ignored`` (it reached the
module loader and nothing was written or raised: the ``.bias`` tolerance), ``raised`` -> ``fatal``.
Per parameter: ``written``, or ``never written`` (still NaN after loading): ``fatal`` when the strict
check raised for it, ``ignored`` when vLLM starts with it uninitialised.

Stubs exist only where no target model or GPU exists (`STUBS`); the one CPU shim is `SHIMS`. Both are
named in every result. `execute` is importable without vLLM; vLLM is imported inside it, and the
internals it hooks are checked first (`check_internals`): if they moved, it raises
`VllmInternalsMoved` naming them, never a silent skip.

`run_isolated(folder)` runs `execute` in a child process of the same interpreter (vLLM patches torch
at import and takes seconds to import; its process-wide state stays in the child) and returns the
same `ExecutedLoad`; the child is `python -m dspark_hub.verify.execute_vllm`, speaking the protocol of
`dspark_hub.vllm.child`. The vLLM version policy is `dspark_hub.vllm.pin`'s.

One concern a module: `internals` (what is hooked, checked first), `trace` (what one load records),
`hooks` (the hooks, the stub and the shims installed on vLLM), `stubs` (what stands in for a target
and a GPU), `load_round` (one load), `classify` (its verdicts), `result` (`ExecutedLoad`,
`as_verdicts`), `runner` (`execute`, `run_isolated`, the child's request handler).
"""

from __future__ import annotations

from dspark_hub.errors import ExecutionFailed, VllmInternalsMoved, VllmNotAvailable
from dspark_hub.verify.execute_vllm.internals import INTERNALS, check_internals, require_vllm
from dspark_hub.verify.execute_vllm.result import TENSOR_VERDICTS, ExecutedLoad, as_verdicts
from dspark_hub.verify.execute_vllm.runner import execute, run_isolated
from dspark_hub.verify.execute_vllm.stubs import SHIMS, STUBS, WORKER_SETUP
from dspark_hub.vllm.pin import PINNED_VERSION

#: The `error_code`s of the engine's exceptions (the README's error-code table lists them).
ERROR_CODES: dict[str, str] = {
    VllmNotAvailable.error_code: "vLLM cannot be imported in this Python",
    VllmInternalsMoved.error_code: "the installed vLLM lacks an internal the engine hooks",
    ExecutionFailed.error_code: "the engine failed (a child process died without a result), not vLLM's verdict",
}

__all__ = ["ERROR_CODES", "INTERNALS", "PINNED_VERSION", "SHIMS", "STUBS", "TENSOR_VERDICTS", "WORKER_SETUP",
           "ExecutedLoad", "ExecutionFailed", "VllmInternalsMoved", "VllmNotAvailable", "as_verdicts",
           "check_internals", "execute", "require_vllm", "run_isolated"]
